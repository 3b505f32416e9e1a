package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
)

// WarmRuntime is a runtime that makes sandboxes ahead of their sessions (see
// sealed.Sandbox).
type WarmRuntime interface {
	Prepare(ctx context.Context, shape sealed.WarmShape, id string, ids containment.IDs, netns, records string) (*sealed.Sandbox, error)
	// Fits says why a session of the policy would not run in a sandbox of the shape; nil
	// when it would.
	Fits(shape sealed.WarmShape, p *manifest.Policy, wasm bool) error
	StartWarm(ctx context.Context, sb *sealed.Sandbox, spec containment.Spec) (containment.Process, error)
	Discard(sb *sealed.Sandbox) error
}

var _ WarmRuntime = (*sealed.Runtime)(nil)

// DefaultWarmPoolCPU is the share of the wall clock the pool's refill may spend making
// sandboxes: after one that took d, it rests d again.
const DefaultWarmPoolCPU = 0.5

// warmDir holds the records directories of sandboxes no session has claimed.
const warmDir = "warm"

// WarmCapsule asks for sandboxes made for a capsule's own shape (roostd
// --warm-pool-capsule DIR=N): its seccomp variant, host_read, workdir_exec and rlimits.
type WarmCapsule struct {
	// Dir is the capsule's directory.
	Dir string
	// Size is how many sandboxes of its shape to keep.
	Size int
}

// warmPool keeps sealed sandboxes made ahead, each for one session: for each of its shapes
// up to that shape's size. A launch takes one whose shape its session fits; the pool
// refills in the background, one sandbox at a time whatever the shape, under one CPU
// budget. Sandboxes do not outlive the daemon: Close discards them, and a daemon that was
// killed leaves containers, network namespaces and uid ranges the next one's start frees
// (sweepLeftovers, and ReleaseIDs here), since no session names them.
type warmPool struct {
	m    *Manager
	rt   WarmRuntime
	cpu  float64
	kick chan struct{}

	mu     sync.Mutex
	shapes []*warmShape
	// claimed is when a launch last took a sandbox.
	claimed time.Time
	// made counts the refill's turns (see neediest).
	made uint64
}

// warmShape is one shape of sandbox the pool keeps, and those of it ready.
type warmShape struct {
	sealed.WarmShape
	size  int
	ready []*sealed.Sandbox
	// made is the refill's turn that last chose this shape.
	made uint64
}

// warmSettle is how long after a claim the refill waits: the launch that claimed, and the
// short program it may run, have the CPU to themselves meanwhile.
const warmSettle = 100 * time.Millisecond

func newWarmPool(m *Manager, rt WarmRuntime, shapes []*warmShape, cpu float64) (*warmPool, error) {
	if cpu <= 0 || cpu > 1 {
		cpu = DefaultWarmPoolCPU
	}
	if err := os.Mkdir(filepath.Join(m.cfg.StateDir, warmDir), 0o711); err != nil {
		return nil, err
	}
	return &warmPool{m: m, rt: rt, shapes: shapes, cpu: cpu, kick: make(chan struct{}, 1)}, nil
}

// warmShapes are the shapes Config asks for: the default capsule's (WarmPool), then each
// WarmCapsule's, planned as a stage would plan it. A capsule that would not start sealed,
// or runs WASM, has no sandbox shape.
func (m *Manager) warmShapes() ([]*warmShape, error) {
	var shapes []*warmShape
	if m.cfg.WarmPool > 0 {
		shapes = append(shapes, &warmShape{WarmShape: sealed.DefaultWarmShape(), size: m.cfg.WarmPool})
	}
	for _, c := range m.cfg.WarmCapsules {
		p, err := m.plan(StageOptions{Capsule: c.Dir}, false)
		if err != nil {
			return nil, fmt.Errorf("capsule %s: %w", c.Dir, err)
		}
		name := fmt.Sprintf("capsule %s@%s", p.manifest.Name, p.manifest.Version)
		switch {
		case p.decision.Achieved != manifest.Sealed:
			return nil, fmt.Errorf("%s (%s) runs %s: only sealed sessions start in a sandbox made ahead: %w", name, c.Dir, p.decision.Achieved, errdefs.ErrInvalidArgument)
		case p.manifest.Run.Wasm != "":
			return nil, fmt.Errorf("%s (%s) runs a WASM module, which sandboxes made ahead do not hold: %w", name, c.Dir, errdefs.ErrInvalidArgument)
		}
		policy := p.policy
		shapes = append(shapes, &warmShape{WarmShape: sealed.WarmShape{Name: name, Policy: &policy}, size: c.Size})
	}
	return shapes, nil
}

// dropWarmLeftovers frees what sandboxes a previous daemon made and no session claimed
// held outside the runtime (whose containers and network namespaces sweepLeftovers
// releases, as no session names them): their records directories and uid ranges. Run at
// every start, pool or not.
func (m *Manager) dropWarmLeftovers() error {
	if err := os.RemoveAll(filepath.Join(m.cfg.StateDir, warmDir)); err != nil {
		return err
	}
	return m.update(func(tx *Tx) error { return tx.ReleaseIDs(func(string) bool { return false }) })
}

// run refills the pool until ctx ends, one sandbox at a time (see neediest).
func (p *warmPool) run(ctx context.Context) {
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
		settle := time.Until(p.claimed.Add(warmSettle))
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
			p.m.cfg.Logger.Warn("making a warm sandbox", "shape", shape.Name, "err", err, "retry_in", backoff.String())
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
func (p *warmPool) neediest() *warmShape {
	p.mu.Lock()
	defer p.mu.Unlock()
	var needy *warmShape
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
func (p *warmPool) chose(s *warmShape) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.made++
	s.made = p.made
}

// make makes one sandbox: its uid range held in the registry, its network namespace
// pinned, its records directory under warmDir.
func (p *warmPool) make(ctx context.Context, shape sealed.WarmShape) (_ *sealed.Sandbox, retErr error) {
	var raw [8]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, err
	}
	id := sealed.WarmPrefix + hex.EncodeToString(raw[:])
	var ids containment.IDs
	if err := p.m.update(func(tx *Tx) (err error) {
		ids, err = tx.ReserveIDs(id, p.m.cfg.IDs)
		return err
	}); err != nil {
		return nil, err
	}
	records := filepath.Join(p.m.cfg.StateDir, warmDir, id)
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
	netns := ""
	if p.m.cfg.Endpoints != nil {
		var err error
		if netns, err = p.m.cfg.Endpoints.Pin(id); err != nil {
			return nil, err
		}
	}
	return p.rt.Prepare(ctx, shape, id, ids, netns, records)
}

// free lets go of what make took for sandbox id but the container.
func (p *warmPool) free(id, records string) {
	if p.m.cfg.Endpoints != nil {
		if err := p.m.cfg.Endpoints.Release(id); err != nil {
			p.m.cfg.Logger.Warn("unpinning a warm sandbox's network namespace", "sandbox", id, "err", err)
		}
	}
	_ = os.RemoveAll(records)
	if err := p.m.update(func(tx *Tx) error {
		return tx.ReleaseIDs(func(s string) bool { return s != id })
	}); err != nil {
		p.m.cfg.Logger.Warn("freeing a warm sandbox's uid range", "sandbox", id, "err", err)
	}
}

// discard ends a sandbox and frees what it held that no session has taken.
func (p *warmPool) discard(sb *sealed.Sandbox) {
	if err := p.rt.Discard(sb); err != nil {
		p.m.cfg.Logger.Warn("discarding a warm sandbox", "sandbox", sb.ID, "err", err)
	}
	p.free(sb.ID, sb.Records)
}

// errPoolEmpty is why a session that fits started cold.
var errPoolEmpty = errors.New("no warm sandbox was free")

// take hands a sandbox to a session of the policy, or says why it starts cold.
func (p *warmPool) take(policy *manifest.Policy, wasm bool) (*sealed.Sandbox, error) {
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
		p.m.cfg.Logger.Warn("a warm sandbox ended before its session; discarding it", "sandbox", sb.ID)
		p.discard(sb)
	}
}

// fitting are the shapes a session of the policy fits, in the pool's order; when none, the
// error says how it differs from each.
func (p *warmPool) fitting(policy *manifest.Policy, wasm bool) ([]*warmShape, error) {
	var fit []*warmShape
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

func (p *warmPool) refill() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// close discards every sandbox the pool holds: they do not outlive the daemon.
func (p *warmPool) close() {
	p.mu.Lock()
	var ready []*sealed.Sandbox
	for _, s := range p.shapes {
		ready = append(ready, s.ready...)
		s.ready = nil
	}
	p.mu.Unlock()
	for _, sb := range ready {
		p.discard(sb)
	}
}

// WarmReady is how many sealed sandboxes made ahead wait for a session.
func (m *Manager) WarmReady() int {
	if m.pool == nil {
		return 0
	}
	return m.pool.Ready()
}

// Ready is how many sandboxes wait for a session, whatever their shape.
func (p *warmPool) Ready() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.shapes {
		n += len(s.ready)
	}
	return n
}

// startPath is what explain says of how a session of the plan would start.
func (m *Manager) startPath(p *plan, class manifest.Class) *roostv1.StartPath {
	switch {
	case m.pool == nil:
		return &roostv1.StartPath{Path: "cold", Reason: "roostd keeps no warm sandboxes (roostd --warm-pool N, --warm-pool-capsule DIR=N)"}
	case class != manifest.Sealed:
		return &roostv1.StartPath{Path: "cold", Reason: "only sealed sessions start in a sandbox made ahead"}
	}
	shapes, err := m.pool.fitting(&p.policy, p.manifest.Run.Wasm != "")
	if err != nil {
		return &roostv1.StartPath{Path: "cold", Reason: err.Error()}
	}
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
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

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// warmStartNote is the log's word for how a session started.
func warmStartNote(warm bool, why error) string {
	switch {
	case warm:
		return "warm"
	case why == nil:
		return "cold"
	}
	return "cold (" + why.Error() + ")"
}
