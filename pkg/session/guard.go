package session

import (
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/workdir"
)

// guardWorkdir ends the session once what it holds on disk is past its
// resources.workdir_max_bytes or resources.workdir_max_inodes (see pkg/session/guard).
// rec is the session as it was when supervision began (a copy: the guard reads no field
// that changes).
func (m *Manager) guardWorkdir(l *liveSession, rec *store.Record, done <-chan struct{}) {
	defer m.wg.Done()
	lim := workdir.Limits{Bytes: rec.WorkdirLimit, Inodes: manifest.DefaultWorkdirMaxInodes}
	canSpawn := true
	if p, err := l.policyOf(m.reg, rec); err == nil {
		lim.Inodes = p.Resources.WorkdirMaxInodes.Value
		if lim.Bytes <= 0 {
			lim.Bytes = p.Resources.WorkdirMaxBytes.Value
		}
		canSpawn = len(p.Spawn.Allow) > 0
	} else {
		m.cfg.Logger.Warn("workdir guard: reading the session's policy; the default inode limit holds", "session", rec.ID, "err", err)
	}
	breach := m.guard.Watch(m.ctx, done, rec, lim, canSpawn, func(bytes int64) {
		l.workdirBytes.Store(bytes)
		l.workdirMeasured.Store(true)
	})
	if breach == nil {
		return
	}
	l.mu.Lock()
	err := m.beginStop(l, rec.ID, store.EndWorkdir, breach.Saw, m.cfg.StopGrace)
	l.mu.Unlock()
	if err != nil {
		m.cfg.Logger.Error("workdir guard", "session", rec.ID, "err", err)
	}
	m.journal.LimitHit(rec.ID, breach.Limit, breach.Saw)
}
