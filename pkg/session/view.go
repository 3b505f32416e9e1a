package session

// What the API shows of a session beyond its record (pkg/server's conversion reads these,
// and stage records the identity in the explanation).

import (
	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
)

// IdentityProto is who a session's processes are on the host.
func IdentityProto(r *store.Record) *roostv1.Identity {
	switch {
	case r.HostRoot:
		return &roostv1.Identity{HostRoot: true}
	case r.IDs != nil:
		return &roostv1.Identity{Uid: r.IDs.First, Gid: r.IDs.First, Size: r.IDs.Size}
	}
	return nil
}

// LogStats is what roost-init counted of the session's output: logs.json, or the totals in
// exit.json when that is final and logs.json is not (a full disk at the end). Nil for a
// session that has not run, or records from before the count.
func LogStats(r *store.Record) *records.LogStats {
	if r.RecordsDir == "" {
		return nil
	}
	st, err := records.ReadLogStats(r.RecordsDir)
	if (err != nil || !st.Final) && r.State == store.Exited {
		if info, xerr := containment.ReadExit(r.RecordsDir); xerr == nil && info.Logs != nil {
			return info.Logs
		}
	}
	if err != nil {
		return nil
	}
	return &st
}
