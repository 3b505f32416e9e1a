package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/cgtest"
	"roost.dev/roost/internal/testenv"
)

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
	t.Cleanup(func() {
		if err := cgtest.RemoveTree(parent); err != nil {
			t.Errorf("removing the test's cgroup parent: %v", err)
		}
	})
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

	roostd := cgtest.ProcCgroups(t, d.cmd.Process.Pid)
	adv := d.inspect(advisory)
	if adv.Containment.Achieved != "advisory" {
		t.Fatalf("the advisory capsule ran %s", adv.Containment.Achieved)
	}
	initPID, pid := sessionPIDs(t, adv)
	for what, p := range map[string]int{"roost-init": initPID, "the program": pid} {
		for h, cg := range cgtest.ProcCgroups(t, p) {
			if cg != path.Join(parent, advisory) {
				t.Errorf("the advisory session's %s (pid %d) is in %s in hierarchy %q, not %s", what, p, cg, h, path.Join(parent, advisory))
			}
			if cg == roostd[h] {
				t.Errorf("the advisory session's %s shares roostd's cgroup %s in hierarchy %q", what, cg, h)
			}
		}
	}
	for _, mnt := range hierarchies(t) {
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
	for _, mnt := range hierarchies(t) {
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

// hierarchies is every mounted cgroup hierarchy; a host with none fails the test.
func hierarchies(t *testing.T) []string {
	t.Helper()
	h := cgtest.Hierarchies()
	if len(h) == 0 {
		t.Fatal("no cgroup hierarchy is mounted")
	}
	return h
}
