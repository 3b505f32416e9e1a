package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/ledger"
)

// Config is what a fleet node needs.
type Config struct {
	// Store is the fleet's shared store; Node this node's name in it, unique in the fleet.
	Store Store
	Node  string
	// StateDir holds the node's File.
	StateDir string
	// Ledger is the node's ledger, opened with Config.Fleet: it admits against the blocks
	// the node holds, and the node sets its allowance.
	Ledger *ledger.Ledger
	// Clock tells the time (time.Now when nil); the ledger's, so both agree on the day.
	Clock  func() time.Time
	Logger *slog.Logger
	// Prefix is where the fleet's keys are in the store; DefaultPrefix when "".
	Prefix string
	// MaxBlock is the most a block holds; DefaultMaxBlock when 0. MinBlock is the least,
	// one call's worst case (DefaultMinBlock when 0): blocks shrink toward it as the pool
	// empties, so the fleet's ceiling is spent to within one call per node.
	MaxBlock, MinBlock int64
	// Share divides what is left of the pool into the size of the next block (DefaultShare
	// when 0): about the number of nodes sharing it.
	Share int64
	// IdleAfter is how long the node's spending stays still before it gives back all but
	// MinBlock of what it holds; DefaultIdleAfter when 0.
	IdleAfter time.Duration
	// Tick is how often the node looks at the day, the pool and its headroom unprompted
	// (DefaultTick when 0); Timeout bounds each store call (DefaultTimeout when 0).
	Tick, Timeout time.Duration
}

// Defaults.
const (
	DefaultMaxBlock  = 1_000_000
	DefaultMinBlock  = 32_768
	DefaultShare     = 16
	DefaultIdleAfter = 5 * time.Minute
	DefaultTick      = time.Second
	DefaultTimeout   = 5 * time.Second
)

// Node is one roostd's part in the fleet ledger. A single goroutine takes blocks for the
// node, gives back what it does not need and settles what an ambiguous store error left
// open; admissions never wait on it: they only meet the ledger's allowance.
type Node struct {
	cfg Config
	k   keys
	st  Store
	led *ledger.Ledger
	log *slog.Logger
	loc *local

	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	status Status
	// Everything below is the worker's alone.
	pool      int64 // what the pool had left at the last read; -1 unknown
	ceiling   int64 // the day's ceiling at that read; -1 unknown
	grants    Grants
	lastUsed  int64
	usedSince time.Time
	// reported is what the node last wrote of its spend (day and tokens), beside a grant or
	// return or on its own once it moved by a block's least.
	reportedDay string
	reported    int64
	watchDay    string
	watchCancel context.CancelFunc
	watch       <-chan []KV
	// watchAfter is when a failed watch is tried again: not at once, lest a store that
	// fails every watch keep the worker spinning.
	watchAfter time.Time
	// looked is when the last finished look began; under mu.
	looked time.Time
}

// Status is a node's own view of its part.
type Status struct {
	Day string `json:"day"`
	// Held is what the node holds of the day (spent included); Used what its ledger
	// charged and reserved against it.
	Held int64 `json:"held"`
	Used int64 `json:"used"`
	// Pool is what the day's pool had left at the last read, Ceiling the day's ceiling
	// then; -1 before one.
	Pool    int64 `json:"pool"`
	Ceiling int64 `json:"ceiling"`
	// Grants counts the blocks the node asked the store for, since it opened, by outcome.
	Grants Grants `json:"grants"`
	// Pending counts writes to the store whose outcome the node has yet to find out.
	Pending     int  `json:"pending"`
	Unreachable bool `json:"unreachable"`
	// Looked is when the worker began the look this status reports (zero before the
	// first): a status whose look began after an event says how the node stood after it.
	Looked time.Time `json:"looked"`
}

// Grants counts grants by outcome: a block taken; the pool changed under the grant (read
// again); no reply (an ambiguous error, settled by reading the block).
type Grants struct {
	Granted   int64 `json:"granted"`
	Contended int64 `json:"contended"`
	Ambiguous int64 `json:"ambiguous"`
}

// Open opens the node's File, gives the ledger the allowance of the blocks the node holds
// and starts the node's worker, which first settles whatever writes a previous run left
// undecided. It needs no store to open: a node cut off spends what it holds.
func Open(cfg Config) (*Node, error) {
	if cfg.Store == nil || cfg.Ledger == nil {
		return nil, fmt.Errorf("fleet: a node needs a store and a ledger: %w", errdefs.ErrInvalidArgument)
	}
	if err := ValidNodeName(cfg.Node); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	cfg.MaxBlock = cmpOr(cfg.MaxBlock, DefaultMaxBlock)
	cfg.MinBlock = cmpOr(cfg.MinBlock, DefaultMinBlock)
	cfg.Share = cmpOr(cfg.Share, DefaultShare)
	cfg.IdleAfter = cmpOr(cfg.IdleAfter, DefaultIdleAfter)
	cfg.Tick = cmpOr(cfg.Tick, DefaultTick)
	cfg.Timeout = cmpOr(cfg.Timeout, DefaultTimeout)
	if cfg.MinBlock < 0 || cfg.MaxBlock < cfg.MinBlock || cfg.Share < 0 {
		return nil, fmt.Errorf("fleet: blocks of %d to %d tokens, a share of 1/%d: %w", cfg.MinBlock, cfg.MaxBlock, cfg.Share, errdefs.ErrInvalidArgument)
	}
	loc, err := openLocal(filepath.Join(cfg.StateDir, File))
	if err != nil {
		return nil, err
	}
	n := &Node{
		cfg: cfg, k: keys{cfg.Prefix}, st: cfg.Store, led: cfg.Ledger, log: cfg.Logger.With("node", cfg.Node), loc: loc,
		kick: make(chan struct{}, 1), done: make(chan struct{}), pool: -1, ceiling: -1, usedSince: cfg.Clock(),
	}
	// What the ledger kept may be more than the blocks now say (a return begun) or less (a
	// grant recorded after the ledger last heard): the blocks are the truth.
	if err := n.refresh(n.today()); err != nil {
		loc.close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go n.run(ctx)
	return n, nil
}

func cmpOr[T int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// ValidNodeName refuses a node name that cannot be a key's last part: it names what is wrong.
func ValidNodeName(node string) error {
	if node == "" || len(node) > 128 {
		return fmt.Errorf("fleet: node name %q: must be 1 to 128 characters: %w", node, errdefs.ErrInvalidArgument)
	}
	for _, r := range node {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("fleet: node name %q: only letters, digits, '-', '_' and '.': %w", node, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Close stops the node's worker and closes its File, keeping every block it holds: what a
// crash does, without one. Shutdown gives back what is unused first.
func (n *Node) Close() error {
	n.cancel()
	<-n.done
	return n.loc.close()
}

// Shutdown gives back what the node holds and has not spent, as far as ctx lets it, then
// closes. What it could not give back it keeps, for its next run.
func (n *Node) Shutdown(ctx context.Context) error {
	n.cancel()
	<-n.done
	var errs []error
	if err := n.settleIntents(ctx); err != nil {
		errs = append(errs, err)
	} else {
		for _, day := range n.loc.days() {
			if err := n.giveBack(ctx, day, 0); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := n.refresh(n.today()); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, n.loc.close())
	return errors.Join(errs...)
}

// Status returns the node's view of its part, as of its worker's last look.
func (n *Node) Status() Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.status
}

// Kick asks the worker to look now (as a low allowance does).
func (n *Node) Kick() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

func (n *Node) today() string { return n.cfg.Clock().UTC().Format(time.DateOnly) }

func (n *Node) run(ctx context.Context) {
	defer close(n.done)
	defer func() {
		if n.watchCancel != nil {
			n.watchCancel()
		}
	}()
	t := time.NewTicker(n.cfg.Tick)
	defer t.Stop()
	for {
		if !n.step(ctx) {
			// The store failed: the next try waits for the tick, whatever asks sooner, so
			// that refusals while cut off do not become a storm of calls to the store.
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.kick:
		case <-n.led.AllowanceLow():
		case _, ok := <-n.watch:
			if !ok {
				n.watch, n.watchDay, n.watchAfter = nil, "", n.cfg.Clock().Add(n.cfg.Tick)
			}
		}
	}
}

// step is one look: settle what is undecided, give back what past days left, then take or
// give back today's tokens as the headroom, the pool and the idleness say. It reports
// whether the store answered.
func (n *Node) step(ctx context.Context) bool {
	today := n.today()
	began := n.cfg.Clock()
	err := n.look(ctx, today)
	if ctx.Err() != nil {
		return false
	}
	n.mu.Lock()
	n.looked = began
	was := n.status.Unreachable
	n.status.Unreachable = err != nil
	n.mu.Unlock()
	switch {
	case err != nil && !was:
		n.log.Warn("the fleet ledger is unreachable; spending what this node holds", "err", err)
	case err == nil && was:
		n.log.Info("the fleet ledger is reachable again")
	}
	if err := n.refresh(today); err != nil {
		n.log.Error("setting the ledger's fleet allowance", "err", err)
	}
	return err == nil
}

func (n *Node) look(ctx context.Context, today string) error {
	if err := n.settleIntents(ctx); err != nil {
		return err
	}
	n.watchCeiling(ctx, today)
	for _, day := range n.loc.days() {
		if day == today {
			continue
		}
		if err := n.giveBack(ctx, day, 0); err != nil {
			return err
		}
		if _, _, reserved, err := n.led.Funded(day); err == nil && reserved == 0 && n.loc.held(day) == n.used(day) {
			if err := n.loc.drop(day); err != nil {
				return err
			}
		}
	}
	ceiling, granted, err := n.readPool(ctx, today)
	if err != nil {
		return err
	}
	used := n.used(today)
	now := n.cfg.Clock()
	if used != n.lastUsed {
		n.lastUsed, n.usedSince = used, now
	}
	if n.reportedDay != today || max(used-n.reported, n.reported-used) >= n.cfg.MinBlock {
		// A report only informs (spend --fleet, Forget's under-use): it compares nothing.
		if _, err := n.txn(ctx, nil, []Op{n.report(today)}); err != nil {
			return fmt.Errorf("reporting what this node spent: %w", err)
		}
	}
	switch {
	case granted > ceiling:
		// The ceiling was lowered under what is granted: give back all that is free.
		return n.giveBack(ctx, today, 0)
	case now.Sub(n.usedSince) >= n.cfg.IdleAfter:
		return n.giveBack(ctx, today, n.cfg.MinBlock)
	}
	for range 4 {
		if n.loc.held(today)-n.used(today) >= n.low() || n.pool == 0 {
			return nil
		}
		if err := n.grant(ctx, today); err != nil {
			return err
		}
	}
	return nil
}

// used is what the ledger charged and reserved against day's blocks.
func (n *Node) used(day string) int64 {
	_, charged, reserved, err := n.led.Funded(day)
	if err != nil {
		// Unknown, it could be all the node holds: nothing is free.
		return n.loc.held(day)
	}
	return charged + reserved
}

// low is the headroom below which the node takes another block: half the next block,
// and never less than one call's worst case.
func (n *Node) low() int64 {
	if n.pool < 0 {
		return n.cfg.MinBlock
	}
	return max(n.cfg.MinBlock, n.blockSize(n.pool)/2)
}

func (n *Node) blockSize(pool int64) int64 {
	return min(max(pool/n.cfg.Share, n.cfg.MinBlock), n.cfg.MaxBlock, pool)
}

// refresh tells the ledger what the node holds of today, and records the status.
func (n *Node) refresh(today string) error {
	held := n.loc.held(today)
	n.mu.Lock()
	unreachable := n.status.Unreachable
	n.mu.Unlock()
	err := n.led.SetAllowance(ledger.Allowance{Day: today, Tokens: max(held, 0), Low: n.low(), Unreachable: unreachable})
	n.mu.Lock()
	n.status = Status{Day: today, Held: held, Used: n.used(today), Pool: n.pool, Ceiling: n.ceiling, Grants: n.grants,
		Pending: len(n.loc.intents), Unreachable: unreachable, Looked: n.looked}
	n.mu.Unlock()
	return err
}

// watchCeiling keeps a watch on today's ceiling, so that a lowered one is seen at once.
func (n *Node) watchCeiling(ctx context.Context, today string) {
	if n.watchDay == today && n.watch != nil || n.watch == nil && n.cfg.Clock().Before(n.watchAfter) {
		return
	}
	if n.watchCancel != nil {
		n.watchCancel()
	}
	wctx, cancel := context.WithCancel(ctx)
	n.watchDay, n.watchCancel = today, cancel
	n.watch = n.st.Watch(wctx, n.k.ceiling(today), false, 0)
}

func (n *Node) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, n.cfg.Timeout)
}

func (n *Node) get(ctx context.Context, key string) (*KV, error) {
	cctx, cancel := n.call(ctx)
	defer cancel()
	kvs, _, err := n.st.Get(cctx, key, false)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", key, err)
	}
	for _, kv := range kvs {
		if kv.Key == key {
			return &kv, nil
		}
	}
	return nil, nil
}

func (n *Node) txn(ctx context.Context, cmps []Cmp, ops []Op) (bool, error) {
	cctx, cancel := n.call(ctx)
	defer cancel()
	return n.st.Txn(cctx, cmps, ops)
}

// readPool reads today's ceiling (copying the standing one into the day when the day has
// none yet) and what is granted of it.
func (n *Node) readPool(ctx context.Context, day string) (ceiling, granted int64, err error) {
	c, err := n.dayCeiling(ctx, day)
	if err != nil {
		return 0, 0, err
	}
	g, err := n.get(ctx, n.k.granted(day))
	if err != nil {
		return 0, 0, err
	}
	if c != nil {
		if ceiling, err = decodeTokens(*c); err != nil {
			return 0, 0, err
		}
	}
	if g != nil {
		if granted, err = decodeTokens(*g); err != nil {
			return 0, 0, err
		}
	}
	n.pool, n.ceiling = max(ceiling-granted, 0), ceiling
	return ceiling, granted, nil
}

// dayCeiling reads a day's ceiling key; nil when neither it nor a standing ceiling exists.
func (n *Node) dayCeiling(ctx context.Context, day string) (*KV, error) {
	c, err := n.get(ctx, n.k.ceiling(day))
	if err != nil || c != nil {
		return c, err
	}
	standing, err := n.get(ctx, n.k.standing())
	if err != nil || standing == nil {
		return nil, err
	}
	if _, err := decodeTokens(*standing); err != nil {
		return nil, err
	}
	// Whoever copies first sets the day's ceiling; either way it is then read.
	if _, err := n.txn(ctx, []Cmp{{Key: n.k.ceiling(day)}}, []Op{{Key: n.k.ceiling(day), Value: standing.Value}}); err != nil {
		return nil, fmt.Errorf("opening %s's pool: %w", day, err)
	}
	return n.get(ctx, n.k.ceiling(day))
}

func (n *Node) report(day string) Op {
	used := n.used(day)
	if day == n.today() {
		n.reportedDay, n.reported = day, used
	}
	return Op{Key: n.k.node(day, n.cfg.Node), Value: encode(NodeReport{Spent: used})}
}

// errContended: the pool changed between the read and the Txn; read again.
var errContended = errors.New("the pool changed under the grant")

// grant takes one block of day's pool, sized by what is left of it. The block's id is
// chosen and kept in the File before the Txn is sent, so that whatever the Txn's outcome,
// the node finds it out by reading the block.
func (n *Node) grant(ctx context.Context, day string) error {
	for range 8 {
		err := n.grantOnce(ctx, day)
		if !errors.Is(err, errContended) {
			return err
		}
	}
	return nil
}

func (n *Node) grantOnce(ctx context.Context, day string) error {
	ceilKV, err := n.dayCeiling(ctx, day)
	if err != nil || ceilKV == nil {
		n.pool = 0
		return err
	}
	ceiling, err := decodeTokens(*ceilKV)
	if err != nil {
		return err
	}
	gKV, err := n.get(ctx, n.k.granted(day))
	if err != nil {
		return err
	}
	var granted, gRev int64
	if gKV != nil {
		if granted, err = decodeTokens(*gKV); err != nil {
			return err
		}
		gRev = gKV.ModRevision
	}
	n.pool, n.ceiling = max(ceiling-granted, 0), ceiling
	if n.pool == 0 {
		return nil
	}
	size := n.blockSize(n.pool)
	in := intent{Kind: intentGrant, Day: day, Block: newBlockID(n.cfg.Node), Tokens: size}
	if err := n.loc.begin(in); err != nil {
		return err
	}
	block := n.k.block(day, in.Block)
	applied, err := n.txn(ctx,
		[]Cmp{{Key: n.k.granted(day), ModRevision: gRev}, {Key: n.k.ceiling(day), ModRevision: ceilKV.ModRevision}, {Key: block}},
		[]Op{{Key: n.k.granted(day), Value: tokens(granted + size)}, {Key: block, Value: encode(Block{Node: n.cfg.Node, Tokens: size, State: StateHeld})}, n.report(day)})
	switch {
	case err != nil:
		n.grants.Ambiguous++
		return n.settleGrant(ctx, in)
	case !applied:
		n.grants.Contended++
		// Decided, not applied: nothing was granted under the id.
		if err := n.loc.settle(in, nil); err != nil {
			return err
		}
		return errContended
	}
	n.pool -= size
	n.grants.Granted++
	if err := n.loc.settle(in, &heldBlock{Tokens: size}); err != nil {
		return err
	}
	return n.refresh(n.today())
}

// settleGrant finds out whether a grant applied: the block is there, or it is fenced off
// with a void entry under its id, after which the grant can never apply.
func (n *Node) settleGrant(ctx context.Context, in intent) error {
	key := n.k.block(in.Day, in.Block)
	for {
		kv, err := n.get(ctx, key)
		if err != nil {
			return err
		}
		if kv != nil {
			b, err := decodeBlock(*kv)
			if err != nil {
				return err
			}
			var held *heldBlock
			if b.Node == n.cfg.Node && b.State != StateVoid {
				held = &heldBlock{Tokens: b.Tokens, Returned: b.Returned, WrittenOff: b.State == StateWrittenOff}
			}
			return n.loc.settle(in, held)
		}
		applied, err := n.txn(ctx, []Cmp{{Key: key}}, []Op{{Key: key, Value: encode(Block{Node: n.cfg.Node, State: StateVoid})}})
		if err != nil {
			return fmt.Errorf("fencing off block %s: %w", in.Block, err)
		}
		if applied {
			return n.loc.settle(in, nil)
		}
	}
}

// giveBack returns what the node holds of day beyond what it has used and keep: first
// taken out of the ledger's allowance, so no admission can spend it meanwhile, then given
// back block by block.
func (n *Node) giveBack(ctx context.Context, day string, keep int64) error {
	free := n.loc.held(day) - n.used(day) - keep
	if free <= 0 {
		return nil
	}
	if day == n.today() {
		cut, err := n.led.ReduceAllowance(day, free)
		if err != nil {
			return err
		}
		free = cut
	}
	defer n.refresh(n.today())
	for free > 0 {
		id, b, ok := n.largest(day)
		if !ok {
			return nil
		}
		amount := min(free, b.left())
		kv, err := n.get(ctx, n.k.block(day, id))
		if err != nil {
			return err
		}
		if kv == nil {
			return fmt.Errorf("block %s of %s is held here but missing from the store (restored from an old snapshot?): %w", id, day, errdefs.ErrDataLoss)
		}
		sb, err := decodeBlock(*kv)
		if err != nil {
			return err
		}
		if sb.Node != n.cfg.Node || sb.State != StateHeld {
			b.WrittenOff = true
			if err := n.loc.put(day, id, b); err != nil {
				return err
			}
			continue
		}
		in := intent{Kind: intentReturn, Day: day, Block: id, Tokens: amount, Rev: kv.ModRevision, Returned: sb.Returned + amount}
		if err := n.loc.begin(in); err != nil {
			return err
		}
		if err := n.settleReturn(ctx, in); err != nil {
			return err
		}
		free -= amount
	}
	return nil
}

// largest is the block of day with the most left to give back.
func (n *Node) largest(day string) (string, heldBlock, bool) {
	var best string
	for id, b := range n.loc.blocks[day] {
		if !b.WrittenOff && b.left() > 0 && (best == "" || b.left() > n.loc.blocks[day][best].left()) {
			best = id
		}
	}
	return best, n.loc.blocks[day][best], best != ""
}

// settleReturn sends a return until it is decided: applied, or the block moved on. Each
// try compares the block's ModRevision as the return read it, so of all the tries (and a
// late one still in flight) at most one applies, and any write to the block after it fences
// the rest off.
func (n *Node) settleReturn(ctx context.Context, in intent) error {
	key := n.k.block(in.Day, in.Block)
	held := n.loc.blocks[in.Day][in.Block]
	for {
		gKV, err := n.get(ctx, n.k.granted(in.Day))
		if err != nil {
			return err
		}
		var granted, gRev int64
		if gKV != nil {
			if granted, err = decodeTokens(*gKV); err != nil {
				return err
			}
			gRev = gKV.ModRevision
		}
		applied, txnErr := n.txn(ctx,
			[]Cmp{{Key: n.k.granted(in.Day), ModRevision: gRev}, {Key: key, ModRevision: in.Rev}},
			[]Op{{Key: n.k.granted(in.Day), Value: tokens(granted - in.Tokens)},
				{Key: key, Value: encode(Block{Node: n.cfg.Node, Tokens: held.Tokens, State: StateHeld, Returned: in.Returned})}, n.report(in.Day)})
		if txnErr == nil && applied {
			held.Returned = in.Returned
			return n.loc.settle(in, &held)
		}
		kv, err := n.get(ctx, key)
		if err != nil {
			return err
		}
		if kv != nil && kv.ModRevision == in.Rev {
			// Not applied (yet): try again; if an earlier try lands first, this one fails.
			if txnErr != nil {
				return fmt.Errorf("returning %d tokens of block %s: %w", in.Tokens, in.Block, txnErr)
			}
			continue
		}
		if kv == nil {
			return fmt.Errorf("block %s of %s vanished from the store while returning it: %w", in.Block, in.Day, errdefs.ErrDataLoss)
		}
		b, err := decodeBlock(*kv)
		if err != nil {
			return err
		}
		// The block moved on: by this return (then Returned says so) or by a write-off.
		held.Returned, held.WrittenOff = b.Returned, b.State != StateHeld || b.Node != n.cfg.Node
		return n.loc.settle(in, &held)
	}
}

// settleIntents finds out the outcome of every write a previous try left undecided.
func (n *Node) settleIntents(ctx context.Context) error {
	ids := make([]string, 0, len(n.loc.intents))
	for id := range n.loc.intents {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		in := n.loc.intents[id]
		var err error
		switch in.Kind {
		case intentGrant:
			err = n.settleGrant(ctx, in)
		case intentReturn:
			err = n.settleReturn(ctx, in)
		default:
			err = fmt.Errorf("fleet intent %s: unknown kind %q", id, in.Kind)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func newBlockID(node string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return node + "." + hex.EncodeToString(b)
}
