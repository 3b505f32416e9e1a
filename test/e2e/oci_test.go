package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `explain --oci` tells the truth: the OCI runtime-tools' runtimetest, run as a sealed
// session's program against the config.json explain printed for it, finds the session as
// the spec says — cwd, rlimits, namespaces, id maps, mounts, masked and read-only paths,
// capabilities, no_new_privs, hostname. What it cannot match by design is the process
// arguments: the spec's process is roost-init, the session's PID 1, which starts the program.
func TestExplainOCIMatchesTheSession(t *testing.T) {
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "runtimetest"), "github.com/opencontainers/runtime-tools/cmd/runtimetest")
	build.Dir = filepath.Join(repoRoot(), "tools")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building runtimetest: %v\n%s", err, out)
	}
	d := newDaemon(t)
	dir := filepath.Join(t.TempDir(), "rt")
	os.MkdirAll(filepath.Join(dir, "bin"), 0o755)
	data, _ := os.ReadFile(filepath.Join(bin, "runtimetest"))
	os.WriteFile(filepath.Join(dir, "bin", "runtimetest"), data, 0o755)
	os.WriteFile(filepath.Join(dir, "capsule.yaml"), []byte(`name: rt
version: 0.1.0
run:
  command: [bin/runtimetest, --path, /work, --compliance-level, must]
capabilities:
  containment: sealed
  resources:
    max_open_files: 2048
`), 0o644)
	work := filepath.Join(t.TempDir(), "work")
	os.Mkdir(work, 0o755)
	config := d.ok("explain", "--oci", dir)
	if err := os.WriteFile(filepath.Join(work, "config.json"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	res := d.ctl("run", "--workdir", work, dir)
	var failed []string
	passed := 0
	for _, line := range strings.Split(res.stdout, "\n") {
		switch {
		case strings.HasPrefix(line, "ok "):
			passed++
		case strings.HasPrefix(line, "not ok ") && !strings.Contains(line, "# TODO") && !strings.Contains(line, "# SKIP"):
			if !strings.Contains(line, "process argument") {
				failed = append(failed, line)
			}
		}
	}
	if passed < 200 || len(failed) > 0 {
		t.Fatalf("runtimetest: %d passed; failed beyond the process arguments:\n%s\n\nfull output:\n%s%s", passed, strings.Join(failed, "\n"), res.stdout, res.stderr)
	}
	t.Logf("runtimetest: %d checks passed; only the process arguments differ (roost-init is the spec's process)", passed)
}
