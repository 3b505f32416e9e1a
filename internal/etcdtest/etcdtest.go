// Package etcdtest answers how a test gets a real etcd cluster and the faults to put it
// through: members of etcd's own server (go.etcd.io/etcd/server/v3/embed) in the test's
// process, on loopback ports the kernel picks, in the test's temp dir, behind bridges the
// test can cut; a member stopped, killed or restarted; the leader found; members partitioned
// from each other; a client cut from the cluster. Everything ends on the test's cleanup.
package etcdtest

import (
	"bufio"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Options shape a cluster.
type Options struct {
	// Members is the cluster's size; 0 means 1.
	Members int
	// Fsync makes members fsync their log and database as a production member does. Without
	// it they skip fsync (etcd's --unsafe-no-fsync): a test of logic needs no durability
	// against power loss, and a member restarted in the same kernel finds what it wrote.
	Fsync bool
	// TLS serves clients over TLS and requires a client certificate, from a CA the cluster
	// makes (TLSFiles).
	TLS bool
}

// Heartbeat and election timing of the members: ten times etcd's defaults' speed, so a lost
// leader is replaced in a fraction of a second, and loose enough for a loaded 2-CPU machine.
const (
	tickMs     = 25
	electionMs = 250
)

// readyTimeout bounds a member's start: it is a failure of the harness, not of what is
// tested, when a member on loopback takes longer.
const readyTimeout = 60 * time.Second

// Cluster is a running etcd cluster of Options.Members members.
type Cluster struct {
	t       testing.TB
	opts    Options
	dir     string
	initial string // etcd's --initial-cluster: each member's name and peer bridge
	tls     *TLSFiles
	members []*Member

	mu    sync.Mutex
	links []*Link
	cuts  map[[2]int]bool // members (by index, lower first) cut from each other
}

// Member is one etcd server of a Cluster.
type Member struct {
	// Name is the member's name: m0, m1, …
	Name string

	c      *Cluster
	idx    int
	dir    string
	peer   *Bridge // the peer URL the member advertises: stable across restarts
	client *Bridge // the client URL it advertises

	mu   sync.Mutex
	etcd *embed.Etcd // nil while stopped
	id   types.ID
}

// Start starts a cluster and waits until every member serves. It ends on t's cleanup.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Members <= 0 {
		opts.Members = 1
	}
	c := &Cluster{t: t, opts: opts, dir: t.TempDir(), cuts: map[[2]int]bool{}}
	t.Cleanup(c.close)
	if opts.TLS {
		files, err := makeTLS(filepath.Join(c.dir, "tls"))
		if err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
		c.tls = files
	}
	var initial []string
	for i := range opts.Members {
		m := &Member{Name: fmt.Sprintf("m%d", i), c: c, idx: i, dir: filepath.Join(c.dir, fmt.Sprintf("m%d", i))}
		var err error
		if m.peer, err = newBridge(m.peerAddr); err != nil {
			t.Fatalf("etcdtest: %s: %v", m.Name, err)
		}
		if m.client, err = newBridge(m.clientAddr); err != nil {
			m.peer.Close()
			t.Fatalf("etcdtest: %s: %v", m.Name, err)
		}
		c.members = append(c.members, m)
		initial = append(initial, m.Name+"=http://"+m.peer.Addr())
	}
	c.initial = strings.Join(initial, ",")
	// Every member starts before any is waited for: a new member's start completes only
	// once a quorum of them talk.
	for _, m := range c.members {
		if err := m.start(); err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
	}
	for _, m := range c.members {
		if err := m.waitReady(); err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
	}
	return c
}

// Members are the cluster's members, in order.
func (c *Cluster) Members() []*Member { return slices.Clone(c.members) }

// Endpoints are the members' client URLs (their own bridges).
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.ClientURL()
	}
	return eps
}

// TLSFiles are the PEM files of a cluster started with Options.TLS, nil otherwise.
func (c *Cluster) TLSFiles() *TLSFiles { return c.tls }

// Client is an etcd client of the given endpoints (the cluster's when none), closed on t's
// cleanup.
func (c *Cluster) Client(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	if len(endpoints) == 0 {
		endpoints = c.Endpoints()
	}
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if c.tls != nil {
		tc, err := transport.TLSInfo{CertFile: c.tls.ClientCert, KeyFile: c.tls.ClientKey, TrustedCAFile: c.tls.CA}.ClientConfig()
		if err != nil {
			t.Fatalf("etcdtest: client TLS: %v", err)
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("etcdtest: client of %v: %v", endpoints, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Leader is the member that leads now, as a quorum of the running members see it; nil when
// none does (an election, or no quorum).
func (c *Cluster) Leader() *Member {
	votes := map[types.ID]int{}
	for _, m := range c.members {
		if e := m.running(); e != nil {
			if l := e.Server.Leader(); l != 0 {
				votes[l]++
			}
		}
	}
	for _, m := range c.members {
		e := m.running()
		if e == nil || e.Server.Leader() != m.id {
			continue
		}
		if votes[m.id] >= len(c.members)/2+1 {
			return m
		}
	}
	return nil
}

// WaitLeader waits until a quorum of members agree on a leader, and returns it.
func (c *Cluster) WaitLeader(t testing.TB) *Member {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		if l := c.Leader(); l != nil {
			return l
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("etcdtest: no leader within %s", readyTimeout)
	return nil
}

// Followers are the running members that do not lead now.
func (c *Cluster) Followers() []*Member {
	l := c.Leader()
	var fs []*Member
	for _, m := range c.members {
		if m != l && m.running() != nil {
			fs = append(fs, m)
		}
	}
	return fs
}

// Partition cuts raft's traffic between members of different groups, both ways: each group
// is on its own side. Members in no group keep talking to everyone. A member restarted
// while cut stays cut. Heal undoes it.
func (c *Cluster) Partition(groups ...[]*Member) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for gi, g := range groups {
		for _, a := range g {
			for _, h := range groups[gi+1:] {
				for _, b := range h {
					if a == b {
						continue
					}
					c.cuts[pair(a, b)] = true
					a.cut(b, true)
					b.cut(a, true)
				}
			}
		}
	}
}

// Heal mends every cut Partition made.
func (c *Cluster) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.cuts {
		a, b := c.members[p[0]], c.members[p[1]]
		a.cut(b, false)
		b.cut(a, false)
	}
	clear(c.cuts)
}

func pair(a, b *Member) [2]int {
	if a.idx > b.idx {
		a, b = b, a
	}
	return [2]int{a.idx, b.idx}
}

// Link is one client's own way to the cluster: a bridge per member, which the test cuts to
// put that client (and only it) on the far side of a partition.
type Link struct {
	scheme  string
	members []*Member // bridges[i] goes to members[i]
	bridges []*Bridge
}

// Link makes a new Link to the given members (every member when none).
func (c *Cluster) Link(members ...*Member) *Link {
	if len(members) == 0 {
		members = c.members
	}
	l := &Link{scheme: c.scheme(), members: slices.Clone(members)}
	for _, m := range members {
		b, err := newBridge(m.clientAddr)
		if err != nil {
			l.close()
			c.t.Fatalf("etcdtest: link to %s: %v", m.Name, err)
		}
		l.bridges = append(l.bridges, b)
	}
	c.mu.Lock()
	c.links = append(c.links, l)
	c.mu.Unlock()
	return l
}

// Endpoints are the URLs a client of this link dials.
func (l *Link) Endpoints() []string {
	eps := make([]string, len(l.bridges))
	for i, b := range l.bridges {
		eps[i] = l.scheme + "://" + b.Addr()
	}
	return eps
}

// Blackhole drops the link's traffic both ways.
func (l *Link) Blackhole() { l.each((*Bridge).Blackhole) }

// BlackholeReplies drops what the members send back over the link.
func (l *Link) BlackholeReplies() { l.each((*Bridge).BlackholeReplies) }

// BlackholeRequests drops what the client sends over the link.
func (l *Link) BlackholeRequests() { l.each((*Bridge).BlackholeRequests) }

// Heal passes the link's traffic again.
func (l *Link) Heal() { l.each((*Bridge).Heal) }

// DropConnections closes the link's open connections.
func (l *Link) DropConnections() { l.each((*Bridge).DropConnections) }

func (l *Link) each(f func(*Bridge)) {
	for _, b := range l.bridges {
		f(b)
	}
}

func (l *Link) close() { l.each((*Bridge).Close) }

// ClientURL is the client URL the member advertises: its bridge, the same across restarts.
func (m *Member) ClientURL() string { return m.c.scheme() + "://" + m.client.Addr() }

// Bridge is the bridge in front of the member's client listener, which the cluster's own
// Endpoints go through.
func (m *Member) Bridge() *Bridge { return m.client }

// Running reports whether the member is started.
func (m *Member) Running() bool { return m.running() != nil }

// Stop stops the member as an operator would: a leader first hands its leadership over.
func (m *Member) Stop(t testing.TB) {
	t.Helper()
	if e := m.take(); e != nil {
		e.Close()
	}
}

// Kill stops the member at once, as a crash would: every connection to it reset, requests
// in flight cut off, no leadership handed over. Its data stays for Restart.
func (m *Member) Kill(t testing.TB) {
	t.Helper()
	if e := m.take(); e != nil {
		m.dropConnections()
		e.Server.HardStop()
		e.Close()
	}
}

// dropConnections closes every bridged connection to the member: the cluster's, and those of
// every link.
func (m *Member) dropConnections() {
	m.peer.DropConnections()
	m.client.DropConnections()
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	for _, l := range m.c.links {
		for i, lm := range l.members {
			if lm == m {
				l.bridges[i].DropConnections()
			}
		}
	}
}

// Restart starts a stopped member again on its data and waits until it serves.
func (m *Member) Restart(t testing.TB) {
	t.Helper()
	if err := m.start(); err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	if err := m.waitReady(); err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	// Cuts are the transport's state, which the restart made anew: a member cut before it
	// is cut again.
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	for p := range m.c.cuts {
		if p[0] == m.idx || p[1] == m.idx {
			other := m.c.members[p[0]+p[1]-m.idx]
			m.cut(other, true)
			other.cut(m, true)
		}
	}
}

func (m *Member) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.etcd != nil {
		return fmt.Errorf("%s: already running", m.Name)
	}
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return fmt.Errorf("%s: %w", m.Name, err)
	}
	scheme := m.c.scheme()
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = filepath.Join(m.dir, "data")
	// The listeners take ports the kernel picks (new ones on each start); the bridges'
	// stable ports are what the cluster and its clients know.
	cfg.ListenPeerUrls = []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}}
	cfg.AdvertisePeerUrls = []url.URL{{Scheme: "http", Host: m.peer.Addr()}}
	cfg.ListenClientUrls = []url.URL{{Scheme: scheme, Host: "127.0.0.1:0"}}
	cfg.AdvertiseClientUrls = []url.URL{{Scheme: scheme, Host: m.client.Addr()}}
	cfg.InitialCluster = m.c.initial
	cfg.InitialClusterToken = "etcdtest"
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.TickMs, cfg.ElectionMs = tickMs, electionMs
	cfg.UnsafeNoFsync = !m.c.opts.Fsync
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{m.logPath()}
	if tf := m.c.tls; tf != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: tf.ServerCert, KeyFile: tf.ServerKey, TrustedCAFile: tf.CA, ClientCertAuth: true}
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("%s: starting etcd: %w", m.Name, err)
	}
	m.etcd, m.id = e, e.Server.MemberID()
	return nil
}

func (m *Member) waitReady() error {
	e := m.running()
	if e == nil {
		return fmt.Errorf("%s: not running", m.Name)
	}
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("%s: %w", m.Name, err)
	case <-time.After(readyTimeout):
		return fmt.Errorf("%s: not serving within %s (log: %s)", m.Name, readyTimeout, m.logPath())
	}
}

func (m *Member) logPath() string { return filepath.Join(m.dir, "etcd.log") }

func (m *Member) running() *embed.Etcd {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd
}

// take marks the member stopped (its bridges refuse from now on) and hands back its server.
func (m *Member) take() *embed.Etcd {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.etcd
	m.etcd = nil
	return e
}

func (m *Member) cut(other *Member, cut bool) {
	e := m.running()
	if e == nil {
		return
	}
	if cut {
		e.Server.CutPeer(other.id)
	} else {
		e.Server.MendPeer(other.id)
	}
}

func (m *Member) peerAddr() string {
	if e := m.running(); e != nil {
		return e.Peers[0].Addr().String()
	}
	return ""
}

func (m *Member) clientAddr() string {
	if e := m.running(); e != nil {
		return e.Clients[0].Addr().String()
	}
	return ""
}

func (c *Cluster) scheme() string {
	if c.opts.TLS {
		return "https"
	}
	return "http"
}

func (c *Cluster) close() {
	c.mu.Lock()
	links := c.links
	c.links = nil
	c.mu.Unlock()
	for _, l := range links {
		l.close()
	}
	var wg sync.WaitGroup
	for _, m := range c.members {
		wg.Go(func() {
			if e := m.take(); e != nil {
				m.dropConnections()
				e.Server.HardStop()
				e.Close()
			}
		})
	}
	wg.Wait()
	for _, m := range c.members {
		m.peer.Close()
		m.client.Close()
	}
	if c.t.Failed() {
		for _, m := range c.members {
			c.t.Logf("etcdtest: %s's log (warnings and errors), last lines:\n%s", m.Name, tail(m.logPath(), 20))
		}
	}
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// HasLeader says whether the member, running, knows of a leader: a member cut off from the
// others loses its after an election timeout (etcd checks its quorum).
func (m *Member) HasLeader() bool {
	e := m.running()
	return e != nil && e.Server.Leader() != 0
}
