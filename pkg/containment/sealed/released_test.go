package sealed

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"roost.dev/roost/pkg/containment"
)

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
	if !released(records, start(containment.InitName)) {
		t.Error("an init that has become roost-init does not count as released")
	}
	if err := os.WriteFile(filepath.Join(records, "init.json"), []byte(`{"init_pid":1,"pid":2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if !released(records, blocked) {
		t.Error("an init that wrote init.json does not count as released")
	}
}
