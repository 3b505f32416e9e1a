package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// command: ["python3", "./app.py", "./out.txt"] runs the capsule's app.py — the program's
// working directory is the session's workdir, which does not hold it — while ./out.txt,
// naming nothing in the capsule, stays the program's to write in its workdir. In sealed
// (the capsule at /capsule) and scoped (the capsule's own path) alike.
func TestCapsuleRelativeArguments(t *testing.T) {
	d := newDaemon(t)
	const app = "import os, sys\nprint('app.py ran as', sys.argv[0], 'in', os.getcwd())\nopen(sys.argv[1], 'w').write('written by app.py\\n')\n"
	for _, class := range []string{"sealed", "scoped"} {
		t.Run(class, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "args-"+class)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			manifest := "name: args\nversion: 0.1.0\nrun:\n  command: [python3, ./app.py, ./out.txt]\n" +
				"capabilities:\n  containment: " + class + "\n  shell: {allow: [\"@python\"]}\n"
			if err := os.WriteFile(filepath.Join(dir, "capsule.yaml"), []byte(manifest), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "app.py"), []byte(app), 0o644); err != nil {
				t.Fatal(err)
			}
			s, stdout := runWorkload(t, d, dir, class)
			if !strings.Contains(stdout, "app.py ran as ") || !strings.Contains(stdout, "/app.py in "+map[string]string{"sealed": "/work", "scoped": s.Workdir}[class]) {
				t.Errorf("stdout:\n%s", stdout)
			}
			if class == "sealed" && !strings.Contains(stdout, "ran as /capsule/app.py") {
				t.Errorf("a sealed session's app.py is not the one at /capsule:\n%s", stdout)
			}
			out, err := os.ReadFile(filepath.Join(s.Workdir, "out.txt"))
			if err != nil || string(out) != "written by app.py\n" {
				t.Errorf("the workdir's out.txt: %q, %v", out, err)
			}
		})
	}
	// The example shows the same: its app.py is the capsule's, its report the workdir's.
	t.Run("examples/python", func(t *testing.T) {
		s, stdout := runWorkload(t, d, filepath.Join(repoRoot(), "examples", "python"), "sealed")
		if !strings.Contains(stdout, "app.py ran from /capsule in /work: 2 files counted into ./report.txt") {
			t.Errorf("stdout:\n%s", stdout)
		}
		if out, err := os.ReadFile(filepath.Join(s.Workdir, "report.txt")); err != nil || !strings.Contains(string(out), "app.py: ") {
			t.Errorf("report.txt: %q, %v", out, err)
		}
	})
}
