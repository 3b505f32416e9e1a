package session

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"roost.dev/roost/pkg/session/delegate"
	"roost.dev/roost/pkg/session/dirs"
	"roost.dev/roost/pkg/session/outcome"
	"roost.dev/roost/pkg/session/store"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/egress"
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
	var recs []*store.Record
	if err := m.reg.View(func(tx *store.Tx) (err error) {
		recs, err = tx.List(store.State.Live)
		return err
	}); err != nil {
		return err
	}
	for _, rec := range recs {
		was := rec.State
		outcome := m.recoverOne(rec)
		m.cfg.Logger.Info("recovered session", "session", rec.ID, "capsule", rec.Capsule.Name+"@"+rec.Capsule.Version, "class", rec.Achieved,
			"was", was, "outcome", outcome, "now", rec.State)
		detail := fmt.Sprintf("%s: roostd restarted while the session was %s", outcome, was)
		if err := m.reg.update(func(tx *store.Tx) error { return tx.Note(rec, store.EventRecovered, detail) }); err != nil {
			m.cfg.Logger.Warn("recording recovery", "session", rec.ID, "err", err)
		}
		if m.cfg.Observer != nil {
			m.cfg.Observer.SessionRecovered(outcome)
		}
	}
	if err := m.lifeline.stopOrphans(); err != nil {
		return err
	}
	if err := sweepLeftovers(m.reg, m.runtimes, m.trees); err != nil {
		return err
	}
	m.collectCapsules()
	return nil
}

func (m *Manager) recoverOne(rec *store.Record) string {
	l := m.live.hold(rec.ID)
	l.mu.Lock()
	defer l.mu.Unlock()

	// exit.json is written once the program has ended: when it is there, the end is known,
	// whatever roost-init is still doing.
	info, err := containment.ReadExit(rec.RecordsDir)
	if err == nil {
		m.journal.readRecords(rec)
		status, code, detail := outcome.Classify(rec, info, nil)
		m.finish(l, rec, status, code, detail, info.EndedAt)
		return RecoveredExited
	}

	class, _ := manifest.ParseClass(rec.Achieved)
	runtime := m.cfg.Runtimes[class]
	if runtime == nil {
		m.finish(l, rec, store.StatusLost, nil, fmt.Sprintf("this daemon has no %s runtime to re-attach the session with", rec.Achieved), time.Now().UTC())
		return RecoveredLost
	}
	// Without a recorded process the daemon died mid-launch; the runtime knows where its
	// supervisor leaves word.
	proc, err := runtime.Attach(rec.ID, rec.RecordsDir, rec.Process)
	if err != nil {
		// It may have ended between the look at exit.json and the attach.
		if info, rerr := containment.ReadExit(rec.RecordsDir); rerr == nil {
			status, code, detail := outcome.Classify(rec, info, nil)
			m.finish(l, rec, status, code, detail, info.EndedAt)
			return RecoveredExited
		}
		detail := "its supervisor is gone and left no exit record"
		if !errors.Is(err, containment.ErrGone) {
			detail = "re-attaching failed: " + err.Error()
		}
		if rec.Process == nil {
			detail = fmt.Sprintf("roostd stopped while the session was %s; %s", rec.State, detail)
		}
		m.finish(l, rec, store.StatusLost, nil, detail, time.Now().UTC())
		return RecoveredLost
	}
	if rec.State == store.Launching {
		ref := proc.Ref()
		rec.Process = &ref
		rec.StartedAt = ref.StartedAt
		rec.DeadlineAt = ref.StartedAt.Add(deadlineOf(rec))
		if err := m.reg.update(func(tx *store.Tx) error { return tx.Transition(rec, store.Running) }); err != nil {
			m.cfg.Logger.Error("recovering", "session", rec.ID, "err", err)
		}
	}
	m.accounts.Reopen(rec, func() (*manifest.Policy, error) { return l.policyOf(m.reg, rec) })
	m.reopenEndpoint(l, rec, class)
	m.supervise(l, rec, proc)
	return RecoveredAttached
}

// reopenEndpoint listens again where the re-attached session's ROOST_ENDPOINT points: in
// its pinned network namespace, or on its host loopback port. The credential it holds
// still verifies: the key is in the state directory.
func (m *Manager) reopenEndpoint(l *liveSession, rec *store.Record, class manifest.Class) {
	if m.cfg.Endpoints == nil {
		return
	}
	// A scoped session launched before scoped sessions had a namespace keeps its port.
	netns := hasNetNS(class) && rec.EndpointPort == 0
	if netns {
		pinned, err := m.cfg.Endpoints.Pinned()
		if err != nil || !slices.Contains(pinned, rec.ID) {
			m.cfg.Logger.Warn("the session's network namespace is gone; it can no longer delegate", "session", rec.ID)
			return
		}
	} else if rec.EndpointPort == 0 {
		return
	}
	maxConns := manifest.DefaultEndpointMaxConns
	if policy, err := l.policyOf(m.reg, rec); err == nil {
		maxConns = int(policy.Resources.EndpointMaxConnections.Value)
	}
	var proxy *egress.Session
	if policy, err := l.policyOf(m.reg, rec); err == nil && netns {
		proxy = m.egress.Open(rec.ID, policy, delegate.ReadCarried(rec.RecordsDir, m.cfg.Logger))
	}
	ep, err := m.cfg.Endpoints.Open(rec.ID, netns, rec.EndpointPort, maxConns, m.backend, proxy)
	if err != nil {
		if proxy != nil {
			proxy.Close()
		}
		m.cfg.Logger.Warn("reopening the session's endpoint", "session", rec.ID, "err", err)
		return
	}
	l.ep = ep
}

// Holder is a runtime that can list the sessions it still holds resources for.
type Holder interface {
	Held() ([]string, error)
}

// sweepLeftovers removes what sessions that are gone left behind: runtime resources
// (containers, cgroups, pinned network namespaces) of sessions that are not live (a crash
// between recording an end and releasing them), and records and work directories of
// sessions the registry no longer has (a crash between forgetting a session and deleting
// its files).
func sweepLeftovers(reg registry, rts runtimes, t dirs.Dirs) error {
	known := map[string]bool{}
	live := map[string]bool{}
	if err := reg.View(func(tx *store.Tx) error {
		for id, state := range tx.States() {
			known[id] = true
			live[id] = state.Live()
		}
		return nil
	}); err != nil {
		return err
	}
	rts.sweep(func(id string) bool { return live[id] })
	return t.Sweep(func(id string) bool { return known[id] }, rts.log)
}
