package session

import (
	"fmt"
	"os"

	"github.com/containerd/errdefs"
)

// Remove forgets a staged or ended session and deletes its records directory, and its
// workdir when roost made it. A workdir the operator named is left alone.
func (m *Manager) Remove(id string) error {
	rec, err := m.Get(id)
	if err != nil {
		return err
	}
	if rec.State.Live() {
		return fmt.Errorf("session %s is %s; stop it before removing it: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
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
	return nil
}
