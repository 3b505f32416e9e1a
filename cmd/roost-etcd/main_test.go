package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/etcdstore"
)

// runAsEtcd makes the test binary roost-etcd itself when the test starts it as a member: the
// processes run this package's main, as bin/roost-etcd would.
const runAsEtcd = "ROOST_ETCD_TEST_MEMBER"

func TestMain(m *testing.M) {
	if os.Getenv(runAsEtcd) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// freePorts reserves n loopback ports by binding them and lets them go for the members to
// take: etcd needs its peers' ports before any of them starts.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// Three roost-etcd processes form a cluster; it serves compare-and-swap Txns, and goes on
// serving them when its leader's process is SIGKILLed.
func TestThreeProcessesSurviveLeaderKill(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ports := freePorts(t, 6)
	var initial, clients []string
	for i := range 3 {
		initial = append(initial, fmt.Sprintf("p%d=http://127.0.0.1:%d", i, ports[2*i]))
		clients = append(clients, fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]))
	}
	procs := make([]*exec.Cmd, 3)
	for i := range 3 {
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i])
		cmd := exec.Command(exe,
			"--name", fmt.Sprintf("p%d", i), "--data-dir", filepath.Join(dir, fmt.Sprintf("p%d", i)),
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--listen-client-urls", clients[i], "--advertise-client-urls", clients[i],
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "roost-etcd-test", "--unsafe-no-fsync",
			"--heartbeat-interval", "25", "--election-timeout", "250", "--log-level", "warn")
		cmd.Env = append(os.Environ(), runAsEtcd+"=1")
		log, err := os.Create(filepath.Join(dir, fmt.Sprintf("p%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = cmd
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			log.Close()
			if t.Failed() {
				b, _ := os.ReadFile(log.Name())
				t.Logf("p%d's log:\n%s", i, b)
			}
		})
	}
	s, err := etcdstore.New(etcdstore.Config{Endpoints: clients, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cas := func(key string) {
		t.Helper()
		for {
			short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
			ok, err := s.Txn(short, []fleet.Cmp{{Key: key}}, []fleet.Op{{Key: key, Value: []byte("x")}})
			cancelShort()
			if err == nil && ok {
				return
			}
			// An error is ambiguous: the key tells.
			if kvs, _, rerr := s.Get(ctx, key, false); rerr == nil && len(kvs) == 1 {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("txn on %q: %v", key, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	start := time.Now()
	cas("before")
	t.Logf("cluster serving %s after its processes started", time.Since(start).Round(time.Millisecond))

	cli, err := clientv3.New(clientv3.Config{Endpoints: clients, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	leader := -1
	for i, ep := range clients {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			t.Fatalf("status of %s: %v", ep, err)
		}
		if st.Leader == st.Header.MemberId {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no process leads")
	}
	if err := procs[leader].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	cas("after")
	t.Logf("serving again %s after the leader's SIGKILL", time.Since(start).Round(time.Millisecond))
	kvs, _, err := s.Get(ctx, "after", false)
	if err != nil || len(kvs) != 1 {
		t.Fatalf("after the leader's SIGKILL: %v, %v", kvs, err)
	}
}
