package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"strings"
	"sync"
	"time"
)

// IsProxyRequest says whether r is for the proxy: a CONNECT, or a request for an absolute
// URI (what a client configured with an HTTP proxy sends).
func IsProxyRequest(r *http.Request) bool {
	return r.Method == http.MethodConnect || r.URL.IsAbs()
}

// ServeHTTP serves a proxy request: a CONNECT tunnel or a forwarded absolute-URI request.
func (s *Session) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		s.serveConnect(w, r)
		return
	}
	s.serveForward(w, r)
}

// denialStatus is the HTTP status for a reason.
func denialStatus(reason string) int {
	switch reason {
	case ReasonBadRequest:
		return http.StatusBadRequest
	case ReasonUnresolvable, ReasonDialFailed:
		return http.StatusBadGateway
	case ReasonSessionClosed, ReasonConnections:
		return http.StatusServiceUnavailable
	default:
		return http.StatusForbidden
	}
}

// writeDenial answers a refused request: the status, the reason in X-Roost-Denied, and a
// JSON body naming host, port and why.
func writeDenial(w http.ResponseWriter, f *flow, d *denial) {
	f.mu.Lock()
	host, port := f.rec.Host, f.rec.Port
	f.mu.Unlock()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set(DeniedHeader, d.reason)
	w.WriteHeader(denialStatus(d.reason))
	_ = json.NewEncoder(w).Encode(struct {
		Error  string `json:"error"`
		Host   string `json:"host"`
		Port   int    `json:"port"`
		Reason string `json:"reason"`
	}{d.detail, host, port, d.reason})
}

// refuse denies a flow: its Record at once, then the answer.
func refuse(w http.ResponseWriter, f *flow, d *denial) {
	f.deny(d.reason, d.detail)
	writeDenial(w, f, d)
}

func badRequest(err error) *denial {
	return &denial{ReasonBadRequest, "egress request refused: " + strings.TrimPrefix(err.Error(), errBadRequest.Error()+": "), 0}
}

// connectEstablished is a CONNECT's answer once its tunnel is up.
const connectEstablished = "HTTP/1.1 200 Connection established\r\n\r\n"

// serveConnect decides and dials a CONNECT's destination, then hijacks the connection
// and carries the tunnel.
func (s *Session) serveConnect(w http.ResponseWriter, r *http.Request) {
	f := s.newFlow(ProtoConnect)
	// r.RequestURI is the authority exactly as the client wrote it; r.URL has been through
	// a URL parser that would take a user@ apart.
	t, err := parseAuthority(r.RequestURI, 0)
	if err != nil {
		refuse(w, f, badRequest(err))
		return
	}
	ctx, stop := s.requestContext(r.Context())
	defer stop()
	d, den := s.admit(ctx, f, ProtoConnect, t)
	if den != nil {
		refuse(w, f, den)
		return
	}
	// The head and the 200 are bytes too: reserved before the dial, given back if none.
	head := requestHeadSize(r)
	if !s.charge(head, len(connectEstablished)) {
		refuse(w, f, &denial{ReasonEgressMaxBytes, f.budgetDetail() + fmt.Sprintf("; the CONNECT's %d-byte head does not fit what is left", head), 0})
		return
	}
	upstream, addr, err := s.dial(ctx, d)
	f.setAddr(addr)
	if err != nil {
		s.refund(head + len(connectEstablished))
		den := refusedSlot(t, err)
		if den == nil {
			den = &denial{ReasonDialFailed, dialDetail(t, addr, err), 0}
		}
		refuse(w, f, den)
		return
	}
	f.count(head, true)
	rc := http.NewResponseController(w)
	client, brw, err := rc.Hijack()
	if err != nil {
		s.refund(len(connectEstablished))
		_ = upstream.Close()
		f.fail(ReasonBadRequest, fmt.Sprintf("egress to %s refused: the connection cannot be taken over for a tunnel: %v", hostPort(t.host, t.port), err))
		f.finish()
		http.Error(w, "CONNECT is not supported on this connection", http.StatusBadRequest)
		return
	}
	// The server's read and write deadlines are for requests; a tunnel lasts as long as
	// its two ends keep it.
	_ = client.SetDeadline(time.Time{})
	n, err := io.WriteString(client, connectEstablished)
	s.refund(len(connectEstablished) - n)
	f.count(n, false)
	if err != nil {
		_ = client.Close()
		_ = upstream.Close()
		f.finish()
		return
	}
	// Bytes the client sent after the CONNECT header may already sit in the server's
	// reader; reading through it forwards them first.
	var clientR io.Reader = client
	if brw != nil && brw.Reader.Buffered() > 0 {
		clientR = brw.Reader
	}
	f.tunnel(client, clientR, upstream)
}

// requestContext is ctx, also ended by the session's Close.
func (s *Session) requestContext(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// forwardKey finds a forwarded request's state in its context.
type forwardKey struct{}

// forward is one forwarded request's state, passed through the request's context to the
// transport's dialer and the proxy's hooks.
type forward struct {
	f      *flow
	t      target
	d      decision
	auth   string // the URL authority the transport dials for
	mu     sync.Mutex
	dialed bool
	err    error // the dial's failure
	addr   string
}

// initForward makes the session's transport and reverse proxy. The transport dials only
// the addresses decided for the request (never a name), chains through no proxy (not the
// daemon's HTTP_PROXY), and leaves bodies as they are (no transparent gzip). Its idle
// connections hold descriptor slots of the session's share: few, and given back when the
// session's next dial finds its share held.
func (s *Session) initForward() {
	s.transport = &http.Transport{
		Proxy:                  nil,
		DialContext:            s.dialForward,
		DisableCompression:     true,
		MaxIdleConns:           8,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        30 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 1 << 20,
	}
	s.rp = &httputil.ReverseProxy{
		Rewrite:        s.rewrite,
		Transport:      s.transport,
		FlushInterval:  -1,
		ModifyResponse: s.modifyResponse,
		ErrorHandler:   s.forwardError,
		// A cut transfer or a client that went away is routine here, not for stderr.
		ErrorLog: slog.NewLogLogger(s.p.log.With("session", s.id).Handler(), slog.LevelDebug),
	}
}

// dialForward is the transport's dialer: it dials the decision that rides in ctx.
func (s *Session) dialForward(ctx context.Context, network, addr string) (net.Conn, error) {
	fw, _ := ctx.Value(forwardKey{}).(*forward)
	if fw == nil {
		return nil, errors.New("egress: a dial without a decision")
	}
	if network != "tcp" || addr != fw.auth {
		return nil, fmt.Errorf("egress: dial of %s %s, decided for %s", network, addr, fw.auth)
	}
	if s.exhausted() {
		// A retry of a request its budget cut: nothing more may cross.
		fw.f.cut(ReasonEgressMaxBytes, fw.f.budgetDetail())
		return nil, errBudget
	}
	c, last, err := s.dial(ctx, fw.d)
	fw.mu.Lock()
	fw.dialed, fw.addr = true, last
	if err != nil {
		fw.err = err
	}
	fw.mu.Unlock()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, s: s}
	if !s.track(tc) {
		return nil, errors.New("egress: the session is closed")
	}
	return tc, nil
}

// serveForward decides a forwarded request and hands it to the reverse proxy.
func (s *Session) serveForward(w http.ResponseWriter, r *http.Request) {
	f := s.newFlow(ProtoHTTP)
	if !r.URL.IsAbs() {
		refuse(w, f, &denial{ReasonBadRequest, fmt.Sprintf("egress request refused: %s %q is not a proxy request (an absolute http:// URI or CONNECT)", r.Method, r.RequestURI), 0})
		return
	}
	switch strings.ToLower(r.URL.Scheme) {
	case "http":
	case "https":
		refuse(w, f, &denial{ReasonBadRequest, fmt.Sprintf("egress request refused: %s is https; an https URL goes through a CONNECT tunnel (any HTTP client does that for an https URL given an http:// proxy)", r.URL.Redacted()), 0})
		return
	default:
		refuse(w, f, &denial{ReasonBadRequest, fmt.Sprintf("egress request refused: scheme %q is not http", r.URL.Scheme), 0})
		return
	}
	if r.URL.User != nil {
		refuse(w, f, &denial{ReasonBadRequest, "egress request refused: the URL has user information; send credentials in an Authorization header", 0})
		return
	}
	t, err := parseAuthority(r.URL.Host, 80)
	if err != nil {
		refuse(w, f, badRequest(err))
		return
	}
	ctx, stop := s.requestContext(r.Context())
	defer stop()
	d, den := s.admit(ctx, f, ProtoHTTP, t)
	if den != nil {
		refuse(w, f, den)
		return
	}
	// Finish even when the proxy aborts the handler (a cut or a vanished client panics
	// with http.ErrAbortHandler, which the server recovers).
	defer f.finish()
	fw := &forward{f: f, t: t, d: d, auth: t.authority(0)}
	ctx = context.WithValue(ctx, forwardKey{}, fw)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			// A pooled socket counts for the request that has it now.
			if tc, ok := info.Conn.(*trackedConn); ok {
				tc.use(f)
			}
			f.setAddr(info.Conn.RemoteAddr().String())
		},
	})
	// An upload may take longer than the endpoint's request timeout; it is counted
	// against the budget, not the clock.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	// A destination may answer before the transport is done with the request body (it
	// reads one byte past the declared length, to check there is none): the HTTP/1 server
	// would close that body once the answer's headers go out, the transport's write would
	// fail, and it would close the connection the answer is still coming down — a response
	// cut short at random. Full duplex keeps the body readable while the answer is sent.
	_ = rc.EnableFullDuplex()
	s.rp.ServeHTTP(w, r.WithContext(ctx))
}

// rewrite aims the outbound request at the decided destination and drops what is for
// this proxy only.
func (s *Session) rewrite(pr *httputil.ProxyRequest) {
	fw := pr.In.Context().Value(forwardKey{}).(*forward)
	u := *pr.In.URL
	u.Scheme, u.Host, u.User = "http", fw.t.authority(80), nil
	pr.Out.URL = &u
	// The Host header is the destination's: a forged one cannot steer the request.
	pr.Out.Host = ""
	pr.Out.RequestURI = ""
	// ReverseProxy drops the hop-by-hop headers; a Proxy-* header of any name is for this
	// hop too.
	for k := range pr.Out.Header {
		if strings.HasPrefix(k, "Proxy-") {
			delete(pr.Out.Header, k)
		}
	}
}

// dialState says whether this request's dial happened, to what address, and how it
// failed.
func (fw *forward) dialState() (bool, string, error) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return fw.dialed, fw.addr, fw.err
}

// modifyResponse drops what is for this hop only. (Bytes are counted on the upstream
// socket, an upgraded connection's both ways too.)
func (s *Session) modifyResponse(res *http.Response) error {
	for k := range res.Header {
		if strings.HasPrefix(k, "Proxy-") {
			delete(res.Header, k)
		}
	}
	return nil
}

// forwardError answers a forwarded request the transport could not complete.
func (s *Session) forwardError(w http.ResponseWriter, r *http.Request, err error) {
	fw := r.Context().Value(forwardKey{}).(*forward)
	f := fw.f
	dialed, addr, dialErr := fw.dialState()
	f.mu.Lock()
	cut := f.rec.Reason == ReasonEgressMaxBytes
	f.mu.Unlock()
	slotDenial := refusedSlot(fw.t, dialErr)
	switch {
	case dialed && slotDenial != nil:
		f.fail(slotDenial.reason, slotDenial.detail)
		writeDenial(w, f, slotDenial)
	case dialed && dialErr != nil:
		f.setAddr(addr)
		d := &denial{ReasonDialFailed, dialDetail(fw.t, addr, dialErr), 0}
		f.fail(d.reason, d.detail)
		writeDenial(w, f, d)
	case cut:
		writeDenial(w, f, &denial{ReasonEgressMaxBytes, f.budgetDetail(), 0})
	case s.ctx.Err() != nil:
		f.cut(ReasonSessionClosed, fmt.Sprintf("egress to %s ended: the session is ending", hostPort(fw.t.host, fw.t.port)))
		w.WriteHeader(http.StatusServiceUnavailable)
	case r.Context().Err() != nil:
		// The client went away; there is no one to answer.
	default:
		f.cut("", fmt.Sprintf("egress to %s failed: %v", hostPort(fw.t.host, fw.t.port), err))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		_ = json.NewEncoder(w).Encode(struct {
			Error string `json:"error"`
			Host  string `json:"host"`
			Port  int    `json:"port"`
		}{fmt.Sprintf("egress to %s failed: the destination did not answer: %v", hostPort(fw.t.host, fw.t.port), err), fw.t.host, fw.t.port})
	}
}
