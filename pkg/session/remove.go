package session

import (
	"context"
	"fmt"
	"os"
	"slices"

	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/workdir"
)

// Remove forgets a staged or ended session with every session below it (RemoveTree without
// force).
func (m *Manager) Remove(id string) error {
	return m.RemoveTree(context.Background(), id, false)
}

// RemoveTree forgets a staged or ended session and every session below it, children before
// their parents: each one's records directory, its home, its workdir when roost made it and
// the directory its children worked in. A workdir the operator named is handed back to
// whoever owned it before the session (first, so a failure leaves the session, and its id
// range, for a retry), then left alone.
//
// A live session anywhere in the tree refuses the whole removal, unless force: then every
// live one is killed first (a parent's kill ends its subtree too) and the tree removed once
// they have all ended.
func (m *Manager) RemoveTree(ctx context.Context, id string, force bool) error {
	rec, err := m.Get(id)
	if err != nil {
		return err
	}
	tree, err := m.reg.tree(rec.ID)
	if err != nil {
		return err
	}
	for _, r := range tree {
		if !r.State.Live() {
			continue
		}
		if !force {
			if r.ID == rec.ID {
				return fmt.Errorf("session %s is %s; stop it before removing it, or use roostctl rm -f to kill it first: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
			}
			return fmt.Errorf("session %s has a descendant %s that is %s; stop it before removing it, or remove with --force to kill the tree first: %w",
				rec.ID, r.ID, r.State, errdefs.ErrFailedPrecondition)
		}
		// Parents come first in tree: a parent's kill waits for its subtree, so its live
		// descendants are ended by then (and answer FailedPrecondition here).
		if _, err := m.Kill(ctx, r.ID, sigKill); err != nil && !errdefs.IsFailedPrecondition(err) {
			return fmt.Errorf("session %s: killing %s before removing it: %w", rec.ID, r.ID, err)
		}
	}
	if force {
		// Read again: the kills changed them, and a child may have been staged meanwhile.
		if tree, err = m.reg.tree(rec.ID); err != nil {
			return err
		}
		for _, r := range tree {
			if r.State.Live() {
				return fmt.Errorf("session %s: %s is still %s after it was killed: %w", rec.ID, r.ID, r.State, errdefs.ErrFailedPrecondition)
			}
		}
	}
	// Children first: a parent's workdir may hold its children's, and a parent's record is
	// what ties the children to it until they are gone.
	// A failure stops there, the ancestors kept, so a retry finds the same tree.
	var failed error
	for _, r := range slices.Backward(tree) {
		if failed = m.removeOne(r); failed != nil {
			break
		}
	}
	// Before rm answers: the ranges it let go are swept before anything else can have them.
	m.ranges.Sweep()
	m.collectCapsules()
	return failed
}

// removeOne forgets one session that is not live.
func (m *Manager) removeOne(rec *store.Record) error {
	if rec.State.Live() {
		return fmt.Errorf("session %s is %s; stop it before removing it, or use roostctl rm -f to kill it first: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	if err := m.trees.ReturnWorkdir(rec); err != nil {
		return fmt.Errorf("session %s: handing its workdir %s back to uid %d: %w", rec.ID, rec.Workdir, rec.WorkdirOwner.UID, err)
	}
	if err := m.reg.update(func(tx *store.Tx) error { return tx.Delete(rec) }); err != nil {
		return err
	}
	// The registry no longer knows the session; files left by a crash here are swept at the
	// next start.
	if err := os.RemoveAll(rec.RecordsDir); err != nil {
		return fmt.Errorf("session %s forgotten, but its records directory remains: %w", rec.ID, err)
	}
	// What the session could write goes by workdir.RemoveAll: two descriptors however deep
	// it made its trees, no link followed, no mount entered.
	if rec.OwnsWorkdir {
		if err := workdir.RemoveAll(rec.Workdir); err != nil {
			return fmt.Errorf("session %s forgotten, but its workdir remains: %w", rec.ID, err)
		}
	}
	if err := workdir.RemoveAll(m.trees.Home(rec.ID)); err != nil {
		return fmt.Errorf("session %s forgotten, but its home remains: %w", rec.ID, err)
	}
	// The directory its children worked in (for a parent without a sealed root): their own
	// removal took their workdirs; what is left is a workdir made for a child that was never
	// staged.
	if err := workdir.RemoveAll(m.trees.Children(rec.ID)); err != nil {
		return fmt.Errorf("session %s forgotten, but the directory of its children's workdirs remains: %w", rec.ID, err)
	}
	return nil
}

// removeEnded removes each of doomed — ended sessions no live session descends from —
// with its tree, children first, as Remove does, but from one listing of the registry (all)
// and collecting capsule copies once after: retention and prune remove many at a time, and
// Remove's own listing per session would make that quadratic. It returns, per doomed
// session, nil once it is gone (also when an earlier tree took it) or why it is not.
func (m *Manager) removeEnded(ctx context.Context, doomed, all []*store.Record) map[string]error {
	kids := map[string][]*store.Record{}
	for _, r := range all {
		if r.ParentID != "" {
			kids[r.ParentID] = append(kids[r.ParentID], r)
		}
	}
	gone := map[string]bool{}
	out := make(map[string]error, len(doomed))
	for _, rec := range doomed {
		if ctx.Err() != nil {
			out[rec.ID] = ctx.Err()
			continue
		}
		if gone[rec.ID] {
			out[rec.ID] = nil
			continue
		}
		// The tree, parents before children, as the listing has it.
		tree := []*store.Record{rec}
		for i := 0; i < len(tree); i++ {
			tree = append(tree, kids[tree[i].ID]...)
		}
		var err error
		for _, r := range slices.Backward(tree) {
			if gone[r.ID] {
				continue
			}
			if err = m.removeOne(r); err != nil {
				break
			}
			gone[r.ID] = true
		}
		out[rec.ID] = err
	}
	m.ranges.Sweep()
	m.collectCapsules()
	return out
}

// collectCapsules removes the store's copies of capsules that no session records and no
// ref names.
func (m *Manager) collectCapsules() {
	if m.cfg.Artifacts == nil {
		return
	}
	m.blobMu.Lock()
	defer m.blobMu.Unlock()
	recs, err := m.reg.all()
	if err != nil {
		m.cfg.Logger.Warn("collecting capsule copies", "err", err)
		return
	}
	used := make(map[string]bool, len(recs))
	for _, r := range recs {
		used[r.Capsule.SHA256] = true
	}
	if _, err := m.cfg.Artifacts.Collect(func(digest string) bool { return used[digest] }); err != nil {
		m.cfg.Logger.Warn("collecting capsule copies", "err", err)
	}
}
