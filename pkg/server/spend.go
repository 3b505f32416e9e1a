package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/records"
)

type spendService struct {
	roostv1.UnimplementedSpendServiceServer
	ledger *ledger.Ledger
	// recordsDir is a session's records directory, where its trace is.
	recordsDir func(sessionID string) (string, error)
	// fleetNode is the fleet ledger this roostd is a node of; nil when it is none.
	fleetNode *Fleet
}

var _ roostv1.SpendServiceServer = (*spendService)(nil)

func (s *spendService) get() (*ledger.Ledger, error) {
	if s.ledger == nil {
		return nil, fmt.Errorf("this roostd keeps no spend ledger: %w", errdefs.ErrUnavailable)
	}
	return s.ledger, nil
}

func (s *spendService) GetDay(ctx context.Context, req *roostv1.GetDayRequest) (*roostv1.GetDayResponse, error) {
	l, err := s.get()
	if err != nil {
		return nil, err
	}
	d, err := l.Report(req.GetDay())
	if err != nil {
		return nil, err
	}
	out := &roostv1.DayLedger{
		Date: d.Date, ResetsAt: timestamppb.New(d.ResetsAt), MachineCeiling: d.MachineCeiling, Charged: d.Charged,
		Reserved: d.Reserved, OpenReservations: int32(d.OpenReservations), Lifetime: d.Lifetime,
	}
	for _, ds := range d.Sessions {
		out.Sessions = append(out.Sessions, &roostv1.DaySession{SessionId: ds.SessionID, Capsule: ds.Capsule, Charged: ds.Charged, Reserved: ds.Reserved, Ceiling: ds.Ceiling})
	}
	for _, dc := range d.Capsules {
		out.Capsules = append(out.Capsules, &roostv1.DayCapsule{Capsule: dc.Capsule, Charged: dc.Charged})
	}
	return &roostv1.GetDayResponse{Day: out}, nil
}

func (s *spendService) SetMachineLimit(ctx context.Context, req *roostv1.SetMachineLimitRequest) (*roostv1.SetMachineLimitResponse, error) {
	l, err := s.get()
	if err != nil {
		return nil, err
	}
	before, err := l.Report("")
	if err != nil {
		return nil, err
	}
	if err := l.SetMachineCeiling(req.GetTokens()); err != nil {
		return nil, err
	}
	return &roostv1.SetMachineLimitResponse{Previous: before.MachineCeiling, Tokens: req.GetTokens()}, nil
}

// ListCalls reads a session's inference_call records from its trace.
func (s *spendService) ListCalls(ctx context.Context, req *roostv1.ListCallsRequest) (*roostv1.ListCallsResponse, error) {
	if req.GetSessionId() == "" {
		return nil, fmt.Errorf("session_id: required: %w", errdefs.ErrInvalidArgument)
	}
	dir, err := s.recordsDir(req.GetSessionId())
	if err != nil {
		return nil, err
	}
	out := &roostv1.ListCallsResponse{}
	f, err := os.Open(filepath.Join(dir, records.TraceFile))
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("session %s: reading its trace: %w", req.GetSessionId(), err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.Contains(line, []byte(`"event_type":"inference_call`)) {
			continue
		}
		var c records.CallTrace
		if json.Unmarshal(line, &c) != nil {
			continue
		}
		switch c.EventType {
		case records.TraceInferenceCallCapped:
			out.Capped = true
		case records.TraceInferenceCall:
			out.Calls = append(out.Calls, &roostv1.InferenceCall{At: timestamppb.New(c.Timestamp), Upstream: c.Upstream, Route: c.Route,
				Model: c.Model, Status: int32(c.Status), InputTokens: c.InputTokens, OutputTokens: c.OutputTokens,
				CacheReadTokens: c.CacheReadTokens, CacheWriteTokens: c.CacheWriteTokens, Reserved: c.Reserved, Charged: c.Charged,
				LatencyMs: c.LatencyMS, Streamed: c.Streamed, LoweredFrom: c.LoweredFrom, LoweredTo: c.LoweredTo, InputCounted: c.InputCounted})
		}
	}
	return out, sc.Err()
}
