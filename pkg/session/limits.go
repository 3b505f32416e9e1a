package session

import "roost.dev/roost/pkg/session/store"

// LimitObserver hears every bound a session meets, for metrics.
type LimitObserver interface {
	LimitHit(limit string)
}

// LimitHit records that a session met one of its bounds: an event (limit: detail) and a
// count. The session may have been removed meanwhile; then only the count remains.
func (m *Manager) LimitHit(sessionID, limit, detail string) {
	if obs, ok := m.cfg.Observer.(LimitObserver); ok {
		obs.LimitHit(limit)
	}
	rec, err := m.Get(sessionID)
	if err != nil {
		m.cfg.Logger.Info("session limit hit", "session", sessionID, "limit", limit, "detail", detail)
		return
	}
	m.cfg.Logger.Info("session limit hit", "session", rec.ID, "capsule", rec.Capsule.Name+"@"+rec.Capsule.Version, "class", rec.Achieved,
		"limit", limit, "detail", detail)
	if err := m.reg.update(func(tx *store.Tx) error { return tx.Note(rec, store.EventLimit, limit+": "+detail) }); err != nil {
		m.cfg.Logger.Warn("recording a limit", "session", sessionID, "limit", limit, "err", err)
	}
}
