package session

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/session/store"
)

// Every end is heard once, by class and status, when the registry commits it; a daemon
// that opens after it hears only the end it recovers, not the ends recorded before.
func TestSessionEndHeardOnce(t *testing.T) {
	state := stateDir(t)
	obs := &recorder{}
	m, err := Open(testConfig(state, obs))
	if err != nil {
		t.Fatal(err)
	}
	failed := waitEnd(t, m, run(t, m, StageOptions{Capsule: capsule(t, "exit 3", "")}).ID)
	timed := waitEnd(t, m, run(t, m, StageOptions{Capsule: capsule(t, "sleep 30", ""), Deadline: time.Second}).ID)
	if failed.ExitStatus != store.StatusError || timed.ExitStatus != store.StatusDeadlineReached {
		t.Fatalf("ends: %s, %s", failed.ExitStatus, timed.ExitStatus)
	}
	// Heard once the end commits, which is also what wakes Wait: a moment after Wait
	// returns, not before.
	for deadline := time.Now().Add(10 * time.Second); len(obs.endsSeen()) < 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got, want := obs.endsSeen(), []string{"advisory/error", "advisory/deadline_reached"}; !slices.Equal(got, want) {
		t.Fatalf("ends heard: %q, want %q", got, want)
	}
	// Waiting again, or reading the record, hears nothing more.
	waitEnd(t, m, failed.ID)
	quick := run(t, m, StageOptions{Capsule: capsule(t, "sleep 1", "")})
	if got, _ := m.Get(quick.ID); got.State == store.Exited {
		t.Fatal("quick ended before the daemon closed; the test needs it running then")
	}
	m.Close()
	waitFile(t, filepath.Join(quick.RecordsDir, containment.ExitFile))
	if got := obs.endsSeen(); len(got) != 2 {
		t.Fatalf("the first daemon heard %q after closing", got)
	}

	m2, obs2 := openManager(t, state)
	if got, _ := m2.Get(quick.ID); got.State != store.Exited || got.ExitStatus != store.StatusOK {
		t.Fatalf("quick after restart: %+v", got)
	}
	for deadline := time.Now().Add(10 * time.Second); len(obs2.endsSeen()) < 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got, want := obs2.endsSeen(), []string{"advisory/ok"}; !slices.Equal(got, want) {
		t.Fatalf("ends the second daemon heard: %q, want %q", got, want)
	}
}
