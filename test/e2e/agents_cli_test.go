package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"roost.dev/roost/internal/testenv"
)

// The coding agents' CLIs as an operator installs them (npm install -g, into the system
// trees: .ci/run does it), each run as a capsule in a sealed and a scoped session whose view
// of the system trees is its allowlist's closure: Claude Code's native binary and its
// libraries; Codex's node launcher, node, and the native binary it execs from its package.
func TestCodingAgentCLIs(t *testing.T) {
	claude, codex := agentCLI(t, "claude"), agentCLI(t, "codex")
	vendor := codexVendor(t, codex)
	d := newDaemon(t)
	for _, c := range []struct{ name, caps, script, want string }{
		{"claude", `  shell: {allow: ["` + claude + `"]}` + "\n", claude + " --version\n", "(Claude Code)"},
		{"codex", `  shell: {allow: ["@node", "` + codex + `", "` + vendor + `"]}` + "\n", codex + " --version\n", "codex-cli "},
	} {
		for _, class := range []string{"sealed", "scoped"} {
			t.Run(c.name+"/"+class, func(t *testing.T) {
				dir := workloadCapsule(t, "agent-cli-"+c.name, class, c.caps, "", c.script)
				_, stdout := runWorkload(t, d, dir, class)
				if !strings.Contains(stdout, c.want) {
					t.Fatalf("stdout lacks %q:\n%s", c.want, stdout)
				}
				t.Logf("%s", strings.TrimSpace(stdout))
			})
		}
	}
}

// agentCLI is where a coding agent's CLI is on the default PATH: .ci/run installs it, and on
// CI its absence fails the test.
func agentCLI(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testenv.Need(t, name+" (.ci/run installs it with npm install -g)", err)
	}
	return p
}

// codexVendor is the vendor directory of Codex's platform package: its node launcher runs the
// native binary there, beneath its own package.
func codexVendor(t *testing.T, codex string) string {
	t.Helper()
	launcher, err := filepath.EvalSymlinks(codex)
	if err != nil {
		t.Fatal(err)
	}
	vendors, _ := filepath.Glob(filepath.Join(filepath.Dir(filepath.Dir(launcher)), "node_modules", "@openai", "codex-linux-*", "vendor"))
	if len(vendors) == 0 {
		t.Fatalf("no vendor directory of a codex-linux-* package beneath %s", launcher)
	}
	return vendors[0]
}
