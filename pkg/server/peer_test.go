package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session"
)

// The peer tests start the test binary again as a client, in the place under test (another
// uid, a cgroup, below a process named roost-init); these select what it does.
const (
	peerClientEnv = "ROOST_PEER_TEST_CLIENT" // the socket to call
	peerDialEnv   = "ROOST_PEER_TEST_DIAL"   // the socket to connect to and leave at once
	peerResultTag = "ROOST-PEER-RESULT "
)

// peerResult is what a client process saw.
type peerResult struct {
	UnaryCode  codes.Code
	UnaryMsg   string
	StreamCode codes.Code
	StreamMsg  string
	// ParentComm is the client's parent's comm, so a test knows its set-up held.
	ParentComm string
}

// TestPeerClient is the client process; run directly, it has nothing to do.
func TestPeerClient(t *testing.T) {
	if sock := os.Getenv(peerDialEnv); sock != "" {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		return
	}
	sock := os.Getenv(peerClientEnv)
	if sock == "" {
		t.Skip("the peer tests run this as their client process")
	}
	res := callPeer(t, sock)
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", os.Getppid()))
	if err != nil {
		t.Fatal(err)
	}
	res.ParentComm = strings.TrimSpace(string(comm))
	out, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(peerResultTag + string(out))
}

// callPeer makes a unary and a streaming call over one connection.
func callPeer(t testing.TB, sock string) peerResult {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var res peerResult
	_, err = roostv1.NewSystemServiceClient(conn).Health(ctx, &roostv1.HealthRequest{})
	res.UnaryCode, res.UnaryMsg = status.Code(err), status.Convert(err).Message()
	stream, err := roostv1.NewSessionServiceClient(conn).Events(ctx, &roostv1.EventsRequest{})
	for err == nil {
		_, err = stream.Recv()
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	res.StreamCode, res.StreamMsg = status.Code(err), status.Convert(err).Message()
	return res
}

// lockedBuffer is a log sink the server writes while a test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// refusals are the log's refusal lines.
func (b *lockedBuffer) refusals() []string {
	var out []string
	for line := range strings.Lines(b.String()) {
		if strings.Contains(line, "refused a control connection") {
			out = append(out, line)
		}
	}
	return out
}

type peerServer struct {
	dir  string // searchable by anyone, so a client of another uid reaches the socket
	sock string
	log  *lockedBuffer
}

// servePeers serves the API with policy on a real unix socket anyone may connect to, so
// that what refuses a caller is the peer check, not the socket's mode.
func servePeers(t *testing.T, policy *PeerPolicy) *peerServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "roost-peer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	host := containment.Host{Root: os.Geteuid() == 0}
	rt := containment.NewProcessRuntime(containment.SelfInit)
	m, err := session.Open(session.Config{
		IDs:      testPool,
		StateDir: state, Host: host, Catalog: containment.NewCatalog(host, containment.ErrNoRuntime, containment.ErrNoRuntime),
		Runtimes: map[manifest.Class]session.Runtime{manifest.Advisory: rt, manifest.Unconfined: rt},
	})
	if err != nil {
		t.Fatal(err)
	}
	ps := &peerServer{dir: dir, sock: filepath.Join(dir, "roostd.sock"), log: &lockedBuffer{}}
	lis, err := net.Listen("unix", ps.sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ps.sock, 0o666); err != nil {
		t.Fatal(err)
	}
	srv := New(Config{Sessions: m, StateDir: state, StartedAt: time.Now(), Logger: slog.New(slog.NewTextHandler(ps.log, nil)), Peers: policy})
	go srv.Serve(lis)
	t.Cleanup(func() {
		srv.Stop()
		m.Close()
	})
	return ps
}

// client is the test binary as a client of ps; the caller may change it before run.
func (ps *peerServer) client(t *testing.T, bin string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^TestPeerClient$", "-test.count=1")
	cmd.Env = append(os.Environ(), peerClientEnv+"="+ps.sock)
	cmd.Dir = ps.dir
	return cmd
}

// run runs a client process and returns what it saw.
func (ps *peerServer) run(t *testing.T, cmd *exec.Cmd) peerResult {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client %v: %v\n%s", cmd.Args, err, out)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), peerResultTag); ok {
			var res peerResult
			if err := json.Unmarshal([]byte(rest), &res); err != nil {
				t.Fatal(err)
			}
			return res
		}
	}
	t.Fatalf("client %v printed no result:\n%s", cmd.Args, out)
	return peerResult{}
}

// copyExec copies the executable at src to dir/name, runnable by anyone.
func copyExec(t *testing.T, src, dir, name string) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, name)
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

func testBinary(t *testing.T) string {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: clients are started as other users and in cgroups")
	}
}

func testSessions() SessionProcs {
	return SessionProcs{CgroupParents: []string{"/roost"}, Helpers: []string{"roost-init", "roost-exec"}}
}

func assertServed(t *testing.T, what string, res peerResult) {
	t.Helper()
	if res.UnaryCode != codes.OK || res.StreamCode != codes.OK {
		t.Fatalf("%s: unary %s %q, stream %s %q; want both served", what, res.UnaryCode, res.UnaryMsg, res.StreamCode, res.StreamMsg)
	}
}

// assertRefused checks that both calls failed with PermissionDenied saying want.
func assertRefused(t *testing.T, what string, res peerResult, want string) {
	t.Helper()
	if res.UnaryCode != codes.PermissionDenied || !strings.Contains(res.UnaryMsg, want) {
		t.Errorf("%s: unary call: %s %q; want PermissionDenied saying %q", what, res.UnaryCode, res.UnaryMsg, want)
	}
	if res.StreamCode != codes.PermissionDenied || !strings.Contains(res.StreamMsg, want) {
		t.Errorf("%s: streaming call: %s %q; want PermissionDenied saying %q", what, res.StreamCode, res.StreamMsg, want)
	}
}

// Root, in no session, is served: unary and streaming calls both.
func TestPeerRootServed(t *testing.T) {
	needRoot(t)
	ps := servePeers(t, &PeerPolicy{Sessions: testSessions()})
	assertServed(t, "root test process", callPeer(t, ps.sock))
	if r := ps.log.refusals(); len(r) != 0 {
		t.Fatalf("refusals logged for root: %q", r)
	}
}

// A uid that is not root is refused unless it is in the socket group, by its primary or a
// supplementary group; each refused connection is logged once, however many calls it makes.
func TestPeerUIDAndGroup(t *testing.T) {
	needRoot(t)
	const uid, gid, other = 12345, 12345, 12346
	cases := []struct {
		name  string
		group *SocketGroup
		cred  syscall.Credential
		want  string // "" = served
	}{
		{"no socket group", nil, syscall.Credential{Uid: uid, Gid: gid}, "uid 12345 is not root, and the socket has no group"},
		{"not in the group", &SocketGroup{Name: "roost", GID: gid}, syscall.Credential{Uid: uid, Gid: other}, "uid 12345 is neither root nor in the socket group roost"},
		{"primary group", &SocketGroup{Name: "roost", GID: gid}, syscall.Credential{Uid: uid, Gid: gid}, ""},
		{"supplementary group", &SocketGroup{Name: "roost", GID: gid}, syscall.Credential{Uid: uid, Gid: other, Groups: []uint32{gid}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ps := servePeers(t, &PeerPolicy{Group: c.group, Sessions: testSessions()})
			// The test binary's own directory is root's alone; the client needs a copy.
			cmd := ps.client(t, copyExec(t, testBinary(t), ps.dir, "server.test"))
			cred := c.cred
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &cred}
			res := ps.run(t, cmd)
			logged := ps.log.refusals()
			if c.want == "" {
				assertServed(t, c.name, res)
				if len(logged) != 0 {
					t.Fatalf("refusals logged: %q", logged)
				}
				return
			}
			assertRefused(t, c.name, res, c.want)
			if len(logged) != 1 {
				t.Fatalf("%d refusal lines for one connection with two calls, want 1: %q", len(logged), logged)
			}
			for _, want := range []string{fmt.Sprintf("pid=%d ", cmd.Process.Pid), "uid=12345 ", c.want} {
				if !strings.Contains(logged[0], want) {
					t.Errorf("refusal line %q lacks %q", logged[0], want)
				}
			}
			// A second connection is a second line.
			again := ps.client(t, cmd.Path)
			again.SysProcAttr = &syscall.SysProcAttr{Credential: &cred}
			ps.run(t, again)
			if n := len(ps.log.refusals()); n != 2 {
				t.Fatalf("%d refusal lines after two connections, want 2", n)
			}
		})
	}
}

// cgroup2Mount is where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup, or
// /sys/fs/cgroup/unified on a hybrid host.
func cgroup2Mount(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		pre, post, ok := strings.Cut(line, " - ")
		if f, pf := strings.Fields(pre), strings.Fields(post); ok && len(f) >= 5 && len(pf) > 0 && pf[0] == "cgroup2" {
			return f[4]
		}
	}
	t.Skip("no cgroup v2 hierarchy is mounted")
	return ""
}

// A root process in a session's cgroup is refused, and told which cgroup; the same client
// outside it is served.
func TestPeerSessionCgroup(t *testing.T) {
	needRoot(t)
	ps := servePeers(t, &PeerPolicy{Sessions: testSessions()})
	assertServed(t, "root client in no session", ps.run(t, ps.client(t, testBinary(t))))

	parent := filepath.Join(cgroup2Mount(t), "roost")
	createdParent := os.Mkdir(parent, 0o755) == nil
	rnd := make([]byte, 4)
	rand.Read(rnd)
	name := "test-" + hex.EncodeToString(rnd)
	cg := filepath.Join(parent, name)
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cg); err != nil {
			t.Errorf("removing cgroup: %v", err)
		}
		if createdParent {
			os.Remove(parent)
		}
	})
	fd, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	cmd := ps.client(t, testBinary(t))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
	res := ps.run(t, cmd)
	assertRefused(t, "root client in a session cgroup", res, fmt.Sprintf("roostd serves no session's processes (pid %d is in session cgroup /roost/%s)", cmd.Process.Pid, name))
	if n := len(ps.log.refusals()); n != 1 {
		t.Fatalf("%d refusal lines, want 1", n)
	}
}

// A root process below one named roost-init is a session's and refused; below a process
// of another name it is served.
func TestPeerSessionAncestry(t *testing.T) {
	needRoot(t)
	ps := servePeers(t, &PeerPolicy{Sessions: testSessions()})
	bin := testBinary(t)
	for _, name := range []string{"not-roost", "roost-init"} {
		// The shell has more to do after the client, so it stays its parent.
		sh := copyExec(t, "/bin/sh", t.TempDir(), name)
		cmd := ps.client(t, bin)
		cmd.Path, cmd.Args = sh, []string{sh, "-c", shellQuote(cmd.Args) + "; exit $?"}
		res := ps.run(t, cmd)
		if res.ParentComm != name {
			t.Fatalf("the client's parent is %q, not %q: the test set-up failed", res.ParentComm, name)
		}
		if name != "roost-init" {
			assertServed(t, "client below "+name, res)
			continue
		}
		// The client's own pid is the shell's to know; its parent's is the test's.
		assertRefused(t, "client below roost-init", res, "roostd serves no session's processes (pid ")
		assertRefused(t, "client below roost-init", res, fmt.Sprintf("'s ancestor pid %d is roost-init)", cmd.Process.Pid))
	}
}

// A process below one running the helper binary is refused, whatever that one's comm:
// helpers started through /proc/self/exe are all named "exe".
func TestPeerSessionHelperBinary(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	helper := copyExec(t, "/bin/sh", dir, "helper-sh")
	other := copyExec(t, "/bin/sh", dir, "other-sh")
	sessions := testSessions()
	sessions.HelperBinary = helper
	ps := servePeers(t, &PeerPolicy{Sessions: sessions})
	for _, sh := range []string{other, helper} {
		cmd := ps.client(t, testBinary(t))
		cmd.Path, cmd.Args = sh, []string{sh, "-c", shellQuote(cmd.Args) + "; exit $?"}
		res := ps.run(t, cmd)
		if sh == other {
			assertServed(t, "client below another binary", res)
			continue
		}
		assertRefused(t, "client below the helper binary", res, fmt.Sprintf("ancestor pid %d runs the session helper binary %s", cmd.Process.Pid, helper))
	}
}

// A peer gone before its connection is judged cannot be told apart from whatever takes its
// pid next, so it is refused.
func TestPeerGoneRefused(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "s")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	cmd := exec.Command(testBinary(t), "-test.run=^TestPeerClient$", "-test.count=1")
	cmd.Env = append(os.Environ(), peerDialEnv+"="+sock)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	conn, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	info := PeerPolicy{Sessions: testSessions()}.judge(conn)
	if info.Reason == "" {
		t.Fatalf("a peer that exited (pid %d) was served", cmd.Process.Pid)
	}
	t.Logf("refused: %s", info.Reason)
}

// A connection the handshake could not read (an in-memory one) is refused, and so is a call
// that reached the interceptors without the handshake's verdict; no handler runs.
func TestPeerUnjudgedRefused(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	log := &lockedBuffer{}
	srv := New(Config{StateDir: t.TempDir(), StartedAt: time.Now(), Logger: slog.New(slog.NewTextHandler(log, nil)), Peers: &PeerPolicy{Sessions: testSessions()}})
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///bufconn", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = roostv1.NewSystemServiceClient(conn).Health(context.Background(), &roostv1.HealthRequest{})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Health over an in-memory connection: %v", err)
	}
	if n := len(log.refusals()); n != 1 {
		t.Fatalf("%d refusal lines, want 1", n)
	}

	called := false
	handler := func(context.Context, any) (any, error) { called = true; return nil, nil }
	_, err = peerUnaryInterceptor(context.Background(), nil, &grpc.UnaryServerInfo{}, handler)
	if status.Code(err) != codes.PermissionDenied || called {
		t.Fatalf("call without a peer: %v, handler ran: %v", err, called)
	}
}

// shellQuote quotes args for sh -c.
func shellQuote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// BenchmarkSessionProcsOf is the check every control connection pays at accept: this test
// process and its ancestry, read up to pid 1 and confirmed.
func BenchmarkSessionProcsOf(b *testing.B) {
	// Some binary none of them runs, so that each is compared with it.
	procs := SessionProcs{CgroupParents: []string{"/roost"}, Helpers: []string{"roost-init", "roost-exec"}, HelperBinary: "/bin/true"}
	for b.Loop() {
		if reason, err := procs.Of(os.Getpid()); err != nil || reason != "" {
			b.Fatalf("Of: %q %v", reason, err)
		}
	}
}
