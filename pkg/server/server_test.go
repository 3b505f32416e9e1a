package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session"
	"roost.dev/roost/pkg/session/store"
)

// testPool is this package's tests' block of host ids, apart from roostd's and other
// packages' tests', and (by pid) from another run of them: freeing a range sweeps it, and
// the sweep must not reach another test's sessions.
var testPool = store.IDPool{First: 0x30000000 + uint32(os.Getpid()%16)*0x01000000, Slots: 256}

func TestMain(m *testing.M) {
	if containment.RunHelper(os.Args) {
		return
	}
	if sock := os.Getenv(streamClientEnv); sock != "" {
		os.Exit(streamClient(sock))
	}
	os.Exit(m.Run())
}

func TestToStatus(t *testing.T) {
	cases := []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{fmt.Errorf("no session %q: %w", "x", errdefs.ErrNotFound), codes.NotFound, `no session "x"`},
		{fmt.Errorf("bad flag: %w", errdefs.ErrInvalidArgument), codes.InvalidArgument, "bad flag"},
		{errdefs.ErrFailedPrecondition.WithMessage("floor cannot be met"), codes.FailedPrecondition, "floor cannot be met"},
		{fmt.Errorf("changed: %w", errdefs.ErrConflict), codes.FailedPrecondition, "changed"},
		{fmt.Errorf("denied: %w", errdefs.ErrPermissionDenied), codes.PermissionDenied, "denied"},
		{fmt.Errorf("budget: %w", errdefs.ErrResourceExhausted), codes.ResourceExhausted, "budget"},
		{fmt.Errorf("dup: %w", errdefs.ErrAlreadyExists), codes.AlreadyExists, "dup"},
		{fmt.Errorf("torn: %w", errdefs.ErrDataLoss), codes.DataLoss, "torn"},
		{fmt.Errorf("waiting: %w", context.Canceled), codes.Canceled, "waiting"},
		{errors.New("plain"), codes.Unknown, "plain"},
		{&manifest.Error{File: "c.yaml", Fields: []*manifest.FieldError{{Path: "name", Line: 1, Msg: "required"}}}, codes.InvalidArgument, "c.yaml:1: name: required"},
		{status.Error(codes.Aborted, "already a status"), codes.Aborted, "already a status"},
	}
	for _, c := range cases {
		st, _ := status.FromError(ToStatus(c.err))
		if st.Code() != c.code || st.Message() != c.msg {
			t.Errorf("%v: got %s %q, want %s %q", c.err, st.Code(), st.Message(), c.code, c.msg)
		}
	}
	if ToStatus(nil) != nil {
		t.Error("nil error mapped to a status")
	}
}

func TestParseSignal(t *testing.T) {
	good := map[string]syscall.Signal{"": syscall.SIGKILL, "KILL": syscall.SIGKILL, "sigterm": syscall.SIGTERM, "SIGHUP": syscall.SIGHUP, "usr1": syscall.SIGUSR1, "9": syscall.SIGKILL, "15": syscall.SIGTERM}
	for in, want := range good {
		if got, err := ParseSignal(in); err != nil || got != want {
			t.Errorf("ParseSignal(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"NOPE", "0", "65", "-1", "9x", "SIG"} {
		if _, err := ParseSignal(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseSignal(%q): %v", bad, err)
		}
	}
}

var (
	initOnce sync.Once
	initPath string
	initErr  error
)

// roostInit builds cmd/roost-init once, so benchmarks measure launches as roostd makes
// them (tests use this test binary as roost-init, which starts slower).
func roostInit(b *testing.B) string {
	initOnce.Do(func() {
		dir, err := os.MkdirTemp("", "roost-init-")
		if err != nil {
			initErr = err
			return
		}
		initPath = filepath.Join(dir, "roost-init")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", initPath, "roost.dev/roost/cmd/roost-init")
		// Static, as make build makes it: a sealed root holds no library for it.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			initErr = fmt.Errorf("building roost-init: %v\n%s", err, out)
		}
	})
	if initErr != nil {
		b.Fatal(initErr)
	}
	return initPath
}

// serve starts the API on a real unix socket over a real registry.
func serve(t testing.TB, init string) roostv1.SessionServiceClient {
	t.Helper()
	state := t.TempDir()
	// Sessions run as unprivileged uids that must pass through to the state directory.
	if err := os.Chmod(filepath.Dir(state), 0o711); err != nil {
		t.Fatal(err)
	}
	host := containment.Host{Root: os.Geteuid() == 0}
	rt := containment.NewProcessRuntime(init)
	m, err := session.Open(session.Config{
		IDs:      testPool,
		StateDir: state, Host: host, Catalog: containment.NewCatalog(host, containment.ErrNoRuntime, containment.ErrNoRuntime),
		Runtimes: map[manifest.Class]session.Runtime{manifest.Advisory: rt, manifest.Unconfined: rt},
	})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(state, "s")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(Config{Sessions: m, StateDir: state, StartedAt: time.Now(), Logger: slog.New(slog.DiscardHandler)})
	go srv.Serve(lis)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		m.Close()
	})
	return roostv1.NewSessionServiceClient(conn)
}

func writeCapsule(t testing.TB, extra string) string {
	t.Helper()
	dir := t.TempDir()
	src := "name: t\nversion: 0.1.0\nrun:\n  command: [/bin/true]\n" + extra
	if err := os.WriteFile(filepath.Join(dir, "capsule.yaml"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Every class of error reaches a client with its code over the real transport.
func TestCodesOverTheWire(t *testing.T) {
	c := serve(t, containment.SelfInit)
	ctx := context.Background()
	_, err := c.Get(ctx, &roostv1.GetRequest{Id: "ses_missing"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("Get of a missing session: %v", err)
	}
	_, err = c.Stage(ctx, &roostv1.StageRequest{Capsule: writeCapsule(t, "bogus: 1\n")})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Stage of a bad manifest: %v", err)
	}
	_, err = c.Stage(ctx, &roostv1.StageRequest{Capsule: writeCapsule(t, "capabilities: {containment: sealed}\n")})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Stage of an unmeetable floor: %v", err)
	}
	staged, err := c.Stage(ctx, &roostv1.StageRequest{Capsule: writeCapsule(t, "")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Kill(ctx, &roostv1.KillRequest{Id: staged.GetSession().GetId(), Signal: "NOPE"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Kill with a bad signal: %v", err)
	}
	_, err = c.Kill(ctx, &roostv1.KillRequest{Id: staged.GetSession().GetId()})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Kill of a staged session: %v", err)
	}
	launched, err := c.Launch(ctx, &roostv1.LaunchRequest{Id: staged.GetSession().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	done, err := c.Wait(ctx, &roostv1.WaitRequest{Id: launched.GetSession().GetId()})
	if err != nil || done.GetSession().GetExitStatus() != "ok" || done.GetSession().GetExitCode() != 0 || done.GetSession().ExitCode == nil {
		t.Fatalf("Wait: %v %v", done, err)
	}
	_, err = c.Launch(ctx, &roostv1.LaunchRequest{Id: staged.GetSession().GetId()})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second Launch: %v", err)
	}
	stream, err := c.Events(ctx, &roostv1.EventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		_, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 4 {
		t.Fatalf("%d events, want 4", n)
	}
}

// BenchmarkGet is one unary RPC round trip over the unix socket, registry read included.
func BenchmarkGet(b *testing.B) {
	c := serve(b, roostInit(b))
	ctx := context.Background()
	s, err := c.Stage(ctx, &roostv1.StageRequest{Capsule: writeCapsule(b, "")})
	if err != nil {
		b.Fatal(err)
	}
	id := s.GetSession().GetId()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Get(ctx, &roostv1.GetRequest{Id: id}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRunTrue is an advisory session of /bin/true end to end through the API: Stage,
// Launch, Wait — what `roostctl run` costs beyond process start-up of roostctl itself.
func BenchmarkRunTrue(b *testing.B) {
	c := serve(b, roostInit(b))
	ctx := context.Background()
	dir := writeCapsule(b, "")
	b.ResetTimer()
	for b.Loop() {
		s, err := c.Stage(ctx, &roostv1.StageRequest{Capsule: dir})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Launch(ctx, &roostv1.LaunchRequest{Id: s.GetSession().GetId()}); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Wait(ctx, &roostv1.WaitRequest{Id: s.GetSession().GetId()}); err != nil {
			b.Fatal(err)
		}
	}
}
