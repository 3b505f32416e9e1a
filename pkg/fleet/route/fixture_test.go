package route

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/remote"
	"roost.dev/roost/pkg/remote/certs"
)

// seen is one call a node's services served: the method, the session, who the remote
// listener said called, and the metadata it carried.
type seen struct {
	method, ref string
	caller      remote.Caller
	md          metadata.MD
	deadline    bool
}

// services are a node's SessionService and FilesService: each call reports what it saw
// and answers as this node.
type services struct {
	roostv1.UnimplementedSessionServiceServer
	roostv1.UnimplementedFilesServiceServer
	node string

	mu    sync.Mutex
	calls []seen
	// ended is told the method of each stream whose context ended before it did.
	ended chan string
}

func (s *services) saw(ctx context.Context, method, ref string) {
	c, _ := remote.CallerFrom(ctx)
	md, _ := metadata.FromIncomingContext(ctx)
	_, deadline := ctx.Deadline()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, seen{method: method, ref: ref, caller: c, md: md, deadline: deadline})
}

func (s *services) seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

func (s *services) Get(ctx context.Context, req *roostv1.GetRequest) (*roostv1.GetResponse, error) {
	s.saw(ctx, "Get", req.GetId())
	_ = grpc.SetHeader(ctx, metadata.Pairs("served-by", s.node))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("served-by-trailer", s.node))
	switch req.GetId() {
	case "s-b-gone":
		return nil, status.Errorf(codes.FailedPrecondition, "session %s ended on node %s", req.GetId(), s.node)
	case "s-b-stopping":
		// An owner answering Unavailable itself: its word must come back unchanged.
		return nil, status.Error(codes.Unavailable, "roostd is shutting down; resume once it is back")
	}
	return &roostv1.GetResponse{Session: &roostv1.Session{Id: req.GetId(), Detail: "served by " + s.node}}, nil
}

func (s *services) Stop(ctx context.Context, req *roostv1.StopRequest) (*roostv1.StopResponse, error) {
	s.saw(ctx, "Stop", req.GetId())
	return &roostv1.StopResponse{Session: &roostv1.Session{Id: req.GetId(), State: "exited", Detail: "stopped by " + s.node}}, nil
}

// Events sends two events of this node, numbered 1 and 2.
func (s *services) Events(req *roostv1.EventsRequest, stream grpc.ServerStreamingServer[roostv1.EventsResponse]) error {
	s.saw(stream.Context(), "Events", req.GetNode())
	for seq := range uint64(2) {
		if err := stream.Send(&roostv1.EventsResponse{Event: &roostv1.Event{Seq: seq + 1, Node: s.node, Type: "session.running"}}); err != nil {
			return err
		}
	}
	return nil
}

// Stage stages here whatever it is sent, naming this node.
func (s *services) Stage(ctx context.Context, req *roostv1.StageRequest) (*roostv1.StageResponse, error) {
	s.saw(ctx, "Stage", req.GetNode())
	return &roostv1.StageResponse{Session: &roostv1.Session{Id: "s-new", Node: s.node, Detail: req.GetCapsule()}}, nil
}

// Wait waits until its caller gives up.
func (s *services) Wait(ctx context.Context, req *roostv1.WaitRequest) (*roostv1.WaitResponse, error) {
	s.saw(ctx, "Wait", req.GetId())
	<-ctx.Done()
	s.ended <- "Wait"
	return nil, ctx.Err()
}

// Logs sends three chunks; following, it then waits, idle, until its client goes.
func (s *services) Logs(req *roostv1.LogsRequest, stream grpc.ServerStreamingServer[roostv1.LogsResponse]) error {
	s.saw(stream.Context(), "Logs", req.GetId())
	if req.GetId() == "s-b-flood" {
		// As fast as it goes, until its stream ends: a session writing without pause.
		chunk := make([]byte, 256<<10)
		for {
			if err := stream.Send(&roostv1.LogsResponse{Stream: "stdout", Data: chunk}); err != nil {
				s.ended <- "Logs"
				return err
			}
		}
	}
	for i := range 3 {
		if err := stream.Send(&roostv1.LogsResponse{Stream: "stdout", Data: fmt.Appendf(nil, "%s line %d\n", s.node, i), Offset: int64(i)}); err != nil {
			return err
		}
	}
	if !req.GetFollow() {
		return nil
	}
	<-stream.Context().Done()
	s.ended <- "Logs"
	return stream.Context().Err()
}

// Exec echoes stdin as stdout, upper-cased and tagged with the node, until stdin closes.
func (s *services) Exec(stream grpc.BidiStreamingServer[roostv1.ExecRequest, roostv1.ExecResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	s.saw(stream.Context(), "Exec", first.GetStart().GetId())
	if err := stream.Send(&roostv1.ExecResponse{Msg: &roostv1.ExecResponse_Started{Started: &roostv1.ExecStarted{ExecId: "x-1", Pid: 42}}}); err != nil {
		return err
	}
	for {
		req, err := stream.Recv()
		if err != nil {
			if stream.Context().Err() != nil {
				s.ended <- "Exec"
			}
			return err
		}
		switch m := req.GetMsg().(type) {
		case *roostv1.ExecRequest_Stdin:
			out := s.node + ": " + strings.ToUpper(string(m.Stdin))
			if err := stream.Send(&roostv1.ExecResponse{Msg: &roostv1.ExecResponse_Stdout{Stdout: []byte(out)}}); err != nil {
				return err
			}
		case *roostv1.ExecRequest_CloseStdin:
			// Read on to the client's own end of the stream, as a command's exit waits for it.
			if _, err := stream.Recv(); err != io.EOF {
				return fmt.Errorf("after close_stdin, want the stream's end, got %v", err)
			}
			return stream.Send(&roostv1.ExecResponse{Msg: &roostv1.ExecResponse_Exit{Exit: &roostv1.ExecExit{ExitCode: 7, Detail: "on " + s.node}}})
		}
	}
}

// WriteFile takes a header and data, and answers the bytes it took.
func (s *services) WriteFile(stream grpc.ClientStreamingServer[roostv1.WriteFileRequest, roostv1.WriteFileResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	s.saw(stream.Context(), "WriteFile", h.GetSession())
	var data []byte
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		data = append(data, req.GetData()...)
	}
	return stream.SendAndClose(&roostv1.WriteFileResponse{Info: &roostv1.FileInfo{Name: h.GetPath() + ": " + string(data) + " on " + s.node, Size: int64(len(data))}})
}

// node is one roostd of the test fleet: its services behind its gRPC server and the router,
// behind a remote listener on loopback.
type node struct {
	name   string
	svc    *services
	grpc   *grpc.Server
	lis    *remote.Server
	router *Router
	served chan error
	// caller, when set, replaces the router's reading of the caller.
	caller func(context.Context) (string, remote.Role, error)
}

// cluster is nodes sharing a CA, each listing the others as nodes, ci-bot as an operator
// and dashboard as a reader; sessions places each session on a node.
type cluster struct {
	dir   string
	nodes map[string]*node

	mu       sync.Mutex
	sessions map[string]string // ref → node
	addrs    map[string]string // node → address
	// locateErr, when set, is what Locate answers.
	locateErr error
}

func newCluster(t testing.TB, names ...string) *cluster {
	t.Helper()
	c := &cluster{dir: filepath.Join(t.TempDir(), "tls"), nodes: map[string]*node{}, sessions: map[string]string{}, addrs: map[string]string{}}
	clients := []certs.Client{{CommonName: "ci-bot", Cert: "ci-bot.pem", Key: "ci-bot-key.pem"}, {CommonName: "dashboard", Cert: "dashboard.pem", Key: "dashboard-key.pem"}}
	roles := []remote.Client{{CommonName: "ci-bot", Role: remote.Operator}, {CommonName: "dashboard", Role: remote.Reader}}
	for _, n := range names {
		clients = append(clients, certs.Client{CommonName: n, Cert: n + ".pem", Key: n + "-key.pem"})
		roles = append(roles, remote.Client{CommonName: n, Role: remote.Node})
	}
	if err := certs.Init(certs.Plan{Dir: c.dir, ServerNames: []string{"localhost", "127.0.0.1"}, Clients: clients}); err != nil {
		t.Fatal(err)
	}
	table, err := remote.NewRoles("remote.clients", roles)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		c.start(t, name, table)
	}
	return c
}

func (c *cluster) start(t testing.TB, name string, roles remote.Roles) {
	t.Helper()
	n := &node{name: name, svc: &services{node: name, ended: make(chan string, 16)}, served: make(chan error, 1)}
	r, err := New(Config{
		Self: name,
		Local: func(ref string) bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.sessions[ref] == name
		},
		Locate: c.locate,
		NodeAddress: func(_ context.Context, node string) (string, error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			addr, ok := c.addrs[node]
			if !ok {
				return "", fmt.Errorf("node %q: %w", node, errdefs.ErrNotFound)
			}
			return addr, nil
		},
		TLS:         c.tls(t, name),
		SendTimeout: 500 * time.Millisecond,
		Caller: func(ctx context.Context) (string, remote.Role, error) {
			if n.caller != nil {
				return n.caller(ctx)
			}
			return RemoteCaller(ctx)
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	n.router = r
	n.grpc = grpc.NewServer(grpc.ChainUnaryInterceptor(r.UnaryInterceptor()), grpc.ChainStreamInterceptor(r.StreamInterceptor()))
	roostv1.RegisterSessionServiceServer(n.grpc, n.svc)
	roostv1.RegisterFilesServiceServer(n.grpc, n.svc)
	at := func(key, v string) remote.Setting {
		return remote.Setting{Value: v, From: name + ".yaml: remote." + key}
	}
	n.lis, err = remote.New(remote.Settings{
		Listen:    at("listen", "127.0.0.1:0"),
		Cert:      at("tls_cert", filepath.Join(c.dir, certs.ServerFile)),
		Key:       at("tls_key", filepath.Join(c.dir, certs.ServerKeyFile)),
		ClientCA:  at("client_ca", filepath.Join(c.dir, certs.CAFile)),
		Roles:     roles,
		RolesFrom: name + ".yaml: remote.clients",
	}, n.grpc, remote.Options{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	go func() { n.served <- n.lis.Serve() }()
	t.Cleanup(func() { n.stop(t) })
	c.mu.Lock()
	c.addrs[name] = n.lis.Addr().String()
	c.mu.Unlock()
	c.nodes[name] = n
}

// stop closes the node's listener and router; a second stop does nothing.
func (n *node) stop(t testing.TB) {
	if n.lis == nil {
		return
	}
	n.lis.Close()
	if err := <-n.served; err != nil {
		t.Errorf("node %s: Serve: %v", n.name, err)
	}
	n.lis = nil
	n.router.Close()
	n.grpc.Stop()
}

func (c *cluster) place(ref, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sessions[ref] = node
}

func (c *cluster) locate(_ context.Context, ref string) (string, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.locateErr != nil {
		return "", "", c.locateErr
	}
	n, ok := c.sessions[ref]
	if !ok {
		return "", "", fmt.Errorf("session %q: %w", ref, errdefs.ErrNotFound)
	}
	return n, c.addrs[n], nil
}

// tls is the client TLS of the certificate named: trusting the cluster's CA, presenting it.
func (c *cluster) tls(t testing.TB, name string) *tls.Config {
	t.Helper()
	pool, _, err := remote.LoadCA(filepath.Join(c.dir, certs.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(c.dir, name+".pem"), filepath.Join(c.dir, name+"-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
}

// dial is a connection to node's listener with the certificate named.
func (c *cluster) dial(t testing.TB, node, as string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+c.addrs[node], grpc.WithTransportCredentials(credentials.NewTLS(c.tls(t, as))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (c *cluster) sessionClient(t testing.TB, node, as string) roostv1.SessionServiceClient {
	return roostv1.NewSessionServiceClient(c.dial(t, node, as))
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}
