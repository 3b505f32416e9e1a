package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/ledger"
)

// etcdCall is one call's worst case in the etcd tests: the least block, and the most an
// admitter asks for.
const etcdCall = 1000

// etcdNode is one fleet node of TestFleetOnEtcd: its ledger, its fleet node, and its own way
// to the cluster, which the test cuts.
type etcdNode struct {
	name, dir string
	link      *etcdtest.Link
	store     *etcdstore.Store
	led       *ledger.Ledger
	node      *fleet.Node
	// refused counts the admissions its allowance refused.
	refused atomic.Int64
}

// etcdFleet is the fleet under test and its invariant's checker.
type etcdFleet struct {
	t     *testing.T
	c     *etcdtest.Cluster
	admin fleet.Store
	day   string
	nodes []*etcdNode

	ceiling   int64
	violation atomic.Pointer[string]
	checks    atomic.Int64
}

func (f *etcdFleet) fail(msg string) { f.violation.CompareAndSwap(nil, &msg) }

// check is the invariant, read while everything runs: Σ spent ≤ Σ granted ≤ ceiling, and
// granted is Σ of what the blocks hold. The ledgers are read before the store: no node
// gives tokens back during the test (never idle, the ceiling only raised), so granted only
// grows and what was spent when the ledgers were read is within what is granted when the
// store is. A read the store fails (a member cut off, an election) checks nothing.
func (f *etcdFleet) check(ctx context.Context) {
	var spent int64
	for _, n := range f.nodes {
		_, charged, reserved, err := n.led.Funded(f.day)
		if err != nil {
			f.fail(fmt.Sprintf("%s: %v", n.name, err))
			return
		}
		spent += charged + reserved
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	d, err := fleet.ReadDay(rctx, f.admin, "", f.day)
	if err != nil {
		return
	}
	f.checks.Add(1)
	var held int64
	for _, nd := range d.Nodes {
		held += nd.Held
	}
	if spent > d.Granted || d.Granted > d.Ceiling || held != d.Granted {
		f.fail(fmt.Sprintf("spent %d, granted %d (blocks hold %d), ceiling %d", spent, d.Granted, held, d.Ceiling))
	}
}

// raise lifts the day's ceiling by tokens, retrying through whatever fault is on: the Txn
// writes the same each time, so an ambiguous error is harmless.
func (f *etcdFleet) raise(tokens int64) {
	f.ceiling += tokens
	f.until("the ceiling raised to "+fmt.Sprint(f.ceiling), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return fleet.SetCeiling(ctx, f.admin, "", f.day, f.ceiling) == nil
	})
}

// granted is what the store says is granted, -1 when it cannot say now.
func (f *etcdFleet) granted() int64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d, err := fleet.ReadDay(ctx, f.admin, "", f.day)
	if err != nil {
		return -1
	}
	return d.Granted
}

// headroom is what n may still admit of what it holds.
func (n *etcdNode) headroom(day string) int64 {
	a, charged, reserved, _ := n.led.Funded(day)
	return a.Tokens - charged - reserved
}

// dry says the fleet spent its ceiling: all of it granted, nothing undecided, no node with
// room for one more call.
func (f *etcdFleet) dry() bool {
	if f.granted() != f.ceiling {
		return false
	}
	for _, n := range f.nodes {
		if n.node.Status().Pending > 0 || n.headroom(f.day) >= etcdCall {
			return false
		}
	}
	return true
}

// until polls cond until it holds, failing the test at a deadline no healthy run nears.
func (f *etcdFleet) until(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("waiting for %s: not within 30s; %s", what, f.describe())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (f *etcdFleet) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ceiling %d granted %d;", f.ceiling, f.granted())
	for _, n := range f.nodes {
		s := n.node.Status()
		a, c, r, _ := n.led.Funded(f.day)
		fmt.Fprintf(&b, " %s: allowance %d charged %d reserved %d pending %d unreachable %v;", n.name, a.Tokens, c, r, s.Pending, s.Unreachable)
	}
	return b.String()
}

// TestFleetOnEtcd runs the fleet protocol on a real 3-member etcd cluster: four nodes, each
// with its own ledger and its own client link, admit and settle as fast as they can while
// the test raises the ceiling a step at a time and puts the cluster through its faults: the
// leader killed while grants are in flight, one node's client blackholed and healed, the
// leader partitioned from the other members and healed. Each step spends its ceiling. The
// invariant is checked throughout; at the end every block has exactly one holder, which
// keeps it as the store has it, every charge is one an admitter settled, and the ceiling is
// spent to within one call per node.
func TestFleetOnEtcd(t *testing.T) {
	const nodes, admitters = 4, 8
	const step = 150 * etcdCall
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	c.WaitLeader(t)
	f := &etcdFleet{t: t, c: c, admin: etcdstore.FromClient(c.Client(t)), day: time.Now().UTC().Format(time.DateOnly)}
	f.raise(step)
	for i := range nodes {
		n := &etcdNode{name: fmt.Sprintf("n%d", i), dir: shmDir(t), link: c.Link()}
		var err error
		if n.store, err = etcdstore.New(etcdstore.Config{Endpoints: n.link.Endpoints(), DialTimeout: 2 * time.Second}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.store.Close() })
		if n.led, err = ledger.Open(ledger.Config{Path: filepath.Join(n.dir, ledger.File), Fleet: true, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		// Never idle within the test: a node gives nothing back, which the checker relies on.
		n.node, err = fleet.Open(fleet.Config{Store: n.store, Node: n.name, StateDir: n.dir, Ledger: n.led,
			MinBlock: etcdCall, MaxBlock: 4 * etcdCall, Share: 2 * nodes, IdleAfter: time.Hour,
			Tick: 10 * time.Millisecond, Timeout: 300 * time.Millisecond})
		if err != nil {
			n.led.Close()
			t.Fatal(err)
		}
		f.nodes = append(f.nodes, n)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			for _, n := range f.nodes {
				n.node.Close()
				n.led.Close()
			}
		}
	})

	ctx, stopAll := context.WithCancel(context.Background())
	defer stopAll()
	var billed atomic.Int64
	var wg sync.WaitGroup
	for i, n := range f.nodes {
		for a := range admitters {
			session := fmt.Sprint("s", a)
			if err := n.led.Register(ledger.Session{ID: session, Capsule: "c"}); err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(a)))
				for ctx.Err() == nil {
					billed.Add(f.spendOnce(ctx, n, session, rng))
				}
			}()
		}
	}
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		for ctx.Err() == nil {
			f.check(ctx)
		}
	}()
	// grantsUnderWay waits until the fleet has taken a block or two of the step just raised:
	// the nodes are granting now.
	grantsUnderWay := func(from int64) {
		f.until("grants under way", func() bool { return f.granted() >= from+2*etcdCall })
	}

	began := time.Now()
	f.until("the first ceiling spent", f.dry)

	// The leader killed while grants are in flight: a node's Txn sent to it has an outcome
	// the node must find out by reading.
	from := f.ceiling
	f.raise(step)
	grantsUnderWay(from)
	old := c.Leader()
	if old == nil {
		old = c.WaitLeader(t)
	}
	old.Kill(t)
	f.until("a new leader", func() bool { l := c.Leader(); return l != nil && l != old })
	mid := f.granted()
	f.until("grants under the new leader", func() bool { return f.granted() > mid })
	old.Restart(t)
	f.until("the ceiling spent past the leader's death", f.dry)

	// One node's client blackholed: it spends what it holds, then refuses; the others spend
	// the rest. Healed, it takes blocks again.
	cut := f.nodes[0]
	cut.link.Blackhole()
	f.raise(step)
	f.until(cut.name+" unreachable", func() bool { return cut.node.Status().Unreachable })
	f.until(cut.name+" spent what it holds", func() bool { return cut.headroom(f.day) < etcdCall })
	refusedBefore := cut.refused.Load()
	f.until(cut.name+" refusing", func() bool { return cut.refused.Load() > refusedBefore })
	f.until("the others granted the rest", func() bool { return f.granted() == f.ceiling })
	cut.link.Heal()
	cut.link.DropConnections()
	f.until(cut.name+" reachable again", func() bool { return !cut.node.Status().Unreachable })
	from = f.ceiling
	f.raise(step)
	grantsUnderWay(from)
	f.until("the ceiling spent with "+cut.name+" back", f.dry)

	// An intra-etcd partition: the leader cut off from the two others, which elect their
	// own; clients reaching the cut member fail there and the nodes try again.
	from = f.ceiling
	f.raise(step)
	grantsUnderWay(from)
	alone := c.Leader()
	if alone == nil {
		alone = c.WaitLeader(t)
	}
	c.Partition([]*etcdtest.Member{alone}, c.Followers())
	f.until("a majority leader", func() bool { l := c.Leader(); return l != nil && l != alone })
	mid = f.granted()
	f.until("grants in the majority", func() bool { return f.granted() > mid })
	c.Heal()
	f.until("the ceiling spent past the partition", f.dry)

	stopAll()
	wg.Wait()
	<-checked
	// A status is as of its node's last look, and a look that began before the fleet went
	// dry may still be writing a block the pool no longer has (its Txn will lose the
	// compare): wait for a look begun after, which settles it and starts none.
	quiet := time.Now()
	f.until("every node's look after the last", func() bool {
		for _, n := range f.nodes {
			if s := n.node.Status(); !s.Looked.After(quiet) || s.Pending > 0 {
				return false
			}
		}
		return true
	})
	f.check(context.Background())
	if v := f.violation.Load(); v != nil {
		t.Fatalf("invariant broken: %s", *v)
	}
	var charged int64
	for _, n := range f.nodes {
		_, c, r, err := n.led.Funded(f.day)
		if err != nil || r != 0 {
			t.Fatalf("%s: %d still reserved, %v", n.name, r, err)
		}
		charged += c
	}
	if charged != billed.Load() {
		t.Errorf("charged %d, but the admitters settled %d", charged, billed.Load())
	}
	if f.ceiling-charged >= nodes*etcdCall {
		t.Errorf("%d of the ceiling %d unspent: more than one call (%d) per node", f.ceiling-charged, f.ceiling, etcdCall)
	}
	for _, n := range f.nodes {
		if s := n.node.Status(); s.Pending > 0 {
			t.Errorf("%s: %d writes undecided at the end", n.name, s.Pending)
		}
		n.node.Close()
		n.led.Close()
	}
	closed = true
	f.holders()
	t.Logf("%s: %d checks; charged %d of %d; %s refused %d admissions", time.Since(began).Round(time.Millisecond), f.checks.Load(), charged, f.ceiling, cut.name, cut.refused.Load())
}

// spendOnce admits one call on n and settles it, returning what it was charged; 0 when
// refused.
func (f *etcdFleet) spendOnce(ctx context.Context, n *etcdNode, session string, rng *rand.Rand) int64 {
	changed := n.led.Changed()
	want := 1 + rng.Int64N(etcdCall)
	r, err := n.led.Admit(ledger.Admission{SessionID: session, Tokens: want})
	if err != nil {
		var refusal *ledger.Refusal
		if !errors.As(err, &refusal) || refusal.Limit != ledger.LimitFleet {
			f.fail(fmt.Sprintf("%s: admission refused otherwise than at the fleet: %v", n.name, err))
		}
		n.refused.Add(1)
		// A block taken changes the ledger; the timer only lets the admitter see the end.
		select {
		case <-changed:
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
		return 0
	}
	used := ledger.Usage{Input: rng.Int64N(want/2 + 1)}
	used.Output = want/2 + rng.Int64N(want-want/2-used.Input+1)
	s, err := n.led.Settle(session, r.ID, used)
	if err != nil {
		f.fail(fmt.Sprintf("%s: settling %s: %v", n.name, r.ID, err))
		return 0
	}
	return s.Charged
}

// holders checks, with every node closed, that each block in the store is held by the node
// it names and by no other, as the store has it, and that no node holds a block the store
// has not nor left a write undecided. It reads the nodes' fleet files as fleet's File
// layout has them: v1/intents, v1/blocks/<day>/<id>.
func (f *etcdFleet) holders() {
	t := f.t
	type heldBlock struct {
		Tokens   int64 `json:"tokens"`
		Returned int64 `json:"returned"`
	}
	claims := map[string][]string{}
	held := map[string]map[string]heldBlock{}
	for _, n := range f.nodes {
		db, err := bolt.Open(filepath.Join(n.dir, fleet.File), 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		held[n.name] = map[string]heldBlock{}
		err = db.View(func(tx *bolt.Tx) error {
			root := tx.Bucket([]byte("v1"))
			if root == nil {
				return fmt.Errorf("%s: no v1 bucket", n.name)
			}
			if k, _ := root.Bucket([]byte("intents")).Cursor().First(); k != nil {
				t.Errorf("%s: write of block %s left undecided", n.name, k)
			}
			day := root.Bucket([]byte("blocks")).Bucket([]byte(f.day))
			if day == nil {
				return nil
			}
			return day.ForEach(func(k, v []byte) error {
				var b heldBlock
				if err := json.Unmarshal(v, &b); err != nil {
					return fmt.Errorf("%s: block %s: %w", n.name, k, err)
				}
				held[n.name][string(k)] = b
				claims[string(k)] = append(claims[string(k)], n.name)
				return nil
			})
		})
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	prefix := fleet.DefaultPrefix + "days/" + f.day + "/blocks/"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kvs, _, err := f.admin.Get(ctx, prefix, true)
	if err != nil {
		t.Fatal(err)
	}
	inStore := map[string]bool{}
	for _, kv := range kvs {
		id := strings.TrimPrefix(kv.Key, prefix)
		var b fleet.Block
		if err := json.Unmarshal(kv.Value, &b); err != nil {
			t.Fatalf("block %s: %v", id, err)
		}
		inStore[id] = true
		if b.State == fleet.StateVoid {
			if len(claims[id]) > 0 {
				t.Errorf("void block %s is held by %v", id, claims[id])
			}
			continue
		}
		if len(claims[id]) != 1 || claims[id][0] != b.Node {
			t.Errorf("block %s of %s is held by %v", id, b.Node, claims[id])
			continue
		}
		if h := held[b.Node][id]; h.Tokens != b.Tokens || h.Returned != b.Returned {
			t.Errorf("block %s: the store has %+v, its node %+v", id, b, h)
		}
	}
	for id, who := range claims {
		if !inStore[id] {
			t.Errorf("%v hold block %s, which the store has not", who, id)
		}
	}
	if len(inStore) == 0 {
		t.Error("the store has no blocks")
	}
}

// shmDir is a directory on tmpfs when there is one: the test is of the protocol, and an
// fsync per admission on a loaded disk would only slow it.
func shmDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/dev/shm", "fleet-etcd-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
