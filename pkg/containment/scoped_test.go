package containment

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"roost.dev/roost/pkg/manifest"
)

// scopedRun runs a shell script as a scoped session and returns its exit and output.
func scopedRun(t *testing.T, caps, script string) (ExitInfo, string, string, Spec) {
	t.Helper()
	needRoot(t)
	rt, err := NewScopedRuntime(reachableDir(t), staticInit(t), testIDs())
	if err != nil {
		t.Fatal(err)
	}
	s := spec(t, "/bin/sh", "-c", script)
	s.SessionID = "ses_" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "_")
	s.Class = manifest.Scoped
	s.Policy = sealedPolicy(t, caps)
	s.CapsuleDir = t.TempDir()
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		t.Fatalf("scoped start: %v", err)
	}
	info := waitDone(t, p)
	if err := rt.Release(s.SessionID); err != nil {
		t.Errorf("release: %v", err)
	}
	return info, readFile(t, filepath.Join(s.RecordsDir, StdoutFile)), readFile(t, filepath.Join(s.RecordsDir, StderrFile)), s
}

func TestScopedHoldsTheHostView(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "outside")
	// A name no earlier run left behind: touch of a file the session's uid already owns
	// needs no write access (it sets the times), so a leftover would read as a write.
	hostTmp := "/tmp/roost-evil-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() { _ = os.Remove(hostTmp) })
	// The host-safe attempts (no write to the host's /etc) are tried on the host too, where
	// each must work; in the session, the same commands on what is its own are the control.
	hostSafe := tryScript + `try outside touch ` + outside + `
try /tmp touch ` + hostTmp + `
try ls ls /
try init kill -0 1
try daemon kill -0 ` + strconv.Itoa(os.Getpid()) + "\n"
	info, out, errOut, s := scopedRun(t, "capabilities: {containment: scoped, shell: {allow: [grep, touch, cat]}}", hostSafe+
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
	expectOutput(t, out, "Seccomp:\t2", "NoNewPrivs:\t1", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000")
	expectAllowed(t, out, "host-read", "own-tmp", "workdir", "own-signal")
	// Landlock holds the writes and exec (ls is not on the allowlist), its uid the signals.
	expectDenied(t, out, syscall.EACCES, "/etc", "outside", "/tmp", "ls")
	expectDenied(t, out, syscall.EPERM, "init", "daemon")
	if data, err := os.ReadFile(filepath.Join(s.Dir, "out.txt")); err != nil || string(data) != "hi\n" {
		t.Fatalf("workdir file: %q %v", data, err)
	}
	if _, err := os.Stat(hostTmp); err == nil {
		t.Fatalf("the session wrote %s", hostTmp)
	}
	expectAllowed(t, onHost(t, hostSafe), "outside", "/tmp", "ls", "init", "daemon")
}

func TestScopedScopeAndSockets(t *testing.T) {
	// The write inside the scope is the control: the same touch, where the session may.
	_, out, _, _ := scopedRun(t, "capabilities: {containment: scoped, filesystem: {scope: src}, shell: {allow: [touch, perl]}}", tryScript+
		`try outside touch outside
try inside touch src/inside
`+unixSocketProbe)
	expectAllowed(t, out, "inside")
	expectDenied(t, out, syscall.EACCES, "outside")
	expectOutput(t, out, "unix socket: Permission denied", "inet socket: allowed")
}

func TestScopedMemoryBomb(t *testing.T) {
	info, _, _, _ := scopedRun(t, "capabilities: {containment: scoped, resources: {cgroup_memory_bytes: 67108864}, shell: {allow: [tail]}}", `tail /dev/zero`)
	if info.Code != 128+int(syscall.SIGKILL) || !info.OOMKilled {
		t.Fatalf("memory bomb: %+v", info)
	}
}

// A scoped session has a network namespace of its own: the host's loopback services are out
// of reach, its own loopback works, and a pinned namespace given to it is the one it joins.
func TestScopedNetworkNamespace(t *testing.T) {
	needRoot(t)
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
	probe := tryScript + `try host-service curl -sSv --max-time 5 http://127.0.0.1:` + port + "/\n"
	_, tried, errOut, _ := scopedRun(t, "capabilities: {containment: scoped, shell: {allow: [curl, readlink, cat]}}", probe+
		`echo ---
readlink /proc/self/ns/net
cat /proc/net/dev`)
	tried, out, _ := strings.Cut(tried, "---\n")
	// Nothing listens on its own loopback; the host's service, which the host reaches
	// (the control), is in another namespace.
	expectDenied(t, tried, syscall.ECONNREFUSED, "host-service")
	expectAllowed(t, onHost(t, probe), "host-service")
	if strings.Contains(out, hostNS) {
		t.Fatalf("the scoped session shares the host's network (host %s):\n%s\n%s", hostNS, out, errOut)
	}
	expectOutput(t, out, "net:[")
	// Only lo: /proc/net/dev lists one interface.
	if n := strings.Count(out, ":"); n != 2 || !strings.Contains(out, "lo:") {
		t.Fatalf("interfaces other than lo:\n%s", out)
	}
}
