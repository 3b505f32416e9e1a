package session

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/fdbudget"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/exec"
)

// detachedExecs is the detached execs this daemon runs, by session and id. Ended ones are
// known by their records alone.
type detachedExecs struct {
	mu   sync.Mutex
	live map[string]map[string]*exec.Detached
	// starting counts each session's starts under way, held against exec.MaxLive too.
	starting map[string]int
	// stopped refuses new ones once the daemon is closing.
	stopped bool
}

// ExecInfo is a detached exec: its record, what it is now and what its output counts.
type ExecInfo struct {
	exec.Record
	State string
	Logs  *records.LogStats
}

// ExecDetached starts a command in a running session as Exec does, in the background (see
// exec.StartDetached): at most exec.MaxLive at once in one session, each taking
// exec.Slots of the session's share of the descriptor budget while it runs.
func (m *Manager) ExecDetached(ctx context.Context, id string, opts containment.ExecOptions) (*exec.Detached, error) {
	if opts.Stdin {
		return nil, fmt.Errorf("a detached exec takes no stdin (its stdin is empty): %w", errdefs.ErrInvalidArgument)
	}
	rec, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	sid := rec.ID
	e := &m.execs
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return nil, fmt.Errorf("roostd is stopping: %w", errdefs.ErrUnavailable)
	}
	if n := len(e.live[sid]) + e.starting[sid]; n >= exec.MaxLive {
		e.mu.Unlock()
		return nil, fmt.Errorf("session %s runs %d detached execs, the most one session may at once; wait for one to end (roostctl exec wait) or kill one (roostctl exec kill): %w", sid, exec.MaxLive, errdefs.ErrResourceExhausted)
	}
	if e.starting == nil {
		e.starting = map[string]int{}
	}
	e.starting[sid]++
	e.mu.Unlock()
	started := false
	defer func() {
		e.mu.Lock()
		if e.starting[sid]--; e.starting[sid] == 0 {
			delete(e.starting, sid)
		}
		e.mu.Unlock()
	}()

	var slots []fdbudget.Slot
	release := func() {
		for _, s := range slots {
			s.Release()
		}
	}
	defer func() {
		if !started {
			release()
		}
	}()
	if b := m.cfg.Descriptors; b != nil {
		for range exec.Slots {
			slot, err := b.Acquire(sid, fdbudget.Exec)
			if err != nil {
				return nil, fmt.Errorf("a detached exec in %s: %w", sid, err)
			}
			slots = append(slots, slot)
		}
	}
	var d *exec.Detached
	err = m.execIn(sid, opts, func(t exec.Target, policy *manifest.Policy) (err error) {
		d, err = exec.StartDetached(ctx, t, m.reg, m.cfg.Logger, opts, policy.Resources.LogMaxBytes.Value, func(d *exec.Detached) {
			e.mu.Lock()
			delete(e.live[sid], d.ID)
			if len(e.live[sid]) == 0 {
				delete(e.live, sid)
			}
			e.mu.Unlock()
			release()
		})
		if err != nil {
			return err
		}
		started = true
		e.mu.Lock()
		defer e.mu.Unlock()
		select {
		case <-d.Done():
			// Already ended, and ended's removal ran: nothing to hold.
			return nil
		default:
		}
		if e.live == nil {
			e.live = map[string]map[string]*exec.Detached{}
		}
		if e.live[sid] == nil {
			e.live[sid] = map[string]*exec.Detached{}
		}
		e.live[sid][d.ID] = d
		return nil
	})
	if err != nil {
		return nil, err
	}
	if recs, err := m.detachedRecords(rec.ID, rec.RecordsDir); err == nil {
		exec.Prune(rec.RecordsDir, recs)
	}
	return d, nil
}

// lookupDetached is the live detached exec execID of session sid; nil when it has ended
// or this daemon never ran it.
func (m *Manager) lookupDetached(sid, execID string) *exec.Detached {
	m.execs.mu.Lock()
	defer m.execs.mu.Unlock()
	return m.execs.live[sid][execID]
}

// detachedRecords reads a session's detached execs' records, marking lost those that
// claim to run but that no process of this daemon is (see exec.MarkLost).
func (m *Manager) detachedRecords(sid, recordsDir string) ([]exec.Record, error) {
	recs, err := exec.ReadRecords(recordsDir)
	if err != nil {
		return nil, err
	}
	for i, r := range recs {
		recs[i] = m.current(sid, recordsDir, r)
	}
	return recs, nil
}

// current is rec as it is now: the live exec's own record, or, for one without an end that
// this daemon does not run, lost.
func (m *Manager) current(sid, recordsDir string, rec exec.Record) exec.Record {
	if rec.State() != exec.Running {
		return rec
	}
	if d := m.lookupDetached(sid, rec.ID); d != nil {
		return d.Record()
	}
	// Started, but not yet in the table: its start holds the session's count.
	m.execs.mu.Lock()
	starting := m.execs.starting[sid] > 0
	m.execs.mu.Unlock()
	if starting {
		return rec
	}
	// Ended between the two reads: its directory has its end now.
	if again, err := exec.ReadRecord(recordsDir, sid, rec.ID); err == nil && again.State() != exec.Running {
		return again
	}
	return exec.MarkLost(recordsDir, rec)
}

func (m *Manager) info(recordsDir string, rec exec.Record) ExecInfo {
	return ExecInfo{Record: rec, State: rec.State(), Logs: exec.Stats(recordsDir, rec.ID)}
}

// detached resolves a session and one of its detached execs.
func (m *Manager) detached(id, execID string) (sid, recordsDir string, rec exec.Record, err error) {
	if err := exec.CheckID(execID); err != nil {
		return "", "", rec, err
	}
	r, err := m.Get(id)
	if err != nil {
		return "", "", rec, err
	}
	rec, err = exec.ReadRecord(r.RecordsDir, r.ID, execID)
	if err != nil {
		return "", "", rec, err
	}
	return r.ID, r.RecordsDir, m.current(r.ID, r.RecordsDir, rec), nil
}

// ListExecs returns a session's detached execs, oldest first.
func (m *Manager) ListExecs(id string) ([]ExecInfo, error) {
	rec, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	recs, err := m.detachedRecords(rec.ID, rec.RecordsDir)
	if err != nil {
		return nil, fmt.Errorf("session %s: its execs: %w", rec.ID, err)
	}
	out := make([]ExecInfo, 0, len(recs))
	for _, r := range recs {
		out = append(out, m.info(rec.RecordsDir, r))
	}
	return out, nil
}

// WaitExec waits for a detached exec to end and returns it.
func (m *Manager) WaitExec(ctx context.Context, id, execID string) (ExecInfo, error) {
	sid, dir, rec, err := m.detached(id, execID)
	if err != nil {
		return ExecInfo{}, err
	}
	if d := m.lookupDetached(sid, execID); d != nil {
		select {
		case <-d.Done():
			rec = d.Record()
		case <-ctx.Done():
			return ExecInfo{}, ctx.Err()
		}
	}
	return m.info(dir, rec), nil
}

// KillExec sends sig to a running detached exec's command and returns the exec: at once,
// or once it has ended when sig is SIGKILL.
func (m *Manager) KillExec(ctx context.Context, id, execID string, sig syscall.Signal) (ExecInfo, error) {
	sid, dir, rec, err := m.detached(id, execID)
	if err != nil {
		return ExecInfo{}, err
	}
	d := m.lookupDetached(sid, execID)
	if d == nil {
		return ExecInfo{}, fmt.Errorf("exec %s of session %s is %s (%s): %w", execID, sid, rec.State(), rec.Detail, errdefs.ErrFailedPrecondition)
	}
	if err := d.Signal(sig); err != nil {
		return ExecInfo{}, fmt.Errorf("signalling exec %s of session %s: %w", execID, sid, err)
	}
	if sig == syscall.SIGKILL {
		select {
		case <-d.Done():
		case <-ctx.Done():
			return ExecInfo{}, ctx.Err()
		}
	}
	return m.info(dir, d.Record()), nil
}

// AttachExec sends a detached exec's output as opts select (Follow: until it has ended and
// all of it has been sent) and returns the exec as it is then.
func (m *Manager) AttachExec(ctx context.Context, id, execID string, opts records.LogOptions, send func(records.LogChunk) error) (ExecInfo, error) {
	if err := opts.Check(); err != nil {
		return ExecInfo{}, err
	}
	sid, dir, rec, err := m.detached(id, execID)
	if err != nil {
		return ExecInfo{}, err
	}
	if b := m.cfg.Descriptors; b != nil {
		for range logFiles {
			slot, err := b.Acquire(fdbudget.Followers, fdbudget.Follower)
			if err != nil {
				return ExecInfo{}, fmt.Errorf("the output of %s in %s: %w", execID, sid, err)
			}
			defer slot.Release()
		}
	}
	r, err := records.NewLogReader(filepath.Join(dir, exec.Dir, execID), opts, send)
	if err != nil {
		return ExecInfo{}, err
	}
	defer r.Close()
	d := m.lookupDetached(sid, execID)
	ticker := time.NewTicker(logPoll)
	defer ticker.Stop()
	for {
		// Ended before the drain: its output is complete, so this drain is the last.
		ended := d == nil
		if d != nil {
			select {
			case <-d.Done():
				ended = true
			default:
			}
		}
		sent, err := r.Drain(send)
		if err != nil {
			return ExecInfo{}, err
		}
		if !opts.Follow || ended {
			break
		}
		if sent {
			continue
		}
		select {
		case <-d.Done():
		case <-ticker.C:
		case <-ctx.Done():
			return ExecInfo{}, ctx.Err()
		}
	}
	if d != nil {
		rec = d.Record()
	}
	return m.info(dir, rec), nil
}

// stopDetached ends this daemon's detached execs as it closes: they are its children, and
// nothing would read their output once it has gone. Each end is recorded, within a grace.
func (m *Manager) stopDetached() {
	e := &m.execs
	e.mu.Lock()
	e.stopped = true
	var all []*exec.Detached
	for _, s := range e.live {
		for _, d := range s {
			all = append(all, d)
		}
	}
	e.mu.Unlock()
	timeout := time.After(stopDetachedGrace)
	for _, d := range all {
		if err := d.End("roostd stopped"); err != nil && !errors.Is(err, containment.ErrGone) {
			m.cfg.Logger.Warn("ending a detached exec", "exec", d.ID, "err", err)
		}
	}
	for _, d := range all {
		select {
		case <-d.Done():
		case <-timeout:
			return
		}
	}
}

// stopDetachedGrace bounds how long a closing daemon waits for its detached execs' ends
// to be recorded.
const stopDetachedGrace = 5 * time.Second
