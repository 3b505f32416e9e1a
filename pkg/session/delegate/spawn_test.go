package delegate

import (
	"crypto/rand"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/spawn"
	"roost.dev/roost/pkg/workdir"
)

// A snapshot fits when the parent's trees and the copy together stay within the parent's
// resources.workdir_max_bytes and workdir_max_inodes, counted in allocated bytes; one byte
// or one entry past is refused, naming the setting, the sizes and spawn.workdir_snapshot.
// What fits is handed to the copy as its room.
func TestSnapshotRoom(t *testing.T) {
	const what = "the workdir and home"
	lim := workdir.Limits{Bytes: 100 << 20, Inodes: 1000}
	// A workdir allocating 40 MiB and 100 entries, its children's part 10 MiB and 10: the
	// copy is 30 MiB and 90 entries.
	whole := workdir.Usage{Bytes: 40 << 20, Inodes: 100}
	kids := workdir.Usage{Bytes: 10 << 20, Inodes: 10}
	copyBytes, copyInodes := int64(30<<20), int64(90)
	for _, c := range []struct {
		name string
		held workdir.Usage
		// key is the refusal's, "" when the snapshot fits.
		key  string
		says []string
	}{
		{"exactly at the limit", workdir.Usage{Bytes: lim.Bytes - copyBytes, Inodes: lim.Inodes - copyInodes}, "", nil},
		{"one byte past", workdir.Usage{Bytes: lim.Bytes - copyBytes + 1, Inodes: 100}, "capabilities.resources.workdir_max_bytes",
			[]string{"spawn.workdir_snapshot", "(31457280 bytes allocated)", "from 73400321 to 104857601 bytes", "past resources.workdir_max_bytes (104857600)"}},
		{"one entry past", workdir.Usage{Bytes: 1 << 20, Inodes: lim.Inodes - copyInodes + 1}, "capabilities.resources.workdir_max_inodes",
			[]string{"spawn.workdir_snapshot", "(90 files and directories)", "from 911 to 1001", "past resources.workdir_max_inodes (1000)"}},
		{"past already", workdir.Usage{Bytes: lim.Bytes + 1}, "capabilities.resources.workdir_max_bytes",
			[]string{"past resources.workdir_max_bytes (104857600): no copy of the workdir fits"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			room, err := snapshotRoom(c.held, whole, kids, lim, what)
			if c.key == "" {
				if err != nil {
					t.Fatal(err)
				}
				if want := (workdir.Limits{Bytes: lim.Bytes - c.held.Bytes, Inodes: lim.Inodes - c.held.Inodes}); room != want {
					t.Fatalf("room %+v, want %+v", room, want)
				}
				return
			}
			var r *spawn.Refusal
			if !errors.As(err, &r) || r.Key != c.key || r.Reason != spawn.ReasonEnvelope || !errdefs.IsPermissionDenied(err) {
				t.Fatalf("refusal: %v", err)
			}
			for _, s := range c.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not say %q", err, s)
				}
			}
		})
	}
	// Nothing left at all is a room of one byte, never 0, which Copy takes for no bound.
	if room, err := snapshotRoom(workdir.Usage{Bytes: lim.Bytes}, workdir.Usage{}, workdir.Usage{}, lim, what); err != nil || room.Bytes != 1 {
		t.Fatalf("a copy of nothing at the limit: room %+v, %v", room, err)
	}
}

// childrenOnly is the one thing childWorkdir asks of the sessions: where children work.
type childrenOnly struct {
	Sessions
	state string
}

func (c childrenOnly) ChildrenDir(parent *store.Record) (string, string, error) {
	rel := filepath.Join("children", parent.ID)
	return c.state, rel, os.MkdirAll(filepath.Join(c.state, rel), 0o700)
}

// A snapshot that outgrows the room measured for it while it is copied (the parent filled
// its workdir after the measurement) is refused as a measurement past the limit is, and
// nothing of the child is left: neither its directory nor the parent's link to it.
func TestChildWorkdirRefusesACopyPastItsRoom(t *testing.T) {
	for _, class := range []manifest.Class{manifest.Advisory, manifest.Sealed} {
		t.Run(class.String(), func(t *testing.T) {
			state := t.TempDir()
			b := New(childrenOnly{state: state}, Config{})
			parent := &store.Record{ID: "ses_parent", Workdir: t.TempDir(), Achieved: class.String()}
			data := make([]byte, 256<<10)
			if _, err := rand.Read(data); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"a", "b"} {
				if err := os.WriteFile(filepath.Join(parent.Workdir, name), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := b.childWorkdir(parent, "worker", &workdir.Limits{Bytes: 300 << 10})
			var r *spawn.Refusal
			if !errors.As(err, &r) || r.Key != "capabilities.resources.workdir_max_bytes" || !errdefs.IsPermissionDenied(err) ||
				!strings.Contains(err.Error(), "spawn.workdir_snapshot") || !strings.Contains(err.Error(), "the 307200 it may take") {
				t.Fatalf("a copy past its room: %v", err)
			}
			for _, dir := range []string{filepath.Join(parent.Workdir, containment.ChildrenRoot, "children"), filepath.Join(state, "children", parent.ID)} {
				if entries, err := os.ReadDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) || len(entries) != 0 {
					t.Errorf("%s holds %d entries (%v) after the refusal", dir, len(entries), err)
				}
			}
		})
	}
}
