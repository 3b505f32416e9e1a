package session

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/session/dirs"
	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/artifact"
	"roost.dev/roost/pkg/spawn"
	"roost.dev/roost/pkg/workdir"
)

// boundsLimitEvent waits for the session.limit event of id whose detail starts with
// limit+": " and returns its detail.
func boundsLimitEvent(t *testing.T, m *Manager, id, limit string) string {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var found string
		m.Events(context.Background(), 0, false, func(ev store.Event) error {
			if ev.Type == store.EventLimit && ev.SessionID == id && strings.HasPrefix(ev.Detail, limit+": ") {
				found = ev.Detail
			}
			return nil
		})
		if found != "" {
			return found
		}
	}
	t.Fatalf("no %s event for %s: %s", store.EventLimit, id, limit)
	return ""
}

// 300,000 empty files take no blocks worth counting but drain the host's inodes: the
// session ends at workdir_max_inodes, long before it has made them all.
func TestBoundsInodeFlood(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t,
		`i=0; while [ $i -lt 300000 ]; do : > f$i; i=$((i+1)); done; echo made them all; sleep 10`,
		"capabilities:\n  resources:\n    workdir_max_inodes: 10000\n")})
	rec = waitEnd(t, m, rec.ID)
	if rec.ExitStatus != store.StatusTerminated || !strings.Contains(rec.Detail, "the workdir and home hold ") ||
		!strings.Contains(rec.Detail, " files and directories, past resources.workdir_max_inodes (10000)") {
		t.Fatalf("end: %s %q", rec.ExitStatus, rec.Detail)
	}
	if out, _ := logs(t, m, rec.ID); strings.Contains(out, "made them all") {
		t.Fatal("the program made all its files before the guard stopped it")
	}
	if ev := boundsLimitEvent(t, m, rec.ID, store.LimitWorkdirInodes); !strings.Contains(ev, "past resources.workdir_max_inodes (10000)") {
		t.Fatalf("event: %q", ev)
	}
}

// boundsDeepScript builds, with cd into one relative directory at a time, a path of 300
// levels of 250-character names (75 KB: far past PATH_MAX), then writes 8 MB at its bottom.
var boundsDeepScript = `n=` + strings.Repeat("d", 250) + `; i=0
while [ $i -lt 300 ]; do mkdir $n && cd -P $n || exit 9; i=$((i+1)); done
head -c 8000000 /dev/urandom > big && echo wrote; sleep 10`

// What lies past PATH_MAX is measured like anything else.
func TestBoundsDeepPath(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, boundsDeepScript,
		"capabilities:\n  resources:\n    workdir_max_bytes: 4194304\n")})
	rec = waitEnd(t, m, rec.ID)
	t.Logf("ran %s: %s", rec.EndedAt.Sub(rec.StartedAt), rec.Detail)
	if rec.ExitStatus != store.StatusTerminated || !strings.Contains(rec.Detail, "past resources.workdir_max_bytes (4194304)") {
		t.Fatalf("end: %s %q", rec.ExitStatus, rec.Detail)
	}
	if ev := boundsLimitEvent(t, m, rec.ID, store.LimitWorkdirBytes); !strings.Contains(ev, "past resources.workdir_max_bytes (4194304)") {
		t.Fatalf("event: %q", ev)
	}
	// And rm takes it all away, deep as it is.
	if err := m.Remove(rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(rec.Workdir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the workdir survived rm: %v", err)
	}
}

// A child's workdir is its parent's to pay for: each holds less than the limit, together
// they hold more, and the parent is ended (its child with it).
func TestBoundsChildrenChargedToParent(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "head -c 2500000 /dev/urandom > mine; sleep 20",
		"  resources:\n    workdir_max_bytes: 4194304\n  spawn:\n    allow: [filler]\n")
	d.push("filler", "head -c 2500000 /dev/urandom > theirs; sleep 20", "  resources:\n    workdir_max_bytes: 4194304\n")
	parent := d.start("parent")
	res, err := d.spawn(parent, "filler", "", false)
	if err != nil {
		t.Fatal(err)
	}
	p := waitEnd(t, d.m, parent.ID)
	if p.ExitStatus != store.StatusTerminated || !strings.Contains(p.Detail, "the workdir, home and children's workdirs grew to") ||
		!strings.Contains(p.Detail, "past resources.workdir_max_bytes (4194304)") {
		t.Fatalf("parent: %s %q", p.ExitStatus, p.Detail)
	}
	c := waitEnd(t, d.m, res.SessionID)
	if c.ExitStatus != store.StatusTerminated || !strings.Contains(c.Detail, "its parent "+parent.ID+" ended") {
		t.Fatalf("child: %s %q", c.ExitStatus, c.Detail)
	}
	boundsLimitEvent(t, d.m, parent.ID, store.LimitWorkdirBytes)
	// rm of the parent takes the child: its record, its workdir, its home, and the
	// directory the parent's children worked in.
	boundsHeld(t, d, parent, c)
	if err := d.m.Remove(parent.ID); err != nil {
		t.Fatal(err)
	}
	boundsGone(t, d, parent, c)
}

// rm of an ended parent takes its ended children with it: records, workdirs, homes, and
// the parent's children/ directory.
func TestBoundsRemoveTakesChildren(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 60", "  spawn:\n    allow: [worker]\n")
	d.push("worker", "echo work > out.txt", "")
	parent := d.start("parent")
	var kids []*store.Record
	for i := 0; i < 3; i++ {
		res, err := d.spawn(parent, "worker", "", true)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := d.m.Get(res.SessionID)
		kids = append(kids, c)
	}
	if _, err := d.m.Stop(context.Background(), parent.ID, time.Second, ""); err != nil {
		t.Fatal(err)
	}
	boundsHeld(t, d, parent, kids...)
	if err := d.m.Remove(parent.ID); err != nil {
		t.Fatal(err)
	}
	boundsGone(t, d, parent, kids...)
}

// boundsHeld checks, before an rm, that the trees boundsGone looks for are there to go: every
// session's workdir, records and home, and the directory the parent's children work in (the
// parent has no sealed root).
func boundsHeld(t *testing.T, d *delegation, parent *store.Record, kids ...*store.Record) {
	t.Helper()
	dirs := []string{d.m.trees.Children(parent.ID)}
	for _, r := range append([]*store.Record{parent}, kids...) {
		dirs = append(dirs, r.Workdir, r.RecordsDir, d.m.trees.Home(r.ID))
	}
	for _, dir := range dirs {
		if _, err := os.Lstat(dir); err != nil {
			t.Errorf("before rm, %s is not there: %v", dir, err)
		}
	}
}

// boundsGone checks that nothing of a removed tree is left.
func boundsGone(t *testing.T, d *delegation, parent *store.Record, kids ...*store.Record) {
	t.Helper()
	for _, r := range append([]*store.Record{parent}, kids...) {
		if _, err := d.m.Get(r.ID); !errdefs.IsNotFound(err) {
			t.Errorf("%s is still recorded: %v", r.ID, err)
		}
		for _, dir := range []string{r.Workdir, r.RecordsDir, d.m.trees.Home(r.ID), d.m.trees.Children(r.ID)} {
			if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s of %s survived rm: %v", dir, r.ID, err)
			}
		}
	}
	if left, _ := os.ReadDir(filepath.Join(d.state, dirs.ChildrenDir)); len(left) != 0 {
		t.Errorf("children/ still holds %d directories", len(left))
	}
}

// Twenty snapshot children, one after another, each a copy of a parent's workdir of 1 MB:
// the parent's ceiling of 8 MiB holds. The copy is roostd's own, made at once, so it is
// judged before it is made: once a copy would take the parent past its limit, the spawn
// is refused (waiting for the guard would let the copy land first).
func TestBoundsSnapshotChildrenHoldTheCeiling(t *testing.T) {
	const limit = 8 << 20
	d := newDelegation(t, 3, 4)
	d.push("parent", "head -c 1000000 /dev/urandom > data; touch ready; sleep 60",
		fmt.Sprintf("  resources:\n    workdir_max_bytes: %d\n  spawn:\n    allow: [worker]\n    workdir_snapshot: [worker]\n", limit))
	d.push("worker", "ls data >/dev/null", fmt.Sprintf("  resources:\n    workdir_max_bytes: %d\n", limit))
	parent := d.start("parent")
	waitFile(t, filepath.Join(parent.Workdir, "ready"))
	var granted []*store.Record
	refused := 0
	for i := 0; i < 20; i++ {
		res, err := d.spawn(parent, "worker", "", true)
		if err != nil {
			var r *spawn.Refusal
			if !errors.As(err, &r) || r.Key != "capabilities.resources.workdir_max_bytes" || !strings.Contains(err.Error(), "past resources.workdir_max_bytes (8388608)") {
				t.Fatalf("spawn %d: %v", i, err)
			}
			refused++
			continue
		}
		if res.Completion == nil || res.Completion.Status != "ok" {
			t.Fatalf("spawn %d: %+v", i, res.Completion)
		}
		c, _ := d.m.Get(res.SessionID)
		granted = append(granted, c)
	}
	t.Logf("%d granted, %d refused", len(granted), refused)
	if refused == 0 || len(granted) < 3 {
		t.Fatalf("%d granted, %d refused", len(granted), refused)
	}
	roots, _ := d.m.guard.Roots(parent, true)
	if used, err := workdir.Measure(roots, workdir.Limits{}); err != nil || used.Bytes > limit {
		t.Fatalf("the parent's tree holds %d bytes (%v), past its %d", used.Bytes, err, limit)
	}
	if p, _ := d.m.Get(parent.ID); p.State != store.Running {
		t.Fatalf("the parent is %s (%q): within its ceiling, it should run on", p.State, p.Detail)
	}
	boundsLimitEvent(t, d.m, parent.ID, store.LimitWorkdirBytes)

	// rm refuses a tree with a live session in it; -f kills it first, then the whole tree
	// goes.
	if err := d.m.Remove(parent.ID); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "stop it before removing it") {
		t.Fatalf("rm of a live parent: %v", err)
	}
	boundsHeld(t, d, parent, granted...)
	if err := d.m.RemoveTree(context.Background(), parent.ID, true); err != nil {
		t.Fatal(err)
	}
	boundsGone(t, d, parent, granted...)
}

// A parent within its 100 MiB resources.workdir_max_bytes, holding a 1 GiB sparse file of
// 1 MiB of data, gets a snapshot child whose copy allocates what the file does: roostd, as
// root, writes the data and leaves the holes, not 1 GiB, and the copy reads the same.
func TestBoundsSnapshotOfASparseFile(t *testing.T) {
	const limit = 100 << 20
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 60",
		fmt.Sprintf("  resources:\n    workdir_max_bytes: %d\n  spawn:\n    allow: [worker]\n    workdir_snapshot: [worker]\n", limit))
	d.push("worker", "true", fmt.Sprintf("  resources:\n    workdir_max_bytes: %d\n", limit))
	parent := d.start("parent")
	data := make([]byte, 1<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	const size, at = 1 << 30, 512 << 20
	src := filepath.Join(parent.Workdir, "sparse")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, at); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	held := allocatedBytes(t, src)
	if held > size/2 {
		testenv.Need(t, "a temporary filesystem that keeps holes", errors.New("a sparse file took its full size"))
	}
	res, err := d.spawn(parent, "worker", "", true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Completion == nil || res.Completion.Status != "ok" {
		t.Fatalf("the child: %+v", res.Completion)
	}
	child, _ := d.m.Get(res.SessionID)
	cp := filepath.Join(child.Workdir, "sparse")
	// A few blocks of slack: the extent tree, rounding.
	if got := allocatedBytes(t, cp); got > held+16<<10 {
		t.Fatalf("the copy allocates %d bytes, its source %d: roostd wrote the holes", got, held)
	}
	g, err := os.Open(cp)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if fi, err := g.Stat(); err != nil || fi.Size() != size {
		t.Fatalf("the copy: %v, %v; want %d bytes", fi, err, size)
	}
	for _, c := range []struct {
		off  int64
		want []byte
	}{{at, data}, {0, make([]byte, 64<<10)}, {at - 64<<10, make([]byte, 64<<10)}, {size - 64<<10, make([]byte, 64<<10)}} {
		got := make([]byte, len(c.want))
		if _, err := g.ReadAt(got, c.off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, c.want) {
			t.Fatalf("the copy differs from its source at [%d, %d)", c.off, c.off+int64(len(got)))
		}
	}
}

// A snapshot whose copy would take the parent past what is left of its
// resources.workdir_max_bytes is refused before roostd copies a byte: no child workdir is
// made, in the parent's .roost or in roost's own state.
func TestBoundsSnapshotPastTheBudgetCopiesNothing(t *testing.T) {
	const limit = 8 << 20
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 60",
		fmt.Sprintf("  resources:\n    workdir_max_bytes: %d\n  spawn:\n    allow: [worker]\n    workdir_snapshot: [worker]\n", limit))
	d.push("worker", "true", fmt.Sprintf("  resources:\n    workdir_max_bytes: %d\n", limit))
	parent := d.start("parent")
	// 5 MiB of data: within the limit, but not twice over.
	data := make([]byte, 5<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(parent.Workdir, "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := d.spawn(parent, "worker", "", true)
	var r *spawn.Refusal
	if !errors.As(err, &r) || r.Key != "capabilities.resources.workdir_max_bytes" || !errdefs.IsPermissionDenied(err) {
		t.Fatalf("a snapshot past the budget: %v", err)
	}
	for _, want := range []string{"spawn.workdir_snapshot", "allocated", "past resources.workdir_max_bytes (8388608)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	for _, dir := range []string{filepath.Join(parent.Workdir, ".roost"), d.m.trees.Children(parent.ID)} {
		// Either may be there, made for children to come: empty.
		if entries, err := os.ReadDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) || len(entries) != 0 {
			t.Errorf("%s holds %d entries (%v): something was made for the refused child", dir, len(entries), err)
		}
	}
	boundsLimitEvent(t, d.m, parent.ID, store.LimitWorkdirBytes)
}

func allocatedBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// rm refuses a tree with a live session anywhere in it, naming it: here a child that
// outlives its parent for the grace of its stop (it ignores SIGTERM). -f kills it, and the
// whole tree goes.
func TestBoundsRemoveRefusesLiveDescendant(t *testing.T) {
	state := stateDir(t)
	store, err := artifact.Open(filepath.Join(state, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cfg, keys := delegationConfig(t, state, store, 3, 4)
	cfg.StopGrace = 20 * time.Second
	m, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := &delegation{t: t, m: m, store: store, keys: keys, state: state}
	t.Cleanup(func() { d.endAll(); d.m.Close() })
	d.push("parent", "sleep 2", "  spawn:\n    allow: [sleeper]\n")
	d.push("sleeper", "trap '' TERM; touch up; while :; do sleep 0.1; done", "")
	parent := d.start("parent")
	res, err := d.spawn(parent, "sleeper", "", false)
	if err != nil {
		t.Fatal(err)
	}
	child, _ := d.m.Get(res.SessionID)
	waitFile(t, filepath.Join(child.Workdir, "up"))
	// The parent's own end, not Wait's: that waits for the child too.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if rec, err := d.m.Get(parent.ID); err != nil || !rec.State.Live() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the parent did not end")
		}
	}
	err = d.m.Remove(parent.ID)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), child.ID) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("rm with a live child: %v", err)
	}
	if _, err := d.m.Get(child.ID); err != nil {
		t.Fatalf("a refused rm removed the child: %v", err)
	}
	if _, err := d.m.Get(parent.ID); err != nil {
		t.Fatalf("a refused rm removed the parent: %v", err)
	}
	boundsHeld(t, d, parent, child)
	start := time.Now()
	if err := d.m.RemoveTree(context.Background(), parent.ID, true); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("rm -f waited %s: it should kill, not wait out the grace", took)
	}
	boundsGone(t, d, parent, child)
}

// spawn.max_total_children bounds the children a session starts in its life, ended ones
// included.
func TestBoundsMaxTotalChildren(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 60", "  spawn:\n    allow: [worker]\n    max_total_children: 3\n")
	d.push("worker", "true", "  spawn:\n    max_total_children: 1\n")
	parent := d.start("parent")
	for i := 0; i < 3; i++ {
		if _, err := d.spawn(parent, "worker", "", true); err != nil {
			t.Fatalf("spawn %d: %v", i, err)
		}
	}
	_, err := d.spawn(parent, "worker", "", true)
	var r *spawn.Refusal
	if !errors.As(err, &r) || r.Reason != spawn.ReasonChildren || r.Key != "capabilities.spawn.max_total_children" ||
		!errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "3 children started already") {
		t.Fatalf("the fourth spawn: %v", err)
	}
	if kids, _ := d.m.reg.childrenOf(parent.ID); len(kids) != 3 {
		t.Fatalf("%d children recorded", len(kids))
	}
	if ev := boundsLimitEvent(t, d.m, parent.ID, store.LimitChildrenTotal); !strings.Contains(ev, "spawn.max_total_children 3") {
		t.Fatalf("event: %q", ev)
	}
}

// One tick of the workdir guard for a session whose workdir holds 100,000 files: the
// registry read for its children and the walk of every tree charged to it.
func BenchmarkGuardTick100k(b *testing.B) {
	state := stateDir(b)
	m, err := Open(testConfig(state, &recorder{}))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	dir := b.TempDir()
	os.WriteFile(filepath.Join(dir, "capsule.yaml"), []byte("name: test\nversion: 0.1.0\nrun:\n  command: [/bin/true]\ncapabilities:\n  spawn:\n    allow: [worker]\n"), 0o644)
	rec, err := m.Stage(StageOptions{Capsule: dir})
	if err != nil {
		b.Fatal(err)
	}
	os.MkdirAll(rec.Workdir, 0o700)
	for i := 0; i < 100_000; i++ {
		sub := filepath.Join(rec.Workdir, fmt.Sprintf("d%03d", i/1000))
		if i%1000 == 0 {
			os.Mkdir(sub, 0o755)
		}
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%06d", i)), nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	lim := workdir.Limits{Bytes: 10 << 30, Inodes: 1_000_000}
	b.ResetTimer()
	for b.Loop() {
		roots, _ := m.guard.Roots(rec, true)
		if u, err := workdir.Measure(roots, lim); err != nil || u.Inodes < 100_000 {
			b.Fatalf("%+v %v", u, err)
		}
	}
}
