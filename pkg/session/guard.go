package session

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"roost.dev/roost/pkg/session/store"

	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/workdir"
)

// guardTries is how often one tick measures again a tree that changed deep down while it
// was being counted (workdir.ErrMoved) before it takes the change for an attack.
const guardTries = 3

// guardWorkdir measures, every GuardInterval, what the session holds on disk, and ends it
// once that is past resources.workdir_max_bytes or resources.workdir_max_inodes. What is
// measured, together (see guardRoots): the workdir, the session's home, a scoped session's
// TMPDIR, and the workdirs (with homes and TMPDIRs) of every child it has started that is
// still recorded, at any depth. A sealed session's /tmp is a tmpfs inside its own mount
// namespace, bounded by size when it is mounted (workdir_max_bytes, at most its cgroup's
// memory), so it needs no measuring here.
//
// The walk is workdir.Measure's: by descriptors, never following a link, allocated blocks
// and every inode, hard links once, each tree counted once however they nest, stopping as
// soon as either limit is passed. No path length, depth or link hides anything from it.
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
	ticker := time.NewTicker(m.cfg.GuardInterval)
	defer ticker.Stop()
	warned := false
	for {
		select {
		case <-done:
			return
		case <-m.ctx.Done():
			return
		case <-ticker.C:
		}
		roots, what := m.guardRoots(rec, canSpawn)
		var used workdir.Usage
		var err error
		for try := 0; try < guardTries; try++ {
			if used, err = workdir.Measure(roots, lim); !errors.Is(err, workdir.ErrMoved) {
				break
			}
		}
		if err == nil || used.Bytes > 0 {
			l.workdirBytes.Store(used.Bytes)
			l.workdirMeasured.Store(true)
		}
		limit, saw := "", ""
		switch {
		case lim.Bytes > 0 && used.Bytes > lim.Bytes:
			limit = store.LimitWorkdirBytes
			saw = fmt.Sprintf("%s grew to %d bytes, past resources.workdir_max_bytes (%d)", what, used.Bytes, lim.Bytes)
		case lim.Inodes > 0 && used.Inodes > lim.Inodes:
			limit = store.LimitWorkdirInodes
			saw = fmt.Sprintf("%s hold %d files and directories, past resources.workdir_max_inodes (%d)", what, used.Inodes, lim.Inodes)
		case errors.Is(err, workdir.ErrMoved):
			// Only directories more than workdir.OpenLevels deep, moved again and again while
			// they are counted, do this: a tree that cannot be measured is not let grow.
			limit = store.LimitWorkdirInodes
			saw = fmt.Sprintf("%s could not be measured: directories more than %d levels deep kept moving while roost counted them (%d tries), so resources.workdir_max_inodes (%d) cannot be held",
				what, workdir.OpenLevels, guardTries, lim.Inodes)
		}
		if err != nil && limit == "" && !warned {
			// What could not be looked at (roostd, as root, can look at everything a
			// session can make); said once per session.
			warned = true
			m.cfg.Logger.Warn("workdir guard: part of the session's trees could not be measured", "session", rec.ID, "err", err)
		}
		if limit == "" {
			continue
		}
		l.mu.Lock()
		err = m.beginStopSaying(l, rec.ID, store.EndWorkdir, saw, m.cfg.StopGrace)
		l.mu.Unlock()
		if err != nil {
			m.cfg.Logger.Error("workdir guard", "session", rec.ID, "err", err)
		}
		m.LimitHit(rec.ID, limit, saw)
		return
	}
}

// guardRoots lists the trees charged to the session and says, for its detail, what they are.
func (m *Manager) guardRoots(rec *store.Record, canSpawn bool) ([]string, string) {
	roots := []string{rec.Workdir, m.trees.home(rec.ID)}
	parts := []string{"workdir", "home"}
	if tmp := m.trees.tmp(rec); tmp != "" {
		roots = append(roots, tmp)
		parts = append(parts, "TMPDIR")
	}
	if canSpawn {
		// Where the children of a parent without a sealed root work (a sealed parent's work
		// beneath its workdir, and are counted there once: a root inside another is counted
		// as itself only).
		roots = append(roots, m.trees.children(rec.ID))
		recs, err := m.reg.all()
		if err != nil {
			m.cfg.Logger.Warn("workdir guard: listing the session's children", "session", rec.ID, "err", err)
		}
		below := store.Descendants(recs, rec.ID)
		for _, d := range below {
			roots = append(roots, d.Workdir, m.trees.home(d.ID), m.trees.children(d.ID))
			if tmp := m.trees.tmp(d); tmp != "" {
				roots = append(roots, tmp)
			}
		}
		if len(below) > 0 {
			parts = append(parts, "children's workdirs")
		}
	}
	return roots, "the " + joinAnd(parts)
}

// joinAnd is "a", "a and b", "a, b and c".
func joinAnd(parts []string) string {
	if len(parts) < 2 {
		return strings.Join(parts, "")
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}
