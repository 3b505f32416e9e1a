package session

import (
	"context"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"
)

// TestDeadlineAboveManifestRefused: --deadline can only lower limits.deadline_seconds, so
// one above it is refused at stage, naming both, rather than silently ignored.
func TestDeadlineAboveManifestRefused(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	dir := capsule(t, "true", "capabilities:\n  limits:\n    deadline_seconds: 600\n")
	_, err := m.Stage(StageOptions{Capsule: dir, Deadline: 2 * time.Hour})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("deadline above the manifest's: %v", err)
	}
	if want := "--deadline 2h0m0s is above the capsule's limits.deadline_seconds (600 s); it can only lower it"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
	// Equal or lower is fine.
	for _, d := range []time.Duration{600 * time.Second, time.Minute} {
		rec, err := m.Stage(StageOptions{Capsule: dir, Deadline: d})
		if err != nil || rec.Deadline != d {
			t.Fatalf("deadline %v: %v %v", d, rec, err)
		}
	}
	// Without a declared limit, the default is what it may not exceed.
	undeclared := capsule(t, "true", "")
	if _, err := m.Stage(StageOptions{Capsule: undeclared, Deadline: 2 * time.Hour}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "default") {
		t.Fatalf("deadline above the default: %v", err)
	}
	if _, err := m.Stage(StageOptions{Capsule: dir, Deadline: -time.Second}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("negative deadline: %v", err)
	}
}

// TestStopReason: a stop with a reason says it in the session's detail instead of the
// generic "stopped by roostctl stop".
func TestStopReason(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, "sleep 30", "")})
	stopped, err := m.Stop(context.Background(), rec.ID, 5*time.Second, "interrupted (SIGINT to roostctl run)")
	if err != nil {
		t.Fatal(err)
	}
	if want := "stopped: interrupted (SIGINT to roostctl run); "; !strings.HasPrefix(stopped.Detail, want) || stopped.ExitStatus != store.StatusTerminated {
		t.Fatalf("detail %q (%s), want it to start %q", stopped.Detail, stopped.ExitStatus, want)
	}
	rec = run(t, m, StageOptions{Capsule: capsule(t, "sleep 30", "")})
	stopped, err = m.Stop(context.Background(), rec.ID, 5*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(stopped.Detail, "stopped by roostctl stop; ") {
		t.Fatalf("detail without a reason: %q", stopped.Detail)
	}
}

// TestPauseAndRemoveSayWhatIsTrue: pause of a session without a cgroup says what pause
// needs (scoped works as well as sealed), and rm of a live one names the way through (-f);
// each names the session once.
func TestPauseAndRemoveSayWhatIsTrue(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, "sleep 30", "capabilities:\n  containment: advisory\n")})
	t.Cleanup(func() { m.Kill(context.Background(), rec.ID, 9) })
	_, err := m.Pause(rec.ID)
	if err == nil {
		t.Fatal("paused a session without a cgroup")
	}
	msg := err.Error()
	if !strings.Contains(msg, "pause needs a cgroup: scoped or sealed") || !strings.Contains(msg, "advisory") || strings.Contains(msg, "needs a sealed session") {
		t.Errorf("pause: %q", msg)
	}
	if n := strings.Count(msg, rec.ID); n != 1 {
		t.Errorf("pause names the session %d times: %q", n, msg)
	}
	err = m.RemoveTree(context.Background(), rec.ID, false)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "roostctl rm -f") {
		t.Errorf("rm of a live session: %v", err)
	}
	if n := strings.Count(err.Error(), rec.ID); n != 1 {
		t.Errorf("rm names the session %d times: %q", n, err)
	}
}

// TestShellAllowNamesChecked: a shell.allow name that is no program on the session's PATH
// is refused at stage with its field path, the name, where roost looked, and the close
// name it probably meant.
func TestShellAllowNamesChecked(t *testing.T) {
	// Through stage, as an operator meets it.
	m, _ := openManager(t, stateDir(t))
	_, err := m.Stage(StageOptions{Capsule: capsule(t, "true", "capabilities:\n  shell:\n    allow: [sh, shhhhh-nope]\n")})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `capabilities.shell.allow[1]: "shhhhh-nope": not found on PATH`) {
		t.Fatalf("stage: %v", err)
	}
}
