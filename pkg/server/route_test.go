package server

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// sawRouter is a Router that serves every call here and notes who ForwardedCaller says
// called, as the fleet's router would forward it.
type sawRouter struct {
	mu      sync.Mutex
	callers []string
	streams []int // the streams the server counted when each stream reached the router
	srv     *Server
}

var _ Router = (*sawRouter)(nil)

func (r *sawRouter) note(ctx context.Context) {
	name, role, err := ForwardedCaller("node-a")(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.callers = append(r.callers, "error: "+err.Error())
		return
	}
	r.callers = append(r.callers, name+" as "+string(role))
}

func (r *sawRouter) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		r.note(ctx)
		return handler(ctx, req)
	}
}

func (r *sawRouter) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		r.note(ss.Context())
		r.srv.streams.mu.Lock()
		r.streams = append(r.streams, len(r.srv.streams.live))
		r.srv.streams.mu.Unlock()
		return handler(srv, ss)
	}
}

// The router runs after the peer check and the stream bounds: a socket caller reaches it
// named by its uid, as an operator, its stream already counted; a caller the peer check
// refused never reaches it.
func TestRouteAfterPeerCheck(t *testing.T) {
	needRoot(t)
	r := &sawRouter{}
	srv := New(Config{StateDir: t.TempDir(), StartedAt: time.Now(), Peers: &PeerPolicy{Sessions: testSessions()}, Route: r})
	r.srv = srv
	sock := filepath.Join(t.TempDir(), "roostd.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := roostv1.NewSystemServiceClient(conn).Health(ctx, &roostv1.HealthRequest{}); err != nil {
		t.Fatalf("Health: %v", err)
	}
	// A stream the server counts: the health watcher, which answers at once.
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	r.mu.Lock()
	callers, streams := append([]string(nil), r.callers...), append([]int(nil), r.streams...)
	r.mu.Unlock()
	if len(callers) != 2 || callers[0] != "uid 0 on node node-a's socket as operator" || callers[1] != callers[0] {
		t.Fatalf("the router saw %q, want root on node-a's socket, twice", callers)
	}
	if len(streams) != 1 || streams[0] != 1 {
		t.Errorf("streams counted when the stream reached the router: %v, want 1", streams)
	}
	// No caller known: nothing to forward.
	if _, _, err := ForwardedCaller("node-a")(context.Background()); status.Code(ToStatus(err)) != codes.PermissionDenied {
		t.Errorf("ForwardedCaller of no caller: %v", err)
	}
}
