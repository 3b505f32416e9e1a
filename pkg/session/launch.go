package session

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/containment/sysview"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/delegate"
	"roost.dev/roost/pkg/session/plan"
	"roost.dev/roost/pkg/session/spec"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/session/warmpool"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/spawn"
	"roost.dev/roost/pkg/toolchain"
)

// Launch starts a staged session and returns once its program runs, or once it has failed
// to start (the session is then exited with start_failed, and that is not an error of
// Launch).
//
// It takes two transactions on purpose: launching is written before the process exists, so
// a daemon that dies in between leaves a record recovery can resolve, never a process
// nobody knows of.
func (m *Manager) Launch(ctx context.Context, id string) (*store.Record, error) {
	rec, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	sid := rec.ID
	l := m.live.hold(sid)
	l.mu.Lock()
	defer l.mu.Unlock()
	// Every way out before the program is supervised lets go of the live entry (release
	// keeps an entry that has a process).
	defer m.live.release(sid, l)
	if rec, err = m.Get(sid); err != nil {
		return nil, err
	}
	if rec.State != store.Staged {
		return nil, fmt.Errorf("session %s is %s; only a staged session can be launched: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	class, err := manifest.ParseClass(rec.Achieved)
	if err != nil {
		return nil, fmt.Errorf("session %s: %v: %w", rec.ID, err, errdefs.ErrDataLoss)
	}
	runtime := m.cfg.Runtimes[class]
	if runtime == nil {
		return nil, fmt.Errorf("session %s needs a %s runtime, which this daemon does not have: %w", rec.ID, class, errdefs.ErrFailedPrecondition)
	}
	// A sealed session that fits takes a sandbox made ahead, and with it the sandbox's uid
	// range, in the same transaction that records it launching.
	var sb *sealed.Sandbox
	var cold error
	if m.pool != nil && class == manifest.Sealed {
		if _, policy, err := m.reg.manifest(rec); err == nil {
			sb, cold = m.pool.Take(policy, rec.Wasm != nil)
		}
	}
	began := time.Now()
	if err := m.reg.update(func(tx *store.Tx) error {
		// Checked in the launch's own transaction: a parent that ends after it commits
		// sees this child launching and stops it; one that ended before refuses it here.
		if rec.ParentID != "" {
			parent, err := tx.Get(rec.ParentID)
			if err != nil || !parent.State.Live() {
				return fmt.Errorf("session %s: its parent %s has ended: %w", rec.ID, rec.ParentID, errdefs.ErrFailedPrecondition)
			}
		}
		if sb != nil {
			if err := tx.TakeIDs(rec, sb.ID, store.IDs(sb.IDs)); err != nil {
				return err
			}
			rec.Warm = true
			return tx.Transition(rec, store.Launching)
		}
		// Staged by a roostd from before id ranges: it gets one now.
		if rec.IDs == nil && !rec.HostRoot {
			if err := tx.AllocateIDs(rec, m.cfg.IDs); err != nil {
				return err
			}
		}
		return tx.Transition(rec, store.Launching)
	}); err != nil {
		if sb != nil {
			m.pool.Discard(sb)
		}
		return nil, err
	}
	proc, err := m.start(ctx, l, rec, class, runtime, sb)
	if err != nil {
		if m.cfg.Observer != nil {
			m.cfg.Observer.SessionStartFailed(class)
		}
		var se *containment.StartError
		detail := err.Error()
		if !errors.As(err, &se) {
			detail = "roost could not start the program: " + detail
		}
		m.finish(l, rec, store.StatusStartFailed, nil, detail, time.Now().UTC())
		return m.Get(rec.ID)
	}

	ref := proc.Ref()
	rec.Process = &ref
	if l.ep != nil {
		rec.EndpointPort = l.ep.Port()
	}
	rec.StartedAt = ref.StartedAt
	rec.DeadlineAt = ref.StartedAt.Add(deadlineOf(rec))
	if err := m.reg.update(func(tx *store.Tx) error { return tx.Transition(rec, store.Running) }); err != nil {
		// The program runs but the registry refused the record: end it rather than leave
		// a process nobody can see, and let go of what the launch took (the live entry
		// goes with the deferred release). The record stays launching: the next start
		// finds the process gone and records the session lost.
		_ = proc.Signal(sigKill)
		select {
		case <-proc.Done():
		case <-time.After(m.cfg.StopGrace):
		}
		l.stopTimers()
		m.egress.Close(rec)
		if l.ep != nil {
			l.ep.Close()
		}
		m.runtimes.release(rec)
		return nil, err
	}
	if m.cfg.Observer != nil {
		m.cfg.Observer.SessionStarted(class, time.Since(began))
	}
	m.cfg.Logger.Info("session launched", "session", rec.ID, "capsule", rec.Capsule.Name+"@"+rec.Capsule.Version, "class", rec.Achieved,
		"pid", ref.PID, "took", time.Since(began).Round(time.Microsecond).String(), "start", warmpool.StartNote(sb != nil, cold))
	m.supervise(l, rec, proc)
	return rec, nil
}

// start makes the session's directories, writes the start of its trace, opens its endpoint
// and starts the program: in sb, a sandbox made ahead, when it is not nil. The launch
// outlives the RPC that asked for it: a client going away mid-launch must not leave a
// half-started session. The caller holds l.mu.
func (m *Manager) start(ctx context.Context, l *liveSession, rec *store.Record, class manifest.Class, runtime Runtime, sb *sealed.Sandbox) (containment.Process, error) {
	if sb != nil {
		defer func() {
			// Not handed to the runtime: nothing else will end it.
			if sb != nil {
				m.pool.Discard(sb)
			}
		}()
		// roost-init holds the sandbox's records directory open: it becomes the session's.
		if err := os.Remove(rec.RecordsDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("records directory: %w", err)
		}
		if err := os.Rename(sb.Records, rec.RecordsDir); err != nil {
			return nil, fmt.Errorf("records directory: %w", err)
		}
		if sb.NetNS != "" {
			if err := m.cfg.Endpoints.Move(sb.ID, rec.ID); err != nil {
				return nil, err
			}
		}
	} else if err := os.MkdirAll(rec.RecordsDir, 0o711); err != nil {
		// Root's: the session may pass through to its task text, never list or read the rest.
		return nil, fmt.Errorf("records directory: %w", err)
	}
	if err := m.trees.PrepareWorkdir(rec); err != nil {
		return nil, fmt.Errorf("workdir: %w", err)
	}
	if err := m.trees.PrepareHome(rec); err != nil {
		return nil, fmt.Errorf("home: %w", err)
	}
	if rec.HasTask {
		var task []byte
		if err := m.reg.View(func(tx *store.Tx) (err error) {
			task, err = tx.Task(rec.ID)
			return err
		}); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(rec.RecordsDir, spec.TaskFile), task, 0o444); err != nil {
			return nil, fmt.Errorf("task: %w", err)
		}
	}
	man, policy, err := m.reg.manifest(rec)
	if err != nil {
		return nil, err
	}
	l.policyMu.Lock()
	l.policy = policy
	l.policyMu.Unlock()
	if len(m.trees.ChildrenDirs(rec, class, policy)) > 0 {
		if err := m.trees.PrepareChildrenDir(rec); err != nil {
			return nil, err
		}
	}
	if err := m.accounts.Open(rec, policy); err != nil {
		return nil, fmt.Errorf("the session's ledger account: %w", err)
	}
	if m.cfg.Endpoints != nil {
		var proxy *egress.Session
		if hasNetNS(class) {
			proxy = m.egress.Open(rec.ID, policy, delegate.Carried{})
		}
		ep, err := m.cfg.Endpoints.Open(rec.ID, hasNetNS(class), 0, int(policy.Resources.EndpointMaxConnections.Value), m.backend, proxy)
		if err != nil {
			if proxy != nil {
				proxy.Close()
			}
			return nil, err
		}
		l.ep = ep
	}
	spec, err := m.launchSpec(rec, class, man, policy, l.ep)
	if err != nil {
		return nil, err
	}
	var explanation []byte
	_ = m.reg.View(func(tx *store.Tx) (err error) {
		explanation, err = tx.Explanation(rec.ID)
		return err
	})
	if err := records.AppendTrace(rec.RecordsDir, traceStart(rec, explanation)); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	if sb != nil {
		claimed := sb
		sb = nil
		return m.pool.Start(context.WithoutCancel(ctx), claimed, spec)
	}
	return runtime.Start(context.WithoutCancel(ctx), spec)
}

// launchSpec builds the program's start from the manifest recorded at staging, with the
// session's view of the host's system trees.
func (m *Manager) launchSpec(rec *store.Record, class manifest.Class, man *manifest.Manifest, policy *manifest.Policy, ep spawn.Endpoint) (containment.Spec, error) {
	// What of roostd's environment reaches the session (see plan.HostVariables).
	hostEnv, _ := plan.HostVariables(policy.Env.Allow, m.cfg.EnvPassthrough, m.cfg.HostEnv)
	roost := map[string]string{}
	var netns string
	if ep != nil {
		netns = ep.NetNS()
		roost["ROOST_ENDPOINT"] = ep.URL()
		roost["ROOST_CREDENTIAL"] = m.cfg.Endpoints.Credential(rec.ID)
	}
	m.accounts.InferenceEnv(policy, ep, roost["ROOST_CREDENTIAL"], roost)
	delegate.Env(policy, ep, roost)
	s := spec.Build(spec.Input{
		Record: rec, Class: class, Manifest: man, Policy: policy,
		Home: m.trees.Home(rec.ID), Children: m.trees.ChildrenDirs(rec, class, policy),
		HostEnv: hostEnv, Roost: roost, NetNS: netns, Wasm: m.cfg.Wasm,
	})
	view, err := m.systemView(rec, class, man, policy, &s)
	if err != nil {
		return s, &containment.StartError{Msg: fmt.Sprintf("session %s: its view of the system trees (filesystem.system): %v", rec.ID, err)}
	}
	s.System = view
	return s, nil
}

// systemView is the part of the host's system trees the session sees: the closure of what
// its allowlist may run, worked out from what its stage recorded, and for a sealed root the
// view built from it (once per closure, shared by every session with the same one). nil is
// all of them: a class without an exec allowlist, filesystem.system: full, or a session
// staged before its shell.allow was recorded, whose names roost-exec looks up at launch.
func (m *Manager) systemView(rec *store.Record, class manifest.Class, man *manifest.Manifest, policy *manifest.Policy, s *containment.Spec) (*containment.SystemView, error) {
	if !plan.Viewed(class, policy) || (rec.Shell == nil && len(policy.Shell.Allow) > 0) {
		return nil, nil
	}
	path := toolchain.SessionPath(man.Env["PATH"], rec.Shell)
	want := plan.SystemWant(plan.SystemInput{
		Command: rec.Command, Path: path, Shell: rec.Shell, CapsuleDir: rec.Capsule.Root(), Runner: s.Runner, Policy: policy,
		ReadTreesOf: m.planner.Tools().ReadTreesOf,
	})
	c, err := m.planner.Closure(want, path, false)
	if err != nil {
		return nil, err
	}
	v := &containment.SystemView{Files: c.Files, Trees: c.Trees, Linked: c.Linked, Digest: c.Digest}
	if class == manifest.Sealed {
		v.Dir, err = m.views.View(c)
		if errors.Is(err, sysview.ErrReplaced) {
			// A package upgraded since the closure was worked out: work it out again.
			if c, err = m.planner.Closure(want, path, true); err != nil {
				return nil, err
			}
			v = &containment.SystemView{Files: c.Files, Trees: c.Trees, Linked: c.Linked, Digest: c.Digest}
			v.Dir, err = m.views.View(c)
		}
		if err != nil {
			return nil, err
		}
	}
	return v, nil
}
