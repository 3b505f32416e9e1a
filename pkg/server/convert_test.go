package server

import (
	"testing"
	"time"

	"roost.dev/roost/pkg/session/store"
)

// The record's fields reach the API's Session: the name, the identity, the egress totals, and
// a pid only while the session is live.
func TestSessionProto(t *testing.T) {
	code := 3
	rec := &store.Record{ID: "ses_x", Name: "web", State: store.Exited, ExitStatus: store.StatusError, ExitCode: &code,
		IDs: &store.IDs{First: 0x70010000, Size: 65536}, CreatedAt: time.Unix(1, 0),
		Egress: &store.EgressTotals{Connections: 2, BytesUp: 10}}
	p := SessionProto(rec)
	if p.GetName() != "web" || p.GetState() != "exited" || p.GetExitCode() != 3 || p.GetIdentity().GetUid() != 0x70010000 ||
		p.GetEgress().GetConnections() != 2 || p.GetEgress().GetBytesUp() != 10 || p.GetCreatedAt().AsTime() != time.Unix(1, 0).UTC() {
		t.Fatalf("%v", p)
	}
	if p.GetStartedAt() != nil || p.GetPid() != 0 {
		t.Fatalf("a session that never ran has a start %v or pid %d", p.GetStartedAt(), p.GetPid())
	}
}
