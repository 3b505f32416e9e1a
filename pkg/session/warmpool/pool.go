// Package warmpool keeps sealed sandboxes made ahead of their sessions: for each shape
// asked for (the default capsule's, capsules' own) up to its size, refilled in the
// background under one CPU budget, each taken by one launch whose session fits it. A
// sandbox holds a container, a network namespace and a uid range; none outlives the
// daemon. The pool neither records nor launches a session: pkg/session claims a sandbox and
// starts its session's program in it.
package warmpool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	roostv1 "roost.dev/roost/api/gen/roost/v1"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
	rec "roost.dev/roost/pkg/records"
)

// Runtime makes sandboxes ahead of their sessions (see sealed.Sandbox).
type Runtime interface {
	Prepare(ctx context.Context, shape sealed.WarmShape, id string, ids containment.IDs, netns, records string) (*sealed.Sandbox, error)
	// Fits says why a session of the policy would not run in a sandbox of the shape; nil
	// when it would.
	Fits(shape sealed.WarmShape, p *manifest.Policy, wasm bool) error
	StartWarm(ctx context.Context, sb *sealed.Sandbox, spec containment.Spec) (containment.Process, error)
	Discard(sb *sealed.Sandbox) error
}

var _ Runtime = (*sealed.Runtime)(nil)

// DefaultCPU is the share of the wall clock the pool's refill may spend making
// sandboxes: after one that took d, it rests d again.
const DefaultCPU = 0.5

// Dir holds, under the state directory, the records directories of sandboxes no session
// has claimed: inside records/, as a claim renames one to its session's records directory,
// and a rename cannot cross the mount each session tree is (dirs.Seal).
const Dir = "records/warm"

// oldDir is where roostds before the session trees were sealed kept them.
const oldDir = "warm"

// Pool keeps sealed sandboxes made ahead, each for one session: for each of its shapes
// up to that shape's size. A launch takes one whose shape its session fits; the pool
// refills in the background, one sandbox at a time whatever the shape, under one CPU
// budget. Sandboxes do not outlive the daemon: Close discards them, and a daemon that was
// killed leaves containers, network namespaces and uid ranges the next one's start frees
// (the session manager's sweep of leftovers, and Free), since no session names them.
type Pool struct {
	rt    Runtime
	ids   IDs
	netns NetNS
	dir   string
	log   *slog.Logger
	cpu   float64
	kick  chan struct{}

	mu     sync.Mutex
	shapes []*shape
	// claimed is when a launch last took a sandbox.
	claimed time.Time
	// made counts the refill's turns (see neediest).
	made uint64
}

// shape is one shape of sandbox the pool keeps, and those of it ready.
type shape struct {
	sealed.WarmShape
	size  int
	ready []*sealed.Sandbox
	// made is the refill's turn that last chose this shape.
	made uint64
}

// settle is how long after a claim the refill waits: the launch that claimed, and the
// short program it may run, have the CPU to themselves meanwhile.
const settle = 100 * time.Millisecond

// Shape asks for Size sandboxes of a shape.
type Shape struct {
	sealed.WarmShape
	Size int
}

// IDs holds and frees the uid ranges of sandboxes in the session record (store.Tx's
// ReserveIDs and ReleaseIDs).
type IDs interface {
	Reserve(sandbox string) (containment.IDs, error)
	// Release frees the ranges held by sandboxes keep does not name.
	Release(keep func(sandbox string) bool) error
}

// NetNS pins a network namespace for a sandbox and lets it go (the endpoints').
type NetNS interface {
	Pin(sandbox string) (string, error)
	Release(sandbox string) error
}

// Config is what a Pool needs.
type Config struct {
	Runtime Runtime
	IDs     IDs
	// NetNS is nil when sessions have no endpoints.
	NetNS NetNS
	// StateDir is roostd's state directory; the pool keeps its sandboxes' records in Dir
	// under it.
	StateDir string
	// CPU is the share of the wall clock the refill may take; DefaultCPU when 0.
	CPU    float64
	Logger *slog.Logger
}

// New makes a pool of shapes; Run fills it.
func New(cfg Config, shapes []Shape) (*Pool, error) {
	cpu := cfg.CPU
	if cpu <= 0 || cpu > 1 {
		cpu = DefaultCPU
	}
	dir := filepath.Join(cfg.StateDir, Dir)
	if err := os.Mkdir(dir, 0o711); err != nil {
		return nil, err
	}
	p := &Pool{rt: cfg.Runtime, ids: cfg.IDs, netns: cfg.NetNS, dir: dir, log: cfg.Logger, cpu: cpu, kick: make(chan struct{}, 1)}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	for _, s := range shapes {
		p.shapes = append(p.shapes, &shape{WarmShape: s.WarmShape, size: s.Size})
	}
	return p, nil
}

// Leftovers frees what sandboxes a previous daemon made and no session claimed held outside
// the runtime (whose containers and network namespaces the session manager's sweep
// releases, as no session names them): their records directories and uid ranges. Run at
// every start, pool or not.
func Leftovers(stateDir string, ids IDs) error {
	for _, dir := range []string{Dir, oldDir} {
		if err := os.RemoveAll(filepath.Join(stateDir, dir)); err != nil {
			return err
		}
	}
	return ids.Release(func(string) bool { return false })
}

// Run refills the pool until ctx ends, one sandbox at a time (see neediest).
func (p *Pool) Run(ctx context.Context) {
	backoff := time.Second
	for {
		shape := p.neediest()
		if shape == nil {
			select {
			case <-p.kick:
				continue
			case <-ctx.Done():
				return
			}
		}
		// A claim is a launch under way: the refill lets it finish first.
		p.mu.Lock()
		settle := time.Until(p.claimed.Add(settle))
		p.mu.Unlock()
		if settle > 0 {
			select {
			case <-time.After(settle):
				continue
			case <-ctx.Done():
				return
			}
		}
		p.chose(shape)
		began := time.Now()
		sb, err := p.make(ctx, shape.WarmShape)
		took := time.Since(began)
		rest := time.Duration(float64(took) * (1/p.cpu - 1))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.log.Warn("making a warm sandbox", "shape", shape.Name, "err", err, "retry_in", backoff.String())
			rest = max(rest, backoff)
			backoff = min(2*backoff, time.Minute)
		} else {
			backoff = time.Second
			p.mu.Lock()
			shape.ready = append(shape.ready, sb)
			p.mu.Unlock()
		}
		select {
		case <-time.After(rest):
		case <-ctx.Done():
			return
		}
	}
}

// neediest is the shape to make a sandbox for next, nil when every shape is full: the one
// least full for its size, and of those the one made for longest ago, so that a shape
// whose sandboxes are taken as fast as they are made does not starve the others.
func (p *Pool) neediest() *shape {
	p.mu.Lock()
	defer p.mu.Unlock()
	var needy *shape
	for _, s := range p.shapes {
		if len(s.ready) >= s.size {
			continue
		}
		if needy == nil {
			needy = s
			continue
		}
		// Fullness compared as fractions of each shape's size.
		a, b := len(s.ready)*needy.size, len(needy.ready)*s.size
		if a < b || (a == b && s.made < needy.made) {
			needy = s
		}
	}
	return needy
}

// chose notes that the refill makes a sandbox of the shape now.
func (p *Pool) chose(s *shape) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.made++
	s.made = p.made
}

// make makes one sandbox: its uid range held in the registry, its network namespace
// pinned, its records directory under warmDir.
func (p *Pool) make(ctx context.Context, shape sealed.WarmShape) (_ *sealed.Sandbox, retErr error) {
	var raw [8]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, err
	}
	id := sealed.WarmPrefix + hex.EncodeToString(raw[:])
	ids, err := p.ids.Reserve(id)
	if err != nil {
		return nil, err
	}
	records := filepath.Join(p.dir, id)
	defer func() {
		if retErr != nil {
			p.free(id, records)
		}
	}()
	// Chmod, not Mkdir's mode alone: roostd narrows its umask while it makes its socket,
	// which the pool's first sandboxes may be made alongside.
	if err := os.Mkdir(records, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(records, 0o711); err != nil {
		return nil, err
	}
	// The session's trace, empty until the claim's first line: made here, its inode is
	// not allocated on the claim's path (see sealed.Runtime.StartWarm).
	trace, err := os.OpenFile(filepath.Join(records, rec.TraceFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	trace.Close()
	netns := ""
	if p.netns != nil {
		if netns, err = p.netns.Pin(id); err != nil {
			return nil, err
		}
	}
	return p.rt.Prepare(ctx, shape, id, ids, netns, records)
}

// free lets go of what make took for sandbox id but the container.
func (p *Pool) free(id, records string) {
	if p.netns != nil {
		if err := p.netns.Release(id); err != nil {
			p.log.Warn("unpinning a warm sandbox's network namespace", "sandbox", id, "err", err)
		}
	}
	_ = os.RemoveAll(records)
	if err := p.ids.Release(func(s string) bool { return s != id }); err != nil {
		p.log.Warn("freeing a warm sandbox's uid range", "sandbox", id, "err", err)
	}
}

// Discard ends a sandbox and frees what it held that no session has taken.
func (p *Pool) Discard(sb *sealed.Sandbox) {
	if err := p.rt.Discard(sb); err != nil {
		p.log.Warn("discarding a warm sandbox", "sandbox", sb.ID, "err", err)
	}
	p.free(sb.ID, sb.Records)
}

// errPoolEmpty is why a session that fits started cold.
var errPoolEmpty = errors.New("no warm sandbox was free")

// Start starts a session's program in a sandbox Take handed it.
func (p *Pool) Start(ctx context.Context, sb *sealed.Sandbox, spec containment.Spec) (containment.Process, error) {
	return p.rt.StartWarm(ctx, sb, spec)
}

// Take hands a sandbox to a session of the policy, or says why it starts cold.
func (p *Pool) Take(policy *manifest.Policy, wasm bool) (*sealed.Sandbox, error) {
	shapes, err := p.fitting(policy, wasm)
	if err != nil {
		return nil, err
	}
	defer p.refill()
	for {
		p.mu.Lock()
		var sb *sealed.Sandbox
		for _, s := range shapes {
			if len(s.ready) > 0 {
				sb, s.ready = s.ready[0], s.ready[1:]
				break
			}
		}
		if sb == nil {
			p.mu.Unlock()
			return nil, errPoolEmpty
		}
		p.claimed = time.Now()
		p.mu.Unlock()
		if sb.Alive() {
			return sb, nil
		}
		p.log.Warn("a warm sandbox ended before its session; discarding it", "sandbox", sb.ID)
		p.Discard(sb)
	}
}

// fitting are the shapes a session of the policy fits, in the pool's order; when none, the
// error says how it differs from each.
func (p *Pool) fitting(policy *manifest.Policy, wasm bool) ([]*shape, error) {
	var fit []*shape
	var misfits fitsNone
	for _, s := range p.shapes {
		if err := p.rt.Fits(s.WarmShape, policy, wasm); err != nil {
			misfits = append(misfits, err)
			continue
		}
		fit = append(fit, s)
	}
	if len(fit) == 0 {
		if len(misfits) == 1 {
			return nil, misfits[0]
		}
		return nil, misfits
	}
	return fit, nil
}

// fitsNone is why a session fits none of the pool's shapes: one reason a shape.
type fitsNone []error

func (e fitsNone) Error() string {
	var b strings.Builder
	for i, err := range e {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e fitsNone) Unwrap() []error { return e }

func (p *Pool) refill() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Close discards every sandbox the pool holds: they do not outlive the daemon.
func (p *Pool) Close() {
	p.mu.Lock()
	var ready []*sealed.Sandbox
	for _, s := range p.shapes {
		ready = append(ready, s.ready...)
		s.ready = nil
	}
	p.mu.Unlock()
	for _, sb := range ready {
		p.Discard(sb)
	}
}

// Ready is how many sandboxes wait for a session, whatever their shape; 0 for a nil pool.
func (p *Pool) Ready() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.shapes {
		n += len(s.ready)
	}
	return n
}

// ReadyByShape is Ready per shape, by the shape's name; nil for a nil pool.
func (p *Pool) ReadyByShape() map[string]int {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.shapes))
	for _, s := range p.shapes {
		out[s.Name] += len(s.ready)
	}
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// StartNote is the log's word for how a session started.
func StartNote(warm bool, why error) string {
	switch {
	case warm:
		return "warm"
	case why == nil:
		return "cold"
	}
	return "cold (" + why.Error() + ")"
}

// StartPath says how a session of the policy and class would start: warm, in a sandbox
// this pool keeps, or cold and why. A nil pool keeps none.
func (p *Pool) StartPath(policy *manifest.Policy, wasm bool, class manifest.Class) *roostv1.StartPath {
	switch {
	case p == nil:
		return &roostv1.StartPath{Path: "cold", Reason: "roostd keeps no warm sandboxes (roostd --warm-pool N, --warm-pool-capsule DIR=N)"}
	case class != manifest.Sealed:
		return &roostv1.StartPath{Path: "cold", Reason: "only sealed sessions start in a sandbox made ahead"}
	}
	shapes, err := p.fitting(policy, wasm)
	if err != nil {
		return &roostv1.StartPath{Path: "cold", Reason: err.Error()}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var kept []string
	for _, s := range shapes {
		made := ""
		if s.Name != sealed.DefaultWarmShapeName {
			made = " made for " + s.Name
		}
		kept = append(kept, fmt.Sprintf("%d sealed %s%s ready (%d now)", s.size, plural(s.size, "sandbox", "sandboxes"), made, len(s.ready)))
	}
	return &roostv1.StartPath{Path: "warm", Reason: "roostd keeps " + strings.Join(kept, ", and ") + "; a launch that finds none free starts cold"}
}
