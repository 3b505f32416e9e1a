package session

import (
	"fmt"
	"os"

	"github.com/containerd/errdefs"
)

// Remove forgets a staged or ended session and deletes its records directory, and its
// workdir when roost made it. A workdir the operator named is handed back to whoever owned
// it before the session (first, so a failure leaves the session, and its id range, for a
// retry), then left alone.
func (m *Manager) Remove(id string) error {
	rec, err := m.Get(id)
	if err != nil {
		return err
	}
	if rec.State.Live() {
		return fmt.Errorf("session %s is %s; stop it before removing it: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	if err := m.returnWorkdir(rec); err != nil {
		return fmt.Errorf("session %s: handing its workdir %s back to uid %d: %w", rec.ID, rec.Workdir, rec.WorkdirOwner.UID, err)
	}
	if err := m.update(func(tx *Tx) error { return tx.Delete(rec) }); err != nil {
		return err
	}
	// The registry no longer knows the session; files left by a crash here are swept at the
	// next start.
	if err := os.RemoveAll(rec.RecordsDir); err != nil {
		return fmt.Errorf("session %s forgotten, but its records directory remains: %w", rec.ID, err)
	}
	if rec.OwnsWorkdir {
		if err := os.RemoveAll(rec.Workdir); err != nil {
			return fmt.Errorf("session %s forgotten, but its workdir remains: %w", rec.ID, err)
		}
	}
	if err := os.RemoveAll(m.homeDir(rec.ID)); err != nil {
		return fmt.Errorf("session %s forgotten, but its home remains: %w", rec.ID, err)
	}
	// The directory its children worked in, once they are all gone too.
	_ = os.Remove(m.childrenOfDir(rec.ID))
	m.collectCapsules()
	return nil
}

// collectCapsules removes the store's copies of capsules that no session records and no
// ref names.
func (m *Manager) collectCapsules() {
	if m.cfg.Artifacts == nil {
		return
	}
	m.blobMu.Lock()
	defer m.blobMu.Unlock()
	recs, err := m.allRecords()
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
