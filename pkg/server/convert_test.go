package server

import (
	"testing"
	"time"

	"roost.dev/roost/pkg/session/store"
)

// The record's fields reach the API's Session: the name, the labels, the identity, the egress
// totals, and a pid only while the session is live.
func TestSessionProto(t *testing.T) {
	code := 3
	rec := &store.Record{ID: "ses_x", Name: "web", Labels: map[string]string{"team": "a"}, State: store.Exited, ExitStatus: store.StatusError, ExitCode: &code,
		IDs: &store.IDs{First: 0x70010000, Size: 65536}, CreatedAt: time.Unix(1, 0),
		Egress: &store.EgressTotals{Connections: 2, BytesUp: 10, Used: 900, Refused: []store.EgressRefusal{
			{Proto: "connect", Host: "x.test", Port: 443, Reason: "not_allowed", Count: 7, First: time.Unix(2, 0), Last: time.Unix(3, 0), Detail: "no rule"}}}}
	p := SessionProto(rec)
	if p.GetName() != "web" || p.GetState() != "exited" || p.GetExitCode() != 3 || p.GetIdentity().GetUid() != 0x70010000 ||
		p.GetEgress().GetConnections() != 2 || p.GetEgress().GetBytesUp() != 10 || p.GetCreatedAt().AsTime() != time.Unix(1, 0).UTC() {
		t.Fatalf("%v", p)
	}
	if l := p.GetLabels(); len(l) != 1 || l["team"] != "a" {
		t.Fatalf("labels %v", l)
	}
	if e := p.GetEgress(); e.GetUsedBytes() != 900 || len(e.GetRefused()) != 1 {
		t.Fatalf("egress %v", e)
	}
	if r := p.GetEgress().GetRefused()[0]; r.GetHost() != "x.test" || r.GetPort() != 443 || r.GetReason() != "not_allowed" || r.GetCount() != 7 ||
		r.GetFirst().AsTime() != time.Unix(2, 0).UTC() || r.GetLast().AsTime() != time.Unix(3, 0).UTC() || r.GetDetail() != "no rule" || r.GetProto() != "connect" {
		t.Fatalf("refusal %v", r)
	}
	if p.GetStartedAt() != nil || p.GetPid() != 0 {
		t.Fatalf("a session that never ran has a start %v or pid %d", p.GetStartedAt(), p.GetPid())
	}
}
