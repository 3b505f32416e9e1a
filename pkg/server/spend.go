package server

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/ledger"
)

type spendService struct {
	roostv1.UnimplementedSpendServiceServer
	ledger *ledger.Ledger
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
