package session

import (
	"context"
	"errors"
	"time"

	"roost.dev/roost/pkg/session/retention"
	"roost.dev/roost/pkg/session/store"
)

// retained is the manager as retention sees it (retention.Sessions).
type retained struct{ *Manager }

var _ retention.Sessions = retained{}

func (r retained) All() ([]*store.Record, error) { return r.reg.all() }

func (r retained) CountByState() map[store.State]int { return r.reg.countByState() }

func (r retained) RemoveEnded(ctx context.Context, doomed, all []*store.Record) map[string]error {
	return r.removeEnded(ctx, doomed, all)
}

// SessionBytes is the disk a session's own files take: its records, its home, and its
// workdir when roost made it.
func (r retained) SessionBytes(rec *store.Record) int64 {
	n := retention.TreeBytes(rec.RecordsDir) + retention.TreeBytes(r.trees.Home(rec.ID))
	if rec.OwnsWorkdir {
		n += retention.TreeBytes(rec.Workdir)
	}
	return n
}

var errNothingToCompact = errors.New("no event to compact")

func (r retained) CompactEvents(keep uint64, by string, batch int) (int, error) {
	var n int
	_, err := r.reg.Update(func(tx *store.Tx) (err error) {
		if n, err = tx.CompactEvents(keep, by, batch); err == nil && n == 0 {
			// Nothing to delete: roll back rather than commit (and fsync) nothing.
			return errNothingToCompact
		}
		return err
	})
	if errors.Is(err, errNothingToCompact) {
		err = nil
	}
	return n, err
}

// Retain applies p for the Manager's life (see retention.Retainer.Run). Call it once.
func (m *Manager) Retain(p retention.Policy) {
	if !p.Enabled() {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.retainer.Run(m.ctx, p, m.reg.changed.wait)
	}()
}

// Prune removes ended sessions now, each as Remove (roostctl rm) does: every ended session,
// or those that ended longer ago than olderThan; with dryRun it only says what would go
// (see retention.Retainer.Prune).
func (m *Manager) Prune(olderThan time.Duration, dryRun bool) (*retention.PruneResult, error) {
	return m.retainer.Prune(m.ctx, olderThan, dryRun)
}
