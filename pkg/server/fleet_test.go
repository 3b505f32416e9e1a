package server

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/directory"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/ledger"
)

// The fleet RPCs on a node of a fleet kept in a real etcd member: the ceiling set through
// one, the node taking blocks of it, the day and the nodes as the store has them, a node
// forgotten; and a roostd that is no fleet node says so.
func TestFleetRPCs(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	st, err := etcdstore.New(etcdstore.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dir := t.TempDir()
	led, err := ledger.Open(ledger.Config{Path: filepath.Join(dir, ledger.File), Fleet: true, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	node, err := fleet.Open(fleet.Config{Store: st, Node: "node-a", StateDir: dir, Ledger: led, MinBlock: 100, MaxBlock: 1000, Tick: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	s := &spendService{ledger: led, fleetNode: &Fleet{Store: st, Node: "node-a", Status: node.Status}}
	ctx := context.Background()

	set, err := s.SetFleetLimit(ctx, &roostv1.SetFleetLimitRequest{Tokens: 5000})
	if err != nil || set.GetTokens() != 5000 || set.GetPrevious() != 0 {
		t.Fatalf("SetFleetLimit: %v, %v", set, err)
	}
	node.Kick()
	for node.Status().Held == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	got, err := s.GetFleet(ctx, &roostv1.GetFleetRequest{})
	if err != nil {
		t.Fatal(err)
	}
	d := got.GetDay()
	if got.GetNode() != "node-a" || d.GetCeiling() != 5000 || !d.GetOpen() || d.GetGranted() == 0 || len(d.GetNodes()) != 1 ||
		d.GetNodes()[0].GetNode() != "node-a" || d.GetNodes()[0].GetHeld() != d.GetGranted() {
		t.Errorf("GetFleet: %v", got)
	}
	if _, err := s.GetFleet(ctx, &roostv1.GetFleetRequest{Day: "yesterday"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a bad day: %v", err)
	}
	nodes, err := s.ListFleetNodes(ctx, &roostv1.ListFleetNodesRequest{})
	if err != nil || nodes.GetSelf().GetNode() != "node-a" || nodes.GetSelf().GetHeld() == 0 || nodes.GetSelf().GetUnreachable() || len(nodes.GetNodes()) != 1 ||
		len(nodes.GetDirectory()) != 0 {
		t.Errorf("ListFleetNodes: %v, %v", nodes, err)
	}
	// node-b registers in the node directory, then stops: listed, stopped, until forgotten.
	reg, err := directory.Register(directory.Config{Store: st, Node: "node-b", Address: "[::1]:7443", Classes: []string{"unconfined"}, Version: "v9",
		StartedAt: time.Now(), Capacity: func() directory.Capacity {
			return directory.Capacity{CPUs: 4, Warm: map[string]int{"a default capsule": 1}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		nodes, err = s.ListFleetNodes(ctx, &roostv1.ListFleetNodesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes.GetDirectory()) == 1 && nodes.GetDirectory()[0].GetReachable() {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e := nodes.GetDirectory()[0]; e.GetNode() != "node-b" || e.GetAddress() != "[::1]:7443" || e.GetState() != "up" || e.GetCpus() != 4 ||
		e.GetWarm()["a default capsule"] != 1 || e.GetVersion() != "v9" || e.GetStartedAt() == nil || len(e.GetClasses()) != 1 {
		t.Errorf("node-b in the directory: %v", e)
	}
	if err := reg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	nodes, err = s.ListFleetNodes(ctx, &roostv1.ListFleetNodesRequest{})
	if err != nil || len(nodes.GetDirectory()) != 1 || nodes.GetDirectory()[0].GetReachable() || nodes.GetDirectory()[0].GetState() != "stopped" {
		t.Errorf("node-b stopped: %v, %v", nodes.GetDirectory(), err)
	}
	if _, err := s.ForgetFleetNode(ctx, &roostv1.ForgetFleetNodeRequest{Node: "node-a"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("forgetting this node: %v", err)
	}
	if _, err := s.ForgetFleetNode(ctx, &roostv1.ForgetFleetNodeRequest{Node: "no such/node"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("forgetting a bad name: %v", err)
	}
	gone, err := s.ForgetFleetNode(ctx, &roostv1.ForgetFleetNodeRequest{Node: "node-b"})
	if err != nil || gone.GetWrittenOff() != 0 || gone.GetUnderUse() != 0 || !gone.GetDirectoryEntryDeleted() {
		t.Errorf("forgetting a node that holds nothing: %v, %v", gone, err)
	}
	if nodes, err := s.ListFleetNodes(ctx, &roostv1.ListFleetNodesRequest{}); err != nil || len(nodes.GetDirectory()) != 0 {
		t.Errorf("node-b forgotten is listed: %v, %v", nodes.GetDirectory(), err)
	}

	single := &spendService{ledger: led}
	if _, err := single.GetFleet(ctx, &roostv1.GetFleetRequest{}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("no fleet: %v", err)
	}
}
