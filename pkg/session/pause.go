package session

import (
	"fmt"
	"time"

	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
)

// Pause freezes every process of a running session. Time paused does not count against its
// deadline.
func (m *Manager) Pause(id string) (*store.Record, error) {
	return m.freeze(id, store.Running, store.Paused, func(l *liveSession, f containment.Freezer, rec *store.Record) error {
		if err := f.Pause(); err != nil {
			return err
		}
		if l.deadline != nil {
			l.deadline.Stop()
		}
		rec.PausedAt = time.Now().UTC()
		return nil
	})
}

// Resume thaws a paused session; its deadline moves on by the time it was paused.
func (m *Manager) Resume(id string) (*store.Record, error) {
	return m.freeze(id, store.Paused, store.Running, func(l *liveSession, f containment.Freezer, rec *store.Record) error {
		if err := f.Resume(); err != nil {
			return err
		}
		if !rec.DeadlineAt.IsZero() && !rec.PausedAt.IsZero() {
			rec.DeadlineAt = rec.DeadlineAt.Add(time.Since(rec.PausedAt))
		}
		rec.PausedAt = time.Time{}
		m.armDeadline(l, rec)
		return nil
	})
}

func (m *Manager) freeze(id string, from, to store.State, act func(*liveSession, containment.Freezer, *store.Record) error) (*store.Record, error) {
	rec, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	l := m.live.lookup(rec.ID)
	if l == nil || rec.State != from {
		return nil, fmt.Errorf("session %s is %s; it must be %s: %w", rec.ID, rec.State, from, errdefs.ErrFailedPrecondition)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec, err = m.Get(rec.ID); err != nil {
		return nil, err
	}
	if rec.State != from {
		return nil, fmt.Errorf("session %s is %s; it must be %s: %w", rec.ID, rec.State, from, errdefs.ErrFailedPrecondition)
	}
	f, ok := l.proc.(containment.Freezer)
	if !ok {
		return nil, fmt.Errorf("session %s is %s: it has no cgroup to freeze; pause needs a cgroup: scoped or sealed sessions have one: %w", rec.ID, rec.Achieved, errdefs.ErrFailedPrecondition)
	}
	if err := act(l, f, rec); err != nil {
		return nil, fmt.Errorf("session %s: %w", rec.ID, err)
	}
	if err := m.reg.update(func(tx *store.Tx) error { return tx.Transition(rec, to) }); err != nil {
		return nil, err
	}
	return rec, nil
}

// thaw resumes a paused session's processes so a signal can reach them. The caller holds
// l.mu.
func thaw(l *liveSession) {
	if f, ok := l.proc.(containment.Freezer); ok {
		_ = f.Resume()
	}
}

// Usage is what a live session uses now: its cgroup's counters and ceilings, and what its
// trees hold on disk.
type Usage struct {
	containment.Usage
	// WorkdirBytes is what the trees resources.workdir_max_bytes bounds hold (the workdir,
	// home, a scoped TMPDIR, children's trees: guard.Roots), as the bound's own walk counts
	// them: the guard's last measurement, at most GuardInterval old (0 until its first).
	WorkdirBytes int64
}

// Usage is what a live session uses now; nil when nothing can be read (no process yet, or
// neither a cgroup nor a workdir to measure).
func (m *Manager) Usage(rec *store.Record) *Usage {
	l := m.live.lookup(rec.ID)
	if l == nil {
		return nil
	}
	l.mu.Lock()
	proc := l.proc
	l.mu.Unlock()
	if proc == nil {
		return nil
	}
	var u Usage
	cgroup := false
	if meter, ok := proc.(containment.Meter); ok {
		if cu, err := meter.Usage(); err == nil {
			u.Usage, cgroup = cu, true
		}
	}
	measured := l.workdirMeasured.Load()
	if !cgroup && !measured {
		return nil
	}
	u.WorkdirBytes = l.workdirBytes.Load()
	return &u
}
