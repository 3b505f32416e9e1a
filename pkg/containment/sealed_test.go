package containment

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"roost.dev/roost/pkg/containment/seccomp"
	"roost.dev/roost/pkg/manifest"
)

var (
	initOnce sync.Once
	initBin  string
	initErr  error
)

// staticInit builds cmd/roost-init once, static, as the Makefile does: sealed roots mount it.
func staticInit(t *testing.T) string {
	t.Helper()
	initOnce.Do(func() {
		dir, err := os.MkdirTemp("", "roost-init-")
		if err != nil {
			initErr = err
			return
		}
		initBin = filepath.Join(dir, InitName)
		cmd := exec.Command("go", "build", "-trimpath", "-o", initBin, "roost.dev/roost/cmd/roost-init")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			initErr = fmt.Errorf("building roost-init: %v\n%s", err, out)
		}
	})
	if initErr != nil {
		t.Fatal(initErr)
	}
	return initBin
}

// warmTests starts the sealed sessions sealedRun runs in sandboxes made ahead, where they
// fit: make unit runs the sealed and hostile suites both ways.
var warmTests = flag.Bool("warm", false, "start sealed test sessions in sandboxes made ahead (roostd --warm-pool) where they fit")

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sealed sessions need root")
	}
	if !seccomp.Built {
		t.Skip("built without the seccomp tag: run with -tags seccomp (make test does)")
	}
}

func sealedPolicy(t *testing.T, caps string) *manifest.Policy {
	t.Helper()
	p := policy(t, caps)
	return &p
}

// sealedRun runs a shell script as a sealed session and returns its exit and output.
func sealedRun(t *testing.T, caps, script string) (ExitInfo, string, string, Spec) {
	t.Helper()
	needRoot(t)
	state := reachableDir(t)
	rt, err := NewSealedRuntime(state, staticInit(t), testIDs(), testSealer(t))
	if err != nil {
		t.Fatal(err)
	}
	name := strings.ReplaceAll(strings.ToLower(t.Name()), "/", "_")
	s := sealedSpec(t, "ses_"+name, caps, script)
	s.Env = append(s.Env, "HOME=/work")
	var p Process
	if *warmTests {
		// A default capsule's shape when the session fits it, else one made for its own
		// policy, as roostd --warm-pool-capsule makes.
		shape := DefaultWarmShape()
		if rt.Fits(shape, s.Policy, false) != nil {
			shape = WarmShape{Name: "its own", Policy: s.Policy}
		}
		sb := prepare(t, rt, shape, name)
		claimSandbox(t, &s, sb.IDs, sb.Records)
		p, err = rt.StartWarm(context.Background(), sb, s)
	} else {
		p, err = rt.Start(context.Background(), s)
	}
	if err != nil {
		t.Fatalf("sealed start: %v", err)
	}
	info := waitDone(t, p)
	if err := rt.Release(s.SessionID); err != nil {
		t.Errorf("release: %v", err)
	}
	out := readFile(t, filepath.Join(s.RecordsDir, StdoutFile))
	errOut := readFile(t, filepath.Join(s.RecordsDir, StderrFile))
	return info, out, errOut, s
}

func TestSealedBasics(t *testing.T) {
	info, out, errOut, s := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls, tr, grep, touch]}}",
		`ls -A / | tr '\n' ' '; echo; grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status; touch /usr/x 2>&1 || true; echo hi > /work/out.txt; exit 4`)
	t.Logf("stdout:\n%s\nstderr:\n%s", out, errOut)
	if info.Code != 4 {
		t.Fatalf("exit %+v", info)
	}
	for _, want := range []string{"Seccomp:\t2", "NoNewPrivs:\t1", "CapEff:\t0000000000000000", "Read-only file system"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if data, err := os.ReadFile(filepath.Join(s.Dir, "out.txt")); err != nil || string(data) != "hi\n" {
		t.Fatalf("workdir file: %q %v", data, err)
	}
}

func TestSealedExecAllowlist(t *testing.T) {
	probe := tryScript + `try ls ls /
try cat cat /etc/hostname
try env /usr/bin/env true`
	info, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls]}}", probe)
	if info.Code != 0 {
		t.Fatalf("exit %+v", info)
	}
	expectAllowed(t, out, "ls")
	expectDenied(t, out, syscall.EACCES, "cat", "env")
	// The control: on the allowlist, they run.
	_, out, _, _ = sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls, cat, env, /usr/bin/true]}}", probe)
	expectAllowed(t, out, "ls", "cat", "env")
}

// A container libcontainer still calls created (its exec fifo file is there) has been
// released when its init has become roost-init, or has written init.json: recovery must
// re-attach it, not destroy a running program.
func TestReleasedInit(t *testing.T) {
	dir := t.TempDir()
	start := func(name string) int {
		t.Helper()
		bin := filepath.Join(dir, name)
		data, err := os.ReadFile("/bin/sleep")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}
	records := t.TempDir()
	blocked := start("exe")
	if released(records, blocked) {
		t.Error("an init still waiting on its fifo counts as released")
	}
	if !released(records, start(InitName)) {
		t.Error("an init that has become roost-init does not count as released")
	}
	if err := os.WriteFile(filepath.Join(records, "init.json"), []byte(`{"init_pid":1,"pid":2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if !released(records, blocked) {
		t.Error("an init that wrote init.json does not count as released")
	}
}
