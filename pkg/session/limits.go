package session

import "roost.dev/roost/pkg/session/store"

// The bounds a session can meet, as events' details and the roost_limit_hits_total label.
const (
	LimitEndpointConnections = "endpoint_connections"
	LimitLogBytes            = "log_bytes"
	LimitWorkdirBytes        = "workdir_bytes"
	LimitWorkdirInodes       = "workdir_inodes"
	LimitChildrenTotal       = "children_total"
	LimitDiskFull            = "disk_full"
)

// EventLimit is a session meeting one of its bounds: a refusal or a cut, with what it was.
const EventLimit = "session.limit"

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
	if err := m.update(func(tx *store.Tx) error { return tx.Note(rec, EventLimit, limit+": "+detail) }); err != nil {
		m.cfg.Logger.Warn("recording a limit", "session", sessionID, "limit", limit, "err", err)
	}
}
