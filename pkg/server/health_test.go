package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

// serveUnix serves srv on a fresh unix socket and returns a client connection to it.
func serveUnix(t *testing.T, srv *Server) *grpc.ClientConn {
	t.Helper()
	dir, err := os.MkdirTemp("", "roost-health-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func checkHealth(t *testing.T, c healthpb.HealthClient, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return resp.GetStatus(), err
}

// listServices asks server reflection for the services it serves.
func listServices(t *testing.T, conn *grpc.ClientConn) ([]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, err
	}
	// A stream the server has already ended (refused it) fails Send with io.EOF; its status
	// is what Recv returns.
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: ""}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		out = append(out, s.GetName())
	}
	return out, nil
}

// Services names the services whose health follows the daemon's readiness.
func (s *Server) Services() []string { return slices.Clone(s.services) }

var roostServices = []string{"roost.v1.ArtifactService", "roost.v1.CapsuleService", "roost.v1.FilesService", "roost.v1.SessionService", "roost.v1.SpendService", "roost.v1.SystemService"}

// Health says NOT_SERVING for the server and each of roost's services until the daemon is
// ready, SERVING once it is, and NOT_SERVING for good once it shuts down; a watcher hears
// each change.
func TestHealthFollowsReadiness(t *testing.T) {
	srv := New(Config{StateDir: t.TempDir(), StartedAt: time.Now(), Logger: slog.New(slog.DiscardHandler)})
	if got := srv.Services(); !slices.Equal(got, roostServices) {
		t.Fatalf("services %v, want %v", got, roostServices)
	}
	conn := serveUnix(t, srv)
	c := healthpb.NewHealthClient(conn)
	all := append([]string{""}, roostServices...)
	for _, name := range all {
		if st, err := checkHealth(t, c, name); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("%q before ready: %v %v", name, st, err)
		}
	}
	if _, err := checkHealth(t, c, "roost.v1.NoSuchService"); status.Code(err) != codes.NotFound {
		t.Fatalf("an unknown service: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch, err := c.Watch(ctx, &healthpb.HealthCheckRequest{Service: "roost.v1.SessionService"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch, first: %v %v", r, err)
	}

	srv.SetServing()
	for _, name := range all {
		if st, err := checkHealth(t, c, name); err != nil || st != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%q once ready: %v %v", name, st, err)
		}
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch, once ready: %v %v", r, err)
	}

	srv.SetNotServing()
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch, at shutdown: %v %v", r, err)
	}
	// Shutting down is final.
	srv.SetServing()
	for _, name := range all {
		if st, err := checkHealth(t, c, name); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("%q after shutdown: %v %v", name, st, err)
		}
	}
}

// Reflection lists roost's services, health and itself.
func TestReflectionLists(t *testing.T) {
	conn := serveUnix(t, New(Config{StateDir: t.TempDir(), StartedAt: time.Now(), Logger: slog.New(slog.DiscardHandler)}))
	got, err := listServices(t, conn)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range append([]string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"}, roostServices...) {
		if !slices.Contains(got, want) {
			t.Errorf("reflection lists %v, without %s", got, want)
		}
	}
}

// Health and reflection sit behind the control socket's peer check like every roost
// service: a session's process learns nothing from them, not even whether roostd is up.
func TestHealthAndReflectionCheckPeers(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// This test binary plays the session helper: its own calls come from "a session".
	refused := New(Config{StateDir: t.TempDir(), StartedAt: time.Now(), Logger: slog.New(slog.DiscardHandler),
		Peers: &PeerPolicy{Sessions: SessionProcs{Helpers: []string{"roost-init"}, HelperBinary: self}}})
	refused.SetServing()
	conn := serveUnix(t, refused)
	_, err = checkHealth(t, healthpb.NewHealthClient(conn), "")
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("health Check from a session's process: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = watch.Recv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("health Watch from a session's process: %v", err)
	}
	if _, err := listServices(t, conn); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reflection from a session's process: %v", err)
	}

	if os.Geteuid() != 0 {
		t.Skip("the served half needs a root caller")
	}
	served := New(Config{StateDir: t.TempDir(), StartedAt: time.Now(), Logger: slog.New(slog.DiscardHandler),
		Peers: &PeerPolicy{Sessions: testSessions()}})
	served.SetServing()
	conn = serveUnix(t, served)
	if st, err := checkHealth(t, healthpb.NewHealthClient(conn), ""); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health Check from root: %v %v", st, err)
	}
	if _, err := listServices(t, conn); err != nil {
		t.Fatalf("reflection from root: %v", err)
	}
}
