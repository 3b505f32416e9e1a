package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"roost.dev/roost/internal/testenv"
)

// make install-check, on the binaries these tests built: make install into a temporary
// DESTDIR lays out binaries (0755), the unit (ExecStart under PREFIX), the default
// configuration and the docs, a second install keeps an edited configuration, and
// systemd-analyze verify accepts the unit as installed.
func TestOpsInstallCheck(t *testing.T) {
	_, err := exec.LookPath("systemd-analyze")
	testenv.Need(t, "systemd-analyze (apt-get install systemd; .ci/run installs it)", err)
	root, err := filepath.Abs(repoRoot())
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("make", "-C", root, "--no-print-directory", "install-check", "INSTALL_FROM="+binDir).CombinedOutput()
	if err != nil {
		t.Fatalf("make install-check: %v\n%s", err, out)
	}
	for _, prefix := range []string{"/usr/local", "/opt/roost"} {
		if !strings.Contains(string(out), "install-check: PREFIX="+prefix+": ") {
			t.Errorf("install-check did not check PREFIX=%s:\n%s", prefix, out)
		}
	}
}
