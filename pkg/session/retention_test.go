package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/session/dirs"
	"roost.dev/roost/pkg/session/retention"
	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
)

// retentionObserver hears limits, prunes and compactions besides what recorder hears.
type retentionObserver struct {
	*recorder
	mu        sync.Mutex
	limits    []string
	pruned    int
	compacted int
}

func (o *retentionObserver) LimitHit(limit string) {
	o.mu.Lock()
	o.limits = append(o.limits, limit)
	o.mu.Unlock()
}

func (o *retentionObserver) SessionsPruned(n int) { o.mu.Lock(); o.pruned += n; o.mu.Unlock() }

func (o *retentionObserver) EventsCompacted(n int) { o.mu.Lock(); o.compacted += n; o.mu.Unlock() }

func openRetentionManager(t testing.TB, state string) (*Manager, *retentionObserver) {
	t.Helper()
	obs := &retentionObserver{recorder: &recorder{}}
	cfg := testConfig(state, nil)
	cfg.Observer = obs
	m, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, obs
}

// A manifest and an explanation the size real ones are.
var (
	benchManifest    = []byte("name: churn\nversion: 0.1.0\nrun:\n  command: [/bin/true]\ncapabilities:\n  containment: advisory\n")
	benchExplanation = []byte(`{"containment":{"declared":"advisory","achieved":"advisory","floor_met":true},"grants":[` +
		strings.Repeat(`{"key":"capabilities.filesystem.read","value":"/usr","enforcement":"advisory","detail":"nothing enforces this in the advisory class"},`, 20) + `{}]}`)
)

// endedSessions records n ended sessions straight through the registry, as a daemon would
// have after running them: staged, launched, run, exited (ended one second apart, after
// from), each with a records directory and a workdir of its own.
func endedSessions(t testing.TB, m *Manager, n int, from time.Time) []*store.Record {
	t.Helper()
	var recs []*store.Record
	for i := 0; i < n; i += 100 {
		if _, err := m.reg.Update(func(tx *store.Tx) error {
			for j := i; j < min(i+100, n); j++ {
				id, err := newID()
				if err != nil {
					return err
				}
				code := 0
				rec := &store.Record{ID: id, Capsule: store.CapsuleRef{Name: "churn", Version: "0.1.0"}, RecordsDir: m.trees.Records(id),
					Workdir: filepath.Join(m.cfg.StateDir, dirs.WorkDir, id), OwnsWorkdir: true, CreatedAt: from.Add(time.Duration(j) * time.Second)}
				if err := tx.Create(rec, benchManifest, benchExplanation); err != nil {
					return err
				}
				for _, s := range []store.State{store.Launching, store.Running} {
					if err := tx.Transition(rec, s); err != nil {
						return err
					}
				}
				rec.ExitStatus, rec.ExitCode, rec.Detail, rec.EndedAt = store.StatusOK, &code, "exited with code 0", rec.CreatedAt
				if err := tx.Transition(rec, store.Exited); err != nil {
					return err
				}
				recs = append(recs, rec)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, rec := range recs {
		for _, dir := range []string{rec.RecordsDir, rec.Workdir} {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(rec.RecordsDir, "stdout.log"), []byte("done\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return recs
}

// highWater is how far into its file the registry has ever written.
func highWater(m *Manager) int64 {
	n, _ := m.reg.Size()
	return n
}

// inUse is what the registry's pages hold. A file that stops growing has this flat; it
// leads the file's size, which bbolt grows in steps.
func inUse(m *Manager) int64 {
	_, n := m.reg.Size()
	return n
}

func fileSize(t testing.TB, path string) int64 {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

func replay(m *Manager, since uint64) ([]store.Event, error) {
	var got []store.Event
	err := m.Events(context.Background(), since, false, func(ev store.Event) error { got = append(got, ev); return nil })
	return got, err
}

// 1,000 ended sessions under --retain-ended 100: the 100 that ended last remain, with their
// files; the others are gone, files and all, and so are their events; the registry file stops
// growing under further churn; a replay from before the window fails and says where it
// starts; the sequence goes on without reuse.
func TestRetentionKeepsNewestEnded(t *testing.T) {
	state := stateDir(t)
	m, obs := openRetentionManager(t, state)
	r := retention.Policy{MaxEnded: 100}
	base := time.Now().Add(-24 * time.Hour)
	recs := endedSessions(t, m, 1000, base)
	m.retainer.Pass(m.ctx, r, true)

	list, err := m.List(true)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 100 {
		t.Fatalf("%d sessions remain, want 100", len(list))
	}
	for i, rec := range list {
		if want := recs[900+i]; rec.ID != want.ID {
			t.Fatalf("remaining session %d is %s, want %s (the newest 100)", i, rec.ID, want.ID)
		}
	}
	for i, rec := range recs {
		_, err := os.Stat(rec.RecordsDir)
		_, werr := os.Stat(rec.Workdir)
		if i < 900 && (!errors.Is(err, os.ErrNotExist) || !errors.Is(werr, os.ErrNotExist)) {
			t.Fatalf("removed session %d kept its files: %v %v", i, err, werr)
		}
		if i >= 900 && (err != nil || werr != nil) {
			t.Fatalf("kept session %d lost its files: %v %v", i, err, werr)
		}
	}
	if obs.pruned != 900 || obs.compacted == 0 {
		t.Errorf("observer heard %d pruned, %d compacted", obs.pruned, obs.compacted)
	}

	// The log starts at the oldest remaining session's first event.
	var c store.Compaction
	var last uint64
	m.reg.View(func(tx *store.Tx) error { c, last = tx.Compaction(), tx.LastSeq(); return nil })
	if want := uint64(900 * 4); c.Through != want || c.By != "roostd --retain-ended 100" {
		t.Fatalf("compaction %+v, want through %d", c, want)
	}
	_, err = replay(m, 0)
	var ce *store.CompactedError
	if !errors.As(err, &ce) || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("replay from 0: %v", err)
	}
	want := fmt.Sprintf("events before %d were compacted away (by roostd --retain-ended 100, with the sessions it removed); the oldest kept is %d: use --since %d or later", c.Through+1, c.Through+1, c.Through)
	if err.Error() != want {
		t.Fatalf("replay from 0:\n%s\nwant\n%s", err, want)
	}
	if _, err := replay(m, c.Through-1); err == nil {
		t.Fatal("replay from just before the window worked")
	}
	got, err := replay(m, c.Through)
	if err != nil || uint64(len(got)) != last-c.Through || got[0].Seq != c.Through+1 || got[len(got)-1].Seq != last {
		t.Fatalf("replay from the window's start: %d events, %v", len(got), err)
	}
	for i, ev := range got {
		if ev.Seq != c.Through+1+uint64(i) {
			t.Fatalf("window not dense at %d: %d", i, ev.Seq)
		}
	}

	// Steady churn: 1,000 more sessions end, 100 at a time, each batch followed by a pass.
	// The file does not grow, and the log holds about the retained sessions' events.
	db := filepath.Join(state, store.DBFile)
	before, hwBefore, usedBefore := fileSize(t, db), highWater(m), inUse(m)
	for i := range 10 {
		endedSessions(t, m, 100, base.Add(time.Duration(1000+100*i)*time.Second))
		m.retainer.Pass(m.ctx, r, false)
	}
	after, hwAfter, usedAfter := fileSize(t, db), highWater(m), inUse(m)
	if after > before || hwAfter > hwBefore || usedAfter > usedBefore*5/4 {
		t.Fatalf("under churn with retention the registry grew from %d to %d bytes, its high water from %d to %d, what its pages hold from %d to %d",
			before, after, hwBefore, hwAfter, usedBefore, usedAfter)
	}
	m.reg.View(func(tx *store.Tx) error { c, last = tx.Compaction(), tx.LastSeq(); return nil })
	if kept := last - c.Through; kept > 100*5+100 {
		t.Fatalf("%d events kept for 100 sessions", kept)
	}
	if last != 2000*5-100 {
		// 2,000 sessions' four events each, and 1,900 removals: dense, none reused.
		t.Fatalf("last seq %d", last)
	}
	t.Logf("registry after 1,000 sessions and retention: %d bytes (high water %d, in use %d); after 1,000 more: %d (%d, %d); %d events kept",
		before, hwBefore, usedBefore, after, hwAfter, usedAfter, last-c.Through)
}

// Without compaction the same churn grows the file: the test above measures something.
func TestChurnWithoutRetentionGrows(t *testing.T) {
	state := stateDir(t)
	m, _ := openRetentionManager(t, state)
	endedSessions(t, m, 1000, time.Now())
	db := filepath.Join(state, store.DBFile)
	before := fileSize(t, db)
	endedSessions(t, m, 1000, time.Now())
	if after := fileSize(t, db); after <= before {
		t.Fatalf("1,000 more sessions left the registry at %d bytes (was %d)", after, before)
	}
}

// A follower at the head of the log sees every new event, densely, across compactions; one
// the window moves past fails rather than skipping events.
func TestEventsFollowAcrossCompaction(t *testing.T) {
	m, _ := openRetentionManager(t, stateDir(t))
	r := retention.Policy{MaxEnded: 5}
	endedSessions(t, m, 20, time.Now().Add(-time.Hour))
	var head uint64
	m.reg.View(func(tx *store.Tx) error { head = tx.LastSeq(); return nil })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	followed := make(chan store.Event, 1000)
	done := make(chan error, 1)
	go func() {
		done <- m.Events(ctx, head, true, func(ev store.Event) error { followed <- ev; return nil })
	}()
	// A slow reader from the start: it holds its first page while the window moves on.
	release := make(chan struct{})
	slow := make(chan error, 1)
	go func() {
		first := true
		slow <- m.Events(ctx, 0, true, func(store.Event) error {
			if first {
				first = false
				<-release
			}
			return nil
		})
	}()

	for range 3 {
		// update broadcasts like the daemon's writes, so followers wake.
		endedSessions(t, m, 10, time.Now())
		m.reg.changed.broadcast()
		m.retainer.Pass(m.ctx, r, true)
	}
	var last uint64
	m.reg.View(func(tx *store.Tx) error { last = tx.LastSeq(); return nil })
	next := head + 1
	for next <= last {
		select {
		case ev := <-followed:
			if ev.Seq != next {
				t.Fatalf("follower got %d, want %d", ev.Seq, next)
			}
			next++
		case err := <-done:
			t.Fatalf("follower ended: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatalf("follower stuck before %d of %d", next, last)
		}
	}
	close(release)
	select {
	case err := <-slow:
		var ce *store.CompactedError
		if !errors.As(err, &ce) {
			t.Fatalf("slow reader: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a reader the window moved past was not stopped")
	}
}

// A session a live session descends from is never removed, however old; prune says so.
func TestRetentionKeepsAncestorsOfLive(t *testing.T) {
	m, _ := openRetentionManager(t, stateDir(t))
	old := endedSessions(t, m, 3, time.Now().Add(-48*time.Hour))
	grandparent, parent := old[0], old[1]
	// parent is grandparent's child; a live child of parent runs.
	parent.ParentID = grandparent.ID
	child := &store.Record{ID: "ses_" + strings.Repeat("f", 32), ParentID: parent.ID, CreatedAt: time.Now()}
	if _, err := m.reg.Update(func(tx *store.Tx) error {
		if err := tx.Save(parent); err != nil {
			return err
		}
		if err := tx.Create(child, nil, nil); err != nil {
			return err
		}
		if err := tx.Transition(child, store.Launching); err != nil {
			return err
		}
		return tx.Transition(child, store.Running)
	}); err != nil {
		t.Fatal(err)
	}
	res, err := m.Prune(time.Hour, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 1 || res.Removed[0].Record.ID != old[2].ID || len(res.Kept) != 2 || res.Kept[0].Record.ID != grandparent.ID || res.Kept[1].Record.ID != parent.ID {
		t.Fatalf("prune --dry-run: %+v", res)
	}
	m.retainer.Pass(m.ctx, retention.Policy{MaxAge: time.Hour}, true)
	list, _ := m.List(true)
	var ids []string
	for _, r := range list {
		ids = append(ids, r.ID)
	}
	slices.Sort(ids)
	want := []string{grandparent.ID, parent.ID, child.ID}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("after retention: %v, want %v", ids, want)
	}
}

// prune: --dry-run removes nothing; --until keeps what ended since; without it every ended
// session goes, staged ones stay; what went is measured.
func TestPrune(t *testing.T) {
	m, _ := openRetentionManager(t, stateDir(t))
	old := endedSessions(t, m, 3, time.Now().Add(-2*time.Hour))
	recent := endedSessions(t, m, 2, time.Now())
	staged, err := m.Stage(StageOptions{Capsule: capsule(t, "true", "")})
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Prune(time.Hour, true)
	if err != nil || len(res.Removed) != 3 || res.Removed[0].Record.ID != old[0].ID || res.Bytes <= 0 {
		t.Fatalf("dry run: %+v %v", res, err)
	}
	if list, _ := m.List(true); len(list) != 6 {
		t.Fatalf("a dry run removed sessions: %d left", len(list))
	}
	if res, err = m.Prune(time.Hour, false); err != nil || len(res.Removed) != 3 || res.Bytes <= 0 || res.EventsCompacted != 3*4 {
		t.Fatalf("prune --until 1h: %+v %v", res, err)
	}
	for _, rec := range old {
		if _, err := os.Stat(rec.RecordsDir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("records of a pruned session: %v", err)
		}
	}
	if res, err = m.Prune(0, false); err != nil || len(res.Removed) != 2 || res.Removed[1].Record.ID != recent[1].ID {
		t.Fatalf("prune: %+v %v", res, err)
	}
	if list, _ := m.List(true); len(list) != 1 || list[0].ID != staged.ID {
		t.Fatalf("after prune: %+v", list)
	}
	if _, err := m.Prune(-time.Second, false); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("negative --until: %v", err)
	}
}

// The daemon's loop: sessions that end are removed shortly after, past the bound.
func TestRetainAfterEnds(t *testing.T) {
	m, _ := openRetentionManager(t, stateDir(t))
	m.Retain(retention.Policy{MaxEnded: 2, Interval: time.Hour})
	dir := capsule(t, "true", "")
	var ids []string
	for range 5 {
		rec := run(t, m, StageOptions{Capsule: dir})
		waitEnd(t, m, rec.ID)
		ids = append(ids, rec.ID)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, _ := m.List(true)
		if len(list) == 2 && list[0].ID == ids[3] && list[1].ID == ids[4] {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sessions after 5 ends under --retain-ended 2: %d", len(list))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// mountTmpfs mounts a tmpfs of size bytes on a new directory whose parents sessions' uids
// can pass, and unmounts it when the test is done.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	testenv.NeedRoot(t, "mounting a tmpfs")
	dir := stateDir(t)
	testenv.Need(t, "a tmpfs mount", syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0711"))
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes a file until the filesystem has no room left.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	for _, n := range []int{64 << 10, 4 << 10, 512, 1} {
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				break
			}
		}
	}
}

// A nearly full state directory refuses new sessions with ResourceExhausted, naming itself and
// its free space, and counts a disk_full limit; a registry commit that meets a full disk is
// rolled back whole and says so; once there is room again everything works and the registry
// is intact.
func TestStageRefusedWhenDiskFull(t *testing.T) {
	state := mountTmpfs(t, "32m")
	m, obs := openRetentionManager(t, state)
	dir := capsule(t, "true", "")
	before, err := m.Stage(StageOptions{Capsule: dir})
	if err != nil {
		t.Fatal(err)
	}
	ballast := filepath.Join(state, "ballast")
	fill(t, ballast)

	_, err = m.Stage(StageOptions{Capsule: dir})
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "the state directory "+state+" has ") || !strings.Contains(err.Error(), "free of 32.0 MiB") || !strings.Contains(err.Error(), "roostctl prune") {
		t.Fatalf("stage on a full state dir: %v", err)
	}
	t.Log(err)
	if !slices.Equal(obs.limits, []string{store.LimitDiskFull}) {
		t.Fatalf("limits counted: %v", obs.limits)
	}

	// Past the check (as a session's end would be): bbolt's commit fails and rolls back.
	var seqBefore uint64
	m.reg.View(func(tx *store.Tx) error { seqBefore = tx.LastSeq(); return nil })
	big := &store.Record{ID: "ses_" + strings.Repeat("e", 32)}
	_, err = m.reg.Update(func(tx *store.Tx) error { return tx.Create(big, make([]byte, 4<<20), nil) })
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "writing the registry") || !strings.Contains(err.Error(), state) {
		t.Fatalf("a registry commit on a full disk: %v", err)
	}
	t.Log(err)
	m.reg.View(func(tx *store.Tx) error {
		if _, err := tx.Get(big.ID); !errdefs.IsNotFound(err) {
			t.Errorf("the failed commit left its session: %v", err)
		}
		if tx.LastSeq() != seqBefore {
			t.Errorf("the failed commit left an event: %d, was %d", tx.LastSeq(), seqBefore)
		}
		return nil
	})

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Stage(StageOptions{Capsule: dir}); err != nil {
		t.Fatalf("stage once there is room: %v", err)
	}
	big = &store.Record{ID: big.ID}
	if _, err := m.reg.Update(func(tx *store.Tx) error { return tx.Create(big, make([]byte, 4<<20), nil) }); err != nil {
		t.Fatalf("the big commit once there is room: %v", err)
	}
	m.Close()

	// The file is whole: bbolt's own consistency check, and every record reads.
	db, err := bolt.Open(filepath.Join(state, store.DBFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	}); err != nil {
		t.Fatalf("registry check: %v", err)
	}
	db.Close()
	m2, _ := openRetentionManager(t, state)
	list, err := m2.List(true)
	if err != nil || len(list) != 3 || list[0].ID != before.ID {
		t.Fatalf("after reopening: %d sessions, %v", len(list), err)
	}
}

func TestDiskReserve(t *testing.T) {
	for _, c := range []struct{ size, want uint64 }{
		{32 << 20, 4 << 20}, {1 << 30, (1 << 30) / 100}, {1 << 40, 64 << 20}, {0, 4 << 20},
	} {
		if got := diskReserve(c.size); got != c.want {
			t.Errorf("reserve of %d: %d, want %d", c.size, got, c.want)
		}
	}
	if store.SizeOf(0) != "0 B" || store.SizeOf(32<<20) != "32.0 MiB" || store.SizeOf(1536) != "1.5 KiB" {
		t.Errorf("sizeOf: %s %s %s", store.SizeOf(0), store.SizeOf(32<<20), store.SizeOf(1536))
	}
}

// BenchmarkPSAfter10k is `roostctl ps --all` (List, and each record as the API shows it) once
// 10,000 sessions have run and ended, keeping them all and under --retain-ended 100 (a pass
// after every 100 ends, as the daemon's loop does); it reports the registry file's size, the
// sessions listed and the events kept.
func BenchmarkPSAfter10k(b *testing.B) {
	for _, c := range []struct {
		name string
		r    retention.Policy
	}{{"keep-all", retention.Policy{}}, {"retain-ended-100", retention.Policy{MaxEnded: 100}}} {
		b.Run(c.name, func(b *testing.B) {
			state := stateDir(b)
			m, _ := openRetentionManager(b, state)
			base := time.Now().Add(-time.Hour)
			for i := range 100 {
				endedSessions(b, m, 100, base.Add(time.Duration(100*i)*time.Second))
				if c.r.Enabled() {
					m.retainer.Pass(m.ctx, c.r, false)
				}
			}
			var n int
			for b.Loop() {
				// What the List RPC does for ps --all: the records, then each one's log
				// counts (the file reads of server.SessionProto).
				list, err := m.List(true)
				if err != nil {
					b.Fatal(err)
				}
				for _, rec := range list {
					_ = LogStats(rec)
				}
				n = len(list)
			}
			var events uint64
			m.reg.View(func(tx *store.Tx) error { events = tx.LastSeq() - tx.Compaction().Through; return nil })
			b.ReportMetric(float64(fileSize(b, filepath.Join(state, store.DBFile))), "db-bytes")
			b.ReportMetric(float64(n), "sessions")
			b.ReportMetric(float64(events), "events")
		})
	}
}
