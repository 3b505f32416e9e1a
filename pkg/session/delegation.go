package session

import (
	"fmt"
	"path/filepath"

	"roost.dev/roost/pkg/session/delegate"
	"roost.dev/roost/pkg/session/dirs"
	"roost.dev/roost/pkg/session/plan"
	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/manifest"
)

// endpointSessions is the manager as delegation sees it (delegate.Sessions): the few things a
// session's endpoint may ask of the sessions it reaches.
type endpointSessions struct{ *Manager }

var _ delegate.Sessions = endpointSessions{}

func (d endpointSessions) Record(id string) (*store.Record, error) { return d.reg.get(id) }

func (d endpointSessions) Children(parentID string) ([]*store.Record, error) {
	return d.reg.childrenOf(parentID)
}

func (d endpointSessions) Policy(id string) (*store.Record, *manifest.Policy, error) {
	rec, err := d.Record(id)
	if err != nil {
		return nil, nil, err
	}
	if !rec.State.Live() {
		return nil, nil, fmt.Errorf("session %s is %s: %w", id, rec.State, errdefs.ErrFailedPrecondition)
	}
	l := d.live.lookup(id)
	if l == nil {
		return nil, nil, fmt.Errorf("session %s is not supervised by this daemon: %w", id, errdefs.ErrFailedPrecondition)
	}
	p, err := l.policyOf(d.reg, rec)
	return rec, p, err
}

func (d endpointSessions) LockSpawns(id string) (func(), error) {
	l := d.live.lookup(id)
	if l == nil {
		return nil, fmt.Errorf("session %s is not supervised by this daemon: %w", id, errdefs.ErrFailedPrecondition)
	}
	l.spawnMu.Lock()
	return l.spawnMu.Unlock, nil
}

func (d endpointSessions) PlanChild(ref string) (*delegate.Child, error) {
	p, err := d.planner.Plan(plan.Options{Capsule: ref}, false)
	if err != nil {
		return nil, err
	}
	return &delegate.Child{Ref: ref, Policy: &p.Policy, Floor: p.Decision.Floor, Met: p.Decision.Met, Shortfall: p.Decision.Shortfall,
		HostRoot: d.planner.HostRoot(p), Shell: p.Shell, Plan: p}, nil
}

func (d endpointSessions) StageChild(c *delegate.Child, s delegate.ChildStage) (*store.Record, error) {
	p, ok := c.Plan.(*plan.Plan)
	if !ok {
		return nil, fmt.Errorf("child %s was not planned by this manager: %w", c.Ref, errdefs.ErrInternal)
	}
	return d.stage(p, StageOptions{Capsule: c.Ref, Workdir: s.Workdir, ownsWorkdir: true, ParentID: s.ParentID, Task: s.Task, DepthRemaining: s.DepthRemaining})
}

func (d endpointSessions) WorkdirRoots(parent *store.Record) ([]string, string) {
	return d.guard.Roots(parent, true)
}

func (d endpointSessions) ChildrenDir(parent *store.Record) (string, string, error) {
	if err := d.trees.PrepareChildrenDir(parent); err != nil {
		return "", "", err
	}
	return d.cfg.StateDir, filepath.Join(dirs.ChildrenDir, parent.ID), nil
}

func (d endpointSessions) TraceDelegation(parent *store.Record, ref, childID string, refusal error) {
	traceDelegation(d.cfg.Logger, d.trees.Records(parent.ID), parent, ref, childID, refusal)
}

func (d endpointSessions) Note(rec *store.Record, event, detail string) error {
	return d.reg.update(func(tx *store.Tx) error { return tx.Note(rec, event, detail) })
}

func (d endpointSessions) LimitHit(sessionID, limit, detail string) {
	d.journal.LimitHit(sessionID, limit, detail)
}
