package cgroups

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	ocgroups "github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/cgtest"
	"roost.dev/roost/internal/testenv"
)

var lastTestParent atomic.Int32

func TestCgroupParentRefused(t *testing.T) {
	for _, parent := range []string{"roost", "./roost", "/roost/", "/roost//x", "/roost/../etc", "/..", "/", "/roost/./x", "/ro\nost", "/ro\x00st"} {
		if _, err := New(Config{Parent: parent}); err == nil || !strings.Contains(err.Error(), "--cgroup-parent") {
			t.Errorf("parent %q: %v", parent, err)
		}
	}
	// A parent that holds roostd's own cgroup, in any hierarchy.
	for h, p := range cgtest.ProcCgroups(t, os.Getpid()) {
		if p == "/" {
			continue
		}
		for _, parent := range []string{p, path.Dir(p)} {
			if parent == "/" {
				continue
			}
			if _, err := New(Config{Parent: parent}); err == nil || !strings.Contains(err.Error(), "roostd's own cgroup") {
				t.Errorf("parent %s holding the test's cgroup %s (%q): %v", parent, p, h, err)
			}
		}
	}
	if _, err := New(Config{Driver: "lxc"}); err == nil || !strings.Contains(err.Error(), `--cgroup-driver "lxc"`) {
		t.Errorf("unknown driver: %v", err)
	}
	if _, err := New(Config{Parent: "/roost-ok/x"}); err != nil {
		t.Errorf("a good parent: %v", err)
	}
}

// A session id that is not one path element names no session's cgroup: Remove (what every
// runtime's Release calls) refuses it rather than kill what is somewhere else.
func TestCgroupsRefuseForeignIDs(t *testing.T) {
	c := &Sessions{driver: DriverCgroupfs, parent: "/roost-never"}
	for _, id := range []string{"", ".", "..", "../etc", "a/b", ".hidden", "x\ny"} {
		if err := c.Remove(id); err == nil {
			t.Errorf("Remove(%q) accepted", id)
		}
	}
	// A note naming another cgroup than the session's is not followed.
	for _, p := range []Place{
		{DriverCgroupfs, "/"}, {DriverCgroupfs, "/ses_x"}, {DriverCgroupfs, "/roost/other"},
		{DriverCgroupfs, "/roost/../ses_x"}, {DriverSystemd, "roost.slice:roost:other"},
		{DriverSystemd, "-.slice:roost:ses_x"}, {DriverSystemd, "roost.slice:runc:ses_x"}, {"lxc", "/roost/ses_x"},
	} {
		if err := p.Check("ses_x"); err == nil {
			t.Errorf("place %+v accepted for ses_x", p)
		}
	}
}

// The systemd driver cannot be tested here (no systemd as PID 1): it is refused with a
// clear error, and its names are checked.
func TestCgroupsSystemdDriver(t *testing.T) {
	if ok, why := SystemdAvailable(); !ok {
		want := "--cgroup-driver systemd: " + why + "; use --cgroup-driver cgroupfs"
		if _, err := os.Stat("/run/systemd/system"); err != nil {
			want = "--cgroup-driver systemd: systemd is not running as PID 1 on this host (no /run/systemd/system); use --cgroup-driver cgroupfs"
		}
		for _, cfg := range []Config{{Driver: DriverSystemd}, {Driver: DriverSystemd, Parent: "machine-roost.slice"}} {
			if _, err := New(cfg); err == nil || err.Error() != want {
				t.Errorf("systemd driver without systemd: %v, want %s", err, want)
			}
		}
	} else {
		t.Log("systemd is PID 1 here: " + why)
	}
	for _, slice := range []string{"roost", "roost.scope", "-.slice", "a--b.slice", "-a.slice", "a/b.slice", "ro ost.slice", ".slice"} {
		if _, err := New(Config{Driver: DriverSystemd, Parent: slice}); err == nil || !strings.Contains(err.Error(), "--cgroup-parent") {
			t.Errorf("slice %q: %v", slice, err)
		}
	}
	for _, slice := range []string{"roost.slice", "machine-roost.slice"} {
		if err := checkSlice(slice); err != nil {
			t.Errorf("slice %q: %v", slice, err)
		}
	}
	c := &Sessions{driver: DriverSystemd, parent: "machine-roost.slice"}
	p := c.PlaceOf("ses_0123abcd")
	if p.Path != "machine-roost.slice:roost:ses_0123abcd" || p.unitName() != "roost-ses_0123abcd.scope" || p.Check("ses_0123abcd") != nil {
		t.Errorf("place %+v, unit %s, check %v", p, p.unitName(), p.Check("ses_0123abcd"))
	}
	cfg := p.config(nil)
	if !cfg.Systemd || cfg.Parent != "machine-roost.slice" || cfg.ScopePrefix != "roost" || cfg.Name != "ses_0123abcd" || cfg.Path != "" || !cfg.Resources.SkipDevices {
		t.Errorf("libcontainer config %+v", cfg)
	}
	if got := c.OCIPath("ses_0123abcd"); got != "machine-roost.slice:roost:ses_0123abcd" {
		t.Errorf("OCI cgroupsPath %s", got)
	}
	if got := c.Parents(); !slices.Equal(got, []string{"/machine.slice/machine-roost.slice", FallbackParent}) {
		t.Errorf("parents %v", got)
	}
	if err := c.PlaceOf("ses x").Check("ses x"); err == nil {
		t.Error("a session id that names no unit accepted")
	}
	if !isNoUnit(errors.New("Unit roost-ses_x.scope not loaded.")) || isNoUnit(errors.New("Access denied")) || isNoUnit(nil) {
		t.Error("isNoUnit")
	}
}

func TestDefaultCgroupParentDecision(t *testing.T) {
	marks := map[string]string{"/system.slice/roostd.service": "trusted.delegate=1", "/user.slice/x.scope": "user.delegate=1"}
	isDelegated := func(cg string) (bool, string) { how, ok := marks[cg]; return ok, how }
	for _, tc := range []struct{ mode, own, want, why string }{
		{"v1", "", "/roost", "cgroup v1"},
		{"hybrid", "/", "/roost", "root cgroup"},
		{"v2", "/", "/roost", "root cgroup"},
		// Delegated, but roostd is in the cgroup itself: moving out would keep systemd from
		// starting it there again while sessions live, so not by default.
		{"v2", "/system.slice/roostd.service", "/roost", "DelegateSubgroup=supervisor"},
		{"hybrid", "/system.slice/roostd.service", "/roost", "every v1 hierarchy"},
		{"v2", "/system.slice/roostd.service/supervisor", "/system.slice/roostd.service/sessions", "supervisor leaf"},
		{"v2", "/user.slice/x.scope", "/roost", "user.delegate=1"},
		{"v2", "/user.slice/x.scope/supervisor", "/user.slice/x.scope/sessions", "user.delegate=1"},
		{"v2", "/system.slice/other.service", "/roost", "not delegated"},
		{"v2", "/system.slice/other.service/supervisor", "/roost", "not delegated"},
		{"v2", "/supervisor", "/roost", "not delegated"},
	} {
		got, why := defaultParent(tc.mode, tc.own, isDelegated)
		if got != tc.want || !strings.Contains(why, tc.why) {
			t.Errorf("%s, own %s: %s (%s), want %s (…%s…)", tc.mode, tc.own, got, why, tc.want, tc.why)
		}
	}
	for _, tc := range []struct{ own, parent, want string }{
		{"/a", "/a/sessions", "/a"},
		{"/a/supervisor", "/a/sessions", "/a"},
		{"/a/supervisor", "/a/supervisor/x", "/a/supervisor"},
		{"/a", "/roost", ""},
		{"/", "/roost", ""},
		{"/a/b", "/a/sessions", ""},
	} {
		if got := leafRoot(tc.own, tc.parent); got != tc.want {
			t.Errorf("leafRoot(%s, %s) = %q, want %q", tc.own, tc.parent, got, tc.want)
		}
	}
	// This host, as the test runs on it.
	parent, why := DefaultParent()
	t.Logf("default cgroup parent here (%s): %s: %s", Mode(), parent, why)
	if own, err := ownUnifiedCgroup(); Mode() != "v1" && err == nil && own == "/" && parent != FallbackParent {
		t.Errorf("in the root cgroup the default parent is %s", parent)
	}
}

// unifiedTestCgroup makes a cgroup of this test's own in the unified hierarchy.
func unifiedTestCgroup(t *testing.T, name string) (mnt, cg string) {
	t.Helper()
	cgtest.RequireRoot(t)
	mnt = unifiedMountpoint()
	if mnt == "" {
		testenv.Need(t, "a unified cgroup hierarchy", errors.New("none is mounted"))
	}
	cg = fmt.Sprintf("/roost-test-%d-%s-%d", os.Getpid(), name, lastTestParent.Add(1))
	if err := os.Mkdir(filepath.Join(mnt, cg), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cgtest.RemoveTree(cg) })
	return mnt, cg
}

// systemd's delegation mark is read from the cgroup itself.
func TestCgroupsDelegationMark(t *testing.T) {
	mnt, cg := unifiedTestCgroup(t, "mark")
	dir := filepath.Join(mnt, cg)
	if ok, how := delegated(dir); ok {
		t.Fatalf("an unmarked cgroup counts as delegated: %s", how)
	}
	if err := unix.Setxattr(dir, "trusted.delegate", []byte("1"), 0); err != nil {
		testenv.Need(t, "the trusted.delegate xattr on cgroupfs", err)
	}
	if ok, how := delegated(dir); !ok || how != "trusted.delegate=1" {
		t.Fatalf("delegated %v %q", ok, how)
	}
	isDelegated := func(c string) (bool, string) { return delegated(filepath.Join(mnt, c)) }
	// roostd in the delegated cgroup itself: not by default (see defaultParent).
	if parent, why := defaultParent("v2", cg, isDelegated); parent != FallbackParent || !strings.Contains(why, "DelegateSubgroup=supervisor") {
		t.Fatalf("in the delegated cgroup: %s: %s", parent, why)
	}
	// roostd in its supervisor leaf: sessions beneath the delegated cgroup.
	if parent, why := defaultParent("v2", cg+"/"+SupervisorName, isDelegated); parent != cg+"/sessions" || !strings.Contains(why, "trusted.delegate=1") {
		t.Fatalf("in its supervisor leaf: %s: %s", parent, why)
	}
}

// roostd leaves a cgroup its sessions' go beneath for its leaf, with every process there:
// the "no internal processes" rule lets only an empty cgroup hand controllers down.
func TestCgroupsEnterLeaf(t *testing.T) {
	mnt, cg := unifiedTestCgroup(t, "leaf")
	var pids []int
	for range 3 {
		cmd := exec.Command("/bin/sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if err := ocgroups.WriteCgroupProc(filepath.Join(mnt, cg), cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, cmd.Process.Pid)
	}
	if err := enterLeaf(mnt, cg); err != nil {
		t.Fatal(err)
	}
	if left, err := readProcs(filepath.Join(mnt, cg)); err != nil || len(left) != 0 {
		t.Fatalf("left in %s: %v %v", cg, left, err)
	}
	for _, pid := range pids {
		if got := cgtest.ProcCgroups(t, pid)[""]; got != cg+"/"+SupervisorName {
			t.Errorf("pid %d is in %s", pid, got)
		}
	}
	// Again: a second start finds the leaf there.
	if err := enterLeaf(mnt, cg); err != nil {
		t.Fatal(err)
	}
}

// A claimed sandbox's note becomes its session's in one rename: the session's place is the
// sandbox's cgroup, and the sandbox has no note left to remove it by. Without a note to move,
// the session is noted at the sandbox's place all the same.
func TestMoveNote(t *testing.T) {
	c, err := New(Config{Parent: "/roost-never", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Note("warm-1", c.PlaceOf("warm-1")); err != nil {
		t.Fatal(err)
	}
	for _, m := range [][2]string{{"warm-1", "ses_a"}, {"warm-2", "ses_b"}} {
		if err := c.Move(m[0], m[1]); err != nil {
			t.Fatal(err)
		}
		if _, ok := c.noted(m[0]); ok {
			t.Errorf("%s is still noted after its move to %s", m[0], m[1])
		}
		p, ok := c.noted(m[1])
		if !ok || p != c.PlaceOf(m[0]) {
			t.Errorf("%s noted at %+v (%v), want %s's place %+v", m[1], p, ok, m[0], c.PlaceOf(m[0]))
		}
	}
	held, err := c.Held()
	if err != nil || !slices.Equal(held, []string{"ses_a", "ses_b"}) {
		t.Errorf("held %v, %v; want ses_a and ses_b", held, err)
	}
}
