package fleet

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"roost.dev/roost/pkg/ledger"
)

var modelSeed = flag.Uint64("fleet.seed", 0, "run the fleet model test with this seed alone")

// modelStart is when the model's clock starts: noon, so that a run stays in one day.
var modelStart = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

const today = "2026-06-01"

// modelNode is one simulated roostd: its ledger and fleet node, swapped on a restart.
type modelNode struct {
	name, dir string
	// led is the ledger the checker reads: the live one, or a dead one's last.
	led atomic.Pointer[ledger.Ledger]

	// paused holds its admitters back, so that the node goes idle and gives tokens back.
	paused atomic.Bool

	mu    sync.Mutex
	alive bool
	node  *Node
	// up is closed while the node is alive; admitters of a dead node wait on it.
	up chan struct{}
}

type model struct {
	t      *testing.T
	seed   uint64
	st     *memStore
	nodes  []*modelNode
	call   int64 // one call's worst case
	stores []*faulty
	// violation is the first invariant violation seen; the checker runs under the store's
	// lock, so it records rather than fails.
	violation atomic.Pointer[string]
	checks    atomic.Int64
	began     time.Time
	// idle is the nodes' IdleAfter.
	idle time.Duration
}

// clock runs from noon at the pace of real time: idleness is real, the day one.
func (m *model) clock() time.Time { return modelStart.Add(time.Since(m.began)) }

func (m *model) open(n *modelNode, st Store) error {
	led, err := ledger.Open(ledger.Config{Path: filepath.Join(n.dir, ledger.File), Fleet: true, Clock: m.clock, TTL: time.Hour})
	if err != nil {
		return err
	}
	node, err := Open(Config{Store: st, Node: n.name, StateDir: n.dir, Ledger: led, Clock: m.clock,
		MinBlock: m.call, MaxBlock: 2 * m.call, Share: 20, IdleAfter: m.idle, Tick: 5 * time.Millisecond, Timeout: time.Second})
	if err != nil {
		led.Close()
		return err
	}
	n.led.Store(led)
	n.mu.Lock()
	n.node, n.alive, n.up = node, true, make(chan struct{})
	close(n.up)
	n.mu.Unlock()
	return nil
}

// kill stops a node as a crash would: its worker stops mid-way, its files close, its
// blocks stay with it. Graceful, it first gives back what it does not spend.
func (m *model) kill(n *modelNode, graceful bool) {
	n.mu.Lock()
	node := n.node
	n.alive, n.up = false, make(chan struct{})
	n.mu.Unlock()
	if graceful {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		// Whatever it could not give back it keeps: an error here is no failure.
		_ = node.Shutdown(ctx)
		cancel()
	} else {
		node.Close()
	}
	n.led.Load().Close()
}

// check is the invariant, at every applied Txn: Σ spent ≤ Σ granted ≤ ceiling, where
// granted is also Σ over the blocks of tokens less what they gave back, and spent is what
// every node's ledger charged and holds reserved against the day.
func (m *model) check() {
	m.checks.Add(1)
	k := keys{DefaultPrefix}
	ceiling, _ := strconv.ParseInt(string(m.st.kv[k.ceiling(today)].Value), 10, 64)
	granted, _ := strconv.ParseInt(string(m.st.kv[k.granted(today)].Value), 10, 64)
	var blocks int64
	for key, kv := range m.st.kv {
		if strings.HasPrefix(key, k.blocks(today)) {
			b, err := decodeBlock(kv)
			if err != nil {
				m.fail(err.Error())
				return
			}
			blocks += b.Tokens - b.Returned
		}
	}
	var spent int64
	for _, n := range m.nodes {
		if led := n.led.Load(); led != nil {
			_, charged, reserved, _ := led.Funded(today)
			spent += charged + reserved
		}
	}
	if spent > granted || granted > ceiling || blocks != granted {
		m.fail(fmt.Sprintf("spent %d, granted %d (blocks say %d), ceiling %d", spent, granted, blocks, ceiling))
	}
}

func (m *model) fail(msg string) { m.violation.CompareAndSwap(nil, &msg) }

// TestModel is the fleet ledger's model test: 10 nodes × 64 admitters spend a fleet ceiling
// through stores that drop, duplicate, delay and make replies ambiguous, while nodes are
// killed and restarted from their files. At every applied Txn Σ spent ≤ Σ granted ≤
// ceiling; at the end every block has exactly one holder, every charge is the one its
// admitter settled, and, nothing being lost, the ceiling is spent to within one call per
// node. -fleet.seed=N runs one seed.
func TestModel(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4, 5, 6}
	if *modelSeed != 0 {
		seeds = []uint64{*modelSeed}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			runModel(t, seed, faultRates{Down: 30, Lost: 30, Dup: 30, Late: 30, GetFail: 30, WatchFail: 100}, false)
			if t.Failed() {
				t.Logf("rerun: go test ./pkg/fleet -run 'TestModel' -fleet.seed=%d", seed)
			}
		})
	}
}

// TestModelForget is TestModel with a node forgotten midway, alive or dead, as an operator
// might in error: its blocks are written off while it may still be spending and giving
// back. The invariant holds throughout, and what is unspent at the end is at most a call
// per node beside what was written off.
func TestModelForget(t *testing.T) {
	seeds := []uint64{7, 8}
	if *modelSeed != 0 {
		seeds = []uint64{*modelSeed}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			runModel(t, seed, faultRates{Down: 30, Lost: 30, Dup: 30, Late: 30, GetFail: 30, WatchFail: 100}, true)
			if t.Failed() {
				t.Logf("rerun: go test ./pkg/fleet -run 'TestModelForget' -fleet.seed=%d", seed)
			}
		})
	}
}

func runModel(t *testing.T, seed uint64, rates faultRates, forget bool) {
	const nodes, admitters = 10, 64
	// Under the race detector, which slows every admission many times over, the fleet
	// spends a smaller ceiling: the same faults, fewer calls.
	ceiling := int64(300_000)
	if raceEnabled {
		ceiling = 100_000
	}
	m := &model{t: t, seed: seed, st: newMemStore(), call: 1000, began: time.Now(), idle: 20 * time.Millisecond}
	m.st.applied = m.check
	if err := SetCeiling(context.Background(), m.st, "", today, ceiling); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	for i := range nodes {
		m.nodes = append(m.nodes, &modelNode{name: fmt.Sprintf("n%02d", i), dir: fastDir(t)})
		m.stores = append(m.stores, &faulty{st: m.st, rng: rand.New(rand.NewPCG(seed, uint64(i))), rates: rates})
	}
	for i, n := range m.nodes {
		if err := m.open(n, m.stores[i]); err != nil {
			t.Fatal(err)
		}
	}

	var billed atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i, n := range m.nodes {
		for a := range admitters {
			session := fmt.Sprintf("s%d", a)
			wg.Add(1)
			go func() {
				defer wg.Done()
				arng := rand.New(rand.NewPCG(seed, uint64(i*admitters+a+1000)))
				var registered *ledger.Ledger
				for !stop.Load() {
					if n.paused.Load() {
						time.Sleep(time.Millisecond)
						continue
					}
					billed.Add(m.spendOnce(n, session, arng, &registered))
				}
			}()
		}
	}

	// The chaos phase: nodes killed and restarted while the stores misbehave.
	kills := 0
	var forgotten Forgotten
	for step := range 40 {
		if forget && step == 20 {
			var err error
			if forgotten, err = Forget(context.Background(), m.st, "", m.nodes[rng.IntN(nodes)].name); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Duration(2+rng.IntN(10)) * time.Millisecond)
		i := rng.IntN(nodes)
		n := m.nodes[i]
		n.mu.Lock()
		alive := n.alive
		n.mu.Unlock()
		switch {
		case rng.IntN(4) == 0:
			n.paused.Store(!n.paused.Load())
		case alive:
			m.kill(n, rng.IntN(2) == 0)
			kills++
		default:
			if err := m.open(n, m.stores[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The rest: every node up, the stores well, spending until the pool is dry.
	for i, n := range m.nodes {
		n.paused.Store(false)
		n.mu.Lock()
		alive := n.alive
		n.mu.Unlock()
		if !alive {
			if err := m.open(n, m.stores[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range m.stores {
		f.setOff(true)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !m.dry() {
		if time.Now().After(deadline) {
			t.Errorf("the fleet did not spend its ceiling: %s", m.describe())
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	m.st.flush()
	if v := m.violation.Load(); v != nil {
		t.Fatalf("invariant broken (seed %d): %s", seed, *v)
	}

	var charged, stranded int64
	for _, n := range m.nodes {
		_, c, r, err := n.led.Load().Funded(today)
		if err != nil || r != 0 {
			t.Fatalf("%s: %d still reserved, %v", n.name, r, err)
		}
		charged += c
		stranded += n.node.Status().Held - c
	}
	// Each node, restarted once more and never idle, finds out what its last run left
	// undecided; then all stop for the holders to be checked.
	m.idle = time.Hour
	for i, n := range m.nodes {
		m.kill(n, false)
		if err := m.open(n, m.stores[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range m.nodes {
		for n.node.Status().Pending > 0 {
			time.Sleep(time.Millisecond)
		}
		m.kill(n, false)
	}
	m.holders()
	t.Logf("seed %d: %d checks, %d kills; charged %d of %d, %d stranded, %d written off", seed, m.checks.Load(), kills, charged, ceiling, stranded, forgotten.WrittenOff)
	if charged != billed.Load() {
		t.Errorf("charged %d, but the admitters settled %d", charged, billed.Load())
	}
	if ceiling-charged >= int64(nodes)*m.call+forgotten.WrittenOff {
		t.Errorf("%d of the ceiling %d unspent: more than one call (%d) per node and the %d written off", ceiling-charged, ceiling, m.call, forgotten.WrittenOff)
	}
}

// fastDir is a directory for a node's files on tmpfs when there is one: the model tests
// the protocol, and every admission's fsync on a loaded disk would make it minutes long.
func fastDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/dev/shm", "fleet-model-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// spendOnce admits one call on n and settles it (on whichever run of n is up by then),
// returning what it was charged; 0 when refused. registered is the run of n the session
// was last registered with.
func (m *model) spendOnce(n *modelNode, session string, rng *rand.Rand, registered **ledger.Ledger) int64 {
	n.mu.Lock()
	up, alive := n.up, n.alive
	n.mu.Unlock()
	if !alive {
		select {
		case <-up:
		case <-time.After(10 * time.Millisecond):
		}
		return 0
	}
	led := n.led.Load()
	if led != *registered {
		if err := led.Register(ledger.Session{ID: session, Capsule: "c"}); err != nil {
			return 0
		}
		*registered = led
	}
	changed := led.Changed()
	want := 1 + rng.Int64N(m.call)
	r, err := led.Admit(ledger.Admission{SessionID: session, Tokens: want})
	if err != nil {
		var refusal *ledger.Refusal
		if errors.As(err, &refusal) && refusal.Limit != ledger.LimitFleet {
			m.fail("refused at " + refusal.Limit)
		}
		// A block taken (or a charge) changes the ledger; the timer only bounds the wait
		// of an admitter whose node died meanwhile.
		select {
		case <-changed:
		case <-time.After(50 * time.Millisecond):
		}
		return 0
	}
	// Most of what was reserved is spent, as a call's worst case is about its cost.
	used := ledger.Usage{Input: rng.Int64N(want/2 + 1)}
	used.Output = want/2 + rng.Int64N(want-want/2-used.Input+1)
	for {
		s, err := n.led.Load().Settle(session, r.ID, used)
		if err == nil {
			return s.Charged
		}
		time.Sleep(time.Millisecond)
	}
}

// dry says the pool is spent: nothing left to grant, nothing undecided, and no node with
// room for one more call.
func (m *model) dry() bool {
	k := keys{DefaultPrefix}
	ceiling, _ := strconv.ParseInt(m.st.value(k.ceiling(today)), 10, 64)
	granted, _ := strconv.ParseInt(m.st.value(k.granted(today)), 10, 64)
	if ceiling-granted > 0 {
		return false
	}
	for _, n := range m.nodes {
		s := n.node.Status()
		a, charged, reserved, _ := n.led.Load().Funded(today)
		if s.Pending > 0 || a.Tokens-charged-reserved >= m.call {
			return false
		}
	}
	return true
}

func (m *model) describe() string {
	k := keys{DefaultPrefix}
	var b strings.Builder
	fmt.Fprintf(&b, "ceiling %s granted %s;", m.st.value(k.ceiling(today)), m.st.value(k.granted(today)))
	for _, n := range m.nodes {
		s := n.node.Status()
		a, c, r, _ := n.led.Load().Funded(today)
		fmt.Fprintf(&b, " %s: allowance %d charged %d reserved %d pending %d unreachable %v;", n.name, a.Tokens, c, r, s.Pending, s.Unreachable)
	}
	return b.String()
}

// holders checks, with every node closed, that each block in the store is held by the node
// it names and by no other, and that each node holds only blocks the store gives it, as
// the store has them.
func (m *model) holders() {
	t := m.t
	k := keys{DefaultPrefix}
	claims := map[string][]string{}
	locals := map[string]*local{}
	for _, n := range m.nodes {
		loc, err := openLocal(filepath.Join(n.dir, File))
		if err != nil {
			t.Fatal(err)
		}
		defer loc.close()
		locals[n.name] = loc
		if len(loc.intents) > 0 {
			t.Errorf("%s: %d writes left undecided", n.name, len(loc.intents))
		}
		for id := range loc.blocks[today] {
			claims[id] = append(claims[id], n.name)
		}
	}
	kvs, _, _ := m.st.Get(context.Background(), k.blocks(today), true)
	inStore := map[string]bool{}
	for _, kv := range kvs {
		id := strings.TrimPrefix(kv.Key, k.blocks(today))
		b, err := decodeBlock(kv)
		if err != nil {
			t.Fatal(err)
		}
		inStore[id] = true
		if b.State == StateVoid {
			if len(claims[id]) > 0 {
				t.Errorf("void block %s is held by %v", id, claims[id])
			}
			continue
		}
		if len(claims[id]) != 1 || claims[id][0] != b.Node {
			t.Errorf("block %s of %s is held by %v", id, b.Node, claims[id])
			continue
		}
		if h := locals[b.Node].blocks[today][id]; h.Tokens != b.Tokens || h.Returned != b.Returned {
			t.Errorf("block %s: the store has %+v, its node %+v", id, b, h)
		}
	}
	for id, who := range claims {
		if !inStore[id] {
			t.Errorf("%v hold block %s, which the store has not", who, id)
		}
	}
}
