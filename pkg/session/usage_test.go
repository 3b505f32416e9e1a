package session

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Usage reports what the session's trees hold as the workdir bound counts them: the guard's
// own measurement, renewed every GuardInterval, so a file written later shows within one.
func TestUsageWorkdirBytes(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, "head -c 1048576 /dev/urandom > one; echo ready > ready; sleep 30", "")})
	t.Cleanup(func() { m.Kill(context.Background(), rec.ID, sigKill) })
	waitFile(t, filepath.Join(rec.Workdir, "ready"))
	atLeast := func(n int64) int64 {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			u := m.Usage(rec)
			if u != nil && u.WorkdirBytes >= n {
				return u.WorkdirBytes
			}
			if time.Now().After(deadline) {
				t.Fatalf("usage never reached %d workdir bytes: %+v", n, u)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	first := atLeast(1 << 20)
	if err := os.WriteFile(filepath.Join(rec.Workdir, "two"), make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	atLeast(first + 4<<20)

	if _, err := m.Kill(context.Background(), rec.ID, sigKill); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, m, rec.ID)
	if u := m.Usage(rec); u != nil {
		t.Fatalf("usage of an ended session: %+v", u)
	}
}
