package session

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/outcome"
	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
)

const (
	sigTerm = syscall.SIGTERM
	sigKill = syscall.SIGKILL
)

// killWait bounds how long Kill waits to see whether a signal other than SIGKILL ends the
// session before it answers with the session as it is.
const killWait = time.Second

// supervise takes charge of a running session: its deadline, the SIGKILL of a stop under
// way, and the recording of its end. The caller holds l.mu.
func (m *Manager) supervise(l *liveSession, rec *store.Record, proc containment.Process) {
	l.proc = proc
	if rec.State != store.Paused {
		m.armDeadline(l, rec)
	}
	if rec.State == store.Stopping {
		l.armKill(rec)
	}
	// The workdir guard reads a copy: the record is the caller's to change.
	guarded := *rec
	m.wg.Add(1)
	go m.guardWorkdir(l, &guarded, proc.Done())
	watched := *rec
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.journal.watchLogs(m.ctx, &watched, m.cfg.GuardInterval, proc.Done())
	}()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-proc.Done():
		case <-m.ctx.Done():
			// The daemon is shutting down: the session runs on, and the next daemon
			// records its end.
			return
		}
		info, err := proc.Exit()
		m.recordEnd(rec.ID, l, info, err)
	}()
}

// armDeadline starts the timer that ends the session at its deadline. The caller holds
// l.mu.
func (m *Manager) armDeadline(l *liveSession, rec *store.Record) {
	if rec.DeadlineAt.IsZero() {
		return
	}
	if l.deadline != nil {
		l.deadline.Stop()
	}
	id := rec.ID
	l.deadline = time.AfterFunc(max(time.Until(rec.DeadlineAt), 0), func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if m.ctx.Err() != nil {
			return
		}
		if err := m.beginStop(l, id, store.EndDeadline, "", m.cfg.StopGrace); err != nil {
			m.cfg.Logger.Error("deadline", "session", id, "err", err)
		}
	})
}

// beginStop records why roost is ending the session (and what it saw, for the detail of
// the end), moves it to stopping and sends SIGTERM; SIGKILL follows after grace. A session
// already stopping keeps its reason, and a shorter grace only brings the SIGKILL forward.
// The caller holds l.mu.
func (m *Manager) beginStop(l *liveSession, id string, why store.EndRequest, saw string, grace time.Duration) error {
	rec, err := m.Get(id)
	if err != nil {
		return err
	}
	killAt := time.Now().Add(grace).UTC()
	switch rec.State {
	case store.Running, store.Paused:
		if rec.State == store.Paused {
			// A frozen process cannot act on SIGTERM.
			thaw(l)
		}
		rec.EndRequest, rec.KillAt, rec.EndDetail = why, killAt, saw
		if err := m.reg.update(func(tx *store.Tx) error { return tx.Transition(rec, store.Stopping) }); err != nil {
			return err
		}
		if err := l.proc.Signal(sigTerm); err != nil && !errors.Is(err, containment.ErrGone) {
			return err
		}
		l.armKill(rec)
	case store.Stopping:
		if killAt.Before(rec.KillAt) {
			rec.KillAt = killAt
			if err := m.reg.update(func(tx *store.Tx) error { return tx.Save(rec) }); err != nil {
				return err
			}
			l.armKill(rec)
		}
	}
	return nil
}

// armKill starts the timer that sends SIGKILL at the record's KillAt. The caller holds
// l.mu.
func (l *liveSession) armKill(rec *store.Record) {
	if l.killTimer != nil {
		l.killTimer.Stop()
	}
	proc := l.proc
	l.killTimer = time.AfterFunc(max(time.Until(rec.KillAt), 0), func() { _ = proc.Signal(sigKill) })
}

// Stop ends a session: SIGTERM, then SIGKILL after grace. It returns once the end is
// recorded. Stopping a session that has already ended returns it as it is. reason is why
// the caller stops it (StopRequest.reason): the session's detail then says "stopped:
// <reason>" rather than "stopped by roostctl stop", so a session ended by, say, an
// interrupted roostctl run says so.
func (m *Manager) Stop(ctx context.Context, id string, grace time.Duration, reason string) (*store.Record, error) {
	rec, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	switch rec.State {
	case store.Staged:
		return nil, fmt.Errorf("session %s is staged and has never run; remove it with rm: %w", rec.ID, errdefs.ErrFailedPrecondition)
	case store.Exited:
		return rec, nil
	}
	l := m.live.lookup(rec.ID)
	if l == nil {
		return nil, fmt.Errorf("session %s is %s but not supervised by this daemon: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	l.mu.Lock()
	err = m.beginStop(l, rec.ID, store.EndStop, reason, grace)
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case <-l.ended:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// Stopping a parent stops its subtree: answer once that is done too.
	if err := m.reg.waitSubtree(ctx, rec.ID); err != nil {
		return nil, err
	}
	return m.Get(rec.ID)
}

// Kill sends sig to every process of the session. For SIGKILL it returns once the end is
// recorded; for another signal, once the session has ended or a moment has passed.
func (m *Manager) Kill(ctx context.Context, id string, sig syscall.Signal) (*store.Record, error) {
	rec, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	if !rec.State.Live() {
		return nil, fmt.Errorf("session %s is %s; only a running session can be signalled: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	l := m.live.lookup(rec.ID)
	if l == nil {
		return nil, fmt.Errorf("session %s is %s but not supervised by this daemon: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	l.mu.Lock()
	if rec, err = m.Get(rec.ID); err != nil || rec.State == store.Exited {
		l.mu.Unlock()
		return rec, err
	}
	// A stop or deadline under way keeps its reason: the kill only hurries it.
	if rec.EndRequest == store.EndNone || rec.EndRequest == store.EndKill {
		rec.EndRequest, rec.EndSignal = store.EndKill, int(sig)
		if err := m.reg.update(func(tx *store.Tx) error { return tx.Save(rec) }); err != nil {
			l.mu.Unlock()
			return nil, err
		}
	}
	if rec.State == store.Paused {
		thaw(l)
	}
	err = l.proc.Signal(sig)
	l.mu.Unlock()
	if err != nil && !errors.Is(err, containment.ErrGone) {
		return nil, fmt.Errorf("signalling session %s: %w", rec.ID, err)
	}
	var timeout <-chan time.Time
	if sig != sigKill {
		timeout = time.After(killWait)
	}
	select {
	case <-l.ended:
		if err := m.reg.waitSubtree(ctx, rec.ID); err != nil {
			return nil, err
		}
	case <-timeout:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return m.Get(rec.ID)
}

// recordEnd records how a supervised session ended.
func (m *Manager) recordEnd(id string, l *liveSession, info containment.ExitInfo, exitErr error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec, err := m.Get(id)
	if err != nil {
		m.cfg.Logger.Error("recording end", "session", id, "err", err)
		return
	}
	status, code, detail := outcome.Classify(rec, info, exitErr)
	detail = outcome.LandlockHint(rec, status, detail)
	ended := info.EndedAt
	if ended.IsZero() {
		ended = time.Now().UTC()
	}
	m.journal.readRecords(rec)
	m.finish(l, rec, status, code, detail, ended)
}

// finish writes the session's end: trace and completion.json first, then the registry, so
// a crash between them leaves a session recovery will end again rather than an end with no
// trace. Then it frees what the runtime held (a crash before that leaves leftovers the next
// start sweeps), closes the session's endpoint and stops its children. The caller holds
// l.mu.
func (m *Manager) finish(l *liveSession, rec *store.Record, status store.ExitStatus, code *int, detail string, ended time.Time) {
	l.stopTimers()
	defer m.runtimes.release(rec)
	if rec.State != store.Exited {
		rec.ExitStatus, rec.ExitCode, rec.Detail, rec.EndedAt = status, code, detail, ended
		// Before the trace's end: the proxy's last records precede it.
		m.egress.Close(rec)
		m.accounts.Close(rec)
		if err := records.AppendTrace(rec.RecordsDir, outcome.Trace(rec)); err != nil {
			m.cfg.Logger.Warn("trace", "session", rec.ID, "err", err)
		}
		// Before the end commits, so a parent woken by it finds the file.
		if rec.ParentID != "" {
			writeCompletion(m.cfg.Logger, rec)
		}
		if err := m.reg.recordExited(m.ctx, rec, m.cfg.Logger); err != nil {
			m.cfg.Logger.Error("recording end", "session", rec.ID, "err", err)
			return
		}
		// Counted once the end commits, and only here: an end recorded before a restart is
		// not live at the next start, so recovery never ends (or counts) it again.
		if m.journal.ends != nil {
			m.journal.ends.SessionEnded(rec.EndClass(), rec.EndStatus())
		}
		ended := []any{"session", rec.ID, "capsule", rec.Capsule.Name + "@" + rec.Capsule.Version, "class", rec.Achieved,
			"status", string(rec.ExitStatus)}
		if rec.ExitCode != nil {
			ended = append(ended, "exit_code", *rec.ExitCode)
		}
		ended = append(ended, "detail", rec.Detail)
		if !rec.StartedAt.IsZero() {
			ended = append(ended, "ran", rec.EndedAt.Sub(rec.StartedAt).Round(time.Millisecond).String())
		}
		m.cfg.Logger.Info("session ended", ended...)
		endHooks(m.cfg.Hooks, m.cfg.SessionView, m.cfg.Logger, rec)
	}
	if l.ep != nil {
		l.ep.Close()
	}
	m.lifeline.endChildren(rec.ID)
	m.live.forget(rec.ID, l)
	select {
	case <-l.ended:
	default:
		close(l.ended)
	}
}
