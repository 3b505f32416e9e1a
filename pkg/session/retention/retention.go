// Package retention decides which ended sessions roostd forgets, and when: the newest
// --retain-ended and those younger than --retain-for stay, nothing a live session descends
// from goes, and the event log is compacted to what remains. It removes nothing itself: the
// session manager removes each session as roostctl rm would, through Sessions.
package retention

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"roost.dev/roost/pkg/session/store"
)

// Sessions is what retention asks of the session manager.
type Sessions interface {
	All() ([]*store.Record, error)
	CountByState() map[store.State]int
	// RemoveEnded removes each of doomed with its subtree, as rm does; all is every record,
	// for the subtrees. It returns each one's error (nil for removed).
	RemoveEnded(ctx context.Context, doomed, all []*store.Record) map[string]error
	// SessionBytes is the disk a session's own files take.
	SessionBytes(rec *store.Record) int64
	// CompactEvents deletes, in one transaction, at most batch events the registry need not
	// keep beyond the newest keep; by names who compacts.
	CompactEvents(keep uint64, by string, batch int) (int, error)
}

// Retainer applies a Policy to the sessions it is given.
type Retainer struct {
	s   Sessions
	obs Observer
	log *slog.Logger
}

// New retains among s's sessions; obs may be nil.
func New(s Sessions, obs Observer, log *slog.Logger) *Retainer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Retainer{s: s, obs: obs, log: log}
}

// Policy is what roostd keeps of ended sessions (roostd --retain-ended, --retain-for).
// Removing one is what `roostctl rm` does; the event log is then compacted to the sessions
// that remain (Tx.CompactEvents). The zero Policy keeps everything: ended sessions stay
// until an operator removes them.
type Policy struct {
	// MaxEnded keeps at most this many ended sessions, those that ended last; 0 keeps any
	// number.
	MaxEnded int
	// MaxAge removes ended sessions that ended longer ago; 0 keeps them however old.
	MaxAge time.Duration
	// Interval is how often a pass runs besides those that follow sessions' ends;
	// DefaultInterval when 0.
	Interval time.Duration
	// MaxEvents bounds the event log even while an old session still held pins it; 0 is
	// max(MinEventsKept, EventsPerSession × the sessions held).
	MaxEvents int
}

// DefaultInterval is how often retention looks at ended sessions' ages.
const DefaultInterval = time.Minute

// The event log's bound while a session the registry holds pins its start (a session staged
// long ago and never launched, one that runs for weeks): at least MinEventsKept events, and
// EventsPerSession for every session held.
const (
	MinEventsKept    = 10000
	EventsPerSession = 100
)

// settle gathers a burst of ends into one pass.
const settle = 200 * time.Millisecond

// compactBatch bounds the events one compaction transaction deletes.
const compactBatch = 10000

// Enabled says whether r removes anything.
func (r Policy) Enabled() bool { return r.MaxEnded > 0 || r.MaxAge > 0 }

// String names the bounds as roostd's flags.
func (r Policy) String() string {
	var flags []string
	if r.MaxEnded > 0 {
		flags = append(flags, fmt.Sprintf("--retain-ended %d", r.MaxEnded))
	}
	if r.MaxAge > 0 {
		flags = append(flags, "--retain-for "+r.MaxAge.String())
	}
	return strings.Join(append([]string{"roostd"}, flags...), " ")
}

// Observer hears what retention and prune removed, for metrics.
type Observer interface {
	SessionsPruned(n int)
	EventsCompacted(n int)
}

// Run applies p until ctx ends: a pass now (the session manager has recovered every session),
// one shortly after sessions end (changed returns a channel closed by the next change), and
// one every p.Interval for the ages.
func (rt *Retainer) Run(ctx context.Context, p Policy, changed func() <-chan struct{}) {
	if p.Interval <= 0 {
		p.Interval = DefaultInterval
	}
	tick := time.NewTicker(p.Interval)
	defer tick.Stop()
	full := true
	for {
		// Taken before the pass: an end committed during it wakes the next one. The pass's
		// own removals wake it too; that pass finds nothing over the bound.
		ch := changed()
		rt.Pass(ctx, p, full)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			full = true
		case <-ch:
			full = false
			select {
			case <-ctx.Done():
				return
			case <-time.After(settle):
			}
		}
	}
}

// Pass removes the ended sessions r does not keep, then compacts the event log. A pass woken
// by a change (not full) first counts ended sessions, reading a few bytes of each, and stops
// there when the count is within bounds.
func (rt *Retainer) Pass(ctx context.Context, r Policy, full bool) {
	if !full && (r.MaxEnded == 0 || rt.s.CountByState()[store.Exited] <= r.MaxEnded) {
		return
	}
	recs, err := rt.s.All()
	if err != nil {
		rt.log.Warn("retention: listing sessions", "err", err)
		return
	}
	cutoff := time.Now().Add(-r.MaxAge)
	doomed, kept := selectEnded(recs, r.MaxEnded, func(rec *store.Record) bool {
		return r.MaxAge > 0 && endedAt(rec).Before(cutoff)
	})
	removed := 0
	results := rt.s.RemoveEnded(ctx, doomed, recs)
	for _, rec := range doomed {
		// NotFound: removed meanwhile (rm, prune, or with its parent).
		if err := results[rec.ID]; err != nil && !errdefs.IsNotFound(err) {
			rt.log.Warn("retention: removing an ended session", "session", rec.ID, "err", err)
			continue
		}
		removed++
	}
	if ctx.Err() != nil {
		return
	}
	if removed > 0 || len(kept) > 0 {
		rt.log.Info("retention pass", "removed", removed, "kept_for_live_descendants", len(kept), "by", r.String())
	}
	if removed == 0 && !full {
		return
	}
	rt.pruned(removed)
	if _, err := rt.compactEvents(r, r.String()); err != nil {
		rt.log.Warn("retention: compacting the event log", "err", err)
	}
}

// compactEvents compacts the event log, a bounded batch per transaction.
func (rt *Retainer) compactEvents(r Policy, by string) (int, error) {
	keep := uint64(r.MaxEvents)
	if keep == 0 {
		held := 0
		for _, n := range rt.s.CountByState() {
			held += n
		}
		keep = uint64(max(MinEventsKept, EventsPerSession*held))
	}
	total := 0
	for {
		n, err := rt.s.CompactEvents(keep, by, compactBatch)
		total += n
		if err != nil || n < compactBatch {
			if total > 0 {
				if rt.obs != nil {
					rt.obs.EventsCompacted(total)
				}
			}
			return total, err
		}
	}
}

func (rt *Retainer) pruned(n int) {
	if rt.obs != nil && n > 0 {
		rt.obs.SessionsPruned(n)
	}
}

// endedAt is when a session ended; an ended record without the time (none should be) counts
// as ended when it was created.
func endedAt(rec *store.Record) time.Time {
	if rec.EndedAt.IsZero() {
		return rec.CreatedAt
	}
	return rec.EndedAt
}

// selectEnded picks the ended sessions to remove, oldest end first: those past the newest
// maxEnded (0: none is), and those old says are too old. A picked session some live session
// descends from is kept instead (it is its parent's, or an ancestor's, and removing it would
// take the child's record with it), and so is a live session's ended child.
func selectEnded(recs []*store.Record, maxEnded int, old func(*store.Record) bool) (doomed, kept []*store.Record) {
	parent := make(map[string]string, len(recs))
	for _, r := range recs {
		parent[r.ID] = r.ParentID
	}
	pinned := map[string]bool{}
	var ended []*store.Record
	for _, r := range recs {
		switch {
		case r.State.Live():
			for p := r.ParentID; p != "" && !pinned[p]; p = parent[p] {
				pinned[p] = true
			}
		case r.State == store.Exited:
			ended = append(ended, r)
		}
	}
	// Newest end first; ids (UUIDv7, creation order) break ties.
	slices.SortFunc(ended, func(a, b *store.Record) int {
		if c := endedAt(b).Compare(endedAt(a)); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	live := map[string]bool{}
	for _, r := range recs {
		if r.State.Live() {
			live[r.ID] = true
		}
	}
	for i, r := range ended {
		if !(maxEnded > 0 && i >= maxEnded) && !old(r) {
			continue
		}
		// A live parent's ended children stay: they count against its
		// spawn.max_total_children, which forgetting them would reset.
		if pinned[r.ID] || live[r.ParentID] {
			kept = append(kept, r)
			continue
		}
		doomed = append(doomed, r)
	}
	slices.Reverse(doomed)
	slices.Reverse(kept)
	return doomed, kept
}

// Pruned is one ended session Prune removed (or, dry, would), or kept.
type Pruned struct {
	Record *store.Record
	// Bytes is what its records, its home and the workdir roost made for it hold on disk.
	Bytes int64
	// Why it was kept; empty for one removed.
	Why string
}

// PruneResult is what Prune did, oldest end first.
type PruneResult struct {
	Removed []Pruned
	Kept    []Pruned
	// Bytes is what the removed sessions' files held.
	Bytes int64
	// EventsCompacted is how many events left the log with them.
	EventsCompacted int
}

// Prune removes ended sessions now, each as Remove (roostctl rm) does: every ended session,
// or those that ended longer ago than olderThan. With dryRun it removes nothing and reports
// what would go. A session a live session descends from is kept, and reported. Then the
// event log is compacted to the sessions that remain.
func (rt *Retainer) Prune(ctx context.Context, olderThan time.Duration, dryRun bool) (*PruneResult, error) {
	if olderThan < 0 {
		return nil, fmt.Errorf("prune --until %s: must not be negative: %w", olderThan, errdefs.ErrInvalidArgument)
	}
	recs, err := rt.s.All()
	if err != nil {
		return nil, err
	}
	cutoff := time.Now().Add(-olderThan)
	doomed, kept := selectEnded(recs, 0, func(rec *store.Record) bool { return olderThan == 0 || endedAt(rec).Before(cutoff) })
	res := &PruneResult{}
	for _, rec := range kept {
		why := "a live session descends from it"
		if slices.ContainsFunc(recs, func(r *store.Record) bool { return r.ID == rec.ParentID && r.State.Live() }) {
			why = "its parent is live (its children count against spawn.max_total_children)"
		}
		res.Kept = append(res.Kept, Pruned{Record: rec, Why: why})
	}
	// Measured before anything goes: removing a parent may take its children with it.
	sizes := make([]int64, len(doomed))
	for i, rec := range doomed {
		sizes[i] = rt.s.SessionBytes(rec)
	}
	var results map[string]error
	if !dryRun {
		results = rt.s.RemoveEnded(ctx, doomed, recs)
	}
	for i, rec := range doomed {
		if err := results[rec.ID]; err != nil && !errdefs.IsNotFound(err) {
			res.Kept = append(res.Kept, Pruned{Record: rec, Bytes: sizes[i], Why: err.Error()})
			continue
		}
		res.Removed = append(res.Removed, Pruned{Record: rec, Bytes: sizes[i]})
		res.Bytes += sizes[i]
	}
	if dryRun {
		return res, nil
	}
	rt.pruned(len(res.Removed))
	// The sessions are gone whatever happens here; a log left long is compacted by the next
	// prune or retention pass.
	if res.EventsCompacted, err = rt.compactEvents(Policy{}, "roostctl prune"); err != nil {
		rt.log.Warn("prune: compacting the event log", "err", err)
	}
	return res, nil
}

// TreeBytes adds up the blocks allocated under root, every one of them.
func TreeBytes(root string) int64 {
	if root == "" {
		return 0
	}
	var n int64
	_ = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}
