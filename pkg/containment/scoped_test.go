package containment

import (
	"context"
	"net"
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
	info, out, errOut, s := scopedRun(t, "capabilities: {containment: scoped, shell: {allow: [grep, touch, cat]}}",
		`grep -E '^(Seccomp|NoNewPrivs|CapEff|CapBnd):' /proc/self/status
cat /etc/hostname >/dev/null && echo "host readable"
touch /etc/evil 2>/dev/null && echo "WROTE /etc" || echo "refused /etc"
touch `+outside+` 2>/dev/null && echo "WROTE outside" || echo "refused outside"
touch `+hostTmp+` 2>/dev/null && echo "WROTE /tmp" || echo "refused /tmp"
touch "$TMPDIR/mine" && echo "own tmp writable"
echo hi > out.txt && echo "workdir writable"
ls / >/dev/null 2>&1 && echo "RAN ls" || echo "ls refused"
kill -0 1 2>/dev/null && echo "SIGNALLED init" || echo "signal refused"
kill -0 `+strconv.Itoa(os.Getpid())+` 2>/dev/null && echo "SIGNALLED the daemon" || echo "daemon signal refused"`)
	if info.Code != 0 {
		t.Fatalf("exit %+v\n%s\n%s", info, out, errOut)
	}
	if strings.Contains(out, "WROTE") || strings.Contains(out, "RAN") || strings.Contains(out, "SIGNALLED") {
		t.Fatalf("scoped session escaped:\n%s", out)
	}
	expectOutput(t, out, "Seccomp:\t2", "NoNewPrivs:\t1", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000",
		"host readable", "refused /etc", "refused outside", "refused /tmp", "own tmp writable", "workdir writable", "ls refused", "signal refused", "daemon signal refused")
	if data, err := os.ReadFile(filepath.Join(s.Dir, "out.txt")); err != nil || string(data) != "hi\n" {
		t.Fatalf("workdir file: %q %v", data, err)
	}
}

func TestScopedScopeAndSockets(t *testing.T) {
	_, out, _, _ := scopedRun(t, "capabilities: {containment: scoped, filesystem: {scope: src}, shell: {allow: [touch, perl]}}",
		`touch outside 2>/dev/null && echo "WROTE outside" || echo "refused outside"
touch src/inside && echo "wrote inside"
`+unixSocketProbe)
	if strings.Contains(out, "WROTE") {
		t.Fatalf("a write escaped the scope:\n%s", out)
	}
	expectOutput(t, out, "refused outside", "wrote inside", "unix socket: Permission denied", "inet socket: allowed")
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
			c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost service\n"))
			c.Close()
		}
	}()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	hostNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	_, out, errOut, _ := scopedRun(t, "capabilities: {containment: scoped, shell: {allow: [curl, readlink, cat]}}",
		`readlink /proc/self/ns/net
curl -s --max-time 5 http://127.0.0.1:`+port+`/ && echo "REACHED the host" || echo "host loopback unreachable"
cat /proc/net/dev`)
	if strings.Contains(out, "REACHED") || strings.Contains(out, hostNS) {
		t.Fatalf("the scoped session shares the host's network (host %s):\n%s\n%s", hostNS, out, errOut)
	}
	expectOutput(t, out, "host loopback unreachable", "net:[")
	// Only lo: /proc/net/dev lists one interface.
	if n := strings.Count(out, ":"); n != 2 || !strings.Contains(out, "lo:") {
		t.Fatalf("interfaces other than lo:\n%s", out)
	}
}
