// Package route answers which node serves a call about a session, and carries it there.
// Any node of the fleet accepts every call about a session (Get, Logs, Exec, Stop, files,
// ...); one about a session this node does not hold is forwarded to the node that does,
// over the fleet's node-to-node mTLS (this node's certificate, its Common Name the node's
// name, presented to the owner's remote listener, where it has role node). The caller's
// identity and role travel with the forwarded call (pkg/remote's Roost-Forwarded-*
// headers), and the owner holds the call to that role as if the caller had come itself.
//
// The Router is a pair of gRPC server interceptors. Which methods are about a session, and
// where each request names it, is the table in methods.go. A call is served here when its
// session is here, when it names none, or when it was forwarded already (never a second
// hop); otherwise the session's node is located and the call forwarded, unary calls
// whole, streams message by message both ways. The owner's answer and status come back
// unchanged; what the router adds are its own failures, each naming the node: the owner
// not answering, an owner without a listener address, the directory unreadable.
package route

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/remote"
)

// Keepalive of the connections to other nodes: a forwarded follower (logs -f) sits idle for
// long, and an owner that went away must end it rather than hold it open. The pings stay
// above what roostd's own listeners accept (pkg/server's MinPingInterval).
const (
	pingAfter   = 30 * time.Second
	pingTimeout = 10 * time.Second
)

// Config is what a Router needs.
type Config struct {
	// Self is this node's name in the fleet (--node-name).
	Self string
	// Local says whether ref names a session in this node's registry. A ref the registry
	// cannot resolve for another reason than its absence (ambiguous, malformed) counts as
	// local, so that the registry's own error answers.
	Local func(ref string) bool
	// Locate is the node holding the session ref and the address of its remote listener
	// (empty when it has none). An errdefs.ErrNotFound error is a session the fleet does
	// not know; any other, a directory that cannot be read.
	Locate func(ctx context.Context, ref string) (node, address string, err error)
	// NodeAddress is the address of a node's remote listener, by name, for the calls about
	// one node (Events naming a node); nil forwards none of them. errdefs.ErrNotFound: no
	// such node in the directory.
	NodeAddress func(ctx context.Context, node string) (string, error)
	// TLS is the client side of the node-to-node mTLS: this node's certificate and the CA
	// the other nodes' listeners' certificates chain to.
	TLS *tls.Config
	// Caller is who called, as the owner is told: the name and the role (operator or
	// reader) the call was let in with. Nil takes the remote listener's caller
	// (remote.CallerFrom) only.
	Caller func(ctx context.Context) (name string, role remote.Role, err error)
	// MaxMessageBytes bounds a message each way on a forwarded call; 0 for gRPC's default.
	MaxMessageBytes int
	// Observe, when set, is told the code each forwarded call ended with.
	Observe func(code string)
	// SendTimeout ends a forwarded stream whose client leaves a message unread this long
	// (control.stream_send_timeout_seconds, as the node's own streams); 0 waits as long as
	// the client stays connected.
	SendTimeout time.Duration
	Logger      *slog.Logger
}

// Router carries calls about sessions to the nodes that hold them.
type Router struct {
	cfg     Config
	log     *slog.Logger
	methods map[string]*method

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
}

// method is one routed method: where its request names the session, and its message types.
type method struct {
	name                         string
	ref                          refOf
	in, out                      protoreflect.MessageType
	clientStreams, serverStreams bool
	// byNode: ref names a node, not a session.
	byNode bool
}

// New checks cfg and returns a Router; it dials nothing until a call is forwarded.
func New(cfg Config) (*Router, error) {
	if err := fleet.ValidNodeName(cfg.Self); err != nil {
		return nil, fmt.Errorf("routing calls: this node's name: %w", err)
	}
	switch {
	case cfg.Local == nil:
		return nil, fmt.Errorf("routing calls: no registry to tell local sessions by: %w", errdefs.ErrInvalidArgument)
	case cfg.Locate == nil:
		return nil, fmt.Errorf("routing calls: no way to locate a session's node: %w", errdefs.ErrInvalidArgument)
	case cfg.TLS == nil || len(cfg.TLS.Certificates) == 0 && cfg.TLS.GetClientCertificate == nil:
		return nil, fmt.Errorf("routing calls: node %s has no certificate to present to the other nodes: %w", cfg.Self, errdefs.ErrInvalidArgument)
	}
	if cfg.Caller == nil {
		cfg.Caller = RemoteCaller
	}
	if cfg.Observe == nil {
		cfg.Observe = func(string) {}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Router{cfg: cfg, log: log, methods: map[string]*method{}, conns: map[string]*grpc.ClientConn{}}
	for name, ref := range routed {
		m, err := describe(name, ref)
		if err != nil {
			return nil, err
		}
		r.methods[name] = m
	}
	for name, ref := range byNode {
		m, err := describe(name, ref)
		if err != nil {
			return nil, err
		}
		m.byNode = true
		r.methods[name] = m
	}
	return r, nil
}

// describe finds a routed method's message types in the protobuf registry and checks that
// its ref reader takes the method's request.
func describe(name string, ref refOf) (*method, error) {
	svc, mname, _ := strings.Cut(strings.TrimPrefix(name, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("routing %s: %w", name, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok || sd.Methods().ByName(protoreflect.Name(mname)) == nil {
		return nil, fmt.Errorf("routing %s: no such method", name)
	}
	md := sd.Methods().ByName(protoreflect.Name(mname))
	m := &method{name: name, ref: ref, clientStreams: md.IsStreamingClient(), serverStreams: md.IsStreamingServer()}
	if m.in, err = protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName()); err != nil {
		return nil, fmt.Errorf("routing %s: %w", name, err)
	}
	if m.out, err = protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err != nil {
		return nil, fmt.Errorf("routing %s: %w", name, err)
	}
	if _, ok := ref(m.in.New().Interface()); !ok {
		return nil, fmt.Errorf("routing %s: the table reads the session from another message than %s", name, md.Input().FullName())
	}
	return m, nil
}

// RemoteCaller is the caller the remote listener let in (remote.CallerFrom); a call that
// did not come through it has no caller to forward.
func RemoteCaller(ctx context.Context) (string, remote.Role, error) {
	if c, ok := remote.CallerFrom(ctx); ok {
		return c.CommonName, c.Role, nil
	}
	return "", "", fmt.Errorf("the caller came neither through the remote listener nor a checked socket: %w", errdefs.ErrPermissionDenied)
}

// Close closes the connections to other nodes; calls forwarded on them end.
func (r *Router) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	var errs []error
	for addr, c := range r.conns {
		errs = append(errs, c.Close())
		delete(r.conns, addr)
	}
	return errors.Join(errs...)
}

// UnaryInterceptor serves a unary call here or forwards it to its session's node.
func (r *Router) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m := r.methods[info.FullMethod]
		msg, ok := req.(proto.Message)
		if m == nil || !ok {
			return handler(ctx, req)
		}
		ref, _ := m.ref(msg)
		t, err := r.targetOf(ctx, m, ref)
		if err != nil {
			return nil, err
		}
		if t == nil {
			return handler(ctx, req)
		}
		return r.forwardUnary(ctx, t, m, msg)
	}
}

// StreamInterceptor serves a stream here or forwards it to its session's node. The session
// is read from the stream's first message, which the handler here is given as its first.
func (r *Router) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		m := r.methods[info.FullMethod]
		if m == nil {
			return handler(srv, ss)
		}
		first := m.in.New().Interface()
		if err := ss.RecvMsg(first); err != nil {
			return handler(srv, &replayed{ServerStream: ss, err: err})
		}
		ref, _ := m.ref(first)
		t, err := r.targetOf(ss.Context(), m, ref)
		if err != nil {
			return err
		}
		if t == nil {
			return handler(srv, &replayed{ServerStream: ss, first: first})
		}
		return r.forwardStream(ss, t, m, first)
	}
}

// replayed is a stream whose first message was read already: its first RecvMsg gives it
// (or the error reading it gave).
type replayed struct {
	grpc.ServerStream
	first proto.Message
	err   error
	done  bool
}

func (s *replayed) RecvMsg(m any) error {
	if s.done {
		return s.ServerStream.RecvMsg(m)
	}
	s.done = true
	if s.err != nil {
		return s.err
	}
	dst, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "roostd read a %T into a %T", s.first, m)
	}
	proto.Reset(dst)
	proto.Merge(dst, s.first)
	return nil
}

// target is the node a call about ref goes to; nil to serve it here.
type target struct {
	ref, node, addr string
	// caller and role are who it is forwarded for.
	caller string
	role   remote.Role
	// about says what the call is about when it is no session ("" for ref's session).
	about string
}

func (r *Router) targetOf(ctx context.Context, m *method, ref string) (*target, error) {
	if m.byNode {
		return r.nodeTarget(ctx, ref)
	}
	return r.target(ctx, ref)
}

// nodeTarget is where a call about node goes; nil to serve it here.
func (r *Router) nodeTarget(ctx context.Context, node string) (*target, error) {
	if node == "" || node == r.cfg.Self {
		return nil, nil
	}
	if forwardedHere(ctx) || r.cfg.NodeAddress == nil {
		return nil, status.Errorf(codes.NotFound, "node %q: this is node %s", node, r.cfg.Self)
	}
	name, role, err := r.cfg.Caller(ctx)
	if err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "node %s forwards a call to node %s only for a caller it knows: %v", r.cfg.Self, node, err)
	}
	if role != remote.Operator && role != remote.Reader {
		return nil, status.Errorf(codes.NotFound, "node %q: this is node %s", node, r.cfg.Self)
	}
	addr, err := r.cfg.NodeAddress(ctx, node)
	switch {
	case errdefs.IsNotFound(err):
		return nil, status.Errorf(codes.NotFound, "node %q is not in the fleet's directory (roostctl fleet nodes lists them)", node)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return nil, status.FromContextError(err).Err()
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "node %q: the fleet's directory cannot be read: %v", node, err)
	case addr == "":
		return nil, status.Errorf(codes.Unavailable, "node %s has no listener address in the fleet's directory (it serves no --listen-tcp)", node)
	}
	return &target{ref: "node " + node, about: "the events of node " + node, node: node, addr: addr, caller: name, role: role}, nil
}

func (r *Router) target(ctx context.Context, ref string) (*target, error) {
	if ref == "" || r.cfg.Local(ref) {
		return nil, nil
	}
	if forwardedHere(ctx) {
		// The forwarding node located it here; this node's registry has the last word. A
		// second hop could only chase a directory that is behind, or loop.
		return nil, status.Errorf(codes.NotFound, "session %q is not on node %s", ref, r.cfg.Self)
	}
	name, role, err := r.cfg.Caller(ctx)
	if err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "session %q is not on node %s, which forwards a call only for a caller it knows: %v", ref, r.cfg.Self, err)
	}
	if role != remote.Operator && role != remote.Reader {
		// A node calling for itself is served where it calls.
		return nil, status.Errorf(codes.NotFound, "session %q is not on node %s", ref, r.cfg.Self)
	}
	node, addr, err := r.cfg.Locate(ctx, ref)
	switch {
	case errdefs.IsNotFound(err):
		return nil, status.Errorf(codes.NotFound, "session %q is neither on node %s nor in the fleet's directory", ref, r.cfg.Self)
	case errdefs.IsInvalidArgument(err):
		// No full id or name: a short id or a prefix names a session of this node only.
		return nil, status.Errorf(codes.NotFound, "session %q is not on node %s, and the fleet's directory is looked up by full id or name only: %v", ref, r.cfg.Self, err)
	case errdefs.IsFailedPrecondition(err):
		// A name on several nodes: the directory's error names them.
		return nil, status.Errorf(codes.FailedPrecondition, "session %q is not on node %s: %v", ref, r.cfg.Self, err)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return nil, status.FromContextError(err).Err()
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "session %q is not on node %s, and the fleet's directory cannot be read: %v", ref, r.cfg.Self, err)
	case node == r.cfg.Self:
		return nil, status.Errorf(codes.NotFound, "session %q is not on node %s", ref, r.cfg.Self)
	case addr == "":
		return nil, status.Errorf(codes.Unavailable, "session %q is on node %s, which has no listener address in the fleet's directory (it serves no --listen-tcp): calls about it are served there only", ref, node)
	}
	return &target{ref: ref, node: node, addr: addr, caller: name, role: role}, nil
}

// forwardedHere says whether a node forwarded the call: its caller came by way of one, or
// it carries the header a forwarding node sets.
func forwardedHere(ctx context.Context) bool {
	if c, ok := remote.CallerFrom(ctx); ok && c.Via != "" {
		return true
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(remote.HeaderForwardedBy)) > 0
}

// transportHeaders are request headers of this hop only; the rest of the caller's
// metadata goes on to the owner.
var transportHeaders = []string{
	"user-agent", "content-type", "content-length", "te", "host", "connection", "keep-alive", "upgrade",
	"transfer-encoding", "proxy-connection", "http2-settings", "accept-encoding", "content-encoding",
}

// outgoing is ctx with the metadata a forwarded call carries: the caller's own, less this
// hop's transport headers, and who it is forwarded for.
func (r *Router) outgoing(ctx context.Context, t *target) context.Context {
	in, _ := metadata.FromIncomingContext(ctx)
	md := metadata.MD{}
	for k, v := range in {
		switch {
		case strings.HasPrefix(k, ":"), strings.HasPrefix(k, "grpc-"), strings.HasPrefix(k, "connect-"),
			strings.HasPrefix(k, "roost-forwarded-"), slices.Contains(transportHeaders, k):
			continue
		}
		md[k] = slices.Clone(v)
	}
	md.Set(remote.HeaderForwardedFor, remote.EscapeHeader(t.caller))
	md.Set(remote.HeaderForwardedRole, string(t.role))
	md.Set(remote.HeaderForwardedBy, r.cfg.Self)
	return metadata.NewOutgoingContext(context.WithValue(ctx, answeredKey{}, new(atomic.Bool)), md)
}

// conn is the cached connection to addr.
func (r *Router) conn(addr string) (*grpc.ClientConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, status.Error(codes.Unavailable, "roostd is shutting down; resume once it is back")
	}
	if c := r.conns[addr]; c != nil {
		return c, nil
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(r.cfg.TLS.Clone())),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: pingAfter, Timeout: pingTimeout}),
		grpc.WithStatsHandler(answers{}),
		// A node that restarts is back within seconds: calls about its sessions must not
		// wait out gRPC's default backoff (up to 2 minutes) of a connection that failed.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second}),
	}
	if n := r.cfg.MaxMessageBytes; n > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(n), grpc.MaxCallSendMsgSize(n)))
	}
	c, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "node address %q: %v", addr, err)
	}
	r.conns[addr] = c
	return c, nil
}

// Stage forwards a stage placed on node to its listener at address, for the caller of ctx
// (placement.Forwarder): the chosen node stages it, and settles its reservation.
func (r *Router) Stage(ctx context.Context, node, address string, req *roostv1.StageRequest) (*roostv1.StageResponse, error) {
	name, role, err := r.cfg.Caller(ctx)
	if err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "node %s places a stage on node %s only for a caller it knows: %v", r.cfg.Self, node, err)
	}
	if address == "" {
		return nil, status.Errorf(codes.Unavailable, "node %s has no listener address in the fleet's directory", node)
	}
	t := &target{ref: "stage", about: "a session placed on node " + node, node: node, addr: address, caller: name, role: role}
	c, err := r.conn(address)
	if err != nil {
		return nil, err
	}
	octx := r.outgoing(ctx, t)
	resp, err := roostv1.NewSessionServiceClient(c).Stage(octx, req)
	if err != nil {
		return nil, r.failed(octx, t, err)
	}
	return resp, nil
}

func (r *Router) forwardUnary(ctx context.Context, t *target, m *method, req proto.Message) (any, error) {
	c, err := r.conn(t.addr)
	if err != nil {
		return nil, err
	}
	octx := r.outgoing(ctx, t)
	resp := m.out.New().Interface()
	var header, trailer metadata.MD
	err = c.Invoke(octx, m.name, req, resp, grpc.Header(&header), grpc.Trailer(&trailer))
	if len(header) > 0 {
		_ = grpc.SetHeader(ctx, header)
	}
	if len(trailer) > 0 {
		_ = grpc.SetTrailer(ctx, trailer)
	}
	r.logForwarded(t, m, err)
	if err != nil {
		return nil, r.failed(octx, t, err)
	}
	return resp, nil
}

func (r *Router) forwardStream(ss grpc.ServerStream, t *target, m *method, first proto.Message) error {
	c, err := r.conn(t.addr)
	if err != nil {
		return err
	}
	// Ends the forwarded stream when this one ends, whichever way: its client gone (ss's
	// context), or an error here.
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	octx := r.outgoing(ctx, t)
	cs, err := c.NewStream(octx, &grpc.StreamDesc{StreamName: m.name, ClientStreams: m.clientStreams, ServerStreams: m.serverStreams}, m.name)
	if err != nil {
		r.logForwarded(t, m, err)
		return r.failed(octx, t, err)
	}
	// An error sending is the stream's end, whose status RecvMsg gives.
	if err := cs.SendMsg(first); err == nil {
		if !m.clientStreams {
			_ = cs.CloseSend()
		} else {
			go func() {
				for {
					in := m.in.New().Interface()
					if err := ss.RecvMsg(in); err != nil {
						if errors.Is(err, io.EOF) {
							_ = cs.CloseSend()
						} else {
							cancel()
						}
						return
					}
					if err := cs.SendMsg(in); err != nil {
						return
					}
				}
			}()
		}
	}
	for headers := true; ; headers = false {
		out := m.out.New().Interface()
		err := cs.RecvMsg(out)
		if headers {
			if md, herr := cs.Header(); herr == nil && len(md) > 0 {
				_ = ss.SetHeader(md)
			}
		}
		if err != nil {
			if md := cs.Trailer(); len(md) > 0 {
				ss.SetTrailer(md)
			}
			if errors.Is(err, io.EOF) {
				r.logForwarded(t, m, nil)
				return nil
			}
			r.logForwarded(t, m, err)
			return r.failed(octx, t, err)
		}
		if err := r.send(ss, cancel, out); err != nil {
			r.logForwarded(t, m, err)
			return err
		}
	}
}

// send sends m to the forwarded stream's client, ending the call (cancel, then the error)
// when the client leaves it unread for SendTimeout: a reader that does not read must not
// hold this node's stream, the owner's, nor the goroutines between them. The send that
// waits returns once gRPC ends the stream, as the handler returns.
func (r *Router) send(ss grpc.ServerStream, cancel context.CancelFunc, m proto.Message) error {
	if r.cfg.SendTimeout <= 0 {
		return ss.SendMsg(m)
	}
	sent := make(chan error, 1)
	go func() { sent <- ss.SendMsg(m) }()
	t := time.NewTimer(r.cfg.SendTimeout)
	defer t.Stop()
	select {
	case err := <-sent:
		return err
	case <-t.C:
		cancel()
		return status.Errorf(codes.ResourceExhausted, "the client left a message unread for %s (control.stream_send_timeout_seconds): roostd ended the forwarded stream rather than hold it for a reader that does not read", r.cfg.SendTimeout)
	}
}

// failed is the error a forwarded call ends with: the owner's status, unchanged, when the
// owner answered; when it did not, one naming the node that does not answer.
func (r *Router) failed(octx context.Context, t *target, err error) error {
	st := status.Convert(err)
	if answered(octx) || (st.Code() != codes.Unavailable && st.Code() != codes.DeadlineExceeded) {
		return err
	}
	// The next call dials again at once rather than after the connection's backoff.
	r.mu.Lock()
	if c := r.conns[t.addr]; c != nil {
		c.ResetConnectBackoff()
	}
	r.mu.Unlock()
	r.log.Warn("a session's node does not answer a call forwarded to it", "session", t.ref, "node", t.node, "addr", t.addr, "err", st.Message())
	if t.about != "" {
		return status.Errorf(st.Code(), "%s: node %s (%s) does not answer: %s", t.about, t.node, t.addr, st.Message())
	}
	return status.Errorf(st.Code(), "session %q is on node %s (%s), which does not answer: %s", t.ref, t.node, t.addr, st.Message())
}

func (r *Router) logForwarded(t *target, m *method, err error) {
	r.cfg.Observe(status.Code(err).String())
	r.log.Debug("forwarded a call to the session's node", "method", m.name, "session", t.ref, "node", t.node, "caller", t.caller, "role", t.role, "code", status.Code(err).String())
}

// answeredKey marks a forwarded call's context with whether the owner answered it at all
// (headers, a message or trailers), which tells an owner that does not answer from one
// answering Unavailable itself (a roostd shutting down).
type answeredKey struct{}

func answered(ctx context.Context) bool {
	a, ok := ctx.Value(answeredKey{}).(*atomic.Bool)
	return ok && a.Load()
}

// answers records on a forwarded call's context that the owner answered.
type answers struct{}

var _ stats.Handler = answers{}

func (answers) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (answers) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.InHeader, *stats.InPayload, *stats.InTrailer:
		if a, ok := ctx.Value(answeredKey{}).(*atomic.Bool); ok {
			a.Store(true)
		}
	}
}

func (answers) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (answers) HandleConn(context.Context, stats.ConnStats) {}
