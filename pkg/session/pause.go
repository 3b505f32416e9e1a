package session

import (
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/workdir"
)

// Pause freezes every process of a running session. Time paused does not count against its
// deadline.
func (m *Manager) Pause(id string) (*Record, error) {
	return m.freeze(id, Running, Paused, func(l *liveSession, f containment.Freezer, rec *Record) error {
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
func (m *Manager) Resume(id string) (*Record, error) {
	return m.freeze(id, Paused, Running, func(l *liveSession, f containment.Freezer, rec *Record) error {
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

func (m *Manager) freeze(id string, from, to State, act func(*liveSession, containment.Freezer, *Record) error) (*Record, error) {
	rec, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	l := m.lookup(rec.ID)
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
	if err := m.update(func(tx *Tx) error { return tx.Transition(rec, to) }); err != nil {
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
	// home, a scoped TMPDIR, children's trees: guardRoots), as the bound's own walk counts
	// them; a few seconds old at most (see workdirBytes).
	WorkdirBytes int64
}

// Usage is what a live session uses now; nil when nothing can be read (no process yet, or
// neither a cgroup nor a workdir to measure).
func (m *Manager) Usage(rec *Record) *Usage {
	l := m.lookup(rec.ID)
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
	bytes, measured := m.workdirBytes(l, rec)
	if !cgroup && !measured {
		return nil
	}
	u.WorkdirBytes = bytes
	return &u
}

// workdirSizes caches what Usage measured of live sessions' trees, by their live entry: a
// `ps` or `stats` over many sessions, asked every second, must not walk every workdir on
// every call. Entries go once their session has ended (swept by the next measurement).
var workdirSizes = struct {
	sync.Mutex
	m map[*liveSession]*workdirSize
}{m: map[*liveSession]*workdirSize{}}

type workdirSize struct {
	// mu is held by the first measurement, which the callers meanwhile wait for; once there
	// is a measurement, it guards only the fields.
	mu         sync.Mutex
	at         time.Time // when bytes was measured; zero before the first measurement
	bytes      int64
	refreshing bool
	used       time.Time // when a caller last asked
}

// workdirSizeIdle is how long an entry nobody asks about is kept.
const workdirSizeIdle = time.Minute

// workdirBytes is what the session's bounded trees hold, measured as the workdir guard does
// (workdir.Measure over guardRoots, stopping past the session's limits, so no tree costs
// more than its bound allows). The first call measures and waits, and so does one finding
// the last measurement 2 × GuardInterval old or older (nobody asked meanwhile). Others answer
// the last measurement at once and, when it is GuardInterval old or older (as stale as the
// guard's own view may be), start one more in the background: a caller asking every second
// (stats) never waits, and sees bytes at most about 2 × GuardInterval old. ok is false when
// nothing could be measured.
func (m *Manager) workdirBytes(l *liveSession, rec *Record) (int64, bool) {
	if rec.Workdir == "" {
		return 0, false
	}
	now := time.Now()
	workdirSizes.Lock()
	ws := workdirSizes.m[l]
	if ws == nil {
		ws = &workdirSize{}
		workdirSizes.m[l] = ws
		sweepWorkdirSizes(now)
	}
	workdirSizes.Unlock()

	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.used = now
	age := now.Sub(ws.at)
	if ws.at.IsZero() || age >= 2*m.cfg.GuardInterval && !ws.refreshing {
		// Nothing measured, or nobody asked for a while: what is cached says too little.
		ws.bytes, ws.at = m.measureWorkdir(l, rec), time.Now()
		return ws.bytes, true
	}
	if age >= m.cfg.GuardInterval && !ws.refreshing && m.ctx.Err() == nil {
		ws.refreshing = true
		r := *rec
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			n := m.measureWorkdir(l, &r)
			ws.mu.Lock()
			ws.bytes, ws.at, ws.refreshing = n, time.Now(), false
			ws.mu.Unlock()
		}()
	}
	return ws.bytes, true
}

// sweepWorkdirSizes drops the entries of ended sessions and of those nobody asked about for
// a while. The caller holds workdirSizes.
func sweepWorkdirSizes(now time.Time) {
	for l, ws := range workdirSizes.m {
		select {
		case <-l.ended:
			delete(workdirSizes.m, l)
			continue
		default:
		}
		// TryLock: an entry being measured for the first time is in use.
		if ws.mu.TryLock() {
			if !ws.at.IsZero() && !ws.refreshing && now.Sub(ws.used) > workdirSizeIdle {
				delete(workdirSizes.m, l)
			}
			ws.mu.Unlock()
		}
	}
}

// measureWorkdir walks the trees the workdir bound counts, within its limits (past them the
// walk stops: the guard is ending the session anyway). What could not be looked at makes
// the answer a floor, as it does the guard's.
func (m *Manager) measureWorkdir(l *liveSession, rec *Record) int64 {
	lim := workdir.Limits{Bytes: rec.WorkdirLimit, Inodes: manifest.DefaultWorkdirMaxInodes}
	canSpawn := true
	if p, err := m.policyOf(l, rec); err == nil {
		lim.Inodes = p.Resources.WorkdirMaxInodes.Value
		if lim.Bytes <= 0 {
			lim.Bytes = p.Resources.WorkdirMaxBytes.Value
		}
		canSpawn = len(p.Spawn.Allow) > 0
	}
	roots, _ := m.guardRoots(rec, canSpawn)
	used, _ := workdir.Measure(roots, lim)
	return used.Bytes
}
