package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
)

// cgroupHierarchies lists the mount point of every mounted cgroup hierarchy: each v1
// controller's, named ones (name=systemd), and the unified one.
func cgroupHierarchies(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		i := slices.Index(f, "-")
		if i < 0 || i+1 >= len(f) || len(f) < 5 {
			continue
		}
		if fstype := f[i+1]; (fstype == "cgroup" || fstype == "cgroup2") && !slices.Contains(out, f[4]) {
			out = append(out, f[4])
		}
	}
	if len(out) == 0 {
		t.Fatal("no cgroup hierarchy is mounted")
	}
	return out
}

// cgroupsOf reads a process's cgroups, by hierarchy ("" is the unified one).
func cgroupsOf(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatalf("pid %d: %v", pid, err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 {
			out[parts[1]] = parts[2]
		}
	}
	return out
}

// removeCgroupParent ends whatever a failed run left beneath parent and removes it from
// every hierarchy, deepest first.
func removeCgroupParent(t *testing.T, parent string) {
	for _, mnt := range cgroupHierarchies(t) {
		root := filepath.Join(mnt, parent)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if data, err := os.ReadFile(filepath.Join(dirs[i], "cgroup.procs")); err == nil {
				for _, f := range strings.Fields(string(data)) {
					var pid int
					if _, err := fmt.Sscan(f, &pid); err == nil {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
			for range 50 {
				if err := syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}

// sessionPIDs reads the session's init.json: roost-init's pid and the program's (host
// pids for a plain session).
func sessionPIDs(t *testing.T, s session) (initPID, pid int) {
	t.Helper()
	var ref struct {
		InitPID int `json:"init_pid"`
		PID     int `json:"pid"`
	}
	data, err := os.ReadFile(filepath.Join(s.RecordsDir, "init.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	return ref.InitPID, ref.PID
}

// roostd --cgroup-parent puts every session's cgroup beneath that parent, the plain
// classes' too: an advisory session's roost-init and program share no cgroup with roostd,
// a sealed session's cgroup is <parent>/<session> in every hierarchy, and after roostd is
// SIGKILLed and started again, recovery and `roostctl rm` leave nothing beneath the parent.
//
// It needs roostd's --cgroup-parent flag (cgroups.New, containment.WithCgroups).
func TestCgroupParent(t *testing.T) {
	testenv.NeedRoot(t, "sessions' cgroups need root")
	parent := fmt.Sprintf("/roost-e2e-%d", os.Getpid())
	t.Cleanup(func() { removeCgroupParent(t, parent) })
	d := newDaemon(t, "--cgroup-parent", parent)

	sleeper := func(name, extra string) string {
		return strings.TrimSpace(d.ok("run", "--detach", capsule(t, name, "echo ready; sleep 60", extra)))
	}
	advisory := sleeper("adv", "")
	sealed := sleeper("sealed", "capabilities:\n  containment: sealed\n  shell:\n    allow: [sleep]\n")
	// One that ends while no daemon watches: recovery records its end and releases it.
	brief := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "brief", "echo ready; sleep 2", "")))
	ids := []string{advisory, sealed, brief}
	for _, id := range ids {
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(d.ok("logs", id), "ready"); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("session %s never said ready: %+v\n%s", id, d.inspect(id), d.log)
			}
		}
	}

	roostd := cgroupsOf(t, d.cmd.Process.Pid)
	adv := d.inspect(advisory)
	if adv.Containment.Achieved != "advisory" {
		t.Fatalf("the advisory capsule ran %s", adv.Containment.Achieved)
	}
	initPID, pid := sessionPIDs(t, adv)
	for what, p := range map[string]int{"roost-init": initPID, "the program": pid} {
		for h, cg := range cgroupsOf(t, p) {
			if cg != path.Join(parent, advisory) {
				t.Errorf("the advisory session's %s (pid %d) is in %s in hierarchy %q, not %s", what, p, cg, h, path.Join(parent, advisory))
			}
			if cg == roostd[h] {
				t.Errorf("the advisory session's %s shares roostd's cgroup %s in hierarchy %q", what, cg, h)
			}
		}
	}
	for _, mnt := range cgroupHierarchies(t) {
		if _, err := os.Stat(filepath.Join(mnt, parent, sealed)); err != nil {
			t.Errorf("the sealed session's cgroup in %s: %v", mnt, err)
		}
		if _, err := os.Stat(filepath.Join(mnt, "roost", sealed)); err == nil {
			t.Errorf("the sealed session has a cgroup under /roost in %s too", mnt)
		}
	}

	briefRec := d.inspect(brief)
	d.kill9()
	waitFor(t, "the brief session to end while no daemon watches", func() bool { return programEnded(briefRec) })
	d.start()
	if s := d.inspect(brief); s.State != "exited" {
		t.Errorf("the brief session after the restart: %+v", s)
	}
	for _, id := range ids {
		if s := d.inspect(id); s.State != "exited" {
			d.ok("kill", id)
		}
		d.ok("rm", id)
	}
	for _, mnt := range cgroupHierarchies(t) {
		entries, err := os.ReadDir(filepath.Join(mnt, parent))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v", mnt, err)
		}
		for _, e := range entries {
			if e.IsDir() {
				t.Errorf("%s is left behind", filepath.Join(mnt, parent, e.Name()))
			}
		}
	}
}
