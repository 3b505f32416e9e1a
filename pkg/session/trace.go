package session

import (
	"log/slog"
	"time"

	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
)

func traceStart(rec *store.Record, explanation []byte) records.Trace {
	return records.Trace{
		EventType:       "session_start",
		SessionID:       rec.ID,
		Timestamp:       time.Now().UTC(),
		Capsule:         rec.Capsule.Name + "@" + rec.Capsule.Version,
		EffectiveGrants: explanation,
		Command:         rec.Command,
		Start:           map[bool]string{true: "warm", false: "cold"}[rec.Warm],
	}
}

// traceDelegation records in the parent's trace a child it was granted (err nil) or refused.
func traceDelegation(log *slog.Logger, recordsDir string, parent *store.Record, ref, childID string, err error) {
	t := records.Trace{EventType: "delegation", SessionID: parent.ID, Timestamp: time.Now().UTC(), Child: ref, ChildID: childID}
	if err != nil {
		t.EventType = "delegation_refused"
		t.Refusal = err.Error()
		log.Info("spawn refused", "session", parent.ID, "capsule", parent.Capsule.Name+"@"+parent.Capsule.Version, "class", parent.Achieved,
			"child", ref, "reason", err.Error())
	}
	if werr := records.AppendTrace(recordsDir, t); werr != nil {
		log.Warn("writing the trace", "session", parent.ID, "err", werr)
	}
}
