package session

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"
)

// Retention is what roostd keeps of ended sessions (roostd --retain-ended, --retain-for).
// Removing one is what `roostctl rm` does (Remove); the event log is then compacted to the
// sessions that remain (Tx.CompactEvents). The zero Retention keeps everything: ended
// sessions stay until an operator removes them.
type Retention struct {
	// MaxEnded keeps at most this many ended sessions, those that ended last; 0 keeps any
	// number.
	MaxEnded int
	// MaxAge removes ended sessions that ended longer ago; 0 keeps them however old.
	MaxAge time.Duration
	// Interval is how often a pass runs besides those that follow sessions' ends;
	// DefaultRetentionInterval when 0.
	Interval time.Duration
	// MaxEvents bounds the event log even while an old session still held pins it; 0 is
	// max(MinEventsKept, EventsPerSession × the sessions held).
	MaxEvents int
}

// DefaultRetentionInterval is how often retention looks at ended sessions' ages.
const DefaultRetentionInterval = time.Minute

// The event log's bound while a session the registry holds pins its start (a session staged
// long ago and never launched, one that runs for weeks): at least MinEventsKept events, and
// EventsPerSession for every session held.
const (
	MinEventsKept    = 10000
	EventsPerSession = 100
)

// retentionSettle gathers a burst of ends into one pass.
const retentionSettle = 200 * time.Millisecond

// compactBatch bounds the events one compaction transaction deletes.
const compactBatch = 10000

// Enabled says whether r removes anything.
func (r Retention) Enabled() bool { return r.MaxEnded > 0 || r.MaxAge > 0 }

// String names the bounds as roostd's flags.
func (r Retention) String() string {
	var flags []string
	if r.MaxEnded > 0 {
		flags = append(flags, fmt.Sprintf("--retain-ended %d", r.MaxEnded))
	}
	if r.MaxAge > 0 {
		flags = append(flags, "--retain-for "+r.MaxAge.String())
	}
	return strings.Join(append([]string{"roostd"}, flags...), " ")
}

// RetentionObserver hears what retention and prune removed, for metrics.
type RetentionObserver interface {
	SessionsPruned(n int)
	EventsCompacted(n int)
}

// Retain applies r for the Manager's life: a pass now (Open has recovered every session), one
// shortly after sessions end, and one every r.Interval for the ages. Call it once.
func (m *Manager) Retain(r Retention) {
	if !r.Enabled() {
		return
	}
	if r.Interval <= 0 {
		r.Interval = DefaultRetentionInterval
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		tick := time.NewTicker(r.Interval)
		defer tick.Stop()
		full := true
		for {
			// Taken before the pass: an end committed during it wakes the next one. The
			// pass's own removals wake it too; that pass finds nothing over the bound.
			changed := m.reg.changed.wait()
			m.retainPass(r, full)
			select {
			case <-m.ctx.Done():
				return
			case <-tick.C:
				full = true
			case <-changed:
				full = false
				select {
				case <-m.ctx.Done():
					return
				case <-time.After(retentionSettle):
				}
			}
		}
	}()
}

// retainPass removes the ended sessions r does not keep, then compacts the event log. A pass
// woken by a change (not full) first counts ended sessions, reading a few bytes of each, and
// stops there when the count is within bounds.
func (m *Manager) retainPass(r Retention, full bool) {
	if !full && (r.MaxEnded == 0 || m.CountByState()[store.Exited] <= r.MaxEnded) {
		return
	}
	recs, err := m.reg.all()
	if err != nil {
		m.cfg.Logger.Warn("retention: listing sessions", "err", err)
		return
	}
	cutoff := time.Now().Add(-r.MaxAge)
	doomed, kept := selectEnded(recs, r.MaxEnded, func(rec *store.Record) bool {
		return r.MaxAge > 0 && endedAt(rec).Before(cutoff)
	})
	removed := 0
	results := m.removeEnded(doomed, recs)
	for _, rec := range doomed {
		// NotFound: removed meanwhile (rm, prune, or with its parent).
		if err := results[rec.ID]; err != nil && !errdefs.IsNotFound(err) {
			m.cfg.Logger.Warn("retention: removing an ended session", "session", rec.ID, "err", err)
			continue
		}
		removed++
	}
	if m.ctx.Err() != nil {
		return
	}
	if removed > 0 || len(kept) > 0 {
		m.cfg.Logger.Info("retention pass", "removed", removed, "kept_for_live_descendants", len(kept), "by", r.String())
	}
	if removed == 0 && !full {
		return
	}
	m.sessionsPruned(removed)
	if _, err := m.compactEvents(r, r.String()); err != nil {
		m.cfg.Logger.Warn("retention: compacting the event log", "err", err)
	}
}

var errNothingToCompact = errors.New("no event to compact")

// compactEvents compacts the event log, a bounded batch per transaction.
func (m *Manager) compactEvents(r Retention, by string) (int, error) {
	keep := uint64(r.MaxEvents)
	if keep == 0 {
		held := 0
		for _, n := range m.CountByState() {
			held += n
		}
		keep = uint64(max(MinEventsKept, EventsPerSession*held))
	}
	total := 0
	for {
		var n int
		_, err := m.reg.Update(func(tx *store.Tx) (err error) {
			if n, err = tx.CompactEvents(keep, by, compactBatch); err == nil && n == 0 {
				// Nothing to delete: roll back rather than commit (and fsync) nothing.
				return errNothingToCompact
			}
			return err
		})
		if errors.Is(err, errNothingToCompact) {
			err = nil
		}
		total += n
		if err != nil || n < compactBatch {
			if total > 0 {
				if obs, ok := m.cfg.Observer.(RetentionObserver); ok {
					obs.EventsCompacted(total)
				}
			}
			return total, err
		}
	}
}

func (m *Manager) sessionsPruned(n int) {
	if obs, ok := m.cfg.Observer.(RetentionObserver); ok && n > 0 {
		obs.SessionsPruned(n)
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
func (m *Manager) Prune(olderThan time.Duration, dryRun bool) (*PruneResult, error) {
	if olderThan < 0 {
		return nil, fmt.Errorf("prune --until %s: must not be negative: %w", olderThan, errdefs.ErrInvalidArgument)
	}
	recs, err := m.reg.all()
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
		sizes[i] = m.sessionBytes(rec)
	}
	var results map[string]error
	if !dryRun {
		results = m.removeEnded(doomed, recs)
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
	m.sessionsPruned(len(res.Removed))
	// The sessions are gone whatever happens here; a log left long is compacted by the next
	// prune or retention pass.
	if res.EventsCompacted, err = m.compactEvents(Retention{}, "roostctl prune"); err != nil {
		m.cfg.Logger.Warn("prune: compacting the event log", "err", err)
	}
	return res, nil
}

// sessionBytes is the disk a session's own files take: its records, its home, and its
// workdir when roost made it.
func (m *Manager) sessionBytes(rec *store.Record) int64 {
	n := treeBytes(rec.RecordsDir) + treeBytes(m.trees.home(rec.ID))
	if rec.OwnsWorkdir {
		n += treeBytes(rec.Workdir)
	}
	return n
}

// treeBytes adds up the blocks allocated under root, every one of them.
func treeBytes(root string) int64 {
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

// What the state directory's filesystem must keep free for roostd to stage a session: 1 %
// of it, at least 4 MiB and at most 64 MiB, and 1024 inodes. The rest of that room is for
// what runs: sessions' ends, logs and exit records, the registry's and the ledger's commits.
const (
	minDiskReserve = 4 << 20
	maxDiskReserve = 64 << 20
	minFreeInodes  = 1024
)

func diskReserve(size uint64) uint64 { return min(max(size/100, minDiskReserve), maxDiskReserve) }

// checkDiskSpace refuses a new session when the state directory's filesystem is nearly full,
// so that what runs keeps the room it needs to record how it ends. It counts a disk_full
// limit: there is no session to note it on.
func (m *Manager) checkDiskSpace() error {
	d, err := store.StatDisk(m.cfg.StateDir)
	if err != nil {
		// Nothing known; the registry's own write reports a full disk.
		return nil
	}
	var what string
	switch {
	case d.Free < diskReserve(d.Size):
		what = fmt.Sprintf("refusing to stage a session: roostd keeps %s free on the state directory's filesystem so that running sessions can still record how they end", store.SizeOf(diskReserve(d.Size)))
	case d.Inodes > 0 && d.FreeInodes < minFreeInodes:
		what = fmt.Sprintf("refusing to stage a session: the state directory's filesystem has %d inodes free of %d (roostd keeps %d)", d.FreeInodes, d.Inodes, minFreeInodes)
	default:
		return nil
	}
	if obs, ok := m.cfg.Observer.(LimitObserver); ok {
		obs.LimitHit(store.LimitDiskFull)
	}
	return store.NoSpaceError(m.cfg.StateDir, what)
}
