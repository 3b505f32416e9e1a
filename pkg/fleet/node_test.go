package fleet

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/ledger"
)

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type testNode struct {
	*Node
	led   *ledger.Ledger
	dir   string
	clock *testClock
}

func noon() *testClock { return &testClock{now: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)} }

func openNode(t *testing.T, st Store, name, dir string, c *testClock, tweak func(*Config)) *testNode {
	t.Helper()
	led, err := ledger.Open(ledger.Config{Path: filepath.Join(dir, ledger.File), Fleet: true, Clock: c.Now, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Store: st, Node: name, StateDir: dir, Ledger: led, Clock: c.Now, MinBlock: 100, MaxBlock: 1000, Share: 4,
		IdleAfter: time.Hour, Tick: time.Millisecond, Timeout: time.Second}
	if tweak != nil {
		tweak(&cfg)
	}
	n, err := Open(cfg)
	if err != nil {
		led.Close()
		t.Fatal(err)
	}
	tn := &testNode{Node: n, led: led, dir: dir, clock: c}
	t.Cleanup(func() { tn.crash() })
	return tn
}

// crash closes the node and its ledger; closing again does nothing.
func (n *testNode) crash() {
	n.Close()
	n.led.Close()
}

// waitFor waits until cond holds; a run where it never does fails after a long while,
// telling what was waited for.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}

func storeTokens(t *testing.T, m *memStore, key string) int64 {
	t.Helper()
	v := m.value(key)
	if v == "" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func blocksOf(t *testing.T, m *memStore, day string) map[string]Block {
	t.Helper()
	kvs, _, _ := m.Get(context.Background(), keys{DefaultPrefix}.blocks(day), true)
	out := map[string]Block{}
	for _, kv := range kvs {
		b, err := decodeBlock(kv)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(kv.Key, keys{DefaultPrefix}.blocks(day))] = b
	}
	return out
}

const day1 = "2026-06-01"

func setCeiling(t *testing.T, st Store, day string, tokens int64) {
	t.Helper()
	if err := SetCeiling(context.Background(), st, "", day, tokens); err != nil {
		t.Fatal(err)
	}
}

func register(t *testing.T, l *ledger.Ledger, id string) {
	t.Helper()
	if err := l.Register(ledger.Session{ID: id, Capsule: "c"}); err != nil {
		t.Fatal(err)
	}
}

// A node takes blocks sized by what is left of the pool (a quarter, here, within 100 to
// 1000), until its headroom is above half the next block; the ledger admits what they hold
// and refuses beyond at "fleet"; the store's granted is the sum of the blocks.
func TestGrantSetsAllowance(t *testing.T) {
	st := newMemStore()
	setCeiling(t, st, day1, 2000)
	n := openNode(t, st, "n1", t.TempDir(), noon(), nil)
	waitFor(t, "a block", func() bool { return n.Status().Held > 0 })
	register(t, n.led, "s")
	var admitted int64
	for {
		r, err := n.led.Admit(ledger.Admission{SessionID: "s", Tokens: 50})
		if err != nil {
			var refusal *ledger.Refusal
			if !errors.As(err, &refusal) || refusal.Limit != ledger.LimitFleet {
				t.Fatalf("refused with %v, want limit fleet", err)
			}
			if n.Status().Pool > 0 || n.Status().Held != admitted {
				// The next block is on its way.
				time.Sleep(time.Millisecond)
				continue
			}
			break
		}
		admitted += r.Tokens
	}
	if admitted != 2000 || storeTokens(t, st, keys{DefaultPrefix}.granted(day1)) != 2000 {
		t.Fatalf("admitted %d, granted %d; want the whole ceiling of 2000", admitted, storeTokens(t, st, keys{DefaultPrefix}.granted(day1)))
	}
	var sizes []int64
	for _, b := range blocksOf(t, st, day1) {
		if b.Node != "n1" || b.State != StateHeld {
			t.Errorf("block %+v", b)
		}
		sizes = append(sizes, b.Tokens)
	}
	for _, s := range sizes {
		if s > 500 {
			t.Errorf("a block of %d from a pool of at most 2000: more than a quarter", s)
		}
	}
}

// scripted is a Store whose grant Txns (those putting a held block) meet the fates queued
// for them: "lost" applies and errs, "late" errs and lands two operations later.
type scripted struct {
	*memStore
	mu    sync.Mutex
	fates []string
}

func (s *scripted) Txn(ctx context.Context, cmps []Cmp, then []Op) (bool, error) {
	grant := false
	for _, op := range then {
		if strings.Contains(op.Key, "/blocks/") && strings.Contains(string(op.Value), `"held"`) && len(cmps) == 3 {
			grant = true
		}
	}
	s.mu.Lock()
	fate := ""
	if grant && len(s.fates) > 0 {
		fate, s.fates = s.fates[0], s.fates[1:]
	}
	s.mu.Unlock()
	switch fate {
	case "lost":
		s.apply(cmps, then)
		return false, errFault
	case "late":
		// It lands after the node's read of the block and its fence: on the fence.
		s.deliverLate(cmps, then, 3)
		return false, errFault
	}
	return s.memStore.Txn(ctx, cmps, then)
}

// A grant whose reply is lost is found by reading its block: the node holds it, once. One
// still in flight when the node reads is fenced off by a void entry under its id, and
// lands on nothing.
func TestAmbiguousGrant(t *testing.T) {
	for _, fate := range []string{"lost", "late"} {
		t.Run(fate, func(t *testing.T) {
			st := &scripted{memStore: newMemStore(), fates: []string{fate}}
			setCeiling(t, st, day1, 10_000)
			n := openNode(t, st, "n1", t.TempDir(), noon(), nil)
			waitFor(t, "blocks held", func() bool { return n.Status().Held >= 500 && n.Status().Pending == 0 })
			n.crash()
			st.flush()
			var held, void int64
			for _, b := range blocksOf(t, st.memStore, day1) {
				switch b.State {
				case StateHeld:
					held += b.Tokens
				case StateVoid:
					void++
				}
			}
			loc, err := openLocal(filepath.Join(n.dir, File))
			if err != nil {
				t.Fatal(err)
			}
			defer loc.close()
			if granted := storeTokens(t, st.memStore, keys{DefaultPrefix}.granted(day1)); granted != held || loc.held(day1) != held {
				t.Fatalf("granted %d, blocks held %d, the node holds %d", granted, held, loc.held(day1))
			}
			if want := map[string]int64{"lost": 0, "late": 1}[fate]; void != want {
				t.Fatalf("%d void blocks, want %d", void, want)
			}
		})
	}
}

// A grant sent by a run that crashed before it heard back is settled by the next run,
// from the intent in fleet.db: adopted when it applied, fenced off when it had not.
func TestRestartSettlesIntent(t *testing.T) {
	for _, applied := range []bool{true, false} {
		t.Run(strconv.FormatBool(applied), func(t *testing.T) {
			st := newMemStore()
			setCeiling(t, st, day1, 10_000)
			dir := t.TempDir()
			loc, err := openLocal(filepath.Join(dir, File))
			if err != nil {
				t.Fatal(err)
			}
			in := intent{Kind: intentGrant, Day: day1, Block: "n1.crashed", Tokens: 700}
			if err := loc.begin(in); err != nil {
				t.Fatal(err)
			}
			loc.close()
			k := keys{DefaultPrefix}
			if applied {
				st.apply(nil, []Op{{Key: k.granted(day1), Value: tokens(700)}, {Key: k.block(day1, in.Block), Value: encode(Block{Node: "n1", Tokens: 700, State: StateHeld})}})
			}
			n := openNode(t, st, "n1", dir, noon(), func(c *Config) { c.MinBlock, c.MaxBlock = 100, 100 })
			waitFor(t, "the intent settled", func() bool { return n.Status().Pending == 0 && n.Status().Held > 0 })
			n.crash()
			b := blocksOf(t, st, day1)["n1.crashed"]
			if applied && (b.State != StateHeld || b.Tokens != 700) || !applied && b.State != StateVoid {
				t.Fatalf("the crashed run's block: %+v", b)
			}
			loc, err = openLocal(filepath.Join(dir, File))
			if err != nil {
				t.Fatal(err)
			}
			defer loc.close()
			if _, ok := loc.blocks[day1]["n1.crashed"]; ok != applied {
				t.Fatalf("held by the node: %v, want %v", ok, applied)
			}
			if loc.held(day1) != storeTokens(t, st, k.granted(day1)) {
				t.Fatalf("the node holds %d, granted is %d", loc.held(day1), storeTokens(t, st, k.granted(day1)))
			}
		})
	}
}

// A ceiling lowered under what is granted is seen through the watch: the node gives back
// all it holds unspent, and takes nothing more.
func TestLoweredCeilingGivesBack(t *testing.T) {
	st := newMemStore()
	setCeiling(t, st, day1, 10_000)
	n := openNode(t, st, "n1", t.TempDir(), noon(), func(c *Config) { c.Tick = time.Hour })
	n.Kick()
	waitFor(t, "blocks held", func() bool { return n.Status().Held >= 1000 })
	register(t, n.led, "s")
	if _, err := n.led.Admit(ledger.Admission{SessionID: "s", Tokens: 300}); err != nil {
		t.Fatal(err)
	}
	setCeiling(t, st, day1, 200)
	k := keys{DefaultPrefix}
	waitFor(t, "the free tokens given back", func() bool { return storeTokens(t, st, k.granted(day1)) == 300 && n.Status().Held == 300 })
	if s := n.Status(); s.Held != 300 || s.Used != 300 {
		t.Fatalf("after giving back: %+v", s)
	}
	if _, err := n.led.Admit(ledger.Admission{SessionID: "s", Tokens: 1}); err == nil {
		t.Fatal("admitted past a ceiling already spent")
	}
}

// An idle node gives back all but one call's worth; a node shut down gives back all.
func TestIdleAndShutdownGiveBack(t *testing.T) {
	st := newMemStore()
	setCeiling(t, st, day1, 10_000)
	c := noon()
	n := openNode(t, st, "n1", t.TempDir(), c, func(cfg *Config) { cfg.IdleAfter = time.Minute })
	waitFor(t, "blocks held", func() bool { return n.Status().Held >= 1000 })
	register(t, n.led, "s")
	if _, err := n.led.Admit(ledger.Admission{SessionID: "s", Tokens: 250}); err != nil {
		t.Fatal(err)
	}
	k := keys{DefaultPrefix}
	// The clock moves on until the node, having seen the spend, sees it idle for a minute.
	waitFor(t, "idle: all but a call given back", func() bool {
		c.Add(time.Minute)
		return storeTokens(t, st, k.granted(day1)) == 350
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if g := storeTokens(t, st, k.granted(day1)); g != 250 {
		t.Fatalf("after shutdown %d granted, want the 250 reserved", g)
	}
}

// At midnight the new day's pool opens from the standing ceiling; what the old day's
// blocks hold unspent goes back, that of a call still open once it settles, and the old
// day is then forgotten.
func TestDayRoll(t *testing.T) {
	st := newMemStore()
	setCeiling(t, st, day1, 10_000)
	c := &testClock{now: time.Date(2026, 6, 1, 23, 59, 0, 0, time.UTC)}
	n := openNode(t, st, "n1", t.TempDir(), c, nil)
	waitFor(t, "blocks held", func() bool { return n.Status().Held >= 1000 })
	register(t, n.led, "s")
	r, err := n.led.Admit(ledger.Admission{SessionID: "s", Tokens: 400})
	if err != nil {
		t.Fatal(err)
	}
	c.Add(2 * time.Minute)
	k := keys{DefaultPrefix}
	const day2 = "2026-06-02"
	waitFor(t, "the old day's free tokens back", func() bool { return storeTokens(t, st, k.granted(day1)) == 400 })
	waitFor(t, "blocks of the new day", func() bool { return storeTokens(t, st, k.granted(day2)) > 0 })
	if got := storeTokens(t, st, k.ceiling(day2)); got != 10_000 {
		t.Fatalf("the new day's ceiling %d, want the standing 10000", got)
	}
	if _, err := n.led.Settle("s", r.ID, ledger.Usage{Input: 100, Output: 50}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "what the open call did not spend back", func() bool { return storeTokens(t, st, k.granted(day1)) == 150 })
	n.crash()
	loc, err := openLocal(filepath.Join(n.dir, File))
	if err != nil {
		t.Fatal(err)
	}
	defer loc.close()
	if _, ok := loc.blocks[day1]; ok {
		t.Fatal("the old day is still kept")
	}
}

// Forget writes a lost node's blocks off as spent (granted keeps them) and says how much
// of that may be under-use; ReadDay shows it. The node, back, gives nothing back of them.
func TestForget(t *testing.T) {
	st := newMemStore()
	setCeiling(t, st, day1, 10_000)
	c := noon()
	dir := t.TempDir()
	n := openNode(t, st, "n1", dir, c, nil)
	waitFor(t, "blocks held", func() bool { return n.Status().Held >= 1000 })
	register(t, n.led, "s")
	if _, err := n.led.Admit(ledger.Admission{SessionID: "s", Tokens: 300}); err != nil {
		t.Fatal(err)
	}
	// A report follows once the spend moved by a block's least (100 here).
	waitFor(t, "a report of the spend", func() bool { return st.value(keys{DefaultPrefix}.node(day1, "n1")) == `{"spent":300}` })
	held := n.Status().Held
	n.crash()
	ctx := context.Background()
	before, err := ReadDay(ctx, st, "", day1)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Forget(ctx, st, "", "n1")
	if err != nil {
		t.Fatal(err)
	}
	spent := before.Nodes[0].Spent
	if spent != 300 {
		t.Fatalf("ReadDay: the node spent %d, want the 300 it reported", spent)
	}
	if f.WrittenOff != held || f.Days[day1] != held || f.UnderUse != held-spent {
		t.Fatalf("forgot %+v; the node held %d and said it spent %d", f, held, spent)
	}
	d, err := ReadDay(ctx, st, "", day1)
	if err != nil {
		t.Fatal(err)
	}
	if d.Granted != held || d.Ceiling != 10_000 || len(d.Nodes) != 1 || d.Nodes[0].WrittenOff != held || d.Nodes[0].Held != 0 {
		t.Fatalf("the day after forgetting: %+v", d)
	}
	// Back and shut down, the node would give back what it does not spend: of
	// written-off blocks, nothing.
	n = openNode(t, st, "n1", dir, c, nil)
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	loc, err := openLocal(filepath.Join(dir, File))
	if err != nil {
		t.Fatal(err)
	}
	defer loc.close()
	for id, b := range loc.blocks[day1] {
		if !b.WrittenOff {
			t.Errorf("block %s not seen written off: %+v", id, b)
		}
	}
	if g := storeTokens(t, st, keys{DefaultPrefix}.granted(day1)); g != held {
		t.Fatalf("granted %d after the forgotten node came back, want %d", g, held)
	}
}

// down is a Store that is unreachable once switched off.
type down struct {
	Store
	mu  sync.Mutex
	off bool
}

func (d *down) set(off bool) {
	d.mu.Lock()
	d.off = off
	d.mu.Unlock()
}

func (d *down) isOff() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.off
}

func (d *down) Get(ctx context.Context, key string, prefix bool) ([]KV, int64, error) {
	if d.isOff() {
		return nil, 0, errors.New("connection refused")
	}
	return d.Store.Get(ctx, key, prefix)
}

func (d *down) Txn(ctx context.Context, cmps []Cmp, then []Op) (bool, error) {
	if d.isOff() {
		return false, errors.New("connection refused")
	}
	return d.Store.Txn(ctx, cmps, then)
}

// A node cut off from the store spends what it holds, then refuses, saying the fleet
// ledger is unreachable.
func TestUnreachableSpendsWhatItHolds(t *testing.T) {
	st := &down{Store: newMemStore()}
	setCeiling(t, st, day1, 10_000)
	n := openNode(t, st, "n1", t.TempDir(), noon(), nil)
	waitFor(t, "blocks held", func() bool { return n.Status().Held >= 1000 })
	st.set(true)
	waitFor(t, "the store seen unreachable", func() bool { return n.Status().Unreachable })
	register(t, n.led, "s")
	held := n.Status().Held
	var admitted int64
	for {
		r, err := n.led.Admit(ledger.Admission{SessionID: "s", Tokens: 100, MinTokens: 1})
		if err != nil {
			var refusal *ledger.Refusal
			if !errors.As(err, &refusal) || refusal.Limit != ledger.LimitFleet || refusal.Detail != "fleet ledger unreachable" {
				t.Fatalf("refused with %v", err)
			}
			break
		}
		admitted += r.Tokens
	}
	if admitted != held {
		t.Fatalf("admitted %d while cut off, holding %d", admitted, held)
	}
	st.set(false)
	waitFor(t, "the store seen again", func() bool { return !n.Status().Unreachable })
}

func TestOpenBadInput(t *testing.T) {
	led, err := ledger.Open(ledger.Config{Path: filepath.Join(t.TempDir(), ledger.File), Fleet: true})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	for name, cfg := range map[string]Config{
		"no store":   {Node: "n1", StateDir: t.TempDir(), Ledger: led},
		"bad name":   {Store: newMemStore(), Node: "n 1", StateDir: t.TempDir(), Ledger: led},
		"bad blocks": {Store: newMemStore(), Node: "n1", StateDir: t.TempDir(), Ledger: led, MinBlock: 10, MaxBlock: 5},
	} {
		if _, err := Open(cfg); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
	plain, err := ledger.Open(ledger.Config{Path: filepath.Join(t.TempDir(), ledger.File)})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := Open(Config{Store: newMemStore(), Node: "n1", StateDir: t.TempDir(), Ledger: plain}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a ledger not in fleet mode: %v", err)
	}
	if err := SetCeiling(context.Background(), newMemStore(), "", "June 1st", 5); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a ceiling for a bad day: %v", err)
	}
}
