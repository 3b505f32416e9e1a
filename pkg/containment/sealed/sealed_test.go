package sealed_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"roost.dev/roost/pkg/containment/internal/testkit"
)

func TestSealedBasics(t *testing.T) {
	info, out, errOut, s := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls, tr, grep, touch]}}",
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
	probe := testkit.TryScript + `try ls ls /
try cat cat /etc/hostname
try env /usr/bin/env true`
	info, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls]}}", probe)
	if info.Code != 0 {
		t.Fatalf("exit %+v", info)
	}
	testkit.ExpectAllowed(t, out, "ls")
	testkit.ExpectDenied(t, out, syscall.EACCES, "cat", "env")
	// The control: on the allowlist, they run.
	_, out, _, _ = kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls, cat, env, /usr/bin/true]}}", probe)
	testkit.ExpectAllowed(t, out, "ls", "cat", "env")
}

// A sealed root has the /etc that name lookups need.
func TestSealedEtc(t *testing.T) {
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [grep]}}",
		`grep -q '^tcp' /etc/protocols && echo protocols; grep -q '^http' /etc/services && echo services; grep -q '^root:x:0:0:root:/root:' /etc/passwd && echo passwd`)
	testkit.ExpectOutput(t, out, "protocols", "services", "passwd")
}
