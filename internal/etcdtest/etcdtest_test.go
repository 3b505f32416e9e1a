package etcdtest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// The harness's goroutines and every member's end with the test's cleanup.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctx(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

func TestMemberRestartKeepsDataAndURL(t *testing.T) {
	c := Start(t, Options{})
	m := c.Members()[0]
	url := m.ClientURL()
	cli := c.Client(t)
	if _, err := cli.Put(ctx(t, 10*time.Second), "k", "v1"); err != nil {
		t.Fatal(err)
	}
	m.Stop(t)
	if m.Running() {
		t.Fatal("stopped member says it runs")
	}
	if _, err := cli.Get(ctx(t, 500*time.Millisecond), "k"); err == nil {
		t.Fatal("a get from a stopped single member succeeded")
	}
	m.Restart(t)
	if m.ClientURL() != url {
		t.Fatalf("client URL moved from %s to %s across a restart", url, m.ClientURL())
	}
	resp, err := cli.Get(ctx(t, 10*time.Second), "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" {
		t.Fatalf("after restart: %v", resp.Kvs)
	}
}

func TestLeaderKilledIsReplaced(t *testing.T) {
	c := Start(t, Options{Members: 3})
	old := c.WaitLeader(t)
	if got := len(c.Followers()); got != 2 {
		t.Fatalf("%d followers of %s, want 2", got, old.Name)
	}
	old.Kill(t)
	l := c.WaitLeader(t)
	if l == old {
		t.Fatalf("killed leader %s still leads", old.Name)
	}
	cli := c.Client(t, l.ClientURL())
	if _, err := cli.Put(ctx(t, 10*time.Second), "k", "after"); err != nil {
		t.Fatal(err)
	}
	old.Restart(t)
	// The restarted member catches up: a linearizable read through it alone sees the put.
	resp, err := c.Client(t, old.ClientURL()).Get(ctx(t, 10*time.Second), "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "after" {
		t.Fatalf("restarted member reads %v", resp.Kvs)
	}
}

func TestPartitionedMinorityRefusesMajorityServes(t *testing.T) {
	c := Start(t, Options{Members: 3})
	l := c.WaitLeader(t)
	rest := c.Followers()
	c.Partition([]*Member{l}, rest)
	// The majority elects a leader of its own; the old leader, alone, steps down.
	var nl *Member
	for nl == nil || nl == l {
		nl = c.WaitLeader(t)
	}
	if _, err := c.Client(t, nl.ClientURL()).Put(ctx(t, 10*time.Second), "k", "majority"); err != nil {
		t.Fatal(err)
	}
	_, err := c.Client(t, l.ClientURL()).Put(ctx(t, time.Second), "k", "minority")
	if err == nil {
		t.Fatal("a put through the cut-off old leader succeeded")
	}
	c.Heal()
	resp, err := c.Client(t, l.ClientURL()).Get(ctx(t, 10*time.Second), "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "majority" {
		t.Fatalf("after healing, the old leader reads %v", resp.Kvs)
	}
}

func TestLinkBlackholeCutsOnlyItsClient(t *testing.T) {
	c := Start(t, Options{})
	link := c.Link()
	cut := c.Client(t, link.Endpoints()...)
	other := c.Client(t)
	if _, err := cut.Put(ctx(t, 10*time.Second), "k", "1"); err != nil {
		t.Fatal(err)
	}
	link.Blackhole()
	if _, err := cut.Get(ctx(t, 500*time.Millisecond), "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a get over a blackholed link: %v, want the deadline to pass", err)
	}
	if _, err := other.Put(ctx(t, 10*time.Second), "k", "2"); err != nil {
		t.Fatalf("a client of the member's own bridge: %v", err)
	}
	link.Heal()
	link.DropConnections()
	resp, err := cut.Get(ctx(t, 10*time.Second), "k")
	if err != nil {
		t.Fatal(err)
	}
	if string(resp.Kvs[0].Value) != "2" {
		t.Fatalf("after healing: %v", resp.Kvs)
	}
}

func TestRepliesBlackholedWriteLandsUnheard(t *testing.T) {
	c := Start(t, Options{})
	link := c.Link()
	cut := c.Client(t, link.Endpoints()...)
	if _, err := cut.Get(ctx(t, 10*time.Second), "warm"); err != nil {
		t.Fatal(err)
	}
	link.BlackholeReplies()
	if _, err := cut.Put(ctx(t, 500*time.Millisecond), "k", "unheard"); err == nil {
		t.Fatal("a put whose reply was dropped succeeded")
	}
	resp, err := c.Client(t).Get(ctx(t, 10*time.Second), "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatal("the put whose reply was dropped did not land")
	}
}

func TestTLSClusterNeedsClientCertificate(t *testing.T) {
	c := Start(t, Options{TLS: true})
	if _, err := c.Client(t).Put(ctx(t, 10*time.Second), "k", "v"); err != nil {
		t.Fatal(err)
	}
	plain, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + c.Members()[0].Bridge().Addr()}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.Get(ctx(t, 500*time.Millisecond), "k"); err == nil {
		t.Fatal("a client without TLS read from a TLS cluster")
	}
}

func TestCleanupClosesPorts(t *testing.T) {
	var addrs []string
	t.Run("cluster", func(t *testing.T) {
		c := Start(t, Options{Members: 3})
		for _, m := range c.Members() {
			addrs = append(addrs, m.Bridge().Addr(), m.peer.Addr(), m.clientAddr(), m.peerAddr())
		}
		l := c.Link()
		addrs = append(addrs, l.bridges[0].Addr())
	})
	for _, a := range addrs {
		if conn, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			conn.Close()
			t.Errorf("%s still accepts after the cluster's cleanup", a)
		}
	}
}
