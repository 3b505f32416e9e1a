package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
)

// WarmRuntime is a runtime that makes sandboxes ahead of their sessions (see
// containment.Sandbox).
type WarmRuntime interface {
	Prepare(ctx context.Context, id string, ids containment.IDs, netns, records string) (*containment.Sandbox, error)
	// Fits says why a session of the policy would not run in a sandbox; nil when it would.
	Fits(p *manifest.Policy, wasm bool) error
	StartWarm(ctx context.Context, sb *containment.Sandbox, spec containment.Spec) (containment.Process, error)
	Discard(sb *containment.Sandbox) error
}

var _ WarmRuntime = (*containment.SealedRuntime)(nil)

// DefaultWarmPoolCPU is the share of the wall clock the pool's refill may spend making
// sandboxes: after one that took d, it rests d again.
const DefaultWarmPoolCPU = 0.5

// warmDir holds the records directories of sandboxes no session has claimed.
const warmDir = "warm"

// warmPool keeps up to size sealed sandboxes made ahead, each for one session. A launch
// takes one when the session fits; the pool refills in the background. Sandboxes do not
// outlive the daemon: Close discards them, and a daemon that was killed leaves containers,
// network namespaces and uid ranges the next one's start frees (sweepLeftovers, and
// ReleaseIDs here), since no session names them.
type warmPool struct {
	m    *Manager
	rt   WarmRuntime
	size int
	cpu  float64
	kick chan struct{}

	mu    sync.Mutex
	ready []*containment.Sandbox
	// claimed is when a launch last took a sandbox.
	claimed time.Time
}

// warmSettle is how long after a claim the refill waits: the launch that claimed, and the
// short program it may run, have the CPU to themselves meanwhile.
const warmSettle = 100 * time.Millisecond

func newWarmPool(m *Manager, rt WarmRuntime, size int, cpu float64) (*warmPool, error) {
	if cpu <= 0 || cpu > 1 {
		cpu = DefaultWarmPoolCPU
	}
	if err := os.Mkdir(filepath.Join(m.cfg.StateDir, warmDir), 0o711); err != nil {
		return nil, err
	}
	return &warmPool{m: m, rt: rt, size: size, cpu: cpu, kick: make(chan struct{}, 1)}, nil
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

// run refills the pool until ctx ends.
func (p *warmPool) run(ctx context.Context) {
	backoff := time.Second
	for {
		p.mu.Lock()
		full := len(p.ready) >= p.size
		p.mu.Unlock()
		if full {
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
		began := time.Now()
		sb, err := p.make(ctx)
		took := time.Since(began)
		rest := time.Duration(float64(took) * (1/p.cpu - 1))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.m.cfg.Logger.Warn("making a warm sandbox", "err", err, "retry_in", backoff.String())
			rest = max(rest, backoff)
			backoff = min(2*backoff, time.Minute)
		} else {
			backoff = time.Second
			p.mu.Lock()
			p.ready = append(p.ready, sb)
			p.mu.Unlock()
		}
		select {
		case <-time.After(rest):
		case <-ctx.Done():
			return
		}
	}
}

// make makes one sandbox: its uid range held in the registry, its network namespace
// pinned, its records directory under warmDir.
func (p *warmPool) make(ctx context.Context) (_ *containment.Sandbox, retErr error) {
	var raw [8]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, err
	}
	id := containment.WarmPrefix + hex.EncodeToString(raw[:])
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
	return p.rt.Prepare(ctx, id, ids, netns, records)
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
func (p *warmPool) discard(sb *containment.Sandbox) {
	if err := p.rt.Discard(sb); err != nil {
		p.m.cfg.Logger.Warn("discarding a warm sandbox", "sandbox", sb.ID, "err", err)
	}
	p.free(sb.ID, sb.Records)
}

// errPoolEmpty is why a session that fits started cold.
var errPoolEmpty = errors.New("no warm sandbox was free")

// take hands a sandbox to a session of the policy, or says why it starts cold.
func (p *warmPool) take(policy *manifest.Policy, wasm bool) (*containment.Sandbox, error) {
	if err := p.rt.Fits(policy, wasm); err != nil {
		return nil, err
	}
	defer p.refill()
	for {
		p.mu.Lock()
		if len(p.ready) == 0 {
			p.mu.Unlock()
			return nil, errPoolEmpty
		}
		sb := p.ready[0]
		p.ready = p.ready[1:]
		p.claimed = time.Now()
		p.mu.Unlock()
		if sb.Alive() {
			return sb, nil
		}
		p.m.cfg.Logger.Warn("a warm sandbox ended before its session; discarding it", "sandbox", sb.ID)
		p.discard(sb)
	}
}

func (p *warmPool) refill() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// close discards every sandbox the pool holds: they do not outlive the daemon.
func (p *warmPool) close() {
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
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

// Ready is how many sandboxes wait for a session.
func (p *warmPool) Ready() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

// startPath is what explain says of how a session of the plan would start.
func (m *Manager) startPath(p *plan, class manifest.Class) *roostv1.StartPath {
	switch {
	case m.pool == nil:
		return &roostv1.StartPath{Path: "cold", Reason: "roostd keeps no warm sandboxes (roostd --warm-pool N)"}
	case class != manifest.Sealed:
		return &roostv1.StartPath{Path: "cold", Reason: "only sealed sessions start in a sandbox made ahead"}
	}
	if err := m.pool.rt.Fits(&p.policy, p.manifest.Run.Wasm != ""); err != nil {
		return &roostv1.StartPath{Path: "cold", Reason: err.Error()}
	}
	return &roostv1.StartPath{Path: "warm", Reason: fmt.Sprintf("roostd keeps %d sealed %s ready (%d now); a launch that finds none free starts cold",
		m.pool.size, plural(m.pool.size, "sandbox", "sandboxes"), m.pool.Ready())}
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
