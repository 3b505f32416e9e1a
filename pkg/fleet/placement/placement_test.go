package placement_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"go.uber.org/goleak"

	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet/directory"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/fleet/placement"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// giveUp bounds every wait for etcd to show something: a failure, not a measure of speed.
const giveUp = 60 * time.Second

func open(t *testing.T, endpoints []string) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.New(etcdstore.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// node is a registered node whose entry says what the test sets.
type node struct {
	name    string
	running atomic.Int64
	slots   atomic.Int64
	max     int
	classes []string
	warm    map[string]int
	staged  *placement.Staged
	r       *directory.Registrant
}

// stage is what the node does for a placed session: counts it, and lists its reservation
// for its entry's next write to settle.
func (n *node) stage(t *testing.T, d placement.Decision) {
	t.Helper()
	if err := n.staged.Check(d.Reservation); err != nil {
		t.Fatal(err)
	}
	n.running.Add(1)
	n.staged.Add(d.Reservation)
}

func register(t *testing.T, st directory.Store, n *node) *node {
	t.Helper()
	if n.classes == nil {
		n.classes = []string{"unconfined", "advisory", "scoped"}
	}
	n.staged = placement.NewStaged(n.name, "")
	r, err := directory.Register(directory.Config{
		Store: st, Node: n.name, Address: "127.0.0.1:7443", Classes: n.classes, StartedAt: time.Now(), Version: "v0.0.0-test",
		Capacity: func() directory.Capacity {
			return directory.Capacity{CPUs: 2, SessionsRunning: int(n.running.Load()), MaxSessions: n.max, SlotsUsed: int(n.slots.Load()), Warm: n.warm}
		},
		Settle: n.staged.Settle,
		TTL:    2 * time.Second, Interval: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	n.r = r
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return n
}

// waitListed waits until the directory lists every node reachable with the running count
// the test set.
func waitListed(t *testing.T, st *etcdstore.Store, nodes ...*node) {
	t.Helper()
	deadline := time.Now().Add(giveUp)
	for {
		listed, err := directory.List(context.Background(), st, "")
		if err == nil {
			ok := 0
			for _, l := range listed {
				for _, n := range nodes {
					if l.Node == n.name && l.Reachable && l.Capacity.SessionsRunning == int(n.running.Load()) {
						ok++
					}
				}
			}
			if ok == len(nodes) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the directory did not list %d nodes as set: %v %v", len(nodes), listed, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitSettled waits until no reservation is left: every node's entry counts what it staged.
func waitSettled(t *testing.T, st *etcdstore.Store) {
	t.Helper()
	deadline := time.Now().Add(giveUp)
	for {
		kvs, _, err := st.Get(context.Background(), directory.DefaultPrefix+"placement/", true)
		left := 0
		for _, kv := range kvs {
			if strings.Contains(kv.Key, "/res/") {
				left++
			}
		}
		if err == nil && left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("reservations not settled: %d left, %v", left, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newPlacer(t *testing.T, st placement.Store, self string, seed uint64) *placement.Placer {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed))
	var mu sync.Mutex
	p, err := placement.New(placement.Config{Store: st, Self: self, TTL: 3 * time.Second, Intn: func(n int) int {
		mu.Lock()
		defer mu.Unlock()
		return r.IntN(n)
	}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Sessions placed one after another, each counted by its node once staged, spread over every
// node and fill each to its bound, not past it; the next is refused as resource exhausted,
// every node's reason said.
func TestSpreadsAndFillsToTheBound(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	st := open(t, c.Endpoints())
	nodes := map[string]*node{}
	for _, name := range []string{"a", "b", "c"} {
		nodes[name] = register(t, st, &node{name: name, max: 4})
	}
	waitListed(t, st, nodes["a"], nodes["b"], nodes["c"])
	p := newPlacer(t, st, "a", 1)
	ctx := context.Background()
	for i := range 12 {
		d, err := p.Place(ctx, placement.Need{})
		if err != nil {
			t.Fatalf("placement %d: %v", i, err)
		}
		if got := len(d.Candidates); got != 3 {
			t.Fatalf("placement %d saw %d candidates, want 3: %+v", i, got, d.Candidates)
		}
		nodes[d.Node].stage(t, d)
		// Until the node's entry counts it, the session and its reservation both count:
		// a node looks full a moment early, never late.
		waitSettled(t, st)
	}
	for name, n := range nodes {
		if got := n.running.Load(); got != 4 {
			t.Errorf("node %s took %d sessions, want 4 (its bound)", name, got)
		}
	}
	_, err := p.Place(ctx, placement.Need{})
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a 13th placement on 3 full nodes: %v, want resource exhausted", err)
	}
	for _, name := range []string{"a: full", "b: full", "c: full"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("the refusal does not say %q: %v", name, err)
		}
	}
}

// Two entry nodes placing at once on one node whose entry never moves (it is slow to write)
// cannot together reserve more than its room: the fence refuses a reservation decided on a
// reading another one made stale.
func TestConcurrentEntriesCannotOverfill(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	st := open(t, c.Endpoints())
	register(t, st, &node{name: "target", max: 5})
	waitListed(t, st, &node{name: "target"})
	placers := []*placement.Placer{newPlacer(t, st, "entry-1", 1), newPlacer(t, st, "entry-2", 2)}
	var placed, full atomic.Int64
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			_, err := placers[i%2].Place(context.Background(), placement.Need{})
			switch {
			case err == nil:
				placed.Add(1)
			case errdefs.IsResourceExhausted(err):
				full.Add(1)
			default:
				t.Errorf("placement %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if placed.Load() != 5 || full.Load() != 11 {
		t.Fatalf("16 placements on a node with room for 5: %d placed, %d refused as full; want 5 and 11", placed.Load(), full.Load())
	}
}

// A reservation counts until its node's entry counts the session, in the write that deletes
// it; one whose entry node died mid-placement lapses with its lease, giving the room back.
func TestReservationsCountUntilTheEntryOrTheLeaseDoes(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	st := open(t, c.Endpoints())
	target := register(t, st, &node{name: "target", max: 2})
	waitListed(t, st, target)
	p := newPlacer(t, st, "entry", 1)
	ctx := context.Background()
	d, err := p.Place(ctx, placement.Need{})
	if err != nil {
		t.Fatal(err)
	}
	// Staged there: the node counts it, and its entry's write settles the reservation, so
	// it no longer counts on top of it: one slot is left, not none.
	target.stage(t, d)
	waitListed(t, st, target)
	if kvs, _, err := st.Get(ctx, directory.DefaultPrefix+"placement/target/res/", true); err != nil || len(kvs) != 0 {
		t.Fatalf("reservations left once the node counts its session: %v %v", kvs, err)
	}
	d2, err := p.Place(ctx, placement.Need{})
	if err != nil {
		t.Fatalf("the second of two slots: %v (first %+v)", err, d.Candidates)
	}
	if c := d2.Candidates[0]; c.InFlight != 0 || c.Running != 1 {
		t.Fatalf("the node as placement saw it: %+v, want running 1 and nothing in flight", c)
	}
	// The second placement's entry node dies before the node stages it: no count moves,
	// and the node is full until its reservation lapses.
	if _, err := p.Place(ctx, placement.Need{}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a third placement with one slot reserved and one used: %v, want resource exhausted", err)
	}
	deadline := time.Now().Add(giveUp)
	for {
		_, err := p.Place(ctx, placement.Need{})
		if err == nil {
			break
		}
		if !errdefs.IsResourceExhausted(err) || time.Now().After(deadline) {
			t.Fatalf("the reservation of a dead placement did not lapse: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A refused stage releases its reservation at once.
func TestReleaseGivesTheRoomBack(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	st := open(t, c.Endpoints())
	register(t, st, &node{name: "target", max: 1})
	waitListed(t, st, &node{name: "target"})
	p := newPlacer(t, st, "entry", 1)
	ctx := context.Background()
	d, err := p.Place(ctx, placement.Need{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Place(ctx, placement.Need{}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("with the one slot reserved: %v, want resource exhausted", err)
	}
	p.Release(ctx, &d)
	if _, err := p.Place(ctx, placement.Need{}); err != nil {
		t.Fatalf("after the release: %v", err)
	}
}

// A node holding a warm sandbox of the session's shape wins over emptier cold ones; the
// class a session needs filters nodes; a pinned node is taken or refused by name.
func TestWarmClassAndPinned(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	st := open(t, c.Endpoints())
	a := register(t, st, &node{name: "a", max: 10})
	b := register(t, st, &node{name: "b", max: 10, warm: map[string]int{"capsule x@1": 1}})
	s := register(t, st, &node{name: "s", max: 10, classes: []string{"unconfined", "advisory", "scoped", "sealed"}})
	b.running.Store(8)
	waitListed(t, st, a, b, s)
	ctx := context.Background()
	for seed := range uint64(10) {
		p := newPlacer(t, st, "a", seed)
		d, err := p.Place(ctx, placement.Need{Shapes: []string{"capsule x@1"}})
		if err != nil {
			t.Fatal(err)
		}
		p.Release(ctx, &d)
		if d.Node != "b" || !strings.Contains(d.Reason, "warm") {
			t.Fatalf("seed %d: placed on %s (%s), want b, the only warm node", seed, d.Node, d.Reason)
		}
		d, err = p.Place(ctx, placement.Need{Class: "sealed"})
		if err != nil {
			t.Fatal(err)
		}
		p.Release(ctx, &d)
		if d.Node != "s" {
			t.Fatalf("seed %d: a sealed session placed on %s, want s, the only node delivering sealed", seed, d.Node)
		}
		// Cold and unpinned, the fullest node never wins a draw of all three.
		d, err = p.Place(ctx, placement.Need{})
		if err != nil {
			t.Fatal(err)
		}
		p.Release(ctx, &d)
		if d.Node == "b" {
			t.Fatalf("seed %d: placed on b (8 of 10) over a and s (0 of 10): %+v", seed, d.Candidates)
		}
	}
	p := newPlacer(t, st, "a", 1)
	if _, err := p.Place(ctx, placement.Need{Class: "sealed", Node: "a"}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "nothing as strong as sealed") {
		t.Fatalf("a sealed session pinned to a node without sealed: %v, want failed precondition saying so", err)
	}
	if _, err := p.Place(ctx, placement.Need{Node: "nope"}); !errdefs.IsNotFound(err) {
		t.Fatalf("pinned to an unknown node: %v, want not found", err)
	}
	d, err := p.Place(ctx, placement.Need{Node: "b"})
	if err != nil || d.Node != "b" || d.Reason != "pinned (--node)" {
		t.Fatalf("pinned to b: %+v %v", d, err)
	}
}

// A node whose lease lapsed is never placed on: pinned to it, the refusal is unavailable and
// names it.
func TestUnreachableNodeIsNotPlacedOn(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	st := open(t, c.Endpoints())
	link := c.Link()
	cut, err := etcdstore.New(etcdstore.Config{Endpoints: link.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	gone := register(t, cut, &node{name: "gone", max: 10})
	here := register(t, st, &node{name: "here", max: 10})
	waitListed(t, st, gone, here)
	link.Blackhole()
	defer link.Heal()
	deadline := time.Now().Add(giveUp)
	for {
		listed, err := directory.List(context.Background(), st, "")
		if err == nil && len(listed) == 2 && !listed[0].Reachable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gone's lease did not lapse: %v %v", listed, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p := newPlacer(t, st, "here", 1)
	ctx := context.Background()
	for range 10 {
		d, err := p.Place(ctx, placement.Need{})
		if err != nil || d.Node != "here" {
			t.Fatalf("with gone unreachable: %+v %v, want here", d, err)
		}
		p.Release(ctx, &d)
	}
	_, err = p.Place(ctx, placement.Need{Node: "gone"})
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "gone: unreachable") {
		t.Fatalf("pinned to an unreachable node: %v, want unavailable naming it", err)
	}
}

// Ended sessions keep their id ranges until removed: a node whose ranges are all held is
// full, however few of its sessions run.
func TestEndedSessionsHoldTheirSlots(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	st := open(t, c.Endpoints())
	n := register(t, st, &node{name: "target", max: 3})
	n.slots.Store(3)
	waitListed(t, st, n)
	deadline := time.Now().Add(giveUp)
	for {
		_, err := newPlacer(t, st, "entry", 1).Place(context.Background(), placement.Need{})
		if errdefs.IsResourceExhausted(err) && strings.Contains(err.Error(), "full (3 of 3") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a node with every slot held by ended sessions: %v, want full", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Placements while the nodes settle the ones before (their entries written between a
// placement's reads) never overfill a node: a reservation and the count it turned into may
// both be seen, never neither. Refused as full a moment early, a placement is tried again.
func TestNeverOverfillsWhileNodesSettle(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	st := open(t, c.Endpoints())
	nodes := map[string]*node{}
	for _, name := range []string{"a", "b", "c"} {
		nodes[name] = register(t, st, &node{name: name, max: 4})
	}
	waitListed(t, st, nodes["a"], nodes["b"], nodes["c"])
	p := newPlacer(t, st, "entry", 7)
	placed := 0
	for deadline := time.Now().Add(giveUp); placed < 12; {
		d, err := p.Place(context.Background(), placement.Need{})
		switch {
		case err == nil:
			n := nodes[d.Node]
			n.stage(t, d)
			placed++
			if got := n.running.Load(); got > 4 {
				t.Fatalf("node %s holds %d sessions, past its bound of 4", d.Node, got)
			}
		case errdefs.IsResourceExhausted(err):
			time.Sleep(5 * time.Millisecond)
		default:
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 12 placed", placed)
		}
	}
}

// Many placements at once, from one entry node and from several, all land while there is
// room: placements that lose the fence to another try again (after a short random pause,
// till their deadline) rather than failing because the best node drew many of them.
// CI once saw 8 concurrent placements on one entry give up after 8 fenced tries in a row.
func TestConcurrentPlacementsAllLand(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	st := open(t, c.Endpoints())
	nodes := map[string]*node{}
	var all []*node
	for _, name := range []string{"n0", "n1", "n2", "n3", "n4"} {
		nodes[name] = register(t, st, &node{name: name, max: 100})
		all = append(all, nodes[name])
	}
	waitListed(t, st, all...)
	placers := []*placement.Placer{newPlacer(t, st, "n0", 1), newPlacer(t, st, "n1", 2), newPlacer(t, st, "n2", 3)}
	const perEntry = 32
	var mu sync.Mutex
	var wg sync.WaitGroup
	for e, p := range placers {
		for i := range perEntry {
			wg.Go(func() {
				d, err := p.Place(context.Background(), placement.Need{})
				if err != nil {
					t.Errorf("entry %d placement %d: %v", e, i, err)
					return
				}
				mu.Lock()
				nodes[d.Node].stage(t, d)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	total := 0
	for _, n := range all {
		total += int(n.running.Load())
	}
	if want := len(placers) * perEntry; total != want {
		t.Fatalf("%d sessions staged, want %d", total, want)
	}
}
