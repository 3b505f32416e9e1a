// Package delegate serves what a session asks of roostd through its endpoint
// (spawn.Backend): spawning its own children, refereed against its manifest, and listing,
// waiting for and stopping them; admitting and settling the tokens of its calls; forwarding
// its model calls through the inference gateway. It decides and answers; the sessions it
// stages, launches and stops are pkg/session's, reached through Sessions. It keeps no state
// of its own, touches no registry bucket and starts no process.
package delegate

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/gateway"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/spawn"
	"roost.dev/roost/pkg/toolchain"
)

// Sessions is what delegation asks of the session manager.
type Sessions interface {
	// Record reads a session by its exact id.
	Record(id string) (*store.Record, error)
	// Children lists a session's children.
	Children(parentID string) ([]*store.Record, error)
	// Policy is a live session this daemon supervises, with its lowered manifest.
	Policy(id string) (*store.Record, *manifest.Policy, error)
	// LockSpawns holds the session's spawns apart until unlock, so that two cannot both pass
	// the live-children count.
	LockSpawns(id string) (unlock func(), err error)
	// PlanChild reads a pushed capsule and decides its containment, staging nothing.
	PlanChild(ref string) (*Child, error)
	// StageChild records a planned child.
	StageChild(c *Child, s ChildStage) (*store.Record, error)
	Launch(ctx context.Context, id string) (*store.Record, error)
	Remove(id string) error
	Wait(ctx context.Context, id string) (*store.Record, error)
	Stop(ctx context.Context, id string, grace time.Duration, reason string) (*store.Record, error)
	// WorkdirRoots are the trees charged to a parent's resources.workdir_max_bytes, its
	// children's among them, and how to name them in a refusal.
	WorkdirRoots(parent *store.Record) (roots []string, what string)
	// ChildrenDir makes the directory, rel beneath root, where the children of a parent
	// without a sealed root work.
	ChildrenDir(parent *store.Record) (root, rel string, err error)
	// TraceDelegation writes a granted child (refusal nil) or a refusal to the parent's
	// trace.
	TraceDelegation(parent *store.Record, ref, childID string, refusal error)
	LimitHit(sessionID, limit, detail string)
	// Note records an event on the session.
	Note(rec *store.Record, event, detail string) error
}

// Child is a capsule a session asked to spawn, planned and not yet staged.
type Child struct {
	// Ref is the capsule as name@version.
	Ref    string
	Policy *manifest.Policy
	// Floor is the child's containment floor; Met says this host achieves it, Shortfall why
	// not when it does not.
	Floor     manifest.Class
	Met       bool
	Shortfall string
	// HostRoot: the operator's sessions.allow_root names the capsule.
	HostRoot bool
	Shell    []toolchain.Entry
	// Plan is the session manager's own, for StageChild.
	Plan any
}

// ChildStage is how a granted child is staged: in its own workdir, below its parent.
type ChildStage struct {
	Workdir        string
	ParentID       string
	Task           []byte
	DepthRemaining int
}

// Spends is what delegation needs of the spend ledger (pkg/ledger).
type Spends interface {
	Session(sessionID string) (ledger.Spend, error)
	Admit(ledger.Admission) (ledger.Reservation, error)
	Settle(sessionID, reservationID string, u ledger.Usage) (ledger.Settlement, error)
}

// Gateway forwards sessions' model calls (pkg/gateway).
type Gateway interface {
	Serve(w http.ResponseWriter, r *http.Request, c gateway.Caller, upstream, path string)
}

// SpawnObserver hears about spawn decisions, for metrics.
type SpawnObserver interface {
	SpawnDecided(result string, took time.Duration)
}

// Config is what a Backend needs besides the sessions.
type Config struct {
	// Ledger meters the sessions' tokens and Gateway forwards their model calls; nil for
	// none.
	Ledger   Spends
	Gateway  Gateway
	Observer SpawnObserver
	// MaxConcurrent is roostd --max-concurrent: live children per parent.
	MaxConcurrent int
	// StopGrace is how long a parent's stop of its child waits before SIGKILL.
	StopGrace time.Duration
	Logger    *slog.Logger
}

// Backend is everything a session's endpoint serves.
type Backend struct {
	s     Sessions
	cfg   Config
	calls callTraces
}

var _ spawn.Backend = (*Backend)(nil)

// New serves the sessions s holds.
func New(s Sessions, cfg Config) *Backend {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Backend{s: s, cfg: cfg, calls: callTraces{sessions: map[string]*callTrace{}}}
}

// LimitHit records a bound the session's endpoint held it to.
func (b *Backend) LimitHit(sessionID, limit, detail string) { b.s.LimitHit(sessionID, limit, detail) }

// liveRecord returns a running session by its exact id (never a prefix: an endpoint names the
// session it serves).
func (b *Backend) liveRecord(id string) (*store.Record, error) {
	rec, err := b.s.Record(id)
	if err != nil {
		return nil, err
	}
	if !rec.State.Live() {
		return nil, fmt.Errorf("session %s is %s: %w", id, rec.State, errdefs.ErrFailedPrecondition)
	}
	return rec, nil
}

func (b *Backend) ledger() (Spends, error) {
	if b.cfg.Ledger == nil {
		return nil, fmt.Errorf("this roostd keeps no spend ledger: %w", errdefs.ErrUnavailable)
	}
	return b.cfg.Ledger, nil
}
