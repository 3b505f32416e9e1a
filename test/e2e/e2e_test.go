// Package e2e drives roost end to end: it builds roostd and roostctl, starts the daemon on
// a temporary state directory and uses it only through roostctl, as an operator would.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/cgtest"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "roost-e2e-bin-")
	if err != nil {
		panic(err)
	}
	build := exec.Command("go", "build", "-tags", "seccomp", "-o", dir, "roost.dev/roost/cmd/roostd", "roost.dev/roost/cmd/roostctl", "roost.dev/roost/cmd/roost-sealer", "roost.dev/roost/cmd/roost-wasm")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	// roost-init static, as make build makes it: a sealed root holds no library for it.
	buildInit := exec.Command("go", "build", "-tags", "seccomp", "-o", dir, "roost.dev/roost/cmd/roost-init")
	buildInit.Env = append(os.Environ(), "CGO_ENABLED=0")
	buildInit.Stdout, buildInit.Stderr = os.Stdout, os.Stderr
	for _, b := range []*exec.Cmd{build, buildInit} {
		if err := b.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building roost:", err)
			os.Exit(1)
		}
	}
	// What make build puts beside the binaries, for make install-check from here.
	man := exec.Command("go", "run", "roost.dev/roost/cmd/roostctl/internal/mangen", filepath.Join(dir, "man"))
	man.Stdout, man.Stderr = os.Stdout, os.Stderr
	if err := man.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "writing roostctl's man pages:", err)
		os.Exit(1)
	}
	// Sessions' uids run roost-wasm from here, as they would from /usr/local/bin.
	if err := os.Chmod(dir, 0o755); err != nil {
		panic(err)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// daemon is one roostd on a temporary state directory.
type daemon struct {
	t           *testing.T
	stateDir    string
	socket      string
	metricsAddr string
	// args are roostd's further flags, on every start.
	args []string
	// netns, when set, is a network namespace roostd runs in (nsenter --net).
	netns string
	// nofile, when set, is roostd's open-file limit, soft and hard (prlimit sets it before
	// roostd's first instruction, so no descriptor is opened under another).
	nofile uint64
	cmd    *exec.Cmd
	log    *bytes.Buffer
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// stateDir is a temporary state directory whose parents let sessions' unprivileged uids pass
// through, as /var/lib does (roostd refuses one they cannot reach).
func stateDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	// Before t.TempDir removes the directory (cleanups run last first), and after a daemon
	// on it has stopped (newDaemon's cleanup is registered later still).
	t.Cleanup(func() { unmountUnder(t, dir) })
	return dir
}

// unmountUnder detaches every mount at or beneath dir, deepest first. roostd seals its
// session trees with binds it leaves for the next roostd (dirs.Seal), and a test's
// temporary state directory could not be removed with them there (EBUSY).
func unmountUnder(t *testing.T, dir string) {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Errorf("the mounts under %s: %v", dir, err)
		return
	}
	slices.SortStableFunc(mounts, func(a, b *mountinfo.Info) int { return len(b.Mountpoint) - len(a.Mountpoint) })
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmounting %s: %v", m.Mountpoint, err)
		}
	}
}

// sessionTrees are where roostd keeps what sessions write on the host, each a nosuid,nodev
// mount of its own.
func sessionTrees(state string) []string {
	var out []string
	for _, sub := range []string{"work", "home", "children", "records", "tmp"} {
		out = append(out, filepath.Join(state, sub))
	}
	return out
}

func newDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	// make e2e-warm runs suites against daemons that keep warm sandboxes: what they check
	// must hold whichever way a session starts.
	if n := os.Getenv("ROOST_E2E_WARM_POOL"); n != "" && !slices.Contains(args, "--warm-pool") {
		args = append(slices.Clone(args), "--warm-pool", n)
	}
	state := stateDir(t)
	d := &daemon{t: t, stateDir: state, socket: filepath.Join(state, "roostd.sock"), metricsAddr: freePort(t), args: args}
	d.start()
	t.Cleanup(func() {
		if d.cmd == nil || d.cmd.ProcessState != nil {
			return
		}
		// Sessions outlive the daemon by design; end what a test left running.
		for _, id := range strings.Fields(d.ctl("ps", "-q").stdout) {
			d.ctl("kill", id)
		}
		d.cmd.Process.Signal(syscall.SIGTERM)
		d.cmd.Wait()
	})
	return d
}

// in is the daemon as a subtest sees it: its helpers fail the subtest, not the test that
// made the daemon (t.Fatal of another test's t, from a subtest's goroutine, is refused).
// It shares the running daemon; start and kill9 belong to the test that owns it.
func (d *daemon) in(t *testing.T) *daemon {
	c := *d
	c.t = t
	return &c
}

func (d *daemon) start() {
	d.t.Helper()
	d.log = &bytes.Buffer{}
	argv := append([]string{filepath.Join(binDir, "roostd"), "--state-dir", d.stateDir, "--socket", d.socket, "--metrics-addr", d.metricsAddr}, d.args...)
	if d.nofile != 0 {
		argv = append([]string{"prlimit", fmt.Sprintf("--nofile=%d:%d", d.nofile, d.nofile), "--"}, argv...)
	}
	if d.netns != "" {
		argv = append([]string{"nsenter", "--net=" + d.netns}, argv...)
	}
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if res := d.ctl("version"); res.code == 0 {
			return
		}
	}
	// Make a hung daemon say where it is stuck (Go dumps its goroutines on SIGQUIT).
	d.cmd.Process.Signal(syscall.SIGQUIT)
	d.cmd.Wait()
	d.t.Fatalf("roostd did not come up:\n%s", d.log)
}

// sessionContainers lists the containers roostd holds for sessions: not the sandboxes it
// keeps made ahead (--warm-pool), which wait for sessions to come.
func (d *daemon) sessionContainers() []string { return d.sessionEntries("containers") }

// sessionEntries lists the state directory's dir but for sandboxes' entries (warm-*).
func (d *daemon) sessionEntries(dir string) []string {
	entries, _ := os.ReadDir(filepath.Join(d.stateDir, dir))
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "warm-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// sessionMounts lists the host's mounts under the state directory but those of sandboxes
// made ahead (their pinned network namespaces) and the session trees' own, which roostd
// keeps for as long as the state directory is used.
func (d *daemon) sessionMounts() []string {
	mounts, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(d.stateDir))
	var out []string
	for _, m := range mounts {
		if !strings.Contains(m.Mountpoint, "/netns/warm-") && !slices.Contains(sessionTrees(d.stateDir), m.Mountpoint) {
			out = append(out, m.Mountpoint)
		}
	}
	return out
}

// sessionPins lists the network namespaces pinned for sessions (not for sandboxes).
func (d *daemon) sessionPins() []string { return d.sessionEntries("netns") }

func (d *daemon) kill9() {
	d.t.Helper()
	d.cmd.Process.Signal(syscall.SIGKILL)
	d.cmd.Wait()
}

// programEnded reports whether a session's program has ended, without asking roostd (which
// may be down): roost-init writes exit.json into the records directory once the program and
// all it left are gone and its output is drained.
func programEnded(s session) bool {
	_, err := os.Stat(filepath.Join(s.RecordsDir, "exit.json"))
	return s.RecordsDir != "" && err == nil
}

// cgroupDirs is where the cgroup of a session or a warm sandbox called name is, in every
// mounted hierarchy (v1 controllers, named, unified): under /roost, the parent of a roostd
// that no systemd delegation holds, as these tests' are. A session that started warm is in
// its sandbox's cgroup, not one named after it (cgroupNameOf). A check that one is gone is
// only worth something beside one that it was there: see TestSealedThroughRoostctl.
func cgroupDirs(t *testing.T, name string) []string {
	t.Helper()
	var out []string
	for _, mnt := range hierarchies(t) {
		out = append(out, filepath.Join(mnt, "roost", name))
	}
	return out
}

// cgroupNameOf is the name, under /roost, of the cgroup live process pid is in: the same in
// every hierarchy.
func cgroupNameOf(t *testing.T, pid int) string {
	t.Helper()
	name := ""
	for h, cg := range cgtest.ProcCgroups(t, pid) {
		rest, ok := strings.CutPrefix(cg, "/roost/")
		if !ok {
			t.Fatalf("pid %d is in %s in hierarchy %q, not under /roost", pid, cg, h)
		}
		first, _, _ := strings.Cut(rest, "/")
		if name != "" && first != name {
			t.Fatalf("pid %d is in %s and in %s", pid, name, first)
		}
		name = first
	}
	if name == "" {
		t.Fatalf("pid %d is in no cgroup", pid)
	}
	return name
}

type result struct {
	stdout, stderr string
	code           int
}

// ctl runs roostctl against this daemon, through ROOST_SOCKET as an operator's shell would.
func (d *daemon) ctl(args ...string) result {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "roostctl"), args...)
	cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	cmd.Dir = repoRoot()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	res := result{stdout: out.String(), stderr: errOut.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	case err != nil:
		d.t.Fatalf("roostctl %v: %v", args, err)
	}
	return res
}

func (d *daemon) ok(args ...string) string {
	d.t.Helper()
	res := d.ctl(args...)
	if res.code != 0 {
		d.t.Fatalf("roostctl %s: exit %d\nstdout: %s\nstderr: %s\nroostd: %s", strings.Join(args, " "), res.code, res.stdout, res.stderr, d.log)
	}
	return res.stdout
}

type session struct {
	ID         string `json:"id"`
	State      string `json:"state"`
	ExitStatus string `json:"exit_status"`
	ExitCode   *int   `json:"exit_code"`
	Detail     string `json:"detail"`
	Workdir    string `json:"workdir"`
	RecordsDir string `json:"records_dir"`
	Capsule    struct {
		Name    string `json:"name"`
		Version string `json:"version"`
		SHA256  string `json:"sha256"`
	} `json:"capsule"`
	Containment struct {
		Declared string `json:"declared"`
		Achieved string `json:"achieved"`
	} `json:"containment"`
	Warm bool `json:"warm"`
}

func (d *daemon) inspect(id string) session {
	d.t.Helper()
	var s session
	if err := json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &s); err != nil {
		d.t.Fatal(err)
	}
	return s
}

func (d *daemon) ps() []session {
	d.t.Helper()
	var list []session
	if err := json.Unmarshal([]byte(d.ok("ps", "--all", "--json")), &list); err != nil {
		d.t.Fatal(err)
	}
	// ps lists newest first; the tests read them in the order they were made.
	slices.Reverse(list)
	return list
}

type event struct {
	Seq       string `json:"seq"`
	Type      string `json:"type"`
	SessionID string `json:"session_id"`
	Detail    string `json:"detail"`
}

func (d *daemon) events(since int) []event {
	d.t.Helper()
	var out []event
	sc := bufio.NewScanner(strings.NewReader(d.ok("events", "--json", "--since", fmt.Sprint(since))))
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			d.t.Fatalf("event line %q: %v", sc.Text(), err)
		}
		out = append(out, ev)
	}
	return out
}

// capsule writes a capsule whose program is a shell script.
func capsule(t *testing.T, name, script, extra string) string {
	t.Helper()
	dir := t.TempDir()
	cmd, _ := json.Marshal([]string{"/bin/sh", "-c", script})
	src := fmt.Sprintf("name: %s\nversion: 0.1.0\nrun:\n  command: %s\n%s", name, cmd, extra)
	if err := os.WriteFile(filepath.Join(dir, "capsule.yaml"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestRunHello(t *testing.T) {
	d := newDaemon(t)
	res := d.ctl("run", "examples/hello")
	if res.code != 0 || !strings.Contains(res.stdout, "hello from hello@0.1.0 (ses_") {
		t.Fatalf("run examples/hello: %+v", res)
	}
	list := d.ps()
	if len(list) != 1 {
		t.Fatalf("ps --all: %+v", list)
	}
	s := d.inspect(list[0].ID)
	if s.State != "exited" || s.ExitStatus != "ok" || *s.ExitCode != 0 || s.Capsule.Name != "hello" || !strings.HasPrefix(s.Capsule.SHA256, "sha256:") {
		t.Fatalf("inspect: %+v", s)
	}
	if data, err := os.ReadFile(filepath.Join(s.Workdir, "out.txt")); err != nil || string(data) != "hello\n" {
		t.Fatalf("the capsule's file: %q %v", data, err)
	}
	// ps --json lists the very objects inspect --json prints.
	var raw []json.RawMessage
	json.Unmarshal([]byte(d.ok("ps", "--all", "--json")), &raw)
	var one json.RawMessage
	json.Unmarshal([]byte(d.ok("inspect", "--json", s.ID)), &one)
	var a, b bytes.Buffer
	json.Compact(&a, raw[0])
	json.Compact(&b, one)
	if a.String() != b.String() {
		t.Fatalf("ps --json and inspect --json differ:\n%s\n%s", a.String(), b.String())
	}
}

func TestExitCodes(t *testing.T) {
	d := newDaemon(t)
	res := d.ctl("run", capsule(t, "three", "echo out; echo err >&2; exit 3", ""))
	if res.code != 3 || res.stdout != "out\n" || res.stderr != "err\n" {
		t.Fatalf("exit 3 capsule: %+v", res)
	}

	start := time.Now()
	res = d.ctl("run", capsule(t, "sleepy", "sleep 30", "capabilities:\n  limits:\n    deadline_seconds: 1\n"))
	if res.code != 124 || time.Since(start) > 15*time.Second {
		t.Fatalf("deadline: %+v after %s", res, time.Since(start))
	}
	last := d.ps()
	s := d.inspect(last[len(last)-1].ID)
	if s.ExitStatus != "deadline_reached" {
		t.Fatalf("inspect after deadline: %+v", s)
	}

	// run --deadline lowers the manifest's deadline.
	if res = d.ctl("run", "--deadline", "1s", capsule(t, "sleepy", "sleep 30", "")); res.code != 124 {
		t.Fatalf("run --deadline: %+v", res)
	}

	res = d.ctl("run", capsule(t, "missing", "exec /nonexistent/program", ""))
	if res.code != 127 {
		t.Fatalf("shell's own not-found: %+v", res)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "capsule.yaml"), []byte("name: nostart\nversion: 0.1.0\nrun:\n  command: [no-such-program]\n"), 0o644)
	res = d.ctl("run", dir)
	if res.code != 125 || !strings.Contains(res.stderr, "no-such-program") {
		t.Fatalf("program not found: %+v", res)
	}
}

func TestBadManifestRecordsNothing(t *testing.T) {
	d := newDaemon(t)
	before := len(d.events(0))
	res := d.ctl("run", capsule(t, "typo", "true", "capabilities:\n  netwrok:\n    allow: []\n"))
	if res.code != 125 || !strings.Contains(res.stderr, "capabilities.netwrok: unknown key") || !strings.Contains(res.stderr, "capsule.yaml:6:3") {
		t.Fatalf("misspelt key: %+v", res)
	}
	res = d.ctl("run", capsule(t, "caller", "true", "inference:\n  upstream: nowhere\n"))
	if res.code != 125 || !strings.Contains(res.stderr, "nowhere") {
		t.Fatalf("an upstream roostd does not declare: %+v", res)
	}
	if res = d.ctl("run", "--containment", "nope", "examples/hello"); res.code != 125 || !strings.Contains(res.stderr, `"nope" is not a containment class`) {
		t.Fatalf("bad --containment: %+v", res)
	}
	if res = d.ctl("run", "/no/such/capsule"); res.code != 125 || !strings.Contains(res.stderr, "no such directory") {
		t.Fatalf("missing capsule: %+v", res)
	}
	if len(d.ps()) != 0 || len(d.events(0)) != before {
		t.Fatal("a refused capsule reached the registry")
	}
	if res = d.ctl("inspect", "ses_nope"); res.code != 1 || !strings.Contains(res.stderr, `no session "ses_nope"`) {
		t.Fatalf("unknown session: %+v", res)
	}
	if res = d.ctl("ps", "extra"); res.code != 2 {
		t.Fatalf("usage error: %+v", res)
	}
}

func TestStopKillLogsRemove(t *testing.T) {
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "ticker", "i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.1; done", "")))
	waitFor(t, "the ticker's second tick", func() bool { return strings.Count(d.ok("logs", id), "\n") >= 2 })
	if res := d.ctl("rm", id); res.code != 1 || !strings.Contains(res.stderr, "stop it before removing it") {
		t.Fatalf("rm of a running session: %+v", res)
	}
	out := d.ok("stop", "--grace", "5s", id)
	if !strings.Contains(out, "terminated (143)") {
		t.Fatalf("stop: %q", out)
	}
	if res := d.ctl("wait", id); res.code != 143 {
		t.Fatalf("wait after stop: %+v", res)
	}
	if logs := d.ok("logs", id); !strings.HasPrefix(logs, "tick 1\ntick 2\n") {
		t.Fatalf("logs: %q", logs)
	}

	id = strings.TrimSpace(d.ok("run", "-d", capsule(t, "stubborn", "trap '' TERM; sleep 30", "")))
	if out := d.ok("kill", id); !strings.Contains(out, "terminated (137)") {
		t.Fatalf("kill: %q", out)
	}

	id = strings.TrimSpace(d.ok("run", "-d", capsule(t, "counter", "for i in 1 2 3; do echo n$i; sleep 0.2; done", "")))
	if logs := d.ok("logs", "-f", id); logs != "n1\nn2\nn3\n" {
		t.Fatalf("logs -f: %q", logs)
	}
	s := d.inspect(id)
	d.ok("rm", id)
	if _, err := os.Stat(s.RecordsDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("records survived rm: %v", err)
	}
	if res := d.ctl("inspect", id); res.code != 1 || !strings.Contains(res.stderr, `no session "`+id+`"`) {
		t.Fatalf("removed session still inspectable, or inspect failed otherwise: %+v", res)
	}
}

func TestEventsFollow(t *testing.T) {
	d := newDaemon(t)
	cmd := exec.Command(filepath.Join(binDir, "roostctl"), "events", "--follow", "--json")
	cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	d.ok("run", "examples/hello")
	sc := bufio.NewScanner(stdout)
	var types []string
	done := make(chan struct{})
	go func() {
		for len(types) < 4 && sc.Scan() {
			var ev event
			json.Unmarshal(sc.Bytes(), &ev)
			types = append(types, ev.Type)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("follower got %v", types)
	}
	if !slices.Equal(types, []string{"session.staged", "session.launching", "session.running", "session.exited"}) {
		t.Fatalf("followed %v", types)
	}
}

// kill -9 of roostd loses nothing: every staged session and every event is there after a
// restart, and a session that ran through the crash has its exact end recorded.
func TestDaemonKilledLosesNothing(t *testing.T) {
	d := newDaemon(t)
	var staged []string
	for i := range 3 {
		staged = append(staged, strings.TrimSpace(d.ok("stage", capsule(t, fmt.Sprintf("s%d", i), "true", ""))))
	}
	running := strings.TrimSpace(d.ok("run", "-d", capsule(t, "through", "echo before; sleep 1; echo after; exit 5", "")))
	d.ok("run", "examples/hello")
	eventsBefore := d.events(0)
	through := d.inspect(running)
	d.kill9()
	waitFor(t, "the session to end while no daemon watches", func() bool { return programEnded(through) })
	d.start()

	list := d.ps()
	ids := map[string]session{}
	for _, s := range list {
		ids[s.ID] = s
	}
	for _, id := range staged {
		if ids[id].State != "staged" {
			t.Errorf("staged session %s after restart: %+v", id, ids[id])
		}
	}
	if s := ids[running]; s.State != "exited" || s.ExitStatus != "error" || *s.ExitCode != 5 {
		t.Fatalf("session that ran through the crash: %+v", s)
	}
	if logs := d.ok("logs", running); logs != "before\nafter\n" {
		t.Fatalf("its output: %q", logs)
	}
	after := d.events(0)
	if len(after) < len(eventsBefore) {
		t.Fatalf("events lost: %d before, %d after", len(eventsBefore), len(after))
	}
	for i, ev := range after {
		if ev.Seq != fmt.Sprint(i+1) {
			t.Fatalf("event %d has seq %s: not dense and ordered", i, ev.Seq)
		}
		if i < len(eventsBefore) && ev != eventsBefore[i] {
			t.Fatalf("event %d changed across the restart: %+v vs %+v", i, eventsBefore[i], ev)
		}
	}
	tail := d.events(len(eventsBefore))
	if len(tail) != len(after)-len(eventsBefore) || (len(tail) > 0 && tail[0].Seq != fmt.Sprint(len(eventsBefore)+1)) {
		t.Fatalf("--since %d: %+v", len(eventsBefore), tail)
	}
}

func TestSecondDaemonRefused(t *testing.T) {
	d := newDaemon(t)
	start := time.Now()
	out, err := exec.Command(filepath.Join(binDir, "roostd"), "--state-dir", d.stateDir, "--socket", filepath.Join(t.TempDir(), "other.sock"), "--metrics-addr", "").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another roostd is using this state directory") || time.Since(start) > 5*time.Second {
		t.Fatalf("second roostd: %v %s (after %s)", err, out, time.Since(start))
	}
	out, err = exec.Command(filepath.Join(binDir, "roostd"), "--state-dir", stateDir(t), "--socket", d.socket, "--metrics-addr", "").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another roostd is serving on it") {
		t.Fatalf("second roostd on the same socket: %v %s", err, out)
	}
	// A state directory and a socket of its own, but the first one's id block: a sweep of
	// a range it freed would kill the first one's sessions.
	out, err = exec.Command(filepath.Join(binDir, "roostd"), "--state-dir", stateDir(t), "--socket", filepath.Join(t.TempDir(), "third.sock"), "--metrics-addr", "").CombinedOutput()
	if want := fmt.Sprintf("the block 1879048192-2147352575 roostd pid %d sweeps", d.cmd.Process.Pid); err == nil || !strings.Contains(string(out), want) {
		t.Fatalf("second roostd on the same id block: %v %s, want %q", err, out, want)
	}
}

func TestSigtermLeavesSessionsRunning(t *testing.T) {
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "survivor", "trap 'exit 7' TERM; touch ready; while :; do sleep 0.05; done", "")))
	s := d.inspect(id)
	waitFor(t, "the survivor to set its trap", func() bool {
		_, err := os.Stat(filepath.Join(s.Workdir, "ready"))
		return err == nil
	})
	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("roostd after SIGTERM: %v\n%s", err, d.log)
	}
	if _, err := os.Stat(d.socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
	d.start()
	if s := d.inspect(id); s.State != "running" {
		t.Fatalf("session after a clean restart: %+v", s)
	}
	out := d.ok("stop", id)
	if !strings.Contains(out, "terminated (7)") {
		t.Fatalf("stop after restart: %q", out)
	}
}

func TestMetrics(t *testing.T) {
	d := newDaemon(t)
	d.ok("run", "examples/hello")
	resp, err := http.Get("http://" + d.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`roost_sessions{state="exited"} 1`, `roost_session_starts_total{class="advisory",result="started"} 1`, "roost_session_start_seconds_bucket", "go_goroutines", "process_resident_memory_bytes"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(string(body), "ses_") {
		t.Error("a session id is a metric label")
	}
}

func TestExplainDoctorVersion(t *testing.T) {
	d := newDaemon(t)
	var e struct {
		Containment struct {
			Declared string `json:"declared"`
			Achieved string `json:"achieved"`
			FloorMet bool   `json:"floor_met"`
		} `json:"containment"`
		Grants []struct {
			Key         string `json:"key"`
			Enforcement string `json:"enforcement"`
		} `json:"grants"`
	}
	if err := json.Unmarshal([]byte(d.ok("explain", "--json", "examples/hello")), &e); err != nil {
		t.Fatal(err)
	}
	if !e.Containment.FloorMet || e.Containment.Declared != "advisory" || e.Containment.Achieved != "advisory" || len(e.Grants) < 20 {
		t.Fatalf("explain: %+v", e)
	}
	// An executable workdir keeps the class, and explain says what may execute.
	out := d.ok("explain", "--containment", "sealed", capsule(t, "execwork", "true", "capabilities:\n  filesystem:\n    workdir_exec: true\n"))
	if !strings.Contains(out, "achieved     sealed") || !strings.Contains(out, "anything in /work, /tmp, /dev/shm and /root") {
		t.Fatalf("explain of a sealed workdir_exec capsule: %s", out)
	}
	var doc struct {
		Classes []struct {
			Class     string `json:"class"`
			Available bool   `json:"available"`
		} `json:"classes"`
		Strongest string `json:"strongest"`
	}
	json.Unmarshal([]byte(d.ok("doctor", "--json")), &doc)
	if doc.Strongest != "sealed" || len(doc.Classes) != 4 {
		t.Fatalf("doctor: %+v", doc)
	}
	if out := d.ok("version"); !strings.Contains(out, "roostd") {
		t.Fatalf("version: %s", out)
	}
	res := (&daemon{t: t, socket: filepath.Join(t.TempDir(), "none.sock")}).ctl("ps")
	if res.code != 69 || !strings.Contains(res.stderr, "cannot reach roostd") {
		t.Fatalf("no daemon: %+v", res)
	}
}

// Ctrl-C in `roostctl run` stops the session instead of abandoning it, and run exits with
// the session's code.
func TestRunInterrupted(t *testing.T) {
	d := newDaemon(t)
	cmd := exec.Command(filepath.Join(binDir, "roostctl"), "run", capsule(t, "patient", "echo waiting; sleep 30", ""))
	cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "waiting\n" {
		t.Fatalf("first line %q", line)
	}
	cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 143 || !strings.Contains(stderr.String(), "stopping session") {
		t.Fatalf("run after Ctrl-C: %v\n%s", err, stderr.String())
	}
	list := d.ps()
	if len(list) != 1 || list[0].State != "exited" || list[0].ExitStatus != "terminated" {
		t.Fatalf("session after Ctrl-C: %+v", list)
	}
}

// The sealed class end to end, as an operator sees it.
func TestSealedThroughRoostctl(t *testing.T) {
	d := newDaemon(t)
	var doc struct {
		Classes []struct {
			Class     string `json:"class"`
			Available bool   `json:"available"`
			Detail    string `json:"detail"`
		} `json:"classes"`
	}
	json.Unmarshal([]byte(d.ok("doctor", "--json")), &doc)
	for _, c := range doc.Classes {
		if !c.Available {
			t.Fatalf("doctor: %s unavailable: %s", c.Class, c.Detail)
		}
	}

	res := d.ctl("run", "examples/sealed")
	if res.code != 0 {
		t.Fatalf("run examples/sealed: %+v", res)
	}
	for _, want := range []string{"/ holds: .roost bin capsule dev etc lib lib64 proc root run sbin tmp usr work", "Seccomp:\t2", "NoNewPrivs:\t1", "CapEff:\t0000000000000000", "Read-only file system", "No such file or directory", "wrote /work/out.txt"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("sealed output lacks %q:\n%s", want, res.stdout)
		}
	}
	list := d.ps()
	s := d.inspect(list[len(list)-1].ID)
	if data, err := os.ReadFile(filepath.Join(s.Workdir, "out.txt")); err != nil || string(data) != "written inside\n" {
		t.Fatalf("/work/out.txt on the host: %q %v", data, err)
	}
	if s.Containment.Declared != "sealed" || s.Containment.Achieved != "sealed" {
		t.Fatalf("containment: %+v", s.Containment)
	}

	// A memory bomb is killed and reported.
	res = d.ctl("run", capsule(t, "membomb", "tail /dev/zero", "capabilities:\n  containment: sealed\n  resources:\n    cgroup_memory_bytes: 67108864\n  shell:\n    allow: [tail]\n"))
	list = d.ps()
	s = d.inspect(list[len(list)-1].ID)
	if res.code != 137 || s.ExitStatus != "crashed" || s.Detail != "oom" {
		t.Fatalf("memory bomb: exit %d, %s %q", res.code, s.ExitStatus, s.Detail)
	}

	// A fork bomb is held by pids.max, and the daemon answers throughout.
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "forkbomb", "b() { b | b; }; b",
		"capabilities:\n  containment: sealed\n  resources:\n    cgroup_pids_max: 64\n  limits:\n    deadline_seconds: 3\n")))
	start := time.Now()
	for time.Since(start) < 2*time.Second {
		t0 := time.Now()
		if res := d.ctl("ps"); res.code != 0 {
			t.Fatalf("ps during the fork bomb: %+v", res)
		}
		if took := time.Since(t0); took > 5*time.Second {
			t.Fatalf("ps took %s during the fork bomb", took)
		}
	}
	// The shell gives up once the kernel refuses its forks (or the deadline ends it).
	if res := d.ctl("wait", id); res.code == 0 {
		t.Fatalf("fork bomb session: %+v", res)
	}

	// Pause freezes it; the usage of a running sealed session is visible.
	id = strings.TrimSpace(d.ok("run", "-d", capsule(t, "ticker", "while :; do echo tick; sleep 0.1; done", "capabilities:\n  containment: sealed\n  shell:\n    allow: [sleep]\n")))
	waitFor(t, "the sealed ticker's first tick", func() bool { return strings.Contains(d.ok("logs", id), "tick\n") })
	var withUsage struct {
		Usage *struct {
			Pids string `json:"pids"`
		} `json:"usage"`
	}
	json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &withUsage)
	if withUsage.Usage == nil || withUsage.Usage.Pids == "0" {
		t.Fatalf("no usage for a running sealed session")
	}
	// Where the check below looks for what is left, a running session's cgroup is.
	tickerCgroup := cgroupNameOf(t, d.identity(id).Pid)
	for _, dir := range cgroupDirs(t, tickerCgroup) {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("the running sealed session's cgroup: %v", err)
		}
	}
	d.ok("pause", id)
	before := d.ok("logs", id)
	// The scenario's time: a session that writes ten times a second is watched for half a
	// second, and must not write.
	time.Sleep(500 * time.Millisecond)
	after := d.ok("logs", id)
	if after != before {
		t.Fatalf("a paused session kept writing")
	}
	d.ok("resume", id)
	// The positive control of that check: resumed, the same session writes again.
	waitFor(t, "the resumed ticker to write", func() bool { return d.ok("logs", id) != after })
	if out := d.ok("stop", id); !strings.Contains(out, "terminated") {
		t.Fatalf("stop: %s", out)
	}

	// Nothing of the ended sessions is left: no container, no cgroup, no mount. Resources
	// are released just after the end is recorded.
	var entries []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if entries = d.sessionContainers(); len(entries) == 0 {
			break
		}
	}
	if len(entries) != 0 {
		t.Fatalf("container state left: %v", entries)
	}
	if left := d.sessionMounts(); len(left) != 0 {
		t.Fatalf("mounts of the state dir remain on the host: %v", left)
	}
	// By id for those that started cold; the ticker's by the name it had, warm or cold.
	names := []string{tickerCgroup}
	for _, s := range d.ps() {
		names = append(names, s.ID)
	}
	for _, name := range names {
		for _, dir := range cgroupDirs(t, name) {
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup of ended session left: %s (%v)", dir, err)
			}
		}
	}
}

// kill -9 of roostd while a sealed session runs: the next daemon records its exact end and
// leaves nothing of it behind.
func TestSealedSurvivesDaemonKill(t *testing.T) {
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "through", "echo before; sleep 1; echo after; exit 5",
		"capabilities:\n  containment: sealed\n  shell:\n    allow: [sleep]\n")))
	through := d.inspect(id)
	d.kill9()
	waitFor(t, "the sealed session to end while no daemon watches", func() bool { return programEnded(through) })
	d.start()
	s := d.inspect(id)
	if s.State != "exited" || s.ExitStatus != "error" || *s.ExitCode != 5 {
		t.Fatalf("after restart: %+v", s)
	}
	if out := d.ok("logs", id); out != "before\nafter\n" {
		t.Fatalf("logs: %q", out)
	}
	if entries := d.sessionContainers(); len(entries) != 0 {
		t.Fatalf("container state left: %v", entries)
	}

	// Still running at the restart: re-attached, then stopped.
	// Still running at the restart: re-attached, still whole (it runs programs from /usr
	// and reads /etc throughout), then stopped.
	id = strings.TrimSpace(d.ok("run", "-d", capsule(t, "long", "trap 'exit 3' TERM; while :; do /usr/bin/true && cat /etc/hostname >/dev/null || echo BROKEN; echo round; sleep 0.1; done",
		"capabilities:\n  containment: sealed\n  shell:\n    allow: [sleep, \"true\", cat]\n")))
	rounds := func() int { return strings.Count(d.ok("logs", id), "round\n") }
	waitFor(t, "the long session's first round", func() bool { return rounds() >= 1 })
	d.kill9()
	d.start()
	// Whole across the restart means rounds of /usr and /etc after it, not just a live pid.
	n := rounds()
	waitFor(t, "five rounds after the restart", func() bool { return rounds() >= n+5 })
	if s := d.inspect(id); s.State != "running" {
		t.Fatalf("after restart: %+v", s)
	}
	if out := d.ok("stop", id); !strings.Contains(out, "terminated (3)") {
		t.Fatalf("stop after restart: %q", out)
	}
	if logs := d.ctl("logs", id); strings.Contains(logs.stdout, "BROKEN") || strings.Contains(logs.stderr, "not found") || strings.Contains(logs.stderr, "No such file") {
		t.Fatalf("the session's root broke across the restart: %.300q %.300q", logs.stdout, logs.stderr)
	}
}

// kill -9 of roostd while a scoped session runs in pid and IPC namespaces of its own: the next
// daemon re-attaches to it by the host pids it recorded, execs into its namespaces (which show
// only the session's processes), pauses it (its cgroup frozen) and stops it with a signal the
// program handles, recording the exact end.
func TestScopedSurvivesDaemonKill(t *testing.T) {
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "scopedlong", "trap 'exit 3' TERM; while :; do echo round; sleep 0.1; done",
		"capabilities:\n  containment: scoped\n  shell:\n    allow: [sleep, sh]\n")))
	rounds := func() int { return strings.Count(d.ok("logs", id), "round\n") }
	waitFor(t, "the scoped session's first round", func() bool { return rounds() >= 1 })
	d.kill9()
	d.start()
	n := rounds()
	waitFor(t, "three rounds after the restart", func() bool { return rounds() >= n+3 })
	pid := d.identity(id).Pid
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	nspid := ""
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			nspid = strings.TrimSpace(rest)
		}
	}
	if f := strings.Fields(nspid); len(f) != 2 || f[0] != strconv.Itoa(pid) {
		t.Fatalf("inspect's pid %d has NSpid %q: not the program's host pid in a pid namespace of its own", pid, nspid)
	}
	// Builtins only, so the listing is of the exec'd shell and what the session runs.
	out := d.ok("exec", id, "--", "sh", "-c", `for p in /proc/[0-9]*; do printf '%s ' "${p#/proc/}"; done; echo; echo $$`)
	listed, self, _ := strings.Cut(strings.TrimSpace(out), "\n")
	pids := strings.Fields(listed)
	if !slices.Contains(pids, "1") || !slices.Contains(pids, strings.Fields(nspid)[1]) || !slices.Contains(pids, self) || slices.Contains(pids, strconv.Itoa(os.Getpid())) || len(pids) > 4 {
		t.Fatalf("exec into the scoped session lists %v (itself %s, the program %s): want roost-init, the program, its sleep and itself only", pids, self, nspid)
	}
	d.ok("pause", id)
	frozen := false
	for _, dir := range cgroupDirs(t, cgroupNameOf(t, pid)) {
		// Whichever freezer holds it says every process in the cgroup is frozen: v1's
		// freezer.state, or the unified hierarchy's cgroup.events.
		if data, err := os.ReadFile(filepath.Join(dir, "freezer.state")); err == nil && strings.TrimSpace(string(data)) == "FROZEN" {
			frozen = true
		}
		if data, err := os.ReadFile(filepath.Join(dir, "cgroup.events")); err == nil && strings.Contains(string(data), "frozen 1") {
			frozen = true
		}
	}
	if !frozen {
		t.Fatalf("paused after the restart, the session's cgroup is not frozen")
	}
	d.ok("resume", id)
	n = rounds()
	waitFor(t, "a round after resume", func() bool { return rounds() > n })
	if out := d.ok("stop", id); !strings.Contains(out, "terminated (3)") {
		t.Fatalf("stop after restart: %q", out)
	}
}

func TestPushAndRunByName(t *testing.T) {
	d := newDaemon(t)
	dir := capsule(t, "worker", "echo from the store", "")
	if out := d.ok("push", dir); !strings.HasPrefix(out, "pushed worker@0.1.0 sha256:") {
		t.Fatalf("push: %q", out)
	}
	if out := d.ok("push", dir); !strings.HasPrefix(out, "already pushed") {
		t.Fatalf("second push: %q", out)
	}
	if res := d.ctl("run", "worker@0.1.0"); res.code != 0 || res.stdout != "from the store\n" {
		t.Fatalf("run worker@0.1.0: %+v", res)
	}
	// Changed bytes under the same version are refused, and runs keep the pushed ones.
	os.WriteFile(filepath.Join(dir, "extra"), []byte("x"), 0o644)
	if res := d.ctl("push", dir); res.code != 1 || !strings.Contains(res.stderr, "already pushed as sha256:") {
		t.Fatalf("push of changed bytes: %+v", res)
	}
	var arts []struct {
		Name, Version, Sha256 string
	}
	json.Unmarshal([]byte(d.ok("artifacts", "--json")), &arts)
	list := d.ps()
	s := d.inspect(list[len(list)-1].ID)
	if len(arts) != 1 || arts[0].Sha256 != s.Capsule.SHA256 {
		t.Fatalf("artifacts %+v, session ran %s", arts, s.Capsule.SHA256)
	}
	if res := d.ctl("run", "missing@1.0.0"); res.code != 125 || !strings.Contains(res.stderr, "no capsule missing@1.0.0 has been pushed") {
		t.Fatalf("run of an unpushed capsule: %+v", res)
	}
}
