package server

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestShutdownEndsStreams: Shutdown does not wait on streams that never end by themselves:
// a health watcher hears NOT_SERVING, then its stream ends Unavailable (the code clients
// resume on), and Shutdown returns well before its grace.
func TestShutdownEndsStreams(t *testing.T) {
	srv := New(Config{StateDir: t.TempDir(), StartedAt: time.Now(), Logger: slog.New(slog.DiscardHandler)})
	conn := serveUnix(t, srv)
	srv.SetServing()
	c := healthpb.NewHealthClient(conn)
	watch, err := c.Watch(context.Background(), &healthpb.HealthCheckRequest{Service: "roost.v1.SessionService"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch, first: %v %v", r, err)
	}
	start := time.Now()
	srv.Shutdown(10 * time.Second)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Shutdown took %v with a stream open", took)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch, at shutdown: %v %v", r, err)
	}
	if _, err := watch.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the stream ended with %v, want Unavailable", err)
	}
}
