package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"roost.dev/roost/internal/fakellm"
	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/directory"
	"roost.dev/roost/pkg/fleet/etcdstore"
)

// Fleet test sizes: a call's worst case is its max_tokens and its input; the fake bills
// fleetInput+fleetOutput of it.
const (
	fleetNodes     = 5
	fleetCeiling   = 1_500_000
	fleetMaxTokens = 2000
	fleetInput     = 12
	fleetOutput    = 1000
	// fleetWorstCall bounds what one call reserves: its max_tokens and the gateway's estimate
	// of its small body's input.
	fleetWorstCall = fleetMaxTokens + 500
)

// cutProxy forwards loopback TCP to target until cut: then it drops every connection it
// carries and every new one, as a partition between a node and one etcd member would.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *cutProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) serve(c net.Conn) {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	go func() { io.Copy(up, c); up.Close() }()
	io.Copy(c, up)
	c.Close()
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}

// etcdProcs starts a 3-member cluster of roost-etcd processes on loopback.
func etcdProcs(t *testing.T) (procs []*exec.Cmd, clients []string) {
	t.Helper()
	bin := filepath.Join(binDir, "roost-etcd")
	if _, err := os.Stat(bin); err != nil {
		build := exec.Command("go", "build", "-o", binDir, "roost.dev/roost/cmd/roost-etcd")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building roost-etcd: %v\n%s", err, out)
		}
	}
	dir := t.TempDir()
	var initial, peers []string
	for i := range 3 {
		peers = append(peers, "http://"+freePort(t))
		clients = append(clients, "http://"+freePort(t))
		initial = append(initial, fmt.Sprintf("e%d=%s", i, peers[i]))
	}
	for i := range 3 {
		cmd := exec.Command(bin, "--name", fmt.Sprintf("e%d", i), "--data-dir", filepath.Join(dir, fmt.Sprint(i)),
			"--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
			"--listen-client-urls", clients[i], "--advertise-client-urls", clients[i],
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "roost-e2e-fleet", "--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "warn")
		log, err := os.Create(filepath.Join(dir, fmt.Sprintf("e%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			log.Close()
			if t.Failed() {
				b, _ := os.ReadFile(log.Name())
				t.Logf("etcd e%d's log:\n%s", i, b)
			}
		})
	}
	return procs, clients
}

type fleetDay struct {
	Node string `json:"node"`
	Day  struct {
		Ceiling string `json:"ceiling"`
		Granted string `json:"granted"`
		Nodes   []struct {
			Node  string `json:"node"`
			Held  string `json:"held"`
			Spent string `json:"spent"`
		} `json:"nodes"`
	} `json:"day"`
}

func fleetInt(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }

// TestFleet: 3 etcd processes, 5 roostd nodes sharing one fleet ceiling, a session on each
// calling its gateway as fast as it can; the etcd leader and a roostd node SIGKILLed, a node
// cut off from etcd and let back. Σ charged across the nodes never passes the ceiling, each
// node charged what its upstream billed, and the ceiling is spent to within a call per node.
func TestFleet(t *testing.T) {
	testenv.NeedRoot(t, "roostd runs sealed sessions as root")
	etcds, clients := etcdProcs(t)
	store, err := etcdstore.New(etcdstore.Config{Endpoints: clients, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	today := time.Now().UTC().Format(time.DateOnly)
	for {
		short, c := context.WithTimeout(ctx, 2*time.Second)
		err := fleet.SetCeiling(short, store, "", today, fleetCeiling)
		c()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("setting the fleet ceiling: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The last node reaches etcd through proxies the test can cut.
	var proxies []*cutProxy
	for _, c := range clients {
		proxies = append(proxies, newCutProxy(t, strings.TrimPrefix(c, "http://")))
	}
	// Each node's remote listener, on a loopback port of its own: the node directory says it.
	tlsDir := t.TempDir()
	certsInit(t, tlsDir, "dashboard:reader")
	addrs := make([]string, fleetNodes)
	for i := range addrs {
		addrs[i] = freePort(t)
	}
	nodes := make([]*daemon, fleetNodes)
	fakes := make([]*fakellm.Server, fleetNodes)
	work := make([]string, fleetNodes)
	ids := make([]string, fleetNodes)
	for i := range fleetNodes {
		fake, err := fakellm.Start(fakellm.Config{APIKey: "sk-operator", InputTokens: fleetInput, OutputTokens: fleetOutput})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(fake.Close)
		fakes[i] = fake
		dir := t.TempDir()
		key := filepath.Join(dir, "llm.key")
		os.WriteFile(key, []byte("sk-operator\n"), 0o600)
		cfg := filepath.Join(dir, "roostd.yaml")
		// Blocks of host ids apart: two roostds on one host must not share one.
		os.WriteFile(cfg, fmt.Appendf(nil, "inference:\n  upstreams:\n    - name: llm\n      format: openai\n      url: %s\n      api_key_file: %s\nsessions:\n  ids:\n    first: %d\n    slots: 4\n"+
			"remote:\n  listen: %s\n  tls_cert: %s\n  tls_key: %s\n  client_ca: %s\n  clients:\n    - {common_name: dashboard, role: reader}\n",
			fake.URL(), key, 0x60000000+i*0x01000000, addrs[i], filepath.Join(tlsDir, "server.pem"), filepath.Join(tlsDir, "server-key.pem"), filepath.Join(tlsDir, "ca.pem")), 0o600)
		eps := strings.Join(clients, ",")
		if i == fleetNodes-1 {
			var via []string
			for _, p := range proxies {
				via = append(via, p.url())
			}
			eps = strings.Join(via, ",")
		}
		nodes[i] = newDaemon(t, "--config", cfg, "--fleet-etcd", eps, "--node-name", fmt.Sprintf("node-%d", i))
		work[i] = t.TempDir()
	}
	script := `
while [ ! -e /work/stop ]; do
  code=$(curl -s --max-time 3 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $OPENAI_API_KEY" -H 'Content-Type: application/json' \
    -d '{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":` + fmt.Sprint(fleetMaxTokens) + `}' "$OPENAI_BASE_URL/chat/completions")
  [ "$code" = 200 ] || sleep 0.05
done
`
	caps := sealedCaps("curl, sleep", "", 170) + "inference:\n  upstream: llm\n  model: gpt-test\n"
	for i, d := range nodes {
		// Pinned: each node's session spends through that node's ledger.
		ids[i] = strings.TrimSpace(d.ok("run", "--detach", "--node", fmt.Sprintf("node-%d", i), "--workdir", work[i], capsule(t, "fleet-caller", script, caps)))
	}
	t.Cleanup(func() {
		for _, w := range work {
			os.WriteFile(filepath.Join(w, "stop"), nil, 0o644)
		}
	})

	// charged reads Σ charged and reserved across the live nodes' ledgers, and the fleet's
	// granted from etcd; every poll holds the invariant.
	polls := 0
	check := func() (used int64) {
		t.Helper()
		polls++
		for _, d := range nodes {
			if d.cmd.ProcessState != nil {
				continue
			}
			l := d.spend()
			used += fleetInt(l.Charged) + fleetInt(l.Reserved)
		}
		short, c := context.WithTimeout(ctx, 5*time.Second)
		day, err := fleet.ReadDay(short, store, "", today)
		c()
		if err == nil {
			if day.Granted > day.Ceiling || day.Ceiling != fleetCeiling {
				t.Fatalf("poll %d: granted %d, ceiling %d", polls, day.Granted, day.Ceiling)
			}
		}
		if used > fleetCeiling {
			t.Fatalf("poll %d: the live nodes used %d tokens of a fleet ceiling of %d", polls, used, fleetCeiling)
		}
		return used
	}
	waitUsed := func(what string, least int64) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); check() < least; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: used stays under %d", what, least)
			}
		}
	}
	waitUsed("the first calls", fleetCeiling/10)

	// The etcd leader's process is SIGKILLed; the cluster elects another.
	cli, err := clientv3.New(clientv3.Config{Endpoints: clients, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	leader := -1
	for i, ep := range clients {
		short, c := context.WithTimeout(ctx, 5*time.Second)
		st, err := cli.Status(short, ep)
		c()
		if err == nil && st.Leader == st.Header.MemberId {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no etcd member leads")
	}
	etcds[leader].Process.Signal(syscall.SIGKILL)
	etcds[leader].Wait()
	t.Logf("SIGKILLed etcd e%d, the leader", leader)

	// The last node is cut off from etcd: it spends what it holds, then refuses.
	cutNode := nodes[fleetNodes-1]
	for _, p := range proxies {
		p.setCut(true)
	}
	waitFor(t, "the cut-off node to say so", func() bool {
		check()
		return strings.Contains(scrape(t, cutNode), "roost_fleet_unreachable 1")
	})
	waitUsed("spending on", fleetCeiling/3)

	// A roostd node is SIGKILLed and started again on its state: it keeps its blocks.
	killed := nodes[1]
	killed.kill9()
	check()
	killed.start()
	for _, p := range proxies {
		p.setCut(false)
	}

	// Spend until the ceiling stops every node: nothing is lost (every node is back), so
	// what is left is less than one call on each.
	last, still := int64(-1), 0
	for deadline := time.Now().Add(90 * time.Second); still < 15; time.Sleep(200 * time.Millisecond) {
		used := check()
		if used == last {
			still++
		} else {
			last, still = used, 0
		}
		if time.Now().After(deadline) {
			t.Fatalf("spending never settled: %d of %d", used, fleetCeiling)
		}
	}
	for _, w := range work {
		os.WriteFile(filepath.Join(w, "stop"), nil, 0o644)
	}
	for i, d := range nodes {
		d.ok("wait", ids[i])
	}
	var charged int64
	for i, d := range nodes {
		l := d.spend()
		c, billed := fleetInt(l.Charged), int64(fakes[i].Billed().InputTokens+fakes[i].Billed().OutputTokens)
		charged += c
		switch {
		case d == killed && c < billed:
			// A call in flight at the SIGKILL was billed, and is charged in full when its
			// reservation ends: never less.
			t.Errorf("node-%d (SIGKILLed) charged %d, its upstream billed %d", i, c, billed)
		case d != killed && c != billed:
			t.Errorf("node-%d charged %d, its upstream billed %d", i, c, billed)
		}
		t.Logf("node-%d: charged %d, billed %d", i, c, billed)
	}
	if charged > fleetCeiling || fleetCeiling-charged > fleetNodes*fleetWorstCall {
		t.Errorf("Σ charged %d of a fleet ceiling of %d: want within %d (a call per node)", charged, fleetCeiling, fleetNodes*fleetWorstCall)
	}
	t.Logf("Σ charged %d of %d over %d polls", charged, fleetCeiling, polls)

	var fd fleetDay
	if err := json.Unmarshal([]byte(nodes[0].ok("spend", "--fleet", "--json")), &fd); err != nil {
		t.Fatal(err)
	}
	if fd.Node != "node-0" || fleetInt(fd.Day.Ceiling) != fleetCeiling || fleetInt(fd.Day.Granted) > fleetCeiling || len(fd.Day.Nodes) != fleetNodes {
		t.Errorf("spend --fleet --json: %+v", fd)
	}
	metrics := scrape(t, nodes[0])
	for _, want := range []string{`roost_fleet_tokens{state="ceiling"} 1.5e+06`, `roost_fleet_block_grants_total{result="granted"}`, "roost_fleet_etcd_seconds_count", "roost_fleet_unreachable 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(metrics, "fleet"))
		}
	}
	if out := nodes[0].ok("fleet", "nodes"); !strings.Contains(out, "node-0 (this)") || !strings.Contains(out, "reaches etcd") || !strings.Contains(out, "node-4") {
		t.Errorf("fleet nodes:\n%s", out)
	}

	// Every node is in the node directory, reachable, with its listener's address (a node
	// SIGKILLed above registers again when it restarts).
	for {
		listed, err := directory.List(ctx, store, "")
		if err != nil {
			t.Fatal(err)
		}
		reachable := 0
		for _, n := range listed {
			if n.Reachable {
				reachable++
			}
		}
		if len(listed) == fleetNodes && reachable == fleetNodes {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the node directory: %+v; want all %d nodes reachable", listed, fleetNodes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var fn struct {
		Directory []struct {
			Node, Address string
			Reachable     bool
			Classes       []string
		}
	}
	if err := json.Unmarshal([]byte(nodes[0].ok("fleet", "nodes", "--json")), &fn); err != nil {
		t.Fatal(err)
	}
	if len(fn.Directory) != fleetNodes {
		t.Errorf("fleet nodes --json lists %d nodes in the directory: %+v", len(fn.Directory), fn.Directory)
	}
	for i, n := range fn.Directory {
		if i < fleetNodes && (n.Node != fmt.Sprintf("node-%d", i) || n.Address != addrs[i] || !n.Reachable || !slices.Contains(n.Classes, "sealed")) {
			t.Errorf("fleet nodes --json, node-%d: %+v; want reachable at %s, delivering sealed", i, n, addrs[i])
		}
	}

	// Every node's session is in the session directory, ended, on its node (node-1's written
	// again after its SIGKILL, node-4's once it reached etcd again); ps --fleet through
	// node-0 lists them with -a, and not without.
	waitFor(t, "every node's session ended in the session directory", func() bool {
		for i, id := range ids {
			s, err := directory.LocateSession(ctx, store, "", id)
			if err != nil || s.Node != fmt.Sprintf("node-%d", i) || s.State != "exited" || s.EndedAt.IsZero() {
				return false
			}
		}
		return true
	})
	if listed := nodes[0].ok("ps", "--fleet", "-a", "-q"); len(strings.Fields(listed)) != fleetNodes || !strings.Contains(listed, ids[fleetNodes-1]) {
		t.Errorf("ps --fleet -a -q lists\n%s\nwant the %d sessions %v", listed, fleetNodes, ids)
	}
	if live := nodes[0].ok("ps", "--fleet"); strings.Contains(live, ids[0]) || !strings.HasPrefix(live, "SESSION ID") {
		t.Errorf("ps --fleet, every session ended:\n%s", live)
	}

	// A node forgotten (as a lost one would be): its blocks are written off as spent, none
	// goes back to the pool, and what it never spent is said.
	before, err := fleet.ReadDay(ctx, store, "", today)
	if err != nil {
		t.Fatal(err)
	}
	out := nodes[0].ok("fleet", "node", "forget", "--yes", "node-1")
	if !strings.Contains(out, "forgot node-1: ") || !strings.Contains(out, "written off as spent") || !strings.Contains(out, "marked 1 of node-1's sessions lost") {
		t.Errorf("fleet node forget: %q", out)
	}
	after, err := fleet.ReadDay(ctx, store, "", today)
	if err != nil {
		t.Fatal(err)
	}
	if after.Granted != before.Granted || after.Granted > fleetCeiling {
		t.Errorf("granted %d before the forget, %d after", before.Granted, after.Granted)
	}
	for _, n := range after.Nodes {
		if n.Node == "node-1" && (n.Held != 0 || n.WrittenOff == 0) {
			t.Errorf("node-1 after its forget: %+v", n)
		}
	}
}
