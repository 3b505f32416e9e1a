package placement_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/fleet/placement"
)

// forwarded records the stages a Stager sends to other nodes, and answers as the node would.
type forwarded struct {
	reqs []*roostv1.StageRequest
	err  error
	// full are nodes that refuse every stage for want of room, as a node whose id pool is
	// taken answers.
	full map[string]bool
}

func (f *forwarded) Stage(_ context.Context, node, address string, req *roostv1.StageRequest) (*roostv1.StageResponse, error) {
	f.reqs = append(f.reqs, req)
	if f.err != nil {
		return nil, f.err
	}
	if f.full[node] {
		return nil, status.Errorf(codes.ResourceExhausted, "node %s: every id range is held", node)
	}
	return &roostv1.StageResponse{Session: &roostv1.Session{Id: "ses_" + node, Node: node}}, nil
}

// A stage is placed and forwarded with its placement; the node it lands on takes only a
// placement from a node, on itself, with one of its own reservations; a refusal there gives
// the reservation back.
func TestStager(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	st := open(t, c.Endpoints())
	other := register(t, st, &node{name: "other", max: 1})
	waitListed(t, st, other)
	fwd := &forwarded{}
	fromNode := false
	var localReqs []*roostv1.StageRequest
	local := func(_ context.Context, req *roostv1.StageRequest) (*roostv1.StageResponse, error) {
		localReqs = append(localReqs, req)
		return &roostv1.StageResponse{Session: &roostv1.Session{Id: "ses_local"}}, nil
	}
	entry, err := placement.NewStager(placement.StagerConfig{
		Placer: newPlacer(t, st, "entry", 1), Staged: placement.NewStaged("entry", ""), Forward: fwd,
		Describe: func(*roostv1.StageRequest) (placement.Need, error) { return placement.Need{}, nil },
		FromNode: func(context.Context) bool { return fromNode },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	resp, err := entry.Stage(ctx, &roostv1.StageRequest{Capsule: "/c", Name: "web"}, local)
	if err != nil {
		t.Fatal(err)
	}
	if len(fwd.reqs) != 1 || len(localReqs) != 0 {
		t.Fatalf("forwarded %d, staged here %d; want the one stage forwarded to other", len(fwd.reqs), len(localReqs))
	}
	sent := fwd.reqs[0]
	if sent.GetNode() != "other" || sent.GetName() != "web" || sent.GetPlacement().GetNode() != "other" || sent.GetPlacement().GetEntry() != "entry" || sent.GetPlacement().GetReservation() == "" {
		t.Fatalf("the forwarded stage: %v", sent)
	}
	if node, _, ok := entry.Placed(resp.GetSession().GetId()); !ok || node != "other" {
		t.Fatalf("the entry does not remember where it placed %s: %q %t", resp.GetSession().GetId(), node, ok)
	}

	// On other: the forwarded stage from a client that is no node is refused; from a node,
	// staged and its reservation listed.
	target, err := placement.NewStager(placement.StagerConfig{
		Placer: newPlacer(t, st, "other", 1), Staged: other.staged, Forward: &forwarded{},
		Describe: func(*roostv1.StageRequest) (placement.Need, error) { return placement.Need{}, nil },
		FromNode: func(context.Context) bool { return fromNode },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := target.Stage(ctx, sent, local); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("a placement from a client that is no node: %v, want permission denied", err)
	}
	// Nor may it pass for one the node made itself.
	posing := placementOf(sent)
	posing.Placement.Entry = "other"
	if _, err := target.Stage(ctx, posing, local); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("a placement naming the node itself as its entry, from a client that is no node: %v, want permission denied", err)
	}
	fromNode = true
	forged := placementOf(sent)
	forged.Placement.Reservation = "/roost/v1/nodes/other"
	if _, err := target.Stage(ctx, forged, local); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a placement naming a key that is no reservation of the node: %v, want invalid argument", err)
	}
	elsewhere := placementOf(sent)
	elsewhere.Node, elsewhere.Placement.Node = "third", "third"
	if _, err := target.Stage(ctx, elsewhere, local); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a stage placed on another node: %v, want invalid argument", err)
	}
	if len(localReqs) != 0 {
		t.Fatalf("refused stages were staged: %v", localReqs)
	}
	if _, err := target.Stage(ctx, sent, local); err != nil {
		t.Fatal(err)
	}
	// Its directory entry's next write settles the reservation.
	deadline := time.Now().Add(giveUp)
	for {
		kvs, _, err := st.Get(ctx, sent.GetPlacement().GetReservation(), false)
		if err == nil && len(kvs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reservation of a session staged on its node was not settled: %v %v", kvs, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A stage the chosen node refuses gives its reservation back at once: other, with room
	// for one, takes the next placement again, well before the lease would have lapsed.
	fwd.err = errors.New("refused")
	if _, err := entry.Stage(ctx, &roostv1.StageRequest{Capsule: "/c"}, local); err == nil {
		t.Fatal("a refused forwarded stage succeeded")
	}
	fwd.err = nil
	if _, err := entry.Stage(ctx, &roostv1.StageRequest{Capsule: "/c"}, local); err != nil {
		t.Fatalf("after a refused stage gave its reservation back: %v", err)
	}
}

func placementOf(req *roostv1.StageRequest) *roostv1.StageRequest {
	p := req.GetPlacement()
	return &roostv1.StageRequest{Capsule: req.GetCapsule(), Node: req.GetNode(),
		Placement: &roostv1.Placement{Node: p.GetNode(), Entry: p.GetEntry(), Reservation: p.GetReservation()}}
}

// A node that refuses the stage for want of room, though its entry said it had some, leaves
// the next node to take it; the decision says why the first one is no candidate. A pinned
// stage is not moved.
func TestStagerTriesAnotherNodeWhenFull(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	st := open(t, c.Endpoints())
	a := register(t, st, &node{name: "a", max: 10})
	b := register(t, st, &node{name: "b", max: 10})
	a.running.Store(0)
	b.running.Store(5) // a is always the better draw
	waitListed(t, st, a, b)
	fwd := &forwarded{full: map[string]bool{"a": true}}
	entry, err := placement.NewStager(placement.StagerConfig{
		Placer: newPlacer(t, st, "entry", 1), Staged: placement.NewStaged("entry", ""), Forward: fwd,
		Describe: func(*roostv1.StageRequest) (placement.Need, error) { return placement.Need{}, nil },
		FromNode: func(context.Context) bool { return false },
	})
	if err != nil {
		t.Fatal(err)
	}
	local := func(context.Context, *roostv1.StageRequest) (*roostv1.StageResponse, error) {
		t.Fatal("staged on the entry node, which is in no directory")
		return nil, nil
	}
	resp, err := entry.Stage(context.Background(), &roostv1.StageRequest{Capsule: "/c"}, local)
	if err != nil || resp.GetSession().GetNode() != "b" {
		t.Fatalf("with a full of its own count: %v %v, want the session on b", resp, err)
	}
	if len(fwd.reqs) != 2 || fwd.reqs[0].GetNode() != "a" {
		t.Fatalf("stages sent: %v; want a, then b", fwd.reqs)
	}
	var saw bool
	for _, c := range fwd.reqs[1].GetPlacement().GetCandidates() {
		if c.GetNode() == "a" && strings.Contains(c.GetRefused(), "refused it") && strings.Contains(c.GetRefused(), "every id range is held") {
			saw = true
		}
	}
	if !saw {
		t.Fatalf("the second decision does not say a refused it: %v", fwd.reqs[1].GetPlacement().GetCandidates())
	}
	fwd.reqs = nil
	if _, err := entry.Stage(context.Background(), &roostv1.StageRequest{Capsule: "/c", Node: "a"}, local); status.Code(err) != codes.ResourceExhausted || len(fwd.reqs) != 1 {
		t.Fatalf("pinned to a full node: %v after %d stages, want its refusal after one", err, len(fwd.reqs))
	}
}

// A node cut off from etcd stages a session it cannot place where it is asked, soon; one
// pinned to another node is refused, saying etcd does not answer.
func TestStagerCutOffStagesHere(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1})
	link := c.Link()
	st, err := etcdstore.New(etcdstore.Config{Endpoints: link.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := placement.New(placement.Config{Store: st, Self: "entry", Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	entry, err := placement.NewStager(placement.StagerConfig{
		Placer: p, Staged: placement.NewStaged("entry", ""), Forward: &forwarded{},
		Describe: func(*roostv1.StageRequest) (placement.Need, error) { return placement.Need{}, nil },
		FromNode: func(context.Context) bool { return false },
	})
	if err != nil {
		t.Fatal(err)
	}
	link.Blackhole()
	defer link.Heal()
	var here int
	local := func(_ context.Context, req *roostv1.StageRequest) (*roostv1.StageResponse, error) {
		here++
		return &roostv1.StageResponse{Session: &roostv1.Session{Id: "ses_here"}}, nil
	}
	resp, err := entry.Stage(context.Background(), &roostv1.StageRequest{Capsule: "/c"}, local)
	if err != nil || here != 1 || resp.GetSession().GetId() != "ses_here" {
		t.Fatalf("cut off from etcd: %v %v (staged here %d), want the session staged here", resp, err, here)
	}
	if _, err := entry.Stage(context.Background(), &roostv1.StageRequest{Capsule: "/c", Node: "other"}, local); !errors.Is(err, placement.ErrStore) || here != 1 {
		t.Fatalf("cut off from etcd, pinned to another node: %v (staged here %d), want the store's error", err, here)
	}
}
