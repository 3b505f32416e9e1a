package server

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/records"
)

// ListCalls returns the trace's inference_call records, in order, and says when the trace
// took no more; other records are not calls.
func TestListCalls(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 12, 2, 18, 0, 0, 0, time.UTC)
	for _, v := range []any{
		records.Trace{EventType: "session_start", SessionID: "s1", Timestamp: at},
		records.CallTrace{EventType: records.TraceInferenceCall, SessionID: "s1", Timestamp: at, Route: "POST v1/messages", Status: 200, Charged: 42, LoweredFrom: 64000, LoweredTo: 12000},
		records.CallTrace{EventType: records.TraceInferenceCall, SessionID: "s1", Timestamp: at, Route: "POST v1/responses", Status: 429},
		records.Trace{EventType: records.TraceInferenceCallCapped, SessionID: "s1", Timestamp: at},
	} {
		data, _ := json.Marshal(v)
		if err := records.AppendLine(filepath.Join(dir, records.TraceFile), data, false); err != nil {
			t.Fatal(err)
		}
	}
	s := &spendService{recordsDir: func(id string) (string, error) { return dir, nil }}
	resp, err := s.ListCalls(context.Background(), &roostv1.ListCallsRequest{SessionId: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if c := resp.GetCalls(); len(c) != 2 || c[0].GetLoweredTo() != 12000 || c[0].GetCharged() != 42 || c[1].GetStatus() != 429 || !resp.GetCapped() {
		t.Errorf("%v", resp)
	}
	if _, err := s.ListCalls(context.Background(), &roostv1.ListCallsRequest{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no session id: %v", err)
	}
	os.Remove(filepath.Join(dir, records.TraceFile))
	if resp, err := s.ListCalls(context.Background(), &roostv1.ListCallsRequest{SessionId: "s1"}); err != nil || len(resp.GetCalls()) != 0 {
		t.Errorf("no trace: %v %v", resp, err)
	}
}
