package session

import (
	"fmt"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/encoding/protojson"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/session/store"
)

// Explained returns a session (ref as Get takes it) and the explanation recorded when it
// was staged: what it was staged with, as decided then, which the host and roostd's
// configuration may no longer decide alike.
func (m *Manager) Explained(ref string) (*store.Record, *roostv1.Explanation, error) {
	var rec *store.Record
	var data []byte
	err := m.reg.View(func(tx *store.Tx) (err error) {
		if rec, err = tx.Resolve(ref); err != nil {
			return err
		}
		data, err = tx.Explanation(rec.ID)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	if len(data) == 0 {
		return nil, nil, fmt.Errorf("session %s: no explanation was recorded when it was staged: %w", rec.ID, errdefs.ErrFailedPrecondition)
	}
	e := &roostv1.Explanation{}
	// A registry written by another roostd version may hold fields this one does not know.
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, e); err != nil {
		return nil, nil, fmt.Errorf("session %s: the explanation recorded at stage is unreadable: %v: %w", rec.ID, err, errdefs.ErrDataLoss)
	}
	m.accounts.Fill(rec)
	return rec, e, nil
}
