package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
)

func openTestRegistry(t *testing.T) (*Registry, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), DBFile)
	r, err := OpenRegistry(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, path
}

func stage(t *testing.T, r *Registry, id string) *Record {
	t.Helper()
	rec := &Record{ID: id, Capsule: CapsuleRef{Name: "x", Version: "0.1.0"}}
	if _, err := r.Update(func(tx *Tx) error {
		if err := tx.AllocateIDs(rec, testPool); err != nil {
			return err
		}
		return tx.Create(rec, []byte("m"), []byte("e"))
	}); err != nil {
		t.Fatal(err)
	}
	return rec
}

// Every pair of states: the table allows exactly the moves it lists, and transition refuses
// the rest with FailedPrecondition, leaving the record untouched.
func TestTransitionMatrix(t *testing.T) {
	all := append([]State{none}, States...)
	all = append(all, removed)
	allowed := map[[2]State]bool{
		{none, Staged}: true, {Staged, Launching}: true, {Staged, removed}: true,
		{Launching, Running}: true, {Launching, Exited}: true,
		{Running, Paused}: true, {Running, Stopping}: true, {Running, Exited}: true,
		{Paused, Running}: true, {Paused, Stopping}: true, {Paused, Exited}: true,
		{Stopping, Exited}: true, {Exited, removed}: true,
	}
	for _, from := range all {
		for _, to := range all {
			rec := &Record{ID: "ses_x", State: from}
			err := transition(rec, to)
			if allowed[[2]State{from, to}] {
				if err != nil || rec.State != to {
					t.Errorf("%q -> %q refused: %v", from, to, err)
				}
				continue
			}
			if err == nil {
				t.Errorf("%q -> %q allowed", from, to)
			} else if !errdefs.IsFailedPrecondition(err) {
				t.Errorf("%q -> %q: error not FailedPrecondition: %v", from, to, err)
			}
			if rec.State != from {
				t.Errorf("%q -> %q: refused move changed the state to %q", from, to, rec.State)
			}
		}
	}
}

// The bucket tree a fresh registry holds is the one buckets.go documents.
func TestBucketTreeMatchesSchema(t *testing.T) {
	r, _ := openTestRegistry(t)
	gone := stage(t, r, "ses_0")
	stage(t, r, "ses_a")
	if _, err := r.Update(func(tx *Tx) error {
		return tx.Create(&Record{ID: "ses_b", Labels: map[string]string{"team": "a"}}, []byte("m"), []byte("e"))
	}); err != nil {
		t.Fatal(err)
	}
	// A removed session's events compacted away leave the compaction mark.
	if _, err := r.Update(func(tx *Tx) error { return tx.Delete(gone) }); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Update(func(tx *Tx) error {
		n, err := tx.CompactEvents(0, "test", 100)
		if err == nil && n != 1 {
			err = fmt.Errorf("compacted %d events, want 1", n)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var tree []string
	err := r.db.View(func(tx *bolt.Tx) error {
		var walk func(prefix string, b *bolt.Bucket) error
		walk = func(prefix string, b *bolt.Bucket) error {
			return b.ForEach(func(k, v []byte) error {
				name := string(k)
				switch prefix {
				case "v1/events/":
					name = "<seq>"
				case "v1/ids/":
					name = "<first id>"
				}
				if v == nil {
					if prefix == "v1/sessions/" {
						name = "<session id>"
					}
					tree = append(tree, prefix+name+"/")
					return walk(prefix+name+"/", b.Bucket(k))
				}
				tree = append(tree, prefix+name)
				return nil
			})
		}
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			tree = append(tree, string(name)+"/")
			return walk(string(name)+"/", b)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(tree)
	tree = slices.Compact(tree)
	want := []string{
		"v1/", "v1/events/", "v1/events/<seq>", "v1/events_compacted", "v1/ids/", "v1/ids/<first id>", "v1/sessions/", "v1/sessions/<session id>/",
		"v1/sessions/<session id>/explanation", "v1/sessions/<session id>/labels", "v1/sessions/<session id>/manifest",
		"v1/sessions/<session id>/record", "v1/sessions/<session id>/state", "v1/version",
	}
	sort.Strings(tree)
	if !slices.Equal(tree, want) {
		t.Fatalf("bucket tree:\n%s\nwant:\n%s", strings.Join(tree, "\n"), strings.Join(want, "\n"))
	}
}

func TestRegistryRefusesNewerSchema(t *testing.T) {
	r, path := openTestRegistry(t)
	if err := r.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketV1).Put(keyVersion, binary.AppendUvarint(nil, dbVersion+1))
	}); err != nil {
		t.Fatal(err)
	}
	r.Close()
	_, err := OpenRegistry(path)
	if err == nil || !strings.Contains(err.Error(), "newer than this roostd") {
		t.Fatalf("opened a newer registry: %v", err)
	}
}

func TestRegistryLockedByAnother(t *testing.T) {
	_, path := openTestRegistry(t)
	_, err := OpenRegistry(path)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v", err)
	}
}

func TestEventsSurviveReopenInOrder(t *testing.T) {
	r, path := openTestRegistry(t)
	for i := range 5 {
		stage(t, r, fmt.Sprintf("ses_%d", i))
	}
	rec := stage(t, r, "ses_x")
	if _, err := r.Update(func(tx *Tx) error { return tx.Transition(rec, Launching) }); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Update(func(tx *Tx) error { return tx.Delete(rec) }); err == nil {
		t.Fatal("deleted a launching session")
	}
	r.Close()

	r2, err := OpenRegistry(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	var all, tail []Event
	r2.View(func(tx *Tx) error {
		all, _ = tx.EventsSince(0, 100)
		tail, _ = tx.EventsSince(5, 100)
		return nil
	})
	if len(all) != 7 {
		t.Fatalf("want 7 events, got %d", len(all))
	}
	for i, ev := range all {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}
	if len(tail) != 2 || tail[0].Type != EventStaged || tail[0].SessionID != "ses_x" || tail[1].Type != EventLaunching {
		t.Fatalf("events after 5: %+v", tail)
	}
	// New events continue the sequence; none is reused.
	stage(t, r2, "ses_y")
	r2.View(func(tx *Tx) error {
		if tx.LastSeq() != 8 {
			t.Errorf("last seq %d", tx.LastSeq())
		}
		return nil
	})
}

func TestFailedUpdateWritesNothing(t *testing.T) {
	r, _ := openTestRegistry(t)
	events, err := r.Update(func(tx *Tx) error {
		if err := tx.Create(&Record{ID: "ses_a"}, nil, nil); err != nil {
			return err
		}
		return errors.New("boom")
	})
	if err == nil || events != nil {
		t.Fatalf("events %v err %v", events, err)
	}
	r.View(func(tx *Tx) error {
		if _, err := tx.Get("ses_a"); !errdefs.IsNotFound(err) {
			t.Errorf("rolled-back session exists: %v", err)
		}
		if tx.LastSeq() != 0 {
			t.Errorf("rolled-back event left seq %d", tx.LastSeq())
		}
		return nil
	})
}

func TestRecordRoundTripAndStaleWrites(t *testing.T) {
	r, _ := openTestRegistry(t)
	rec := stage(t, r, "ses_a")
	code := 3
	rec.ExitCode = &code
	rec.Detail = "d"
	if _, err := r.Update(func(tx *Tx) error { return tx.Save(rec) }); err != nil {
		t.Fatal(err)
	}
	// A writer holding an out-of-date copy is refused rather than overwriting.
	stale := *rec
	if _, err := r.Update(func(tx *Tx) error { return tx.Transition(rec, Launching) }); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Update(func(tx *Tx) error { return tx.Save(&stale) }); !errdefs.IsConflict(err) {
		t.Fatalf("stale save: %v", err)
	}
	r.View(func(tx *Tx) error {
		got, err := tx.Get("ses_a")
		if err != nil || got.State != Launching || *got.ExitCode != 3 || got.Detail != "d" {
			t.Errorf("got %+v %v", got, err)
		}
		counts := tx.CountByState()
		if counts[Launching] != 1 || len(counts) != 1 {
			t.Errorf("counts %v", counts)
		}
		m, _ := tx.Manifest("ses_a")
		if string(m) != "m" {
			t.Errorf("manifest %q", m)
		}
		return nil
	})
	if _, err := r.Update(func(tx *Tx) error { return tx.Create(&Record{ID: "ses_a"}, nil, nil) }); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate create: %v", err)
	}
}

// testPool is this package's tests' block of host ids.
var testPool = IDPool{First: 0x50000000, Slots: 256}

// A range let go is not handed out until its sweep says it is clean; then the clean range
// freed longest ago goes first, after every range never used. A failed sweep quarantines it.
func TestRangesSweptBeforeReuse(t *testing.T) {
	r, _ := openTestRegistry(t)
	small := IDPool{First: testPool.First, Slots: 4} // three ranges for sessions
	alloc := func(id string) (*Record, error) {
		rec := &Record{ID: id, Capsule: CapsuleRef{Name: "x", Version: "0.1.0"}}
		_, err := r.Update(func(tx *Tx) error {
			if err := tx.AllocateIDs(rec, small); err != nil {
				return err
			}
			return tx.Create(rec, []byte("m"), []byte("e"))
		})
		return rec, err
	}
	// Each ran, then ended: its range is to be swept.
	remove := func(rec *Record) {
		t.Helper()
		if _, err := r.Update(func(tx *Tx) error {
			for _, to := range []State{Launching, Exited} {
				if err := tx.Transition(rec, to); err != nil {
					return err
				}
			}
			return tx.Delete(rec)
		}); err != nil {
			t.Fatal(err)
		}
	}
	sweep := func(first uint32, err error) {
		t.Helper()
		if _, uerr := r.Update(func(tx *Tx) error { return tx.Swept(first, small, err) }); uerr != nil {
			t.Fatal(uerr)
		}
	}
	var toSweep []LetGo
	view := func() {
		t.Helper()
		if err := r.View(func(tx *Tx) error { toSweep = tx.ToSweep(); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := alloc("ses_a")
	b, _ := alloc("ses_b")
	c, err := alloc("ses_c")
	if err != nil || a.IDs.First == b.IDs.First || c.IDs.First == b.IDs.First {
		t.Fatalf("three ranges: %+v %+v %+v %v", a.IDs, b.IDs, c.IDs, err)
	}
	remove(b)
	remove(a)
	// Freed, not swept: nothing to give.
	if _, err := alloc("ses_d"); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "2 of them let go but not yet swept clean") {
		t.Fatalf("a freed range was handed out, or the refusal does not say why: %v", err)
	}
	view()
	if len(toSweep) != 2 || toSweep[0].IDs.First != b.IDs.First || toSweep[0].By != "ses_b" || toSweep[1].IDs.First != a.IDs.First {
		t.Fatalf("to sweep, oldest first: %+v", toSweep)
	}
	sweep(a.IDs.First, errors.New("a process kept appearing"))
	sweep(b.IDs.First, nil)
	view()
	if len(toSweep) != 1 || toSweep[0].State != RangeQuarantined || toSweep[0].Tries != 1 || toSweep[0].Error != "a process kept appearing" {
		t.Fatalf("quarantined: %+v", toSweep)
	}
	var counts map[string]int
	r.View(func(tx *Tx) error { counts = tx.RangeCounts(small); return nil })
	if counts["held"] != 1 || counts["free"] != 1 || counts["quarantined"] != 1 || counts["freed"] != 0 {
		t.Fatalf("counts %v", counts)
	}
	d, err := alloc("ses_d")
	if err != nil || d.IDs.First != b.IDs.First {
		t.Fatalf("the clean range: %+v %v", d.IDs, err)
	}
	if _, err := alloc("ses_e"); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("the quarantined range was handed out: %v", err)
	}
	// Swept at last, it goes to the next.
	sweep(a.IDs.First, nil)
	if e, err := alloc("ses_e"); err != nil || e.IDs.First != a.IDs.First {
		t.Fatalf("after its sweep: %+v %v", e.IDs, err)
	}
}

// Among clean ranges the one freed longest ago goes first, but a range never used goes
// before any of them.
func TestRangesLeastRecentlyFreedFirst(t *testing.T) {
	r, _ := openTestRegistry(t)
	pool := IDPool{First: testPool.First, Slots: 5}
	var recs []*Record
	for i := range 3 {
		rec := &Record{ID: fmt.Sprintf("ses_%d", i)}
		if _, err := r.Update(func(tx *Tx) error {
			if err := tx.AllocateIDs(rec, pool); err != nil {
				return err
			}
			return tx.Create(rec, nil, nil)
		}); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	// Freed in the order 2, 0, 1; all swept.
	for _, i := range []int{2, 0, 1} {
		if _, err := r.Update(func(tx *Tx) error {
			for _, to := range []State{Launching, Exited} {
				if err := tx.Transition(recs[i], to); err != nil {
					return err
				}
			}
			if err := tx.Delete(recs[i]); err != nil {
				return err
			}
			return tx.Swept(recs[i].IDs.First, pool, nil)
		}); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint32
	for i := range 4 {
		rec := &Record{ID: fmt.Sprintf("ses_n%d", i)}
		if _, err := r.Update(func(tx *Tx) error {
			if err := tx.AllocateIDs(rec, pool); err != nil {
				return err
			}
			return tx.Create(rec, nil, nil)
		}); err != nil {
			t.Fatal(err)
		}
		got = append(got, rec.IDs.First)
	}
	never := pool.First + 4*65536
	want := []uint32{never, recs[2].IDs.First, recs[0].IDs.First, recs[1].IDs.First}
	if !slices.Equal(got, want) {
		t.Fatalf("allocated %v, want %v (never used, then least recently freed)", got, want)
	}
}

// A range nothing ran on — a session removed while staged, or the one a session staged with
// before it took a sandbox's — is clean at once: there is nothing to sweep.
func TestRangeNothingRanOnIsCleanAtOnce(t *testing.T) {
	r, _ := openTestRegistry(t)
	pool := IDPool{First: testPool.First, Slots: 2}
	rec := &Record{ID: "ses_staged"}
	if _, err := r.Update(func(tx *Tx) error {
		if err := tx.AllocateIDs(rec, pool); err != nil {
			return err
		}
		if err := tx.Create(rec, nil, nil); err != nil {
			return err
		}
		return tx.Delete(rec)
	}); err != nil {
		t.Fatal(err)
	}
	var pending []LetGo
	var counts map[string]int
	r.View(func(tx *Tx) error { pending, counts = tx.ToSweep(), tx.RangeCounts(pool); return nil })
	if len(pending) != 0 || counts["free"] != 1 {
		t.Fatalf("a staged session's range: to sweep %+v, counts %v", pending, counts)
	}
}
