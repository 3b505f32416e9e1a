// Package ranges keeps sessions' id ranges clean and bounded: it sweeps each range let
// go (pkg/containment/idsweep) before it can be handed out again, quarantines one whose
// sweep fails and retries it, and refuses a spawn whose range would take its delegation
// tree, or all spawned sessions, past their bounds. The ranges themselves are the
// record's (pkg/session/store's ids.go); this package only reads and marks them.
package ranges

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"roost.dev/roost/pkg/containment/idsweep"
	"roost.dev/roost/pkg/session/store"
)

// Sweeper clears what the ids of freed ranges left on the host: their processes, SysV
// IPC objects and files in the shared writable places (pkg/containment/idsweep).
type Sweeper interface {
	Sweep(idsweep.Ranges) (idsweep.Report, error)
}

var _ Sweeper = idsweep.Sweeper{}

// Observer hears how sweeps of freed id ranges went, for metrics.
type Observer interface {
	RangeSwept(ok bool, took time.Duration)
}

// quarantineRetry is how often a quarantined range is swept again.
const quarantineRetry = time.Minute

// Keeper sweeps the id ranges sessions and sandboxes let go so that none reaches the next
// holder with the last one's leftovers. A range is swept when it is let go (rm sweeps
// before it returns), at every start for those a previous daemon let go and did not sweep,
// and every quarantineRetry for those whose sweep failed.
type Keeper struct {
	reg     *store.Registry
	pool    store.IDPool
	sweeper Sweeper
	obs     Observer // nil for none
	log     *slog.Logger
	// mu makes sweeps one at a time: two would race each other's kills and removals.
	mu   sync.Mutex
	kick chan struct{}
}

// New keeps the ranges of pool in reg, swept by sweeper (the host's when nil).
func New(reg *store.Registry, pool store.IDPool, sweeper Sweeper, obs Observer, log *slog.Logger) *Keeper {
	if sweeper == nil {
		sweeper = idsweep.Sweeper{}
	}
	return &Keeper{reg: reg, pool: pool, sweeper: sweeper, obs: obs, log: log, kick: make(chan struct{}, 1)}
}

// Sweep sweeps every range let go and not clean, and records how each went: clean, or
// quarantined with why.
func (r *Keeper) Sweep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	var pending []store.LetGo
	if err := r.reg.View(func(tx *store.Tx) error { pending = tx.ToSweep(); return nil }); err != nil {
		r.log.Error("listing id ranges to sweep", "err", err)
		return
	}
	// A range outside the block (the block moved since it was let go) is no longer this
	// daemon's to act on: it is forgotten, never swept.
	var outside []uint32
	pending = slices.DeleteFunc(pending, func(p store.LetGo) bool {
		if r.pool.Holds(p.IDs.First) {
			return false
		}
		outside = append(outside, p.IDs.First)
		return true
	})
	if len(outside) > 0 {
		if _, err := r.reg.Update(func(tx *store.Tx) error {
			for _, first := range outside {
				if err := tx.Swept(first, r.pool, nil); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			r.log.Error("forgetting id ranges outside the block", "err", err)
		}
	}
	if len(pending) == 0 {
		return
	}
	all := make(idsweep.Ranges, 0, len(pending))
	for _, p := range pending {
		all = append(all, idsweep.Range{First: p.IDs.First, Size: p.IDs.Size})
	}
	began := time.Now()
	rep, err := r.sweeper.Sweep(all)
	if r.obs != nil {
		r.obs.RangeSwept(err == nil, time.Since(began))
	}
	results := make(map[uint32]error, len(pending))
	if err == nil {
		for _, p := range pending {
			results[p.IDs.First] = nil
		}
	} else {
		// Which range failed: each on its own.
		for _, p := range pending {
			_, results[p.IDs.First] = r.sweeper.Sweep(idsweep.Ranges{{First: p.IDs.First, Size: p.IDs.Size}})
		}
	}
	if _, err := r.reg.Update(func(tx *store.Tx) error {
		for first, serr := range results {
			if err := tx.Swept(first, r.pool, serr); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		r.log.Error("recording id ranges swept", "err", err)
		return
	}
	for _, p := range pending {
		if serr := results[p.IDs.First]; serr != nil {
			r.log.Warn("id range quarantined: its sweep failed; it is swept again before any session gets it", "first", p.IDs.First, "last_held_by", p.By, "tries", p.Tries+1, "err", serr)
		}
	}
	if rep.Processes+rep.IPC+rep.Files > 0 {
		r.log.Info("swept what freed id ranges left", "ranges", len(pending), "processes", rep.Processes, "ipc_objects", rep.IPC, "files", rep.Files, "took", time.Since(began).Round(time.Millisecond))
	}
}

// Later asks Run for a sweep soon, off the caller's path.
func (r *Keeper) Later() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run sweeps when asked and every quarantineRetry until ctx ends.
func (r *Keeper) Run(ctx context.Context) {
	t := time.NewTicker(quarantineRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-t.C:
		}
		r.Sweep()
	}
}

// Status counts the pool's ranges by where they stand and lists the quarantined.
func (r *Keeper) Status() (map[string]int, []store.LetGo) {
	var counts map[string]int
	var quarantined []store.LetGo
	_ = r.reg.View(func(tx *store.Tx) error {
		counts = tx.RangeCounts(r.pool)
		for _, p := range tx.ToSweep() {
			if p.State == store.RangeQuarantined {
				quarantined = append(quarantined, p)
			}
		}
		return nil
	})
	return counts, quarantined
}

// Bounds are the bounds on the ranges spawned sessions hold (roostd's
// sessions.ids.per_tree and .spawns); 0 for none.
type Bounds struct {
	PerTree, Spawns int
}

// RefuseSpawn refuses, with ResourceExhausted, a child of parent whose range would take its
// delegation tree past b.PerTree or all spawned sessions past b.Spawns: what is left is
// the operator's. Ended children keep their ranges until they are removed — their
// workdirs, which their parents read, are owned by them. A refusal is a *Refusal.
func (b Bounds) RefuseSpawn(tx *store.Tx, parent string) error {
	if b.PerTree <= 0 && b.Spawns <= 0 {
		return nil
	}
	top, tree, spawned, err := tx.TreeRanges(parent)
	if err != nil {
		return err
	}
	switch {
	case b.PerTree > 0 && tree+1 > b.PerTree:
		return &Refusal{fmt.Errorf("the delegation tree of %s holds %d id ranges, sessions.ids.per_tree (%d): ended children keep theirs until removed (roostctl rm): %w",
			top, tree, b.PerTree, errdefs.ErrResourceExhausted)}
	case b.Spawns > 0 && spawned+1 > b.Spawns:
		return &Refusal{fmt.Errorf("spawned sessions hold %d id ranges, sessions.ids.spawns (%d), which keeps the rest of the block for the operator; the tree of %s holds %d: %w",
			spawned, b.Spawns, top, tree, errdefs.ErrResourceExhausted)}
	}
	return nil
}

// Refusal is a spawn refused for the id range it would take.
type Refusal struct{ err error }

func (r *Refusal) Error() string { return r.err.Error() }
func (r *Refusal) Unwrap() error { return r.err }
