package server

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet/directory"
	"roost.dev/roost/pkg/fleet/etcdstore"
)

// publishOnce writes a node's sessions in the session directory as its roostd would, and
// stops its publisher (the entries stay: they have no lease).
func publishOnce(t *testing.T, st *etcdstore.Store, node string, ss ...directory.Session) {
	t.Helper()
	p, err := directory.PublishSessions(directory.SessionsConfig{Store: st, Node: node, List: func() ([]directory.Session, error) { return ss, nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// ListFleet over a real socket against a real etcd member: node-a heard, node-b stopped,
// node-c never registered; the unreachable nodes said; all, the node filter and a bad
// node name; ForgetFleetNode marking node-b's sessions lost and counting them; a roostd
// that is no fleet node says how to make it one.
func TestListFleetOnEtcd(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	st, err := etcdstore.New(etcdstore.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	created := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return created.Add(time.Duration(i) * time.Minute) }
	publishOnce(t, st, "node-a",
		directory.Session{ID: "ses_a1", Name: "build", State: "running", Capsule: "hello@0.1.0", Class: "sealed", CreatedAt: at(1)},
		directory.Session{ID: "ses_a2", State: "exited", Capsule: "hello@0.1.0", Class: "sealed", CreatedAt: at(2), EndedAt: at(3)})
	publishOnce(t, st, "node-b", directory.Session{ID: "ses_b1", Name: "build", State: "running", Capsule: "agent@2.0.0", Class: "scoped", CreatedAt: at(0)})
	publishOnce(t, st, "node-c", directory.Session{ID: "ses_c1", State: "staged", Capsule: "hello@0.1.0", CreatedAt: at(4)})
	for _, n := range []string{"node-a", "node-b"} {
		reg, err := directory.Register(directory.Config{Store: st, Node: n, StartedAt: time.Now(), Capacity: func() directory.Capacity { return directory.Capacity{} }})
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Stop(ctx)
		if n == "node-b" {
			for {
				nodes, err := directory.List(ctx, st, "")
				if err != nil {
					t.Fatal(err)
				}
				if len(nodes) == 2 && nodes[0].Reachable && nodes[1].Reachable {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := reg.Stop(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	f := &Fleet{Store: st, Node: "node-a"}
	conn := serveUnix(t, New(Config{Fleet: f}))
	sc := roostv1.NewSessionServiceClient(conn)
	ids := func(resp *roostv1.ListFleetResponse) []string {
		var out []string
		for _, s := range resp.GetSessions() {
			out = append(out, s.GetNode()+"/"+s.GetId())
		}
		return out
	}

	live, err := sc.ListFleet(ctx, &roostv1.ListFleetRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(live), []string{"node-a/ses_a1", "node-b/ses_b1", "node-c/ses_c1"}; !slices.Equal(got, want) {
		t.Errorf("ListFleet: %v; want %v", got, want)
	}
	if got := live.GetUnreachableNodes(); !slices.Equal(got, []string{"node-b", "node-c"}) {
		t.Errorf("unreachable nodes %v; want node-b (stopped) and node-c (never registered)", got)
	}
	a1 := live.GetSessions()[0]
	if a1.GetName() != "build" || a1.GetState() != "running" || a1.GetCapsule() != "hello@0.1.0" || a1.GetClass() != "sealed" || !a1.GetNodeReachable() ||
		!a1.GetCreatedAt().AsTime().Equal(at(1)) || a1.GetEndedAt() != nil || a1.GetUpdatedAt() == nil {
		t.Errorf("ses_a1: %v", a1)
	}
	if live.GetSessions()[1].GetNodeReachable() {
		t.Errorf("node-b, stopped, is reachable: %v", live.GetSessions()[1])
	}

	all, err := sc.ListFleet(ctx, &roostv1.ListFleetRequest{All: true, Node: []string{"node-a"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(all), []string{"node-a/ses_a1", "node-a/ses_a2"}; !slices.Equal(got, want) || len(all.GetUnreachableNodes()) != 0 {
		t.Errorf("ListFleet all of node-a: %v, unreachable %v; want %v and none", got, all.GetUnreachableNodes(), want)
	}
	if e := all.GetSessions()[1]; !e.GetEndedAt().AsTime().Equal(at(3)) || e.GetState() != "exited" {
		t.Errorf("ses_a2: %v", e)
	}
	_, err = sc.ListFleet(ctx, &roostv1.ListFleetRequest{Node: []string{"node-a", "no/such"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), `node 1 of the request: fleet: node name "no/such"`) {
		t.Errorf("a bad node name: %v", err)
	}

	forgot, err := roostv1.NewSpendServiceClient(conn).ForgetFleetNode(ctx, &roostv1.ForgetFleetNodeRequest{Node: "node-b"})
	if err != nil || forgot.GetSessionsLost() != 1 || !forgot.GetDirectoryEntryDeleted() {
		t.Fatalf("ForgetFleetNode node-b: %v, %v", forgot, err)
	}
	lost, err := sc.ListFleet(ctx, &roostv1.ListFleetRequest{Node: []string{"node-b"}})
	if err != nil || len(lost.GetSessions()) != 1 || lost.GetSessions()[0].GetState() != directory.StateLost ||
		lost.GetSessions()[0].GetLastState() != "running" || !slices.Equal(lost.GetUnreachableNodes(), []string{"node-b"}) {
		t.Errorf("node-b's session once node-b is forgotten: %v, %v", lost, err)
	}
	again, err := roostv1.NewSpendServiceClient(conn).ForgetFleetNode(ctx, &roostv1.ForgetFleetNodeRequest{Node: "node-b"})
	if err != nil || again.GetSessionsLost() != 0 {
		t.Errorf("forgetting node-b again: %v, %v", again, err)
	}

	single := roostv1.NewSessionServiceClient(serveUnix(t, New(Config{})))
	_, err = single.ListFleet(ctx, &roostv1.ListFleetRequest{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "start it with --fleet-etcd and --node-name") {
		t.Errorf("ListFleet on a roostd that is no fleet node: %v", err)
	}
}
