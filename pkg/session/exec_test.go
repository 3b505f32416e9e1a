package session

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/exec"
	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
)

// A command exec'd into a running session gets the session's environment (and more), runs
// in its workdir, passes its exit code, and is recorded in the events and the trace.
func TestExecRecordsAndPassesTheEnd(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, "sleep 60", "env:\n  GREETING: world\n")})
	defer func() { _, _ = m.Kill(context.Background(), rec.ID, sigKill) }()

	x, err := m.Exec(context.Background(), rec.ID, containment.ExecOptions{
		Argv: []string{"/bin/sh", "-c", `echo "$GREETING $EXTRA $ROOST_SESSION_ID $(pwd)"; exit 7`},
		Env:  []string{"EXTRA=more"},
	})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(x.Stdout)
	code, detail := x.Wait()
	x.Close()
	if want := "world more " + rec.ID + " " + rec.Workdir + "\n"; string(out) != want || code != 7 || detail != "exited with code 7" {
		t.Fatalf("exec: %q (want %q), %d %q", out, want, code, detail)
	}
	var details []string
	if err := m.Events(context.Background(), 0, false, func(ev store.Event) error {
		if ev.Type == store.EventExec && ev.SessionID == rec.ID {
			details = append(details, ev.Detail)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(details) != 2 || !strings.HasPrefix(details[0], x.ID+" started: /bin/sh -c ") ||
		!strings.HasPrefix(details[1], x.ID+" of /bin/sh -c ") || !strings.HasSuffix(details[1], "ended: exited with code 7") {
		t.Fatalf("events: %q", details)
	}
	trace, err := os.ReadFile(filepath.Join(rec.RecordsDir, records.TraceFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(trace), `"event_type":"exec_start","session_id":"`+rec.ID) ||
		!strings.Contains(string(trace), `"event_type":"exec_end"`) || !strings.Contains(string(trace), `"exec_id":"`+x.ID+`"`) {
		t.Fatalf("trace:\n%s", trace)
	}
}

func TestExecRefusals(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	ctx := context.Background()
	if _, err := m.Exec(ctx, "ses_nosuchsession", containment.ExecOptions{Argv: []string{"true"}}); !errdefs.IsNotFound(err) {
		t.Errorf("missing session: %v", err)
	}
	rec := run(t, m, StageOptions{Capsule: capsule(t, "sleep 60", "")})
	if _, err := m.Exec(ctx, rec.ID, containment.ExecOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no command: %v", err)
	}
	if _, err := m.Exec(ctx, rec.ID, containment.ExecOptions{Argv: []string{"true"}, Env: []string{"NOVALUE"}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad environment: %v", err)
	}
	// A command that cannot start is recorded, and its code says so.
	_, err := m.Exec(ctx, rec.ID, containment.ExecOptions{Argv: []string{"no-such-command-here"}})
	var ns *exec.NotStarted
	if !errors.As(err, &ns) || ns.Code != exec.NotFoundCode || !strings.Contains(ns.Detail, "not found") {
		t.Errorf("a missing command: %v", err)
	}
	// A command still running when its session ends ends with it.
	x, err := m.Exec(ctx, rec.ID, containment.ExecOptions{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan int, 1)
	go func() {
		code, _ := x.Wait()
		x.Close()
		ended <- code
	}()
	if _, err := m.Kill(ctx, rec.ID, sigKill); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, m, rec.ID)
	select {
	case code := <-ended:
		if code != 128+9 {
			t.Errorf("the exec ended %d, want killed", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an exec outlived its session")
	}
	_, err = m.Exec(ctx, rec.ID, containment.ExecOptions{Argv: []string{"true"}})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "is exited") {
		t.Errorf("an ended session: %v", err)
	}
}
