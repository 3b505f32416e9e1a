package session

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
)

// Recovery outcomes, as events' details and metric labels.
const (
	RecoveredAttached = "attached"
	RecoveredExited   = "exited"
	RecoveredLost     = "lost"
)

// recover reconciles, before the daemon serves, every session the registry lists as live:
// still running → re-attached (exit watched, deadline and any pending SIGKILL re-armed);
// ended while no daemon watched → its end recorded from exit.json; vanished without a
// record → lost. Then it removes directories of sessions the registry no longer has.
func (m *Manager) recover() error {
	var recs []*Record
	if err := m.reg.View(func(tx *Tx) (err error) {
		recs, err = tx.List(State.Live)
		return err
	}); err != nil {
		return err
	}
	for _, rec := range recs {
		was := rec.State
		outcome := m.recoverOne(rec)
		m.cfg.Logger.Info("recovered session", "session", rec.ID, "was", was, "outcome", outcome, "now", rec.State)
		if m.cfg.Observer != nil {
			m.cfg.Observer.SessionRecovered(outcome)
		}
	}
	return m.sweepLeftovers()
}

func (m *Manager) recoverOne(rec *Record) string {
	l := m.hold(rec.ID)
	l.mu.Lock()
	defer l.mu.Unlock()

	// exit.json is written once the program has ended: when it is there, the end is known,
	// whatever roost-init is still doing.
	info, err := containment.ReadExit(rec.RecordsDir)
	if err == nil {
		status, code, detail := classify(rec, info, nil)
		m.finish(l, rec, status, code, detail, info.EndedAt)
		return RecoveredExited
	}

	ref := rec.Process
	if ref == nil {
		// The daemon died during launch, before it recorded the process; roost-init
		// writes init.json before it reports, so look there, giving a roost-init still
		// starting the time to write it.
		ref = m.awaitInit(rec)
		if info, err := containment.ReadExit(rec.RecordsDir); err == nil {
			status, code, detail := classify(rec, info, nil)
			m.finish(l, rec, status, code, detail, info.EndedAt)
			return RecoveredExited
		}
	}
	class, _ := manifest.ParseClass(rec.Achieved)
	runtime := m.cfg.Runtimes[class]
	switch {
	case ref == nil:
		m.endWithoutProcess(l, rec, StatusLost, fmt.Sprintf("roostd stopped while the session was %s, and no supervisor record (init.json) or exit record was found", rec.State))
		return RecoveredLost
	case runtime == nil:
		m.endWithoutProcess(l, rec, StatusLost, fmt.Sprintf("this daemon has no %s runtime to re-attach the session with", rec.Achieved))
		return RecoveredLost
	}
	proc, err := runtime.Attach(rec.RecordsDir, *ref)
	if err != nil {
		// It may have ended between the look at exit.json and the attach.
		if info, rerr := containment.ReadExit(rec.RecordsDir); rerr == nil {
			status, code, detail := classify(rec, info, nil)
			m.finish(l, rec, status, code, detail, info.EndedAt)
			return RecoveredExited
		}
		if !errors.Is(err, containment.ErrGone) {
			m.cfg.Logger.Warn("re-attaching", "session", rec.ID, "err", err)
		}
		m.endWithoutProcess(l, rec, StatusLost, fmt.Sprintf("its supervisor (pid %d) is gone and left no exit record", ref.InitPID))
		return RecoveredLost
	}
	if rec.State == Launching {
		rec.Process = ref
		rec.StartedAt = ref.StartedAt
		rec.DeadlineAt = ref.StartedAt.Add(rec.Deadline)
		if err := m.update(func(tx *Tx) error { return tx.Transition(rec, Running) }); err != nil {
			m.cfg.Logger.Error("recovering", "session", rec.ID, "err", err)
		}
	}
	m.supervise(l, rec, proc)
	return RecoveredAttached
}

// initWait bounds how long recovery waits for a roost-init caught mid-start to write
// init.json.
const initWait = 10 * time.Second

// awaitInit returns the process identities of a session caught mid-launch: from init.json,
// or, while a roost-init of the session is still running, once it has written one.
func (m *Manager) awaitInit(rec *Record) *containment.ProcessRef {
	for deadline := time.Now().Add(initWait); ; time.Sleep(20 * time.Millisecond) {
		if r, err := containment.ReadInit(rec.RecordsDir); err == nil {
			return &r
		}
		pid, running := containment.FindInit(rec.ID)
		if !running {
			return nil
		}
		if time.Now().After(deadline) {
			// A supervisor that cannot say what it runs is not one anybody can supervise.
			m.cfg.Logger.Warn("killing a roost-init that never wrote init.json", "session", rec.ID, "pid", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			return nil
		}
	}
}

// sweepLeftovers removes records and work directories of sessions the registry no longer
// has: what a crash between forgetting a session and deleting its files leaves behind.
func (m *Manager) sweepLeftovers() error {
	known := map[string]bool{}
	if err := m.reg.View(func(tx *Tx) error {
		return sessionsBucket(tx.tx).ForEachBucket(func(k []byte) error {
			known[string(k)] = true
			return nil
		})
	}); err != nil {
		return err
	}
	for _, sub := range []string{recordsDir, workDir} {
		entries, err := os.ReadDir(filepath.Join(m.cfg.StateDir, sub))
		if err != nil {
			return err
		}
		for _, e := range entries {
			if !e.IsDir() || known[e.Name()] || !isSessionID(e.Name()) {
				continue
			}
			path := filepath.Join(m.cfg.StateDir, sub, e.Name())
			m.cfg.Logger.Info("removing leftover", "path", path)
			if err := os.RemoveAll(path); err != nil {
				m.cfg.Logger.Warn("removing leftover", "path", path, "err", err)
			}
		}
	}
	return nil
}

func isSessionID(s string) bool {
	if len(s) != len("ses_")+32 || s[:4] != "ses_" {
		return false
	}
	for _, c := range s[4:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
