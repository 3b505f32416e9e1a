package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/vanguard"
	"connectrpc.com/vanguard/vanguardgrpc"
	"google.golang.org/grpc"
)

// Keepalive of the listener's HTTP/2 connections, as the socket's gRPC server keeps its
// own (pkg/server): a connection idle this long is pinged, and dropped when no answer
// comes in time, so that a peer that went away frees what it held.
const (
	pingAfter   = 2 * time.Minute
	pingTimeout = 20 * time.Second
	// idleTimeout closes a connection that has carried no request for this long.
	idleTimeout = 10 * time.Minute
	// headerTimeout bounds how long a client may take to send a request's headers.
	headerTimeout = 10 * time.Second
)

// Server is the remote listener: an HTTP server (HTTP/2 over TLS for gRPC and Connect,
// HTTP/1.1 too for Connect's unary calls) in front of roostd's gRPC server, every request
// let in by its client's certificate and role first.
type Server struct {
	http *http.Server
	lis  net.Listener
	gate *gate
	ca   *x509.Certificate
}

// Options are the listener's bounds.
type Options struct {
	// MaxMessageBytes bounds a message the transcoder holds while it turns JSON into the
	// gRPC server's protobuf and back; 0 for vanguard's default.
	MaxMessageBytes int
	// MaxStreams bounds the requests one connection carries at once.
	MaxStreams int
}

// New opens the listener s describes in front of srv: its TLS configuration checked and
// loaded and its address bound, so that what is wrong with either is said before roostd
// serves. Serve serves it.
func New(s Settings, srv *grpc.Server, opts Options, log *slog.Logger) (*Server, error) {
	tlsCfg, ca, err := s.TLS()
	if err != nil {
		return nil, err
	}
	h, err := newHandler(s.Roles, srv, opts, log)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", s.Listen.Value)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", s.Listen.From, s.Listen.Value, err)
	}
	hs := &http.Server{
		Handler:           h,
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleTimeout,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: opts.MaxStreams,
			SendPingTimeout:      pingAfter,
			PingTimeout:          pingTimeout,
		},
		// A refused handshake (no certificate, another CA's) is the client's business and
		// is logged at debug: a scanner must not fill the daemon's log.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return &Server{http: hs, lis: lis, gate: h, ca: ca}, nil
}

// CASubject is the subject of the client CA's (first) certificate.
func (s *Server) CASubject() string { return s.ca.Subject.String() }

// Addr is the address the listener is bound to.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Serve serves until Close; it returns why it stopped otherwise.
func (s *Server) Serve() error {
	err := s.http.Serve(tls.NewListener(s.lis, s.http.TLSConfig))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Drain stops the listener taking connections and calls, and waits up to grace for its
// unary calls in flight. Its streams are the gRPC server's to end (pkg/server's Shutdown
// ends followers at once); Close then closes what is left.
func (s *Server) Drain(grace time.Duration) {
	s.gate.drain(grace)
	// Shutdown closes the listener and tells HTTP/2 clients (GOAWAY) that no new stream
	// will be served; it returns once every connection is idle, which Close no longer waits for.
	go func() { _ = s.http.Shutdown(context.Background()) }()
}

// Close closes the listener's connections, whatever they carry.
func (s *Server) Close() error { return s.http.Close() }

// newHandler is the listener's handler: the gate in front of a vanguard transcoder that
// serves srv's services to gRPC, gRPC-Web and Connect clients.
func newHandler(roles Roles, srv *grpc.Server, opts Options, log *slog.Logger) (*gate, error) {
	var svcOpts []vanguard.ServiceOption
	if opts.MaxMessageBytes > 0 {
		svcOpts = append(svcOpts, vanguard.WithMaxMessageBufferBytes(uint32(opts.MaxMessageBytes)))
	}
	tr, err := vanguardgrpc.NewTranscoder(srv, vanguard.WithDefaultServiceOptions(svcOpts...))
	if err != nil {
		return nil, fmt.Errorf("serving the control API over HTTP: %w", err)
	}
	streaming := map[string]bool{}
	for svc, info := range srv.GetServiceInfo() {
		for _, m := range info.Methods {
			if m.IsClientStream || m.IsServerStream {
				streaming["/"+svc+"/"+m.Name] = true
			}
		}
	}
	return &gate{roles: roles, next: tr, errs: connect.NewErrorWriter(), streaming: streaming, log: log}, nil
}

// gate lets a request through only from a client with a verified certificate whose name
// the role table knows, to a method its role allows. gRPC and Connect both name the
// method in the path, /package.Service/Method; a refusal is written in the request's own
// protocol (gRPC's status trailers, Connect's JSON error with its HTTP status).
type gate struct {
	roles     Roles
	next      http.Handler
	errs      *connect.ErrorWriter
	streaming map[string]bool
	log       *slog.Logger

	mu       sync.Mutex
	draining bool
	unary    sync.WaitGroup
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	caller, err := g.admit(r)
	if err != nil {
		g.refuse(w, r, err)
		return
	}
	done, err := g.track(r.URL.Path)
	if err != nil {
		g.refuse(w, r, err)
		return
	}
	defer done()
	r = r.WithContext(withCaller(r.Context(), caller))
	// The API declares no REST routes, so a unary POST of JSON or protobuf to a method's
	// path can only be Connect's: taken as such even without Connect's version header,
	// which the transcoder otherwise wants, so that a plain curl -d '{}' is served.
	if ct := r.Header.Get("Content-Type"); r.Method == http.MethodPost && r.Header.Get("Connect-Protocol-Version") == "" &&
		(ct == "application/json" || ct == "application/proto") {
		r.Header.Set("Connect-Protocol-Version", "1")
	}
	g.next.ServeHTTP(w, r)
}

// admit is who calls, or why they may not.
func (g *gate) admit(r *http.Request) (Caller, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return Caller{}, connect.NewError(connect.CodeUnauthenticated, errors.New("roostd serves remote callers only with a client certificate its client CA signed"))
	}
	cn := r.TLS.VerifiedChains[0][0].Subject.CommonName
	role, ok := g.roles[cn]
	if !ok {
		g.log.Warn("refused a remote client its certificate's name is not listed for", "common_name", cn, "remote_addr", r.RemoteAddr, "method", r.URL.Path)
		return Caller{}, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("the certificate's Common Name %q is not among remote.clients: roostd gives it no role", cn))
	}
	c, err := forwarded(r.Header, Caller{CommonName: cn, Role: role})
	if err != nil {
		g.log.Warn("refused a remote call naming a caller it forwards for", "common_name", cn, "role", role, "method", r.URL.Path, "remote_addr", r.RemoteAddr, "err", err)
		return Caller{}, connect.NewError(connect.CodePermissionDenied, err)
	}
	if !Allowed(c.Role, r.URL.Path) {
		g.log.Warn("refused a remote call its role does not allow", "common_name", c.CommonName, "role", c.Role, "via", c.Via, "method", r.URL.Path, "remote_addr", r.RemoteAddr)
		why := "a reader may call only the read methods"
		if c.Role == Node {
			why = "a node may call only the read methods, unless it forwards a caller who may"
		}
		return Caller{}, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s may not call %s: %s", c, r.URL.Path, why))
	}
	return c, nil
}

// forwarded is the caller of a request from c: c itself, or, when c is a node naming a
// caller it forwards for, that caller by way of c. Only a node may name one, and only with
// an operator's or a reader's role: a forwarded call is never a node's own.
func forwarded(h http.Header, c Caller) (Caller, error) {
	var named bool
	for k := range h {
		named = named || strings.HasPrefix(strings.ToLower(k), headerForwardedPrefix)
	}
	if !named {
		return c, nil
	}
	if c.Role != Node {
		return Caller{}, fmt.Errorf("%s sent %s headers, which only a node of the fleet may send (role node in remote.clients)", c, headerForwardedPrefix+"*")
	}
	one := func(name string) (string, error) {
		switch v := h.Values(name); len(v) {
		case 1:
			return v[0], nil
		case 0:
			return "", fmt.Errorf("node %s forwarded a call without %s", c.CommonName, name)
		default:
			return "", fmt.Errorf("node %s forwarded a call with %d %s headers, want one", c.CommonName, len(v), name)
		}
	}
	raw, err := one(HeaderForwardedFor)
	if err != nil {
		return Caller{}, err
	}
	name, err := url.PathUnescape(raw)
	if err != nil || strings.TrimSpace(name) == "" {
		return Caller{}, fmt.Errorf("node %s forwarded a call for %q: %s must name the caller", c.CommonName, raw, HeaderForwardedFor)
	}
	rs, err := one(HeaderForwardedRole)
	if err != nil {
		return Caller{}, err
	}
	if role := Role(rs); role != Operator && role != Reader {
		return Caller{}, fmt.Errorf("node %s forwarded a call for %q as role %q: a forwarded caller is an operator or a reader", c.CommonName, name, rs)
	}
	by, err := one(HeaderForwardedBy)
	if err != nil {
		return Caller{}, err
	}
	if by != c.CommonName {
		return Caller{}, fmt.Errorf("node %s forwarded a call as node %q: %s must be its own name", c.CommonName, by, HeaderForwardedBy)
	}
	return Caller{CommonName: name, Role: Role(rs), Via: c.CommonName}, nil
}

// track counts a unary call in flight, for drain to wait on; once draining, nothing new
// is let in.
func (g *gate) track(method string) (done func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("roostd is shutting down; resume once it is back"))
	}
	if g.streaming[method] {
		return func() {}, nil
	}
	g.unary.Add(1)
	return g.unary.Done, nil
}

func (g *gate) drain(grace time.Duration) {
	g.mu.Lock()
	g.draining = true
	g.mu.Unlock()
	done := make(chan struct{})
	go func() { g.unary.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
	}
}

// refuse writes err in the request's protocol: gRPC's status, or Connect's JSON error with
// its HTTP status (which a request in no protocol, a browser's GET, gets too).
func (g *gate) refuse(w http.ResponseWriter, r *http.Request, err error) {
	_ = g.errs.Write(w, r, err)
}
