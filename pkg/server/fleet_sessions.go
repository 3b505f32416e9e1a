package server

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/directory"
)

// ListFleet lists the fleet's sessions from its session directory, each with whether its
// node is heard now (from the node directory, read after it: a node that came back between
// the two reads is listed as heard, which it is).
func (s *sessionService) ListFleet(ctx context.Context, req *roostv1.ListFleetRequest) (*roostv1.ListFleetResponse, error) {
	f, ctx, cancel, err := fleetCall(ctx, s.fleetNode)
	if err != nil {
		return nil, err
	}
	defer cancel()
	only := map[string]bool{}
	for i, n := range req.GetNode() {
		if err := fleet.ValidNodeName(n); err != nil {
			return nil, fmt.Errorf("node %d of the request: %w", i, err)
		}
		only[n] = true
	}
	list, err := directory.ListSessions(ctx, f.Store, f.DirectoryPrefix)
	if err != nil {
		return nil, err
	}
	nodes, err := directory.List(ctx, f.Store, f.DirectoryPrefix)
	if err != nil {
		return nil, err
	}
	reachable := map[string]bool{}
	for _, n := range nodes {
		reachable[n.Node] = n.Reachable
	}
	resp := &roostv1.ListFleetResponse{}
	for _, e := range list {
		if len(only) > 0 && !only[e.Node] {
			continue
		}
		if !req.GetAll() && (!e.EndedAt.IsZero() || e.State == "exited") {
			continue
		}
		fs := &roostv1.FleetSession{Id: e.ID, Name: e.Name, Node: e.Node, State: e.State, Capsule: e.Capsule, Class: e.Class,
			NodeReachable: reachable[e.Node], LastState: e.LastState}
		if !e.CreatedAt.IsZero() {
			fs.CreatedAt = timestamppb.New(e.CreatedAt)
		}
		if !e.EndedAt.IsZero() {
			fs.EndedAt = timestamppb.New(e.EndedAt)
		}
		if !e.UpdatedAt.IsZero() {
			fs.UpdatedAt = timestamppb.New(e.UpdatedAt)
		}
		resp.Sessions = append(resp.Sessions, fs)
		if !fs.NodeReachable && !slices.Contains(resp.UnreachableNodes, e.Node) {
			resp.UnreachableNodes = append(resp.UnreachableNodes, e.Node)
		}
	}
	// Sessions come by node: the nodes are in order already.
	return resp, nil
}
