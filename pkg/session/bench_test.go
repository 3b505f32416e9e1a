package session

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/pkg/session/store"

	"roost.dev/roost/pkg/artifact"
)

// BenchmarkStage is one Stage: read and validate the capsule, digest it, decide its
// containment, and commit the session (one fsynced bbolt transaction).
func BenchmarkStage(b *testing.B) {
	cfg := testConfig(stateDir(b), &recorder{})
	// Every staged session holds an id range until it is removed: enough for the loop.
	cfg.IDs = store.IDPool{First: 0x10000000, Slots: 0xE000}
	m, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	dir := capsuleB(b)
	for b.Loop() {
		if _, err := m.Stage(StageOptions{Capsule: dir}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStageFromStore stages a capsule given by its directory as roostd does: copied
// into the content store on the first stage, then found there by its digest (the tree is
// hashed by descriptors each time).
func BenchmarkStageFromStore(b *testing.B) {
	state := stateDir(b)
	cfg := testConfig(state, &recorder{})
	cfg.IDs = store.IDPool{First: 0x10000000, Slots: 0xE000}
	store, err := artifact.Open(filepath.Join(state, "artifacts"))
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	cfg.Artifacts = store
	m, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	dir := capsuleB(b)
	for b.Loop() {
		if _, err := m.Stage(StageOptions{Capsule: dir}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEventsReplay replays 10,000 events from the registry, as `roostctl events
// --since 0` does.
func BenchmarkEventsReplay(b *testing.B) {
	r, err := store.OpenRegistry(b.TempDir() + "/" + store.DBFile)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	const n = 10000
	for i := 0; i < n; i += 500 {
		if _, err := r.Update(func(tx *store.Tx) error {
			for j := i; j < i+500; j++ {
				if err := tx.Create(&store.Record{ID: fmt.Sprintf("ses_%08d", j)}, nil, nil); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	m := &Manager{reg: registry{Registry: r, changed: newNotifier()}}
	b.ResetTimer()
	for b.Loop() {
		count := 0
		if err := m.Events(context.Background(), 0, false, func(store.Event) error { count++; return nil }); err != nil || count != n {
			b.Fatalf("%d events, %v", count, err)
		}
	}
}

func capsuleB(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	if err := writeFile(dir+"/capsule.yaml", "name: bench\nversion: 0.1.0\nrun:\n  command: [/bin/true]\n"); err != nil {
		b.Fatal(err)
	}
	return dir
}

func writeFile(path, data string) error { return os.WriteFile(path, []byte(data), 0o644) }

// BenchmarkListByLabel lists 10,000 sessions by a label that 1,000 of them have, as
// `roostctl ps --all --filter label=team=t3` (or an SDK's List) asks: List reads every
// session's labels, and decodes the records of those that match.
func BenchmarkListByLabel(b *testing.B) {
	r, err := store.OpenRegistry(b.TempDir() + "/" + store.DBFile)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	const n = 10000
	for i := 0; i < n; i += 500 {
		if _, err := r.Update(func(tx *store.Tx) error {
			for j := i; j < i+500; j++ {
				id := fmt.Sprintf("ses_%08d", j)
				// A record as large as a command session's, with an SDK's few labels.
				rec := &store.Record{ID: id, Capsule: store.CapsuleRef{Name: "agent", Version: "0.1.0", SHA256: "sha256:" + strings.Repeat("0", 64), Source: "/srv/capsules/agent"},
					Declared: "sealed", Achieved: "sealed", Workdir: "/var/lib/roost/work/" + id, RecordsDir: "/var/lib/roost/records/" + id,
					Command: []string{"/usr/bin/python3", "agent.py", "--task", "task.md"}, Deadline: time.Hour,
					Labels: map[string]string{"team": fmt.Sprintf("t%d", j%10), "example.com/run": fmt.Sprintf("run-%d", j), "owner": "user-42"}}
				if err := tx.Create(rec, nil, nil); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	m := &Manager{reg: registry{Registry: r, changed: newNotifier()}}
	for _, c := range []struct {
		name string
		sel  []string
		want int
	}{{"every", nil, n}, {"team=t3", []string{"team=t3"}, n / 10}, {"run=run-7", []string{"example.com/run=run-7"}, 1}} {
		sels, err := store.ParseSelectors(c.sel)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if recs, err := m.List(true, sels...); err != nil || len(recs) != c.want {
					b.Fatalf("%d sessions, %v", len(recs), err)
				}
			}
		})
	}
}
