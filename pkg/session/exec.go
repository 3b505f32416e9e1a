package session

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/exec"
	"roost.dev/roost/pkg/session/store"
)

// Exec starts one more command in a running session (see pkg/session/exec), holding the
// session while it starts so that it can neither end nor freeze meanwhile.
func (m *Manager) Exec(ctx context.Context, id string, opts containment.ExecOptions) (*exec.Exec, error) {
	var x *exec.Exec
	err := m.execIn(id, opts, func(t exec.Target, _ *manifest.Policy) (err error) {
		x, err = exec.Start(ctx, t, m.reg, m.cfg.Logger, opts)
		return err
	})
	return x, err
}

// execIn checks opts and calls start with the running session id resolves to, as its
// launch started it, and its policy, holding the session meanwhile.
func (m *Manager) execIn(id string, opts containment.ExecOptions, start func(exec.Target, *manifest.Policy) error) error {
	if err := exec.Check(opts); err != nil {
		return err
	}
	rec, err := m.Get(id)
	if err != nil {
		return err
	}
	if err := execState(rec); err != nil {
		return err
	}
	l := m.live.lookup(rec.ID)
	if l == nil {
		return fmt.Errorf("session %s is %s but this daemon holds no process of it: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec, err = m.Get(rec.ID); err != nil {
		return err
	}
	if err := execState(rec); err != nil {
		return err
	}
	if l.proc == nil {
		return fmt.Errorf("session %s has no process yet: %w", rec.ID, errdefs.ErrFailedPrecondition)
	}
	class, err := manifest.ParseClass(rec.Achieved)
	if err != nil {
		return fmt.Errorf("session %s: %v: %w", rec.ID, err, errdefs.ErrDataLoss)
	}
	rt, ok := m.cfg.Runtimes[class].(exec.Runtime)
	if !ok {
		return fmt.Errorf("session %s is %s, and this daemon cannot run commands in such a session: %w", rec.ID, class, errdefs.ErrNotImplemented)
	}
	man, policy, err := m.reg.manifest(rec)
	if err != nil {
		return err
	}
	// The program's own start, rebuilt as launch built it.
	s, err := m.launchSpec(rec, class, man, policy, l.ep)
	if err != nil {
		return err
	}
	return start(exec.Target{Session: rec.ID, RecordsDir: rec.RecordsDir, Spec: s, Proc: l.proc, Runtime: rt}, policy)
}

// execState refuses a session that is not running, naming its state.
func execState(rec *store.Record) error {
	switch rec.State {
	case store.Running:
		return nil
	case store.Paused:
		return fmt.Errorf("session %s is paused; resume it to run a command in it: %w", rec.ID, errdefs.ErrFailedPrecondition)
	}
	return fmt.Errorf("session %s is %s; a command runs only in a running session: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
}
