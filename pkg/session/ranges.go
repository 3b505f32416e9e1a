package session

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"roost.dev/roost/pkg/containment/idsweep"
	"roost.dev/roost/pkg/session/store"
)

// RangeSweeper clears what the ids of freed ranges left on the host: their processes, SysV
// IPC objects and files in the shared writable places (pkg/containment/idsweep).
type RangeSweeper interface {
	Sweep(idsweep.Ranges) (idsweep.Report, error)
}

var _ RangeSweeper = idsweep.Sweeper{}

// RangeObserver hears how sweeps of freed id ranges went, for metrics.
type RangeObserver interface {
	RangeSwept(ok bool, took time.Duration)
}

// quarantineRetry is how often a quarantined range is swept again.
const quarantineRetry = time.Minute

// ranges sweeps the id ranges sessions and sandboxes let go (see pkg/session/store's ids.go)
// so that none reaches the next holder with the last one's leftovers. A range is swept
// when it is let go (rm sweeps before it returns), at every start for those a previous
// daemon let go and did not sweep, and every quarantineRetry for those whose sweep failed.
type ranges struct {
	reg     registry
	pool    store.IDPool
	sweeper RangeSweeper
	obs     RangeObserver // nil for none
	log     *slog.Logger
	// mu makes sweeps one at a time: two would race each other's kills and removals.
	mu   sync.Mutex
	kick chan struct{}
}

func newRanges(reg registry, pool store.IDPool, sweeper RangeSweeper, obs RangeObserver, log *slog.Logger) *ranges {
	if sweeper == nil {
		sweeper = idsweep.Sweeper{}
	}
	return &ranges{reg: reg, pool: pool, sweeper: sweeper, obs: obs, log: log, kick: make(chan struct{}, 1)}
}

// sweep sweeps every range let go and not clean, and records how each went: clean, or
// quarantined with why.
func (r *ranges) sweep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	var pending []store.LetGo
	if err := r.reg.View(func(tx *store.Tx) error { pending = tx.ToSweep(); return nil }); err != nil {
		r.log.Error("listing id ranges to sweep", "err", err)
		return
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
	if err := r.reg.update(func(tx *store.Tx) error {
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

// later asks run for a sweep soon, off the caller's path.
func (r *ranges) later() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run sweeps when asked and every quarantineRetry until ctx ends.
func (r *ranges) run(ctx context.Context) {
	t := time.NewTicker(quarantineRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-t.C:
		}
		r.sweep()
	}
}

// status counts the pool's ranges by where they stand and lists the quarantined.
func (r *ranges) status() (map[string]int, []store.LetGo) {
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

// rangeRefusal is a spawn refused for the id ranges it would take.
type rangeRefusal struct {
	parent string
	err    error
}

// spawnRangeRefusal refuses a child of parent whose range would take its delegation tree
// past Config.RangesPerTree, or all spawned sessions past Config.RangesForSpawns: what is
// left is the operator's. Ended children keep their ranges until they are removed — their
// workdirs, which their parents read, are owned by them.
func (m *Manager) spawnRangeRefusal(tx *store.Tx, parent string) *rangeRefusal {
	if m.cfg.RangesPerTree <= 0 && m.cfg.RangesForSpawns <= 0 {
		return nil
	}
	top, tree, spawned, err := tx.TreeRanges(parent)
	if err != nil {
		return &rangeRefusal{parent, err}
	}
	switch {
	case m.cfg.RangesPerTree > 0 && tree+1 > m.cfg.RangesPerTree:
		return &rangeRefusal{parent, fmt.Errorf("the delegation tree of %s holds %d id ranges, sessions.ids.per_tree (%d): ended children keep theirs until removed (roostctl rm): %w",
			top, tree, m.cfg.RangesPerTree, errdefs.ErrResourceExhausted)}
	case m.cfg.RangesForSpawns > 0 && spawned+1 > m.cfg.RangesForSpawns:
		return &rangeRefusal{parent, fmt.Errorf("spawned sessions hold %d id ranges, sessions.ids.spawns (%d), which keeps the rest of the block for the operator; the tree of %s holds %d: %w",
			spawned, m.cfg.RangesForSpawns, top, tree, errdefs.ErrResourceExhausted)}
	}
	return nil
}
