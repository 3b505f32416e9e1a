package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/fleet/etcdstore"
)

// routedNodes and routedSessions size TestFleetRouting as the issue asks: five nodes, 200
// sessions started through one of them; routedMax is each node's bound (its id pool's
// slots less one), so the 200 must spread over at least five.
const (
	routedNodes    = 5
	routedSessions = 200
	routedMax      = 45
)

// fleetClient is roostctl --server against one node's listener, as the operator "ops".
type fleetClient struct {
	t      *testing.T
	addr   string
	tlsDir string
	cert   string
}

func (c fleetClient) ctl(args ...string) result {
	c.t.Helper()
	argv := append([]string{"--server", "https://" + c.addr, "--tls-ca", filepath.Join(c.tlsDir, "ca.pem"),
		"--tls-cert", filepath.Join(c.tlsDir, c.cert+".pem"), "--tls-key", filepath.Join(c.tlsDir, c.cert+"-key.pem")}, args...)
	cmd := exec.Command(filepath.Join(binDir, "roostctl"), argv...)
	cmd.Dir = repoRoot()
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	res := result{stdout: out.String(), stderr: errOut.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		res.code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("roostctl %v: %v", args, err)
	}
	return res
}

func (c fleetClient) ok(args ...string) string {
	c.t.Helper()
	res := c.ctl(args...)
	if res.code != 0 {
		c.t.Fatalf("roostctl --server %s %s: exit %d\nstdout: %s\nstderr: %s", c.addr, strings.Join(args, " "), res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

type fleetSession struct {
	ID    string `json:"id"`
	Node  string `json:"node"`
	State string `json:"state"`
}

// TestFleetRouting is issue 33's end to end: 3 etcd processes and 5 roostd nodes, each with
// its own state dir, socket, listener and node certificate. 200 sessions started through
// one entry node are placed over all five, none past its bound; each one sampled is
// reachable — inspect, logs, exec, stop, rm — through a node that is neither its owner nor
// the entry; ps --fleet lists all 200 with their nodes; an owner SIGKILLed makes its
// sessions' calls refused as unavailable, naming it.
func TestFleetRouting(t *testing.T) {
	testenv.NeedRoot(t, "roostd runs sessions as root")
	etcds, clients := etcdProcs(t)
	tlsDir := t.TempDir()
	argv := []string{"certs", "init", tlsDir, "--server-name", "127.0.0.1", "--client", "ops:operator", "--client", "viewer:reader"}
	for i := range routedNodes {
		argv = append(argv, "--client", fmt.Sprintf("node-%d:node", i))
	}
	if out, err := exec.Command(filepath.Join(binDir, "roostctl"), argv...).CombinedOutput(); err != nil {
		t.Fatalf("roostctl %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	var table strings.Builder
	table.WriteString("    - {common_name: ops, role: operator}\n    - {common_name: viewer, role: reader}\n")
	for i := range routedNodes {
		fmt.Fprintf(&table, "    - {common_name: node-%d, role: node}\n", i)
	}
	addrs := make([]string, routedNodes)
	for i := range addrs {
		addrs[i] = freePort(t)
	}
	nodes := make([]*daemon, routedNodes)
	via := make([]fleetClient, routedNodes)
	for i := range routedNodes {
		cfg := filepath.Join(t.TempDir(), "roostd.yaml")
		// Blocks of host ids apart: two roostds on one host must not share one.
		os.WriteFile(cfg, fmt.Appendf(nil, "sessions:\n  ids:\n    first: %d\n    slots: %d\n"+
			"remote:\n  listen: %s\n  tls_cert: %s\n  tls_key: %s\n  client_ca: %s\n  clients:\n%s",
			0x50000000+i*0x01000000, routedMax+1, addrs[i], filepath.Join(tlsDir, "server.pem"), filepath.Join(tlsDir, "server-key.pem"),
			filepath.Join(tlsDir, "ca.pem"), table.String()), 0o600)
		name := fmt.Sprintf("node-%d", i)
		args := []string{"--config", cfg, "--fleet-etcd", strings.Join(clients, ","), "--node-name", name,
			"--fleet-node-cert", filepath.Join(tlsDir, name+".pem"), "--fleet-node-key", filepath.Join(tlsDir, name+"-key.pem")}
		if i == routedNodes-1 {
			// The one node with a sandbox made ahead: placement prefers it for a sealed capsule.
			args = append(args, "--warm-pool", "1")
		}
		nodes[i] = newDaemon(t, args...)
		// certs init names the first client's files client.pem and client-key.pem.
		via[i] = fleetClient{t: t, addr: addrs[i], tlsDir: tlsDir, cert: "client"}
	}
	// Every node is in the directory, reachable, before the first placement.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out := via[0].ok("fleet", "nodes", "--json")
		if strings.Count(out, `"reachable": true`) == routedNodes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the directory does not list %d reachable nodes:\n%s", routedNodes, out)
		}
	}

	caps := capsule(t, "routed", `echo started; exec sleep 3600`, "")
	started := time.Now()
	ids := make([]string, routedSessions)
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				res := via[0].ctl("run", "--detach", caps)
				if res.code != 0 {
					t.Errorf("run %d through node-0: exit %d: %s", i, res.code, res.stderr)
					continue
				}
				ids[i] = strings.TrimSpace(res.stdout)
			}
		})
	}
	for i := range routedSessions {
		work <- i
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d sessions placed and launched through node-0 in %s", routedSessions, time.Since(started).Round(time.Millisecond))

	// ps --fleet, through another node, lists all 200 with their nodes, spread over all
	// five and none past its bound.
	var listed []fleetSession
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		listed = nil
		if err := json.Unmarshal([]byte(via[1].ok("ps", "--fleet", "--json")), &listed); err != nil {
			t.Fatal(err)
		}
		if len(listed) == routedSessions {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ps --fleet lists %d sessions, want %d", len(listed), routedSessions)
		}
	}
	owner := map[string]string{}
	per := map[string]int{}
	for _, s := range listed {
		owner[s.ID] = s.Node
		per[s.Node]++
	}
	for _, id := range ids {
		if owner[id] == "" {
			t.Fatalf("ps --fleet does not list %s", id)
		}
	}
	for i := range routedNodes {
		name := fmt.Sprintf("node-%d", i)
		if n := per[name]; n == 0 || n > routedMax {
			t.Fatalf("node %s holds %d sessions (want 1 to %d): %v", name, n, routedMax, per)
		}
	}
	t.Logf("sessions per node: %v", per)
	// node-0 counts what it placed: all 200, most forwarded to the other four.
	var here, forwarded int
	for line := range strings.Lines(scrape(t, nodes[0])) {
		fmt.Sscanf(line, `roost_fleet_placements_total{result="here"} %d`, &here)
		fmt.Sscanf(line, `roost_fleet_placements_total{result="forwarded"} %d`, &forwarded)
	}
	if here != per["node-0"] || here+forwarded != routedSessions {
		t.Fatalf("node-0's metrics count %d placed here and %d forwarded; it placed %d here of %d", here, forwarded, per["node-0"], routedSessions)
	}

	// Every one of them, asked of node-4: its record, from its own node.
	var iwg sync.WaitGroup
	next := make(chan string)
	for range 8 {
		iwg.Go(func() {
			for id := range next {
				var s fleetSession
				res := via[4].ctl("inspect", "--json", id)
				if res.code != 0 || json.Unmarshal([]byte(res.stdout), &s) != nil || s.Node != owner[id] || s.State != "running" {
					t.Errorf("inspect %s through node-4: exit %d, %+v: %s; want running on %s", id, res.code, s, res.stderr, owner[id])
				}
			}
		})
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	iwg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// One session of each node, driven through a node that is neither its owner nor the
	// entry node.
	seen := map[string]bool{}
	for _, id := range ids {
		o := owner[id]
		if seen[o] {
			continue
		}
		seen[o] = true
		k := 1
		for fmt.Sprintf("node-%d", k) == o {
			k++
		}
		c := via[k]
		var s struct {
			ID        string `json:"id"`
			Node      string `json:"node"`
			State     string `json:"state"`
			Placement struct {
				Node       string `json:"node"`
				Entry      string `json:"entry"`
				Candidates []struct {
					Node string `json:"node"`
				} `json:"candidates"`
			} `json:"placement"`
		}
		if err := json.Unmarshal([]byte(c.ok("inspect", "--json", id)), &s); err != nil {
			t.Fatal(err)
		}
		if s.Node != o || s.Placement.Node != o || s.Placement.Entry != "node-0" || len(s.Placement.Candidates) != routedNodes {
			t.Fatalf("inspect %s through node-%d: node %q, placement %+v; want %s placed by node-0 among %d", id, k, s.Node, s.Placement, o, routedNodes)
		}
		if out := c.ok("exec", id, "--", "/bin/echo", "routed"); strings.TrimSpace(out) != "routed" {
			t.Fatalf("exec in %s through node-%d: %q", id, k, out)
		}
		if out := c.ok("logs", id); !strings.Contains(out, "started") {
			t.Fatalf("logs of %s through node-%d: %q", id, k, out)
		}
		// A follower of its logs, through the same node, ends when the session does.
		argv := []string{"--server", "https://" + c.addr, "--tls-ca", filepath.Join(tlsDir, "ca.pem"), "--tls-cert", filepath.Join(tlsDir, "client.pem"),
			"--tls-key", filepath.Join(tlsDir, "client-key.pem"), "logs", "-f", id}
		follow := exec.Command(filepath.Join(binDir, "roostctl"), argv...)
		var fout strings.Builder
		follow.Stdout = &fout
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		c.ok("stop", id)
		ended := make(chan error, 1)
		go func() { ended <- follow.Wait() }()
		select {
		case err := <-ended:
			if err != nil || !strings.Contains(fout.String(), "started") {
				t.Fatalf("logs -f of %s through node-%d: %v, %q", id, k, err, fout.String())
			}
		case <-time.After(30 * time.Second):
			follow.Process.Kill()
			t.Fatalf("logs -f of %s through node-%d did not end with the session", id, k)
		}
		c.ok("rm", id)
		if res := c.ctl("inspect", id); res.code == 0 {
			t.Fatalf("inspect of %s after rm through node-%d succeeded: %s", id, k, res.stdout)
		}
	}

	// A reader through another node may read, not stop.
	viewer := via[2]
	viewer.cert = "viewer"
	var victim string
	for _, id := range ids {
		if o := owner[id]; o == "node-3" {
			if res := viewer.ctl("inspect", id); res.code == 0 {
				victim = id
				break
			}
		}
	}
	if victim == "" {
		t.Fatal("no session of node-3 left to read")
	}
	if res := viewer.ctl("stop", victim); res.code == 0 || !strings.Contains(res.stderr, "reader") {
		t.Fatalf("a reader's stop of %s through node-2: exit %d: %s", victim, res.code, res.stderr)
	}

	// A sealed capsule goes to the node holding a warm sandbox of its shape, and starts in it.
	sealedOne := capsule(t, "routed-sealed", `echo warm`, sealedCaps("echo", "", 60))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if strings.Contains(via[0].ok("fleet", "nodes", "--json"), `"a default capsule": 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-4's warm sandbox is not in the directory:\n%s", via[0].ok("fleet", "nodes", "--json"))
		}
	}
	warmID := strings.TrimSpace(via[0].ok("run", "--detach", sealedOne))
	var warm struct {
		Node      string `json:"node"`
		Warm      bool   `json:"warm"`
		Placement struct {
			Reason string `json:"reason"`
		} `json:"placement"`
	}
	if err := json.Unmarshal([]byte(via[2].ok("inspect", "--json", warmID)), &warm); err != nil {
		t.Fatal(err)
	}
	if warm.Node != "node-4" || !warm.Warm || !strings.Contains(warm.Placement.Reason, "warm") {
		t.Fatalf("a sealed session placed on %s (warm %t, %q); want node-4's warm sandbox", warm.Node, warm.Warm, warm.Placement.Reason)
	}

	// events --fleet --follow through node-0 outlives node-0's SIGKILL and restart: it
	// resumes each node after its last event, sees what comes after, and repeats nothing.
	follower := exec.Command(filepath.Join(binDir, "roostctl"), "--server", "https://"+addrs[0], "--tls-ca", filepath.Join(tlsDir, "ca.pem"),
		"--tls-cert", filepath.Join(tlsDir, "client.pem"), "--tls-key", filepath.Join(tlsDir, "client-key.pem"), "events", "--fleet", "--follow", "--json")
	followed := &lockedBuffer{}
	follower.Stdout, follower.Stderr = followed, &lockedBuffer{}
	if err := follower.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { follower.Process.Kill(); follower.Wait() }()
	waitFor(t, "the fleet follower to print every node's events", func() bool {
		for i := range routedNodes {
			if !strings.Contains(followed.String(), fmt.Sprintf(`"node":"node-%d"`, i)) {
				return false
			}
		}
		return true
	})
	nodes[0].kill9()
	nodes[0].start()
	after := strings.TrimSpace(via[1].ok("run", "--detach", "--node", "node-2", caps))
	waitFor(t, "the follower to print an event of a session started after the entry node's restart", func() bool {
		return strings.Contains(followed.String(), after)
	})
	// Its trace says where it was placed and why.
	if !strings.Contains(followed.String(), `"detail":"placed on node-2 by node-1: pinned (--node)"`) {
		t.Fatalf("no staged event of %s says its placement:\n%s", after, followed.String())
	}
	type keyed struct {
		Node string `json:"node"`
		Seq  string `json:"seq"`
	}
	printed := map[keyed]int{}
	for line := range strings.Lines(followed.String()) {
		var k keyed
		if err := json.Unmarshal([]byte(line), &k); err != nil {
			t.Fatalf("follower line %q: %v", line, err)
		}
		if printed[k]++; printed[k] > 1 {
			t.Fatalf("the follower printed node %s's event %s twice", k.Node, k.Seq)
		}
	}

	// node-1, the entry node of a burst of placements, SIGKILLed in the middle of it: every
	// run either returned its session or failed saying why; every session returned is in
	// the directory once; the reservations it held lapse.
	burst := make([]result, 16)
	var bwg sync.WaitGroup
	for i := range burst {
		bwg.Go(func() { burst[i] = via[1].ctl("run", "--detach", caps) })
	}
	time.Sleep(300 * time.Millisecond)
	nodes[1].kill9()
	bwg.Wait()
	nodes[1].start()
	var survived []string
	for i, r := range burst {
		switch {
		case r.code == 0:
			survived = append(survived, strings.TrimSpace(r.stdout))
		case r.code == 69 || strings.Contains(r.stderr, "roostctl:"):
		default:
			t.Fatalf("run %d of the burst: exit %d without a word: %q", i, r.code, r.stderr)
		}
	}
	t.Logf("of %d placements through node-1 when it was SIGKILLed, %d returned their session", len(burst), len(survived))
	waitFor(t, "every session the burst returned to be in the directory once", func() bool {
		listed = nil
		if err := json.Unmarshal([]byte(via[2].ok("ps", "--fleet", "-a", "--json")), &listed); err != nil {
			t.Fatal(err)
		}
		count := map[string]int{}
		for _, s := range listed {
			count[s.ID]++
		}
		for _, id := range survived {
			if count[id] != 1 {
				return false
			}
		}
		return true
	})
	etcd, err := etcdstore.New(etcdstore.Config{Endpoints: clients, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	waitFor(t, "the reservations of the killed entry node to lapse", func() bool {
		kvs, _, err := etcd.Get(context.Background(), "/roost/v1/placement/", true)
		if err != nil {
			return false
		}
		for _, kv := range kvs {
			if strings.Contains(kv.Key, "/res/") {
				return false
			}
		}
		return true
	})

	// The etcd leader SIGKILLed while calls are routed: each is answered, or refused as
	// unavailable saying why, and they are answered again once another member leads.
	cli, err := clientv3.New(clientv3.Config{Endpoints: clients, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	leader := -1
	for i, ep := range clients {
		short, c := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := cli.Status(short, ep)
		c()
		if err == nil && st.Leader == st.Header.MemberId {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no etcd member leads")
	}
	var routedIDs []string
	for _, id := range ids {
		if o := owner[id]; o != "node-2" && o != "node-3" && len(routedIDs) < 10 {
			if res := via[2].ctl("inspect", id); res.code == 0 {
				routedIDs = append(routedIDs, id)
			}
		}
	}
	answered, refused := 0, 0
	for i := range 60 {
		if i == 5 {
			etcds[leader].Process.Signal(syscall.SIGKILL)
			etcds[leader].Wait()
		}
		res := via[2].ctl("inspect", routedIDs[i%len(routedIDs)])
		switch {
		case res.code == 0:
			answered++
		case res.code == 69:
			refused++
		default:
			t.Fatalf("a routed inspect with the etcd leader killed: exit %d: %s", res.code, res.stderr)
		}
	}
	t.Logf("with etcd e%d, the leader, SIGKILLed: %d routed calls answered, %d refused as unavailable", leader, answered, refused)
	if res := via[2].ctl("inspect", routedIDs[0]); res.code != 0 {
		t.Fatalf("a routed inspect once another etcd member leads: exit %d: %s", res.code, res.stderr)
	}

	// node-3 SIGKILLed: a call about its session, through another node, is refused as
	// unavailable, naming it.
	nodes[3].kill9()
	res := via[1].ctl("inspect", victim)
	if res.code != 69 || !strings.Contains(res.stderr, "node-3") {
		t.Fatalf("inspect of %s on a killed node-3 through node-1: exit %d: %s", victim, res.code, res.stderr)
	}
	// Back, it answers again, and its sessions outlived it (they run under roost-init).
	nodes[3].start()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		res := via[1].ctl("inspect", "--json", victim)
		if res.code == 0 {
			if !strings.Contains(res.stdout, `"node": "node-3"`) || !strings.Contains(res.stdout, `"state": "running"`) {
				t.Fatalf("inspect of %s once node-3 is back: %s", victim, res.stdout)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("inspect of %s through node-1 once node-3 is back: exit %d: %s", victim, res.code, res.stderr)
		}
	}
}
