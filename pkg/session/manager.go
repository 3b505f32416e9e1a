package session

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	roostv1 "roost.dev/roost/api/gen/roost/v1"

	"roost.dev/roost/pkg/containment/sysview"
	"roost.dev/roost/pkg/session/account"
	"roost.dev/roost/pkg/session/delegate"
	"roost.dev/roost/pkg/session/dirs"
	"roost.dev/roost/pkg/session/guard"
	"roost.dev/roost/pkg/session/plan"
	"roost.dev/roost/pkg/session/ranges"
	"roost.dev/roost/pkg/session/retention"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/session/warmpool"
	"roost.dev/roost/pkg/wasmcache"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/artifact"
	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/fdbudget"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/spawn"
)

// DefaultStopGrace is how long a stop or a deadline waits after SIGTERM before SIGKILL.
const DefaultStopGrace = 10 * time.Second

// Runtime starts and re-attaches the programs of one containment class.
type Runtime interface {
	Start(ctx context.Context, spec containment.Spec) (containment.Process, error)
	// Attach re-attaches to a session a previous daemon started; ref is nil when that
	// daemon died before recording the process.
	Attach(sessionID, recordsDir string, ref *containment.ProcessRef) (containment.Process, error)
	// Release frees what the runtime holds for an ended session (a container, a composed
	// root). It is safe to call more than once, and for a session it never started.
	Release(sessionID string) error
}

// Artifacts is the content store: pushed capsules by name@version, and the copies of
// capsules staged from a directory.
type Artifacts interface {
	Resolve(ref string) (artifact.Artifact, error)
	Dir(a artifact.Artifact) string
	// Import copies a capsule directory into the store, named by its digest.
	Import(dir string) (artifact.Imported, error)
	// Collect removes copies no ref names and keep does not claim.
	Collect(keep func(sha256 string) bool) (int, error)
}

// Endpoints opens sessions' endpoints (see pkg/endpoint).
type Endpoints interface {
	// Open starts a session's endpoint: in a network namespace of its own when netns, else
	// on host loopback at port (0: any free one). It holds at most maxConns connections at
	// once (resources.endpoint_max_connections) and reports those it refuses to b. In a
	// namespace it carries proxy, the session's egress, when that is not nil.
	Open(sessionID string, netns bool, port, maxConns int, b spawn.Backend, proxy *egress.Session) (spawn.Endpoint, error)
	// Credential is the session's ROOST_CREDENTIAL.
	Credential(sessionID string) string
	// Release unpins the session's network namespace, if it has one.
	Release(sessionID string) error
	// Pinned lists sessions whose network namespace is pinned.
	Pinned() ([]string, error)
	// Pin makes and pins a network namespace for a sandbox made ahead of its session;
	// Move gives it to the session that claims the sandbox.
	Pin(sandbox string) (string, error)
	Move(sandbox, sessionID string) error
}

// Observer hears about session starts and recoveries, for metrics.
type Observer interface {
	SessionStarted(class manifest.Class, took time.Duration)
	SessionStartFailed(class manifest.Class)
	SessionRecovered(outcome string)
	// Egress counts one connection or request of a session's egress proxy.
	Egress(decision string, bytesUp, bytesDown int64)
}

// Config is what a Manager needs.
type Config struct {
	StateDir string
	// DaemonFloor is roostd --containment; ClassNone when unset.
	DaemonFloor manifest.Class
	Host        containment.Host
	Catalog     containment.Catalog
	// Runtimes runs each class the catalog offers.
	Runtimes map[manifest.Class]Runtime
	// Artifacts resolves name@version capsules; nil when the daemon keeps none.
	Artifacts Artifacts
	// Endpoints gives each launched session its endpoint; nil for none (then no session
	// can delegate).
	Endpoints Endpoints
	// MaxDepth is roostd --max-depth: how many levels may be started below a top-level
	// session. MaxConcurrent is roostd --max-concurrent: live children per parent.
	MaxDepth, MaxConcurrent int
	// Ledger meters sessions' tokens and Gateway forwards their model calls; nil for none.
	Ledger   account.Ledger
	Gateway  account.Gateway
	Observer Observer
	Logger   *slog.Logger
	// StopGrace is the deadline's grace between SIGTERM and SIGKILL; DefaultStopGrace when 0.
	StopGrace time.Duration
	// HostEnv is the environment env.allow draws from; os.Environ() when nil.
	HostEnv []string
	// GuardInterval is how often a session's workdir is measured against
	// resources.workdir_max_bytes; DefaultGuardInterval when 0.
	GuardInterval time.Duration
	// IDs is the block of host ids sessions' ranges come from; roostd's default block
	// when zero.
	IDs store.IDPool
	// AllowRoot names capsules whose sessions, when not sealed, run as host root (roostd's
	// sessions.allow_root); every other session runs as an unprivileged uid of its own.
	AllowRoot []string
	// HostPaths are the host trees capsules may read with filesystem.host_read (roostd's
	// sessions.host_paths).
	HostPaths []string
	// Hooks are the operator's stage and session_end hooks; nil for none.
	Hooks Hooks
	// SessionView is a record as the API shows it (server.SessionProto): what the
	// session_end hooks read. Open refuses Hooks without it.
	SessionView func(*store.Record) *roostv1.Session
	// Wasm runs run.wasm sessions and keeps their compiled modules; nil for none (then a
	// WASM capsule is refused at stage).
	Wasm *wasmcache.Cache
	// Egress is how sessions in a network namespace of their own reach the outside
	// (roostd's egress block); nil for not at all.
	Egress *egress.Config
	// Descriptors is roostd's descriptor budget: a reader of a session's logs holds a
	// slot of it (fdbudget.Followers) per open file. Nil for none.
	Descriptors *fdbudget.Budget
	// EnvPassthrough is the operator's list of host variables a capsule's env.allow may
	// draw from (roostd's env.passthrough); nothing else of HostEnv reaches a session.
	EnvPassthrough []string
	// RangesPerTree bounds the id ranges one delegation tree holds (its top-level session
	// and every session below, until removed), RangesForSpawns those every spawned session
	// holds together (roostd's sessions.ids.per_tree and .spawns); 0 for no bound.
	RangesPerTree, RangesForSpawns int
	// Sweeper clears what freed id ranges left on the host before they are handed out
	// again; the host's (idsweep.Sweeper) when nil.
	Sweeper ranges.Sweeper
	// WarmPool is how many sealed sandboxes of a default capsule's shape to keep made ahead
	// of their sessions (roostd --warm-pool); 0 for none. WarmCapsules ask for sandboxes of
	// capsules' own shapes (--warm-pool-capsule). WarmPoolCPU is the share of the wall
	// clock their refill may take; warmpool.DefaultCPU when 0.
	WarmPool     int
	WarmCapsules []WarmCapsule
	WarmPoolCPU  float64
}

// idsPerSession is how many host ids a session's range holds.
const idsPerSession = config.IDsPerSession

// DefaultGuardInterval is how often the workdir guard measures a running session's workdir.
const DefaultGuardInterval = 2 * time.Second

// Manager runs sessions: it is the only way the rest of roost changes one.
type Manager struct {
	cfg Config
	reg registry

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	live liveSet
	// egress holds the proxies sessions' endpoints carry (none without Config.Egress).
	egress *delegate.Egress

	planner *plan.Planner
	// views builds sealed sessions' views of the system trees, one per closure.
	views    *sysview.Builder
	journal  *journal
	ranges   *ranges.Keeper
	runtimes runtimes
	lifeline lifeline

	// blobMu keeps collecting the content store apart from a stage between importing a
	// capsule and recording the session that names it.
	blobMu sync.RWMutex

	// pool holds sealed sandboxes made ahead; nil without Config.WarmPool.
	pool *warmpool.Pool

	accounts account.Accounts
	trees    dirs.Dirs
	guard    guard.Guard

	retainer *retention.Retainer

	// backend is what every session's endpoint serves (pkg/session/delegate).
	backend *delegate.Backend

	// writers makes the writes into one session's workdir one at a time (files.go).
	writers writerSet

	execs detachedExecs
}

// liveSet is the sessions the daemon holds a live entry for, by id.
type liveSet struct {
	mu sync.Mutex
	m  map[string]*liveSession
}

// hold returns the session's live entry, creating it.
func (s *liveSet) hold(id string) *liveSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.m[id]
	if l == nil {
		l = &liveSession{ended: make(chan struct{})}
		s.m[id] = l
	}
	return l
}

// release drops a live entry that never got a process.
func (s *liveSet) release(id string, l *liveSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[id] == l && l.proc == nil {
		delete(s.m, id)
	}
}

// lookup returns the live entry of a session, if the daemon holds one.
func (s *liveSet) lookup(id string) *liveSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id]
}

// forget drops the session's entry once its end is recorded, unless another has taken its
// place.
func (s *liveSet) forget(id string, l *liveSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[id] == l {
		delete(s.m, id)
	}
}

// all is every entry held now.
func (s *liveSet) all() []*liveSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*liveSession, 0, len(s.m))
	for _, l := range s.m {
		out = append(out, l)
	}
	return out
}

// liveSession is the daemon's hold on a session that has (or may have) a process.
type liveSession struct {
	// mu orders everything done to the session: launch, stop, kill, deadline, end.
	mu sync.Mutex
	// spawnMu orders the session's spawns, so two cannot both pass the live-children check.
	spawnMu sync.Mutex
	proc    containment.Process
	ep      spawn.Endpoint
	// policy is the session's lowered manifest, for what its endpoint serves (policyOf).
	policyMu  sync.Mutex
	policy    *manifest.Policy
	ended     chan struct{}
	deadline  *time.Timer
	killTimer *time.Timer
	// workdirBytes is what the workdir guard last measured of the session's trees, for
	// Usage: one walk serves the bound and the operator's view.
	workdirBytes    atomic.Int64
	workdirMeasured atomic.Bool
}

// policyOf is a supervised session's lowered manifest, read from the registry once and kept
// with the session (a restarted daemon reads it when first asked, not at recovery).
func (l *liveSession) policyOf(reg registry, rec *store.Record) (*manifest.Policy, error) {
	l.policyMu.Lock()
	defer l.policyMu.Unlock()
	if l.policy == nil {
		_, p, err := reg.manifest(rec)
		if err != nil {
			return nil, err
		}
		l.policy = p
	}
	return l.policy, nil
}

// Open opens the state directory's registry, reconciles every session it lists as live
// with what actually runs, and returns a Manager ready to serve.
func Open(cfg Config) (*Manager, error) {
	if cfg.Hooks != nil && cfg.SessionView == nil {
		return nil, fmt.Errorf("session.Config: Hooks without SessionView (the session_end hooks' input): %w", errdefs.ErrInvalidArgument)
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = DefaultStopGrace
	}
	if cfg.GuardInterval == 0 {
		cfg.GuardInterval = DefaultGuardInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HostEnv == nil {
		cfg.HostEnv = os.Environ()
	}
	if cfg.IDs == (store.IDPool{}) {
		cfg.IDs = store.IDPool{First: config.DefaultFirstID, Slots: config.DefaultIDSlots}
	}
	if err := dirs.Prepare(cfg.StateDir); err != nil {
		return nil, err
	}
	reg, err := store.OpenRegistry(filepath.Join(cfg.StateDir, store.DBFile))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{cfg: cfg, reg: registry{Registry: reg, changed: newNotifier()}, ctx: ctx, cancel: cancel, live: liveSet{m: map[string]*liveSession{}}}
	// Whatever fails below leaves nothing open: one release for every way out.
	opened := false
	defer func() {
		if !opened {
			cancel()
			reg.Close()
		}
	}()
	m.planner = plan.New(plan.Config{Artifacts: cfg.Artifacts, Catalog: cfg.Catalog, DaemonFloor: cfg.DaemonFloor, AllowRoot: cfg.AllowRoot,
		HostPaths: cfg.HostPaths, EnvPassthrough: cfg.EnvPassthrough, HostEnv: cfg.HostEnv})
	m.views = sysview.NewBuilder(m.trees.Views())
	limits, _ := cfg.Observer.(LimitObserver)
	refused, _ := cfg.Observer.(ExecRefusalObserver)
	ends, _ := cfg.Observer.(EndObserver)
	m.journal = &journal{reg: m.reg, log: cfg.Logger, limits: limits, refused: refused, ends: ends}
	m.lifeline = lifeline{reg: m.reg, live: &m.live, ctx: ctx, wg: &m.wg, log: cfg.Logger,
		stop: func(l *liveSession, id, saw string) error {
			return m.beginStop(l, id, store.EndParent, saw, cfg.StopGrace)
		}}
	rangeObs, _ := cfg.Observer.(ranges.Observer)
	m.ranges = ranges.New(reg, cfg.IDs, cfg.Sweeper, rangeObs, cfg.Logger)
	m.runtimes = runtimes{byClass: cfg.Runtimes, endpoints: cfg.Endpoints, log: cfg.Logger}
	m.accounts = account.Accounts{Ledger: cfg.Ledger, Gateway: cfg.Gateway, Log: cfg.Logger}
	scoped, _ := cfg.Runtimes[manifest.Scoped].(interface{ TmpDir(string) string })
	m.trees = dirs.Dirs{State: cfg.StateDir, IDs: cfg.IDs, Group: m.reg.parentGroup, Scoped: scoped,
		Save: func(rec *store.Record) error { return m.reg.update(func(tx *store.Tx) error { return tx.Save(rec) }) }}
	m.views = sysview.NewBuilder(m.trees.Views())
	m.guard = guard.Guard{Interval: cfg.GuardInterval, Logger: cfg.Logger,
		Trees: guard.Trees{Home: m.trees.Home, Tmp: m.trees.Tmp, Children: m.trees.Children, List: m.reg.all}}
	m.egress = delegate.NewEgress(cfg.Egress, cfg.Observer, m.trees.Records, cfg.Logger)
	retains, _ := cfg.Observer.(retention.Observer)
	m.retainer = retention.New(retained{m}, retains, cfg.Logger)
	spawns, _ := cfg.Observer.(delegate.SpawnObserver)
	m.backend = delegate.New(endpointSessions{m}, delegate.Config{Ledger: cfg.Ledger, Gateway: cfg.Gateway, Observer: spawns,
		MaxConcurrent: cfg.MaxConcurrent, StopGrace: cfg.StopGrace, Logger: cfg.Logger})

	if err := m.recover(); err != nil {
		return nil, fmt.Errorf("recovering sessions: %w", err)
	}
	if err := warmpool.Leftovers(cfg.StateDir, sandboxIDs{m.reg, cfg.IDs, m.ranges}); err != nil {
		return nil, fmt.Errorf("freeing warm sandboxes a previous roostd left: %w", err)
	}
	// What a previous daemon let go and did not sweep (it was killed in between) is swept
	// before any session can be given it.
	m.ranges.Sweep()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.ranges.Run(ctx)
	}()
	// The sessions' refusal counters and egress checkpoints, written at intervals.
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.egress.Run(ctx, delegate.FlushInterval)
	}()
	if cfg.WarmPool > 0 || len(cfg.WarmCapsules) > 0 {
		rt, ok := cfg.Runtimes[manifest.Sealed].(warmpool.Runtime)
		if !ok {
			return nil, fmt.Errorf("a warm pool needs a sealed runtime, which this daemon does not have: %w", errdefs.ErrFailedPrecondition)
		}
		shapes, err := warmShapes(cfg, m.planner)
		if err != nil {
			return nil, fmt.Errorf("the warm pool: %w", err)
		}
		pool, err := warmpool.New(warmpool.Config{Runtime: rt, IDs: sandboxIDs{m.reg, cfg.IDs, m.ranges}, NetNS: cfg.Endpoints, StateDir: cfg.StateDir,
			CPU: cfg.WarmPoolCPU, Logger: cfg.Logger}, shapes)
		if err != nil {
			return nil, fmt.Errorf("the warm pool: %w", err)
		}
		m.pool = pool
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			pool.Run(ctx)
		}()
	}
	opened = true
	return m, nil
}

// Close lets go of every session without touching it (they run on under roost-init; the
// next daemon listens on their endpoints again), ends its detached execs and closes the
// registry.
func (m *Manager) Close() error {
	m.stopDetached()
	m.cancel()
	for _, l := range m.live.all() {
		l.mu.Lock()
		l.stopTimers()
		if l.ep != nil {
			l.ep.Close()
		}
		l.mu.Unlock()
	}
	m.egress.Release()
	m.wg.Wait()
	if m.pool != nil {
		m.pool.Close()
	}
	return m.reg.Close()
}

// SchemaVersion names the registry's layout.
func (m *Manager) SchemaVersion() string { return m.reg.SchemaVersion() }

// Get returns one session; ref is its name, its id, a unique prefix of its id or its short
// id (see resolve).
func (m *Manager) Get(ref string) (*store.Record, error) {
	var rec *store.Record
	err := m.reg.View(func(tx *store.Tx) (err error) {
		rec, err = tx.Resolve(ref)
		return err
	})
	if err == nil {
		m.accounts.Fill(rec)
	}
	return rec, err
}

// List returns staged and live sessions, or all of them, that match every label selector.
func (m *Manager) List(all bool, sels ...store.Selector) ([]*store.Record, error) {
	var recs []*store.Record
	err := m.reg.View(func(tx *store.Tx) (err error) {
		keep := func(s store.State) bool { return s != store.Exited }
		if all {
			keep = nil
		}
		recs, err = tx.List(keep, sels...)
		return err
	})
	for _, r := range recs {
		m.accounts.Fill(r)
	}
	return recs, err
}

// Status is what the daemon's gauges and doctor read of the sessions: how many are in
// each state, how many sealed sandboxes wait, and where the id ranges stand.
type Status struct {
	ByState   map[store.State]int
	WarmReady int
	// WarmByShape is WarmReady per shape of sandbox, by its name; nil without a warm pool.
	WarmByShape map[string]int
	// Ranges counts the id pool's ranges: held, free, freed (waiting for their sweep) and
	// quarantined (their sweep failed), which Quarantined lists.
	Ranges      map[string]int
	Quarantined []store.LetGo
}

// Status reads the sessions' gauges.
func (m *Manager) Status() Status {
	st := Status{ByState: m.reg.countByState(), WarmReady: m.pool.Ready(), WarmByShape: m.pool.ReadyByShape()}
	st.Ranges, st.Quarantined = m.ranges.Status()
	return st
}

// Wait blocks until the session and every descendant have ended and returns the session's
// final record. A parent's end only begins its children's (a child trapping TERM outlives
// it by up to its grace), and a caller that goes on to remove the parent, or to read its
// subtree's spend, needs the tree ended, as Stop and Kill answer.
func (m *Manager) Wait(ctx context.Context, id string) (*store.Record, error) {
	rec, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	if _, err = m.reg.waitFor(ctx, rec.ID, func(r *store.Record) bool { return r.State == store.Exited }); err != nil {
		return nil, err
	}
	if err := m.reg.waitSubtree(ctx, rec.ID); err != nil {
		return nil, err
	}
	if rec, err = m.Get(rec.ID); err != nil {
		return nil, err
	}
	m.accounts.Fill(rec)
	return rec, nil
}

func (l *liveSession) stopTimers() {
	if l.deadline != nil {
		l.deadline.Stop()
	}
	if l.killTimer != nil {
		l.killTimer.Stop()
	}
}
