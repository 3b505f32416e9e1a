package session

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Usage reports what the session's workdir holds, as the workdir bound counts it: the first
// call measures, later ones answer the cached measurement at once (a file written meanwhile
// does not show), and a measurement older than GuardInterval is redone in the background.
func TestUsageWorkdirBytes(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, "head -c 1048576 /dev/urandom > one; echo ready > ready; sleep 30", "")})
	t.Cleanup(func() { m.Kill(context.Background(), rec.ID, sigKill) })
	waitFile(t, filepath.Join(rec.Workdir, "ready"))
	u := m.Usage(rec)
	if u == nil || u.WorkdirBytes < 1<<20 {
		t.Fatalf("usage after a 1 MiB file: %+v", u)
	}
	first := u.WorkdirBytes

	// 4 MiB more, written by the test: the cached answer does not see it yet.
	if err := os.WriteFile(filepath.Join(rec.Workdir, "two"), make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if u := m.Usage(rec); u == nil || u.WorkdirBytes != first {
		t.Fatalf("a second call at once measured again: %+v, first %d", u, first)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		u := m.Usage(rec)
		if u != nil && u.WorkdirBytes >= first+4<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the measurement was never refreshed: %+v", u)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Once the session has ended its cache entry goes, with the next new one.
	if _, err := m.Kill(context.Background(), rec.ID, sigKill); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, m, rec.ID)
	if u := m.Usage(rec); u != nil {
		t.Fatalf("usage of an ended session: %+v", u)
	}
	other := run(t, m, StageOptions{Capsule: capsule(t, "sleep 30", "")})
	t.Cleanup(func() { m.Kill(context.Background(), other.ID, sigKill) })
	m.Usage(other)
	workdirSizes.Lock()
	n := len(workdirSizes.m)
	workdirSizes.Unlock()
	if n != 1 {
		t.Fatalf("%d cached measurements, want the live session's alone", n)
	}
}
