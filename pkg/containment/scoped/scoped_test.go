package scoped_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/containment/scoped"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/resolver"
)

func TestScopedHoldsTheHostView(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "outside")
	// A name no earlier run left behind: touch of a file the session's uid already owns
	// needs no write access (it sets the times), so a leftover would read as a write.
	hostTmp := "/tmp/roost-evil-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() { _ = os.Remove(hostTmp) })
	// The host-safe attempts (no write to the host's /etc) are tried on the host too, where
	// each must work; in the session, the same commands on what is its own are the control.
	hostSafe := testkit.TryScript + `try outside touch ` + outside + `
try /tmp touch ` + hostTmp + `
try ls ls /
try init kill -0 1
try daemon kill -0 ` + strconv.Itoa(os.Getpid()) + "\n"
	info, out, errOut, s := kit.ScopedRun(t, "capabilities: {containment: scoped, shell: {allow: [grep, touch, cat]}}", hostSafe+
		`grep -E '^(Seccomp|NoNewPrivs|CapEff|CapBnd):' /proc/self/status
write() { echo hi > "$1"; }
try host-read cat /etc/hostname
try /etc touch /etc/evil
try own-tmp touch "$TMPDIR/mine"
try workdir write out.txt
try own-signal kill -0 $$`)
	if info.Code != 0 {
		t.Fatalf("exit %+v\n%s\n%s", info, out, errOut)
	}
	testkit.ExpectOutput(t, out, "Seccomp:\t2", "NoNewPrivs:\t1", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000")
	testkit.ExpectAllowed(t, out, "host-read", "own-tmp", "workdir", "own-signal")
	// Landlock holds the writes and exec (ls is not on the allowlist), its uid the signals to
	// its pid 1 (roost-init); the daemon is not in its pid namespace at all.
	testkit.ExpectDenied(t, out, syscall.EACCES, "/etc", "outside", "/tmp", "ls")
	testkit.ExpectDenied(t, out, syscall.EPERM, "init")
	testkit.ExpectDenied(t, out, syscall.ESRCH, "daemon")
	if data, err := os.ReadFile(filepath.Join(s.Dir, "out.txt")); err != nil || string(data) != "hi\n" {
		t.Fatalf("workdir file: %q %v", data, err)
	}
	if _, err := os.Stat(hostTmp); err == nil {
		t.Fatalf("the session wrote %s", hostTmp)
	}
	testkit.ExpectAllowed(t, testkit.OnHost(t, hostSafe), "outside", "/tmp", "ls", "init", "daemon")
}

func TestScopedScopeAndSockets(t *testing.T) {
	// The write inside the scope is the control: the same touch, where the session may.
	_, out, _, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, filesystem: {scope: src}, shell: {allow: [touch, perl]}}", testkit.TryScript+
		`try outside touch outside
try inside touch src/inside
`+testkit.UnixSocketProbe)
	testkit.ExpectAllowed(t, out, "inside")
	testkit.ExpectDenied(t, out, syscall.EACCES, "outside")
	testkit.ExpectOutput(t, out, "unix socket: Permission denied", "inet socket: allowed")
}

func TestScopedMemoryBomb(t *testing.T) {
	info, _, _, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, resources: {cgroup_memory_bytes: 67108864}, shell: {allow: [tail]}}", `tail /dev/zero`)
	if info.Code != 128+int(syscall.SIGKILL) || !info.OOMKilled {
		t.Fatalf("memory bomb: %+v", info)
	}
}

// A scoped session has a network namespace of its own: the host's loopback services are out
// of reach, its own loopback works, and a pinned namespace given to it is the one it joins.
func TestScopedNetworkNamespace(t *testing.T) {
	testkit.NeedRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// The request read first: closed on it unread, the connection would be reset.
			if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
				c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost service\n"))
			}
			c.Close()
		}
	}()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	hostNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	probe := testkit.TryScript + `try host-service curl -sSv --max-time 5 http://127.0.0.1:` + port + "/\n"
	_, tried, errOut, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, shell: {allow: [curl, readlink, cat]}}", probe+
		`echo ---
readlink /proc/self/ns/net
cat /proc/net/dev`)
	tried, out, _ := strings.Cut(tried, "---\n")
	// Nothing listens on its own loopback; the host's service, which the host reaches
	// (the control), is in another namespace.
	testkit.ExpectDenied(t, tried, syscall.ECONNREFUSED, "host-service")
	testkit.ExpectAllowed(t, testkit.OnHost(t, probe), "host-service")
	if strings.Contains(out, hostNS) {
		t.Fatalf("the scoped session shares the host's network (host %s):\n%s\n%s", hostNS, out, errOut)
	}
	testkit.ExpectOutput(t, out, "net:[")
	// Only lo: /proc/net/dev lists one interface.
	if n := strings.Count(out, ":"); n != 2 || !strings.Contains(out, "lo:") {
		t.Fatalf("interfaces other than lo:\n%s", out)
	}
}

// A scoped session reads its own resolver's resolv.conf where the host's is (bound in its
// mount namespace over the host's file, or what it links to), and the host's is untouched.
func TestScopedResolvConf(t *testing.T) {
	testkit.NeedRoot(t)
	host, err := os.ReadFile("/etc/resolv.conf")
	testenv.Need(t, "a host /etc/resolv.conf", err)
	if string(host) == resolver.ResolvConf {
		t.Fatal("the host's resolv.conf is already the session's: nothing here would tell them apart")
	}
	_, out, errOut, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, shell: {allow: [cat]}}", "cat /etc/resolv.conf")
	if out != resolver.ResolvConf {
		t.Fatalf("the session's /etc/resolv.conf:\n%s\n%s\nwant:\n%s", out, errOut, resolver.ResolvConf)
	}
	if after, err := os.ReadFile("/etc/resolv.conf"); err != nil || string(after) != string(host) {
		t.Fatalf("the host's resolv.conf changed: %q %v", after, err)
	}
}

// startScopedSleeper starts a real scoped session whose program marks its private
// /dev/shm and sleeps.
func startScopedSleeper(t *testing.T) (*scoped.Runtime, containment.Spec, containment.Process) {
	t.Helper()
	testkit.NeedRoot(t)
	rt, err := kit.NewScopedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs())
	if err != nil {
		t.Fatal(err)
	}
	s := kit.Spec(t, "/bin/sh", "-c", "echo mark > /dev/shm/exec-mark; cat /proc/self/status > status; exec sleep 60")
	s.SessionID = "ses_" + strings.ToLower(t.Name())
	s.Class = manifest.Scoped
	s.Policy = testkit.Policy(t, "capabilities: {containment: scoped, shell: {allow: [sleep, cat]}}")
	s.CapsuleDir = t.TempDir()
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		t.Fatalf("scoped start: %v", err)
	}
	t.Cleanup(func() {
		_ = p.Signal(syscall.SIGKILL)
		<-p.Done()
		_ = rt.Release(s.SessionID)
	})
	return rt, s, p
}

func runExec(t *testing.T, x *containment.Execution) (string, string, containment.ExitInfo) {
	t.Helper()
	out, _ := io.ReadAll(x.Stdout)
	errOut, _ := io.ReadAll(x.Stderr)
	info, err := x.Wait()
	if err != nil {
		t.Fatal(err)
	}
	x.Close()
	return string(out), string(errOut), info
}

// A command exec'd into a scoped session runs in its program's mount namespace (its private
// /dev/shm), as its uid, with its seccomp filter and no capability, under its allowlist.
func TestExecScopedJoinsTheProgram(t *testing.T) {
	rt, s, p := startScopedSleeper(t)
	status := filepath.Join(s.Dir, "status")
	var program string
	for i := 0; i < 200 && program == ""; i++ {
		if data, err := os.ReadFile(status); err == nil && strings.Contains(string(data), "NoNewPrivs") {
			program = string(data)
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	x, err := rt.Exec(context.Background(), s, p, containment.ExecOptions{Argv: []string{"cat", "/dev/shm/exec-mark", "/proc/self/status"}})
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, info := runExec(t, x)
	if info.Code != 0 || !strings.HasPrefix(out, "mark\n") {
		t.Fatalf("exec: code %d, stdout %q, stderr %q", info.Code, out, errOut)
	}
	if _, err := os.Stat("/dev/shm/exec-mark"); err == nil {
		t.Errorf("the session's /dev/shm is the host's")
	}
	for _, field := range []string{"Uid", "Gid", "CapEff", "CapBnd", "Seccomp", "NoNewPrivs"} {
		if got, want := statusLine(out, field), statusLine(program, field); got != want || got == "" {
			t.Errorf("%s: exec %q, program %q", field, got, want)
		}
	}

	_, err = rt.Exec(context.Background(), s, p, containment.ExecOptions{Argv: []string{"id"}})
	var se *containment.StartError
	if !errors.As(err, &se) || !strings.HasPrefix(se.Msg, roostinit.RefusedPrefix) {
		t.Errorf("a command outside shell.allow: %v", err)
	}
	// A working directory the session's uid cannot enter is refused, though roostd is root.
	_, err = rt.Exec(context.Background(), s, p, containment.ExecOptions{Argv: []string{"cat", "x"}, Dir: "/root"})
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "working directory /root") {
		t.Errorf("-w /root: %v", err)
	}
}

func statusLine(status, field string) string {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// The report pipe survives everything roost-exec does to a scoped program: its own mount
// and network namespaces, cgroup-free here, Landlock, the uid switch, capabilities dropped,
// no_new_privs and seccomp.
func TestReportThroughScopedExec(t *testing.T) {
	testkit.NeedRoot(t)
	s := kit.Spec(t, "/bin/sh", "-c", testkit.FDScript+`echo '{"status":"deadline_reached"}' >&3; exit 124`)
	s.Class = manifest.Scoped
	s.Policy = testkit.Policy(t, "capabilities: {containment: scoped, shell: {allow: [ls]}}")
	s.CapsuleDir = t.TempDir()
	tmp := testkit.ReachableDir(t)
	bpf, err := scoped.SeccompOf(s.Policy, true)
	if err != nil {
		t.Fatal(err)
	}
	exec := roostinit.ExecSpec{Report: true, NoNewPrivileges: true, DropCapabilities: true, Seccomp: bpf, NewNetNS: true}
	exec.Landlock, exec.Mounts = scoped.ExecRules(s, tmp)
	info, out := kit.ReportRun(t, kit.Init(t), s, exec)
	nums, env := testkit.FDs(t, out)
	if info.Code != 124 || !slices.Equal(nums, []string{"0", "1", "2", "3"}) || env != "3" {
		t.Fatalf("exit %+v; the program has descriptors %v and ROOST_REPORT_FD=%s:\n%s", info, nums, env, out)
	}
	if o, ok := info.Outcome(); !ok || o.Status != records.OutcomeDeadlineReached {
		t.Fatalf("report %s", info.Report)
	}
}

// A scoped session has a /dev/shm of its own: writable, bounded, and not the host's.
func TestScopedPrivateShm(t *testing.T) {
	name := fmt.Sprintf("roost-test-shm-%d", os.Getpid())
	_, out, errOut, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, shell: {allow: [df]}}",
		`echo data > /dev/shm/`+name+` && echo "shm writable"; df -k /dev/shm | tail -1`)
	testkit.ExpectOutput(t, out, "shm writable")
	if _, err := os.Stat("/dev/shm/" + name); err == nil {
		os.Remove("/dev/shm/" + name)
		t.Fatalf("the session wrote the host's /dev/shm:\n%s%s", out, errOut)
	}
}

// execNSPython lists the processes the command sees, its own pid as it and as /proc name it,
// and tries ipcPython's IPC objects.
const execNSPython = `
import os
print("pids: " + " ".join(sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int)))
print("self: %d %s" % (os.getpid(), os.readlink("/proc/self")))
` + ipcPython

// A command exec'd into a scoped session is in its pid and IPC namespaces and sees its
// /proc: the session's processes and its own, not the host's; the segment the program made,
// not the host's. Its exit and signals are its own, as without the namespaces.
func TestExecScopedSharesProcessesAndIPC(t *testing.T) {
	testkit.NeedRoot(t)
	key, mq := hostIPC(t)
	// The program's segment, made in whatever IPC namespace the session has. Left behind on
	// the host if that is the host's: removed then.
	program := fmt.Sprintf(`/usr/bin/python3 -c 'import ctypes; ctypes.CDLL(None).shmget(%d, 4096, 0o1600)' && touch made && exec sleep 60`, key+1)
	t.Cleanup(func() {
		if id, err := unix.SysvShmGet(key+1, 0, 0); err == nil {
			_, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil)
		}
	})
	rt, err := kit.NewScopedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs())
	if err != nil {
		t.Fatal(err)
	}
	s := kit.Spec(t, "/bin/sh", "-c", program)
	s.SessionID = "ses_" + strings.ToLower(t.Name())
	s.Class = manifest.Scoped
	s.Policy = testkit.Policy(t, "capabilities: {containment: scoped, shell: {allow: [/usr/bin/python3, touch, sleep, sh]}}")
	s.CapsuleDir = t.TempDir()
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		t.Fatalf("scoped start: %v", err)
	}
	t.Cleanup(func() {
		_ = p.Signal(syscall.SIGKILL)
		<-p.Done()
		_ = rt.Release(s.SessionID)
	})
	testkit.WaitFile(t, filepath.Join(s.Dir, "made"))

	x, err := rt.Exec(context.Background(), s, p, containment.ExecOptions{Argv: []string{"/usr/bin/python3", "-c", execNSPython, strconv.Itoa(key), mq, strconv.Itoa(key + 1), "find"}})
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, info := runExec(t, x)
	if info.Code != 0 {
		t.Fatalf("exec: %+v\n%s%s", info, out, errOut)
	}
	self := strings.Fields(lineAfter(out, "self: "))
	if len(self) != 2 || self[0] != self[1] {
		t.Fatalf("the command's /proc/self is not its own: %q\n%s", self, errOut)
	}
	// roost-init, the program (sleep, exec'd by sh) and the command itself; not the test.
	if programPIDs := nsPIDs(t, p.Ref().PID); len(programPIDs) != 2 {
		t.Errorf("the program's pids %v: it is not in a pid namespace of its own", programPIDs)
	} else {
		want := []string{"1", programPIDs[1], self[0]}
		slices.SortFunc(want, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
		if pids := strings.Fields(lineAfter(out, "pids: ")); !slices.Equal(pids, want) {
			t.Errorf("the command sees processes %v, want the session's roost-init (1), program (%v) and itself (%v):\n%s", pids, programPIDs, self, errOut)
		}
	}
	testkit.ExpectDenied(t, out, syscall.ENOENT, "host-shm", "host-sem", "host-msg", "host-mq")
	// The control: own-shm is the program's segment, which the command attaches.
	testkit.ExpectAllowed(t, out, "own-shm")
	testkit.ExpectOutput(t, out, "listed: False")

	// Its end is its own: an exit code, and a signal it dies of (it is not a pid 1 that
	// ignores what it has no handler for).
	x, err = rt.Exec(context.Background(), s, p, containment.ExecOptions{Argv: []string{"sh", "-c", "exit 7"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, info := runExec(t, x); info.Code != 7 {
		t.Errorf("exit 7: %+v", info)
	}
	x, err = rt.Exec(context.Background(), s, p, containment.ExecOptions{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(x.Pid, syscall.SIGTERM); err != nil {
		t.Fatalf("the command's host pid %d: %v", x.Pid, err)
	}
	if _, _, info := runExec(t, x); info.Signal != int(syscall.SIGTERM) {
		t.Errorf("SIGTERM: %+v", info)
	}
}

// nsPIDs is a process's pids from the host's pid namespace inward (/proc/<pid>/status).
func nsPIDs(t *testing.T, pid int) []string {
	t.Helper()
	return strings.Fields(statusLine(testkit.ReadFile(t, fmt.Sprintf("/proc/%d/status", pid)), "NSpid"))
}

// A scoped session's records name its processes by their host pids, so a daemon started
// afterwards re-attaches to it, from the registry's ref or from init.json alone, and pauses,
// meters and signals it: the program ends of the SIGTERM it gets (not pid 1, which would
// ignore it), recorded as before.
func TestScopedReattachedAcrossNamespaces(t *testing.T) {
	_, s, p := startScopedSleeper(t)
	testkit.WaitFile(t, filepath.Join(s.Dir, "status"))
	ref := p.Ref()
	if got := nsPIDs(t, ref.InitPID); len(got) != 2 || got[0] != strconv.Itoa(ref.InitPID) || got[1] != "1" {
		t.Errorf("roost-init's pids %v, want host %d and the session's 1", got, ref.InitPID)
	}
	if got := nsPIDs(t, ref.PID); len(got) != 2 || got[0] != strconv.Itoa(ref.PID) || got[1] == "1" {
		t.Errorf("the program's pids %v, want host %d and one in the session's namespace", got, ref.PID)
	}
	onDisk, err := containment.ReadInit(s.RecordsDir)
	if err != nil || onDisk.InitPID != ref.InitPID || onDisk.PID != ref.PID || onDisk.PIDStart != ref.PIDStart || onDisk.InitStart != ref.InitStart {
		t.Fatalf("init.json %+v (%v), reported %+v", onDisk, err, ref)
	}
	next, err := kit.NewScopedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs())
	if err != nil {
		t.Fatal(err)
	}
	fromRecords, err := next.Attach(s.SessionID, s.RecordsDir, nil)
	if err != nil {
		t.Fatalf("Attach from init.json: %v", err)
	}
	again, err := next.Attach(s.SessionID, s.RecordsDir, &ref)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if fromRecords.Ref() != ref {
		t.Errorf("re-attached from init.json as %+v, want %+v", fromRecords.Ref(), ref)
	}
	if u, err := again.(containment.Meter).Usage(); err != nil || u.Pids < 2 {
		t.Errorf("usage of the re-attached session: %+v, %v", u, err)
	}
	f := again.(containment.Freezer)
	if err := f.Pause(); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if err := f.Resume(); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if err := again.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	info := testkit.WaitDone(t, again)
	if info.Signal != int(syscall.SIGTERM) || info.Code != 128+int(syscall.SIGTERM) || info.PID != ref.PID {
		t.Fatalf("exit %+v, want SIGTERM of host pid %d", info, ref.PID)
	}
}

// What a scoped program leaves behind, even in a session of its own, ends with it: roost-init,
// the pid 1 its orphans are given to, ends everything in the namespace, and the program's
// exit is recorded as it was.
func TestScopedOrphansEndWithTheProgram(t *testing.T) {
	testkit.NeedRoot(t)
	rt, err := kit.NewScopedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs())
	if err != nil {
		t.Fatal(err)
	}
	s := kit.Spec(t, "/bin/sh", "-c", `setsid sh -c 'echo $$ > orphan; exec sleep 300' & while [ ! -s orphan ]; do :; done; exit 3`)
	s.SessionID = "ses_" + strings.ToLower(t.Name())
	s.Class = manifest.Scoped
	s.Policy = testkit.Policy(t, "capabilities: {containment: scoped, shell: {allow: [setsid, sh, sleep]}}")
	s.CapsuleDir = t.TempDir()
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		t.Fatalf("scoped start: %v", err)
	}
	t.Cleanup(func() { _ = rt.Release(s.SessionID) })
	if info := testkit.WaitDone(t, p); info.Code != 3 || info.Signal != 0 {
		t.Fatalf("exit %+v, want 3", info)
	}
	if testkit.ReadFile(t, filepath.Join(s.Dir, "orphan")) == "" {
		t.Fatal("the orphan never ran")
	}
	if u, err := p.(containment.Meter).Usage(); err != nil || u.Pids != 0 {
		t.Fatalf("the session's cgroup after its end: %+v, %v", u, err)
	}
}
