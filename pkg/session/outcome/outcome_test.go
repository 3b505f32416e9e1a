package outcome

import (
	"os"
	"path/filepath"
	"testing"

	"roost.dev/roost/pkg/session/store"
)

// TestLandlockHint: a session under Landlock (scoped, sealed) that exits non-zero with
// "Permission denied" at the head of its stderr gets a hint in its detail pointing at
// explain; others do not.
func TestLandlockHint(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "stderr.log"), []byte("cat: /etc/shadow: Permission denied\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rec := &store.Record{Achieved: "sealed", RecordsDir: dir}
	rec.Capsule.Source = "/srv/capsules/x"
	got := LandlockHint(rec, store.StatusError, "exited with code 1")
	if want := "exited with code 1; hint: roost limits what this session may read, write and execute (Landlock, shell.allow); see roostctl explain /srv/capsules/x"; got != want {
		t.Errorf("sealed, denied:\n got %q\nwant %q", got, want)
	}
	for _, c := range []struct {
		class  string
		status store.ExitStatus
	}{{"advisory", store.StatusError}, {"sealed", store.StatusOK}, {"scoped", store.StatusDeadlineReached}} {
		rec.Achieved = c.class
		if got := LandlockHint(rec, c.status, "d"); got != "d" {
			t.Errorf("%s %s: %q", c.class, c.status, got)
		}
	}
	rec.Achieved = "scoped"
	if err := os.WriteFile(filepath.Join(dir, "stderr.log"), []byte("something else\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := LandlockHint(rec, store.StatusError, "d"); got != "d" {
		t.Errorf("no denial: %q", got)
	}
}
