package directory_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"go.uber.org/goleak"

	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet/directory"
	"roost.dev/roost/pkg/fleet/etcdstore"
)

// Every client, keep-alive and registrant ends with its test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// giveUp bounds every wait for etcd to show something: a failure of the harness or the code,
// not a measure of speed.
const giveUp = 90 * time.Second

func open(t *testing.T, endpoints []string) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.New(etcdstore.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type node struct {
	sessions atomic.Int64
	r        *directory.Registrant
}

func register(t *testing.T, st directory.Store, name, addr string) *node {
	t.Helper()
	n := &node{}
	r, err := directory.Register(directory.Config{
		Store: st, Node: name, Address: addr, Classes: []string{"unconfined", "advisory", "scoped"},
		StartedAt: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC), Version: "v0.0.0-test",
		Capacity: func() directory.Capacity {
			return directory.Capacity{CPUs: 2, MemoryBytes: 1 << 30, SessionsRunning: int(n.sessions.Load()), Warm: map[string]int{"a default capsule": 1}}
		},
		TTL: 2 * time.Second, Interval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	n.r = r
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return n
}

func list(t *testing.T, st directory.Store) map[string]directory.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nodes, err := directory.List(ctx, st, "")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]directory.Node{}
	for _, n := range nodes {
		out[n.Node] = n
	}
	return out
}

// waitFor polls the directory as st reads it until ok holds of it.
func waitFor(t *testing.T, st directory.Store, what string, ok func(map[string]directory.Node) bool) map[string]directory.Node {
	t.Helper()
	deadline := time.Now().Add(giveUp)
	for {
		got := list(t, st)
		if ok(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never seen; the directory is %+v", what, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func revision(t *testing.T, st directory.Store) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, rev, err := st.Get(ctx, "/roost/", true)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// Nodes registered on a real 3-member etcd, each through its own link, read back by a client
// of their own; one node's link cut until its lease lapses (listed unreachable from its
// tombstone, never dropped), then healed (registered again under a new lease); a burst of a
// thousand changes written as a few; a clean stop listed as stopped; forget deleting it.
func TestDirectoryOnEtcd(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	observer := open(t, c.Endpoints())
	linkA := c.Link()
	a := register(t, open(t, linkA.Endpoints()), "node-a", "10.0.0.1:7443")
	b := register(t, open(t, c.Link().Endpoints()), "node-b", "")

	got := waitFor(t, observer, "both nodes registered", func(m map[string]directory.Node) bool {
		return m["node-a"].Reachable && m["node-b"].Reachable
	})
	ea := got["node-a"]
	if ea.Address != "10.0.0.1:7443" || ea.State != directory.StateUp || ea.Version != "v0.0.0-test" || ea.Capacity.CPUs != 2 ||
		ea.Capacity.MemoryBytes != 1<<30 || ea.Capacity.Warm["a default capsule"] != 1 || len(ea.Classes) != 3 ||
		!ea.StartedAt.Equal(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)) || ea.Schema != directory.Schema {
		t.Errorf("node-a as read back: %+v", ea)
	}
	if got["node-b"].Address != "" {
		t.Errorf("node-b has no listener, yet: %+v", got["node-b"])
	}

	t.Run("Throttled", func(t *testing.T) {
		before := revision(t, observer)
		// A thousand changes, as a node starting sessions under load makes them, spread over
		// several of the registrant's intervals.
		for range 1000 {
			a.sessions.Add(1)
			time.Sleep(time.Millisecond)
		}
		waitFor(t, observer, "node-a's last count", func(m map[string]directory.Node) bool {
			return m["node-a"].Capacity.SessionsRunning == 1000
		})
		writes := revision(t, observer) - before
		t.Logf("1000 changes, %d writes", writes)
		if writes < 1 || writes > 100 {
			t.Errorf("1000 changes made %d writes to etcd; want a few (one per interval at most)", writes)
		}
		// Nothing changes: nothing is written.
		quiet := revision(t, observer)
		time.Sleep(500 * time.Millisecond)
		if n := revision(t, observer) - quiet; n != 0 {
			t.Errorf("%d writes while nothing changed", n)
		}
	})

	t.Run("CutOff", func(t *testing.T) {
		linkA.Blackhole()
		got := waitFor(t, observer, "node-a unreachable once its lease lapsed", func(m map[string]directory.Node) bool {
			return !m["node-a"].Reachable
		})
		if n, ok := got["node-a"]; !ok || n.Address != "10.0.0.1:7443" || n.State != directory.StateUp || n.Capacity.SessionsRunning != 1000 {
			t.Errorf("node-a cut off is listed from its tombstone as %+v (present: %t)", n, ok)
		}
		if !got["node-b"].Reachable {
			t.Errorf("node-b, not cut off, is unreachable: %+v", got["node-b"])
		}
		linkA.Heal()
		waitFor(t, observer, "node-a registered again once healed", func(m map[string]directory.Node) bool {
			return m["node-a"].Reachable
		})
	})

	t.Run("StopAndForget", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		got := list(t, observer)
		if n := got["node-b"]; n.Reachable || n.State != directory.StateStopped {
			t.Errorf("node-b stopped cleanly is listed %+v", n)
		}
		found, err := directory.Forget(ctx, observer, "", "node-b")
		if err != nil || !found {
			t.Fatalf("forget node-b: %t, %v", found, err)
		}
		if _, ok := list(t, observer)["node-b"]; ok {
			t.Error("node-b is still listed once forgotten")
		}
		if found, err := directory.Forget(ctx, observer, "", "node-b"); err != nil || found {
			t.Errorf("forgetting node-b again: %t, %v", found, err)
		}
		if _, err := directory.Forget(ctx, observer, "", "no/such"); !errdefs.IsInvalidArgument(err) {
			t.Errorf("forgetting a bad name: %v", err)
		}
	})
}

// Bad names and addresses are refused before anything is written, each error naming it.
func TestRegisterRefuses(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, c.Endpoints())
	capacity := func() directory.Capacity { return directory.Capacity{} }
	for _, tc := range []struct {
		node, addr, want string
	}{
		{"", "", `node name ""`},
		{"a/b", "", `node name "a/b"`},
		{strings.Repeat("n", 129), "", "1 to 128 characters"},
		{"node-a", "10.0.0.1", `node address "10.0.0.1": want host:port`},
		{"node-a", "https://10.0.0.1:7443", "no scheme"},
		{"node-a", "10.0.0.1:http", `port "http"`},
		{"node-a", "10.0.0.1:70000", `port "70000"`},
		{"node-a", "10.0.0.1:0", `port "0"`},
	} {
		r, err := directory.Register(directory.Config{Store: st, Node: tc.node, Address: tc.addr, Capacity: capacity})
		if err == nil {
			_ = r.Stop(context.Background())
			t.Errorf("node %q address %q: registered", tc.node, tc.addr)
			continue
		}
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("node %q address %q: %v; want invalid argument saying %q", tc.node, tc.addr, err, tc.want)
		}
	}
	if _, err := directory.Register(directory.Config{Store: st, Node: "node-a", Capacity: capacity, TTL: time.Millisecond}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a TTL under a second: %v", err)
	}
	if got := list(t, st); len(got) != 0 {
		t.Errorf("refused registrations wrote %+v", got)
	}
}
