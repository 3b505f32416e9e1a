package server

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/directory"
)

// Fleet is what the fleet RPCs need of a roostd that is a node of a fleet ledger.
type Fleet struct {
	// Store is the fleet's shared store, Prefix where its keys are ("" for the default).
	Store  fleet.Store
	Prefix string
	// DirectoryPrefix is where the node directory's keys are ("" for its default).
	DirectoryPrefix string
	// Node is this roostd's name in the fleet; Status its own view of its part.
	Node   string
	Status func() fleet.Status
	// Clock tells the day (time.Now when nil): the node's, so both name the same one.
	Clock func() time.Time
	// Timeout bounds each call to the store (10 s when 0): a cut-off store is said, not
	// waited on.
	Timeout time.Duration
}

func (s *spendService) fleet(ctx context.Context) (*Fleet, context.Context, context.CancelFunc, error) {
	return fleetCall(ctx, s.fleetNode)
}

// fleetCall is f with ctx bounded by its Timeout, or the error that says how to make this
// roostd a fleet node when f is nil.
func fleetCall(ctx context.Context, f *Fleet) (*Fleet, context.Context, context.CancelFunc, error) {
	if f == nil {
		return nil, nil, nil, fmt.Errorf("this roostd is no fleet node (start it with --fleet-etcd and --node-name, or fleet: in its config): %w", errdefs.ErrFailedPrecondition)
	}
	timeout := f.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return f, ctx, cancel, nil
}

func (f *Fleet) today() string {
	now := time.Now
	if f.Clock != nil {
		now = f.Clock
	}
	return now().UTC().Format(time.DateOnly)
}

func fleetNodes(nodes []fleet.NodeDay) []*roostv1.FleetNodeDay {
	out := make([]*roostv1.FleetNodeDay, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, &roostv1.FleetNodeDay{Node: n.Node, Held: n.Held, Spent: n.Spent, Returned: n.Returned, WrittenOff: n.WrittenOff, Blocks: int32(n.Blocks)})
	}
	return out
}

func (s *spendService) GetFleet(ctx context.Context, req *roostv1.GetFleetRequest) (*roostv1.GetFleetResponse, error) {
	f, ctx, cancel, err := s.fleet(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	day := req.GetDay()
	if day == "" {
		day = f.today()
	}
	d, err := fleet.ReadDay(ctx, f.Store, f.Prefix, day)
	if err != nil {
		return nil, err
	}
	return &roostv1.GetFleetResponse{Node: f.Node, Day: &roostv1.FleetDay{Date: d.Date, Ceiling: d.Ceiling, Granted: d.Granted, Open: d.Open, Nodes: fleetNodes(d.Nodes)}}, nil
}

func (s *spendService) SetFleetLimit(ctx context.Context, req *roostv1.SetFleetLimitRequest) (*roostv1.SetFleetLimitResponse, error) {
	f, ctx, cancel, err := s.fleet(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	day := f.today()
	before, err := fleet.ReadDay(ctx, f.Store, f.Prefix, day)
	if err != nil {
		return nil, err
	}
	if err := fleet.SetCeiling(ctx, f.Store, f.Prefix, day, req.GetTokens()); err != nil {
		return nil, err
	}
	return &roostv1.SetFleetLimitResponse{Previous: before.Ceiling, Tokens: req.GetTokens()}, nil
}

func (s *spendService) ListFleetNodes(ctx context.Context, _ *roostv1.ListFleetNodesRequest) (*roostv1.ListFleetNodesResponse, error) {
	f, ctx, cancel, err := s.fleet(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	st := f.Status()
	self := &roostv1.FleetSelf{Node: f.Node, Day: st.Day, Held: st.Held, Used: st.Used, Pool: st.Pool, Pending: int32(st.Pending), Unreachable: st.Unreachable}
	day := st.Day
	if day == "" {
		day = f.today()
	}
	d, err := fleet.ReadDay(ctx, f.Store, f.Prefix, day)
	if err != nil {
		// This node's own view is worth having when the store is not: it says why.
		return nil, fmt.Errorf("reading the fleet's nodes (this node, %s, holds %d, used %d, unreachable %t): %w", f.Node, st.Held, st.Used, st.Unreachable, err)
	}
	dir, err := directory.List(ctx, f.Store, f.DirectoryPrefix)
	if err != nil {
		return nil, err
	}
	return &roostv1.ListFleetNodesResponse{Date: d.Date, Nodes: fleetNodes(d.Nodes), Self: self, Directory: directoryNodes(dir)}, nil
}

func directoryNodes(nodes []directory.Node) []*roostv1.FleetDirectoryNode {
	out := make([]*roostv1.FleetDirectoryNode, 0, len(nodes))
	for _, n := range nodes {
		var warm map[string]int32
		if len(n.Capacity.Warm) > 0 {
			warm = make(map[string]int32, len(n.Capacity.Warm))
			for shape, k := range n.Capacity.Warm {
				warm[shape] = int32(k)
			}
		}
		e := &roostv1.FleetDirectoryNode{Node: n.Node, Reachable: n.Reachable, State: n.State, Address: n.Address, Classes: n.Classes,
			Cpus: int32(n.Capacity.CPUs), MemoryBytes: n.Capacity.MemoryBytes, SessionsRunning: int32(n.Capacity.SessionsRunning), Warm: warm,
			Version: n.Version}
		if !n.StartedAt.IsZero() {
			e.StartedAt = timestamppb.New(n.StartedAt)
		}
		if !n.WrittenAt.IsZero() {
			e.WrittenAt = timestamppb.New(n.WrittenAt)
		}
		out = append(out, e)
	}
	return out
}

func (s *spendService) ForgetFleetNode(ctx context.Context, req *roostv1.ForgetFleetNodeRequest) (*roostv1.ForgetFleetNodeResponse, error) {
	f, ctx, cancel, err := s.fleet(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	if req.GetNode() == f.Node {
		return nil, fmt.Errorf("node %q is this roostd: forget a node from another one, after this one is gone for good: %w", req.GetNode(), errdefs.ErrInvalidArgument)
	}
	got, err := fleet.Forget(ctx, f.Store, f.Prefix, req.GetNode())
	if err != nil {
		return nil, err
	}
	// After the blocks: a node whose blocks could not be written off stays listed.
	deleted, err := directory.Forget(ctx, f.Store, f.DirectoryPrefix, req.GetNode())
	if err != nil {
		return nil, fmt.Errorf("node %s's blocks were written off (%d tokens), but: %w", req.GetNode(), got.WrittenOff, err)
	}
	// Forgetting again marks what this time could not: MarkLost marks only what is not.
	lost, err := directory.MarkLost(ctx, f.Store, f.DirectoryPrefix, req.GetNode())
	if err != nil {
		return nil, fmt.Errorf("node %s's blocks were written off (%d tokens) and its node-directory entry deleted, but %d of its sessions were marked lost before: %w",
			req.GetNode(), got.WrittenOff, lost, err)
	}
	return &roostv1.ForgetFleetNodeResponse{Node: got.Node, Days: got.Days, WrittenOff: got.WrittenOff, UnderUse: got.UnderUse, DirectoryEntryDeleted: deleted,
		SessionsLost: int32(lost)}, nil
}
