package containment

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	cgroupsmanager "github.com/opencontainers/cgroups/manager"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/manifest"
)

// hierarchies lists the mount point of every cgroup hierarchy mounted here: each v1
// controller's (and named ones such as name=systemd) and the unified one. It reads this
// thread's mounts, not the main thread's: libcontainer joins a container's mount namespace
// on a locked thread it lets end, and when that thread is the main one Go parks it instead,
// in that namespace, which /proc/self then shows.
func hierarchies() []string {
	data, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil
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
	return out
}

// removeCgroupTree ends what is left beneath the cgroup parent and removes it from every
// hierarchy.
func removeCgroupTree(parent string) error {
	var err error
	for range 50 {
		err = nil
		for _, mnt := range hierarchies() {
			dir := filepath.Join(mnt, parent)
			if pids, perr := cgroups.GetAllPids(dir); perr == nil {
				for _, pid := range pids {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			err = errors.Join(err, cgroups.RemovePath(dir))
		}
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

var lastTestParent atomic.Int32

// testCgroups is a cgroupfs configuration whose parent is this test's own, removed with
// everything beneath it when the test ends; notes go to stateDir ("" for none).
func testCgroups(t *testing.T, stateDir string) *Cgroups {
	t.Helper()
	parent := fmt.Sprintf("/roost-test-%d-%d", os.Getpid(), lastTestParent.Add(1))
	c, err := NewCgroups(CgroupConfig{Parent: parent, StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroupTree(parent) })
	return c
}

// procCgroups reads a process's cgroups, one entry per hierarchy ("" the unified one; the
// controllers of a v1 line joined by commas, as the kernel writes them).
func procCgroups(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			out[parts[1]] = parts[2]
		}
	}
	return out
}

// expectIn fails unless pid is in cgroup in every hierarchy.
func expectIn(t *testing.T, what string, pid int, cgroup string) {
	t.Helper()
	for h, p := range procCgroups(t, pid) {
		if p != cgroup {
			t.Errorf("%s (pid %d) is in %s in hierarchy %q, not in %s", what, pid, p, h, cgroup)
		}
	}
}

// expectDirs fails unless the cgroup's directory exists in every mounted hierarchy (want),
// or in none.
func expectDirs(t *testing.T, cgroup string, want bool) {
	t.Helper()
	mounts := hierarchies()
	if len(mounts) == 0 {
		t.Fatal("no cgroup hierarchy is mounted")
	}
	for _, mnt := range mounts {
		_, err := os.Stat(filepath.Join(mnt, cgroup))
		if want && err != nil {
			t.Errorf("%s: %v", mnt, err)
		}
		if !want && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s%s is left behind (%v)", mnt, cgroup, err)
		}
	}
}

// waitOutput waits until the session's stdout holds want.
func waitOutput(t *testing.T, s Spec, want string) string {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if data, _ := os.ReadFile(filepath.Join(s.RecordsDir, StdoutFile)); strings.Contains(string(data), want) {
			return string(data)
		}
	}
	data, _ := os.ReadFile(filepath.Join(s.RecordsDir, StdoutFile))
	errOut, _ := os.ReadFile(filepath.Join(s.RecordsDir, StderrFile))
	t.Fatalf("no %q in the session's output:\n%s\n%s", want, data, errOut)
	return ""
}

func killAndWait(t *testing.T, p Process) {
	t.Helper()
	_ = p.Signal(syscall.SIGKILL)
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("session did not end")
	}
}

// Advisory and unconfined sessions leave roostd's cgroup: roost-init and the program are in
// <parent>/<session> in every hierarchy, never in the caller's; the program, an unprivileged
// uid, cannot move itself out (into the root of a hierarchy, or back into roostd's); Release
// removes the cgroup everywhere.
func TestCgroupsPlainSessionsHaveTheirOwn(t *testing.T) {
	needRoot(t)
	own := procCgroups(t, os.Getpid())
	// Every cgroup.procs the program might try to move itself into: each hierarchy's root
	// and this test process's own cgroups.
	var targets []string
	for _, mnt := range hierarchies() {
		targets = append(targets, filepath.Join(mnt, "cgroup.procs"))
		for h, p := range own {
			name := strings.TrimPrefix(h, "name=")
			if h == "" && (filepath.Base(mnt) == "unified" || mnt == "/sys/fs/cgroup") || h != "" && filepath.Base(mnt) == name {
				targets = append(targets, filepath.Join(mnt, p, "cgroup.procs"))
			}
		}
	}
	for _, class := range []manifest.Class{manifest.Advisory, manifest.Unconfined} {
		t.Run(class.String(), func(t *testing.T) {
			c := testCgroups(t, "")
			rt := NewProcessRuntime(SelfInit, WithCgroups(c))
			probe := tryScript + `move() { echo $$ > "$1"; }
for f in ` + strings.Join(targets, " ") + `; do try $f move $f; done
`
			s := spec(t, "/bin/sh", "-c", probe+`echo ready; sleep 30`)
			s.SessionID = "ses_plain_" + class.String()
			s.Class = class
			p, err := rt.Start(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Signal(syscall.SIGKILL) })
			out := waitOutput(t, s, "ready")
			// The files are root's: the program's uid may not write them. The control: a
			// shell of the host's root moves itself into each (and ends).
			expectDenied(t, out, syscall.EACCES, targets...)
			expectAllowed(t, onHost(t, probe), targets...)
			cg := path.Join(c.Parent(), s.SessionID)
			ref := p.Ref()
			expectIn(t, "roost-init", ref.InitPID, cg)
			expectIn(t, "the program", ref.PID, cg)
			for h, p := range procCgroups(t, ref.PID) {
				if own[h] == p {
					t.Errorf("the program shares the test's cgroup %s in hierarchy %q", p, h)
				}
			}
			expectDirs(t, cg, true)
			u, err := p.(Meter).Usage()
			if err != nil || u.Pids < 2 || u.MemoryBytes <= 0 {
				t.Errorf("usage %+v, %v", u, err)
			}
			killAndWait(t, p)
			if err := rt.Release(s.SessionID); err != nil {
				t.Fatal(err)
			}
			expectDirs(t, cg, false)
		})
	}
}

// Scoped and sealed sessions' cgroups, limits and all, are under the configured parent in
// every hierarchy; roost-init is in it too; Release removes them everywhere.
func TestCgroupsScopedAndSealedUnderTheParent(t *testing.T) {
	needRoot(t)
	state := reachableDir(t)
	c := testCgroups(t, state)
	scoped, err := NewScopedRuntime(state, staticInit(t), testIDs(), WithCgroups(c))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := NewSealedRuntime(state, staticInit(t), testIDs(), WithCgroups(c))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		class manifest.Class
		rt    interface {
			Start(context.Context, Spec) (Process, error)
			Release(string) error
		}
	}{{manifest.Scoped, scoped}, {manifest.Sealed, sealed}} {
		t.Run(tc.class.String(), func(t *testing.T) {
			s := spec(t, "/bin/sh", "-c", "echo ready; sleep 30")
			s.SessionID = "ses_under_" + tc.class.String()
			s.Class = tc.class
			s.Policy = sealedPolicy(t, "capabilities: {containment: "+tc.class.String()+", shell: {allow: [sleep]}, resources: {cgroup_pids_max: 77}}")
			s.CapsuleDir = t.TempDir()
			if tc.class == manifest.Sealed {
				s.Env = []string{"PATH=/usr/bin:/bin", "HOME=/work"}
			}
			p, err := tc.rt.Start(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Signal(syscall.SIGKILL) })
			waitOutput(t, s, "ready")
			cg := path.Join(c.Parent(), s.SessionID)
			expectDirs(t, cg, true)
			ref := p.Ref()
			expectIn(t, "roost-init", ref.InitPID, cg)
			expectIn(t, "the program", ref.PID, cg)
			if _, err := os.Stat(filepath.Join(CgroupParent, s.SessionID)); err == nil {
				t.Errorf("a cgroup at %s/%s too", CgroupParent, s.SessionID)
			}
			// The limits are the session's own.
			for _, mnt := range hierarchies() {
				for _, f := range []string{"pids.max"} {
					if data, err := os.ReadFile(filepath.Join(mnt, cg, f)); err == nil && strings.TrimSpace(string(data)) != "77" {
						t.Errorf("%s: %q", filepath.Join(mnt, cg, f), data)
					}
				}
			}
			if held, _ := c.held(); !slices.Contains(held, s.SessionID) {
				t.Errorf("the session's cgroup is not noted: %v", held)
			}
			killAndWait(t, p)
			if err := tc.rt.Release(s.SessionID); err != nil {
				t.Fatal(err)
			}
			expectDirs(t, cg, false)
			if held, _ := c.held(); slices.Contains(held, s.SessionID) {
				t.Errorf("the note outlived Release: %v", held)
			}
		})
	}
}

// After roostd dies with a session running and comes back configured with another parent,
// the session's cgroup is where it was noted: Held lists it, Attach reads it, Release
// removes it from every hierarchy.
func TestCgroupsFoundAfterACrash(t *testing.T) {
	needRoot(t)
	state := t.TempDir()
	before := testCgroups(t, state)
	s := spec(t, "/bin/sh", "-c", "echo ready; sleep 30")
	s.SessionID = "ses_crash"
	p, err := NewProcessRuntime(SelfInit, WithCgroups(before)).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Signal(syscall.SIGKILL) })
	waitOutput(t, s, "ready")
	cg := path.Join(before.Parent(), s.SessionID)
	// The daemon is gone without a Release; the next one puts new sessions elsewhere.
	after := testCgroups(t, state)
	rt := NewProcessRuntime(SelfInit, WithCgroups(after))
	if held, err := rt.Held(); err != nil || !slices.Equal(held, []string{s.SessionID}) {
		t.Fatalf("held %v, %v", held, err)
	}
	ref := p.Ref()
	again, err := rt.Attach(s.SessionID, s.RecordsDir, &ref)
	if err != nil {
		t.Fatal(err)
	}
	if u, err := again.(Meter).Usage(); err != nil || u.Pids < 2 {
		t.Errorf("usage of the re-attached session: %+v, %v", u, err)
	}
	// Release ends what is still in it.
	if err := rt.Release(s.SessionID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Release left the session running")
	}
	expectDirs(t, cg, false)
	if held, _ := rt.Held(); len(held) != 0 {
		t.Errorf("held after Release: %v", held)
	}
}

// A session recorded before the parent was configurable has its cgroup at /roost/<id>,
// and no note: Attach and Release still find it.
func TestCgroupsAtTheOldLocation(t *testing.T) {
	needRoot(t)
	old, err := NewCgroups(CgroupConfig{Parent: CgroupParent})
	if err != nil {
		t.Fatal(err)
	}
	suffix := strconv.Itoa(os.Getpid())

	t.Run("bare", func(t *testing.T) {
		id := "ses_old_bare_" + suffix
		cg := path.Join(CgroupParent, id)
		m, err := cgroupsmanager.New(&cgroups.Cgroup{Path: cg, Resources: &cgroups.Resources{}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { removeCgroupTree(cg) })
		cmd := exec.Command("/bin/sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		if err := m.Apply(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		expectDirs(t, cg, true)
		for _, r := range []interface{ Release(string) error }{
			NewProcessRuntime(SelfInit, WithCgroups(testCgroups(t, t.TempDir()))),
		} {
			if err := r.Release(id); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			t.Fatal("Release left the old cgroup's process running")
		}
		expectDirs(t, cg, false)
	})

	for _, class := range []manifest.Class{manifest.Scoped, manifest.Sealed} {
		t.Run(class.String(), func(t *testing.T) {
			state := reachableDir(t)
			type runtime interface {
				Start(context.Context, Spec) (Process, error)
				Attach(string, string, *ProcessRef) (Process, error)
				Release(string) error
			}
			mk := func(c *Cgroups) runtime {
				if class == manifest.Scoped {
					r, err := NewScopedRuntime(state, staticInit(t), testIDs(), WithCgroups(c))
					if err != nil {
						t.Fatal(err)
					}
					return r
				}
				r, err := NewSealedRuntime(state, staticInit(t), testIDs(), WithCgroups(c))
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			s := spec(t, "/bin/sh", "-c", "echo ready; sleep 30")
			s.SessionID = "ses_old_" + class.String() + "_" + suffix
			s.Class = class
			s.Policy = sealedPolicy(t, "capabilities: {containment: "+class.String()+", shell: {allow: [sleep]}}")
			s.CapsuleDir = t.TempDir()
			if class == manifest.Sealed {
				s.Env = []string{"PATH=/usr/bin:/bin", "HOME=/work"}
			}
			cg := path.Join(CgroupParent, s.SessionID)
			t.Cleanup(func() { removeCgroupTree(cg) })
			p, err := mk(old).Start(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Signal(syscall.SIGKILL) })
			waitOutput(t, s, "ready")
			expectDirs(t, cg, true)
			// The next daemon's parent is elsewhere, and it has no note of the session.
			rt := mk(testCgroups(t, ""))
			ref := p.Ref()
			again, err := rt.Attach(s.SessionID, s.RecordsDir, &ref)
			if err != nil {
				t.Fatal(err)
			}
			if u, err := again.(Meter).Usage(); err != nil || u.Pids < 1 {
				t.Errorf("usage of the re-attached session: %+v, %v", u, err)
			}
			if f, ok := again.(Freezer); ok {
				if err := f.Pause(); err != nil {
					t.Errorf("pause: %v", err)
				}
				// Release ends a paused session too.
			}
			if err := rt.Release(s.SessionID); err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("Release left the session running")
			}
			expectDirs(t, cg, false)
		})
	}
}

func TestCgroupParentRefused(t *testing.T) {
	for _, parent := range []string{"roost", "./roost", "/roost/", "/roost//x", "/roost/../etc", "/..", "/", "/roost/./x", "/ro\nost", "/ro\x00st"} {
		if _, err := NewCgroups(CgroupConfig{Parent: parent}); err == nil || !strings.Contains(err.Error(), "--cgroup-parent") {
			t.Errorf("parent %q: %v", parent, err)
		}
	}
	// A parent that holds roostd's own cgroup, in any hierarchy.
	for h, p := range procCgroups(t, os.Getpid()) {
		if p == "/" {
			continue
		}
		for _, parent := range []string{p, path.Dir(p)} {
			if parent == "/" {
				continue
			}
			if _, err := NewCgroups(CgroupConfig{Parent: parent}); err == nil || !strings.Contains(err.Error(), "roostd's own cgroup") {
				t.Errorf("parent %s holding the test's cgroup %s (%q): %v", parent, p, h, err)
			}
		}
	}
	if _, err := NewCgroups(CgroupConfig{Driver: "lxc"}); err == nil || !strings.Contains(err.Error(), `--cgroup-driver "lxc"`) {
		t.Errorf("unknown driver: %v", err)
	}
	if _, err := NewCgroups(CgroupConfig{Parent: "/roost-ok/x"}); err != nil {
		t.Errorf("a good parent: %v", err)
	}
}

// A session id that is not one path element names no session's cgroup: Release refuses it
// rather than kill what is somewhere else.
func TestCgroupsRefuseForeignIDs(t *testing.T) {
	c := &Cgroups{driver: CgroupDriverCgroupfs, parent: "/roost-never"}
	rt := NewProcessRuntime(SelfInit, WithCgroups(c))
	for _, id := range []string{"", ".", "..", "../etc", "a/b", ".hidden", "x\ny"} {
		if err := rt.Release(id); err == nil {
			t.Errorf("Release(%q) accepted", id)
		}
	}
	// A note naming another cgroup than the session's is not followed.
	for _, p := range []cgroupPlace{
		{CgroupDriverCgroupfs, "/"}, {CgroupDriverCgroupfs, "/ses_x"}, {CgroupDriverCgroupfs, "/roost/other"},
		{CgroupDriverCgroupfs, "/roost/../ses_x"}, {CgroupDriverSystemd, "roost.slice:roost:other"},
		{CgroupDriverSystemd, "-.slice:roost:ses_x"}, {CgroupDriverSystemd, "roost.slice:runc:ses_x"}, {"lxc", "/roost/ses_x"},
	} {
		if err := p.check("ses_x"); err == nil {
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
		for _, cfg := range []CgroupConfig{{Driver: CgroupDriverSystemd}, {Driver: CgroupDriverSystemd, Parent: "machine-roost.slice"}} {
			if _, err := NewCgroups(cfg); err == nil || err.Error() != want {
				t.Errorf("systemd driver without systemd: %v, want %s", err, want)
			}
		}
	} else {
		t.Log("systemd is PID 1 here: " + why)
	}
	for _, slice := range []string{"roost", "roost.scope", "-.slice", "a--b.slice", "-a.slice", "a/b.slice", "ro ost.slice", ".slice"} {
		if _, err := NewCgroups(CgroupConfig{Driver: CgroupDriverSystemd, Parent: slice}); err == nil || !strings.Contains(err.Error(), "--cgroup-parent") {
			t.Errorf("slice %q: %v", slice, err)
		}
	}
	for _, slice := range []string{"roost.slice", "machine-roost.slice"} {
		if err := checkSlice(slice); err != nil {
			t.Errorf("slice %q: %v", slice, err)
		}
	}
	c := &Cgroups{driver: CgroupDriverSystemd, parent: "machine-roost.slice"}
	p := c.placeOf("ses_0123abcd")
	if p.Path != "machine-roost.slice:roost:ses_0123abcd" || p.unitName() != "roost-ses_0123abcd.scope" || p.check("ses_0123abcd") != nil {
		t.Errorf("place %+v, unit %s, check %v", p, p.unitName(), p.check("ses_0123abcd"))
	}
	cfg := p.config(nil)
	if !cfg.Systemd || cfg.Parent != "machine-roost.slice" || cfg.ScopePrefix != "roost" || cfg.Name != "ses_0123abcd" || cfg.Path != "" || !cfg.Resources.SkipDevices {
		t.Errorf("libcontainer config %+v", cfg)
	}
	if got := c.ociPath("ses_0123abcd"); got != "machine-roost.slice:roost:ses_0123abcd" {
		t.Errorf("OCI cgroupsPath %s", got)
	}
	if got := c.Parents(); !slices.Equal(got, []string{"/machine.slice/machine-roost.slice", CgroupParent}) {
		t.Errorf("parents %v", got)
	}
	if err := c.placeOf("ses x").check("ses x"); err == nil {
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
	parent, why := DefaultCgroupParent()
	t.Logf("default cgroup parent here (%s): %s: %s", CgroupMode(), parent, why)
	if own, err := ownUnifiedCgroup(); CgroupMode() != "v1" && err == nil && own == "/" && parent != CgroupParent {
		t.Errorf("in the root cgroup the default parent is %s", parent)
	}
	h := Probe()
	if h.CgroupParent != parent || h.CgroupParentWhy != why || h.CgroupDriver != CgroupDriverCgroupfs || h.SystemdDriverWhy == "" || h.Cgroups != CgroupMode() {
		t.Errorf("probe %+v", h)
	}
	var names []string
	for _, c := range h.Checks() {
		names = append(names, c.Name)
	}
	if !slices.Contains(names, "cgroup parent") || !slices.Contains(names, "systemd cgroup driver") {
		t.Errorf("checks %v", names)
	}
	c, err := NewCgroups(CgroupConfig{Parent: "/roost-report"})
	if err != nil {
		t.Fatal(err)
	}
	c.Report(&h)
	if h.CgroupParent != "/roost-report" || h.CgroupParentWhy != "--cgroup-parent /roost-report" || h.CgroupParentHint != "" {
		t.Errorf("report %+v", h)
	}
	h.CgroupParentHint = "add DelegateSubgroup=supervisor"
	for _, c := range h.Checks() {
		if c.Name == "cgroup parent" && (c.Status != "warn" || c.Hint != h.CgroupParentHint || !strings.HasPrefix(c.Detail, "/roost-report (cgroupfs driver): ")) {
			t.Errorf("check %+v", c)
		}
	}
}

// unifiedTestCgroup makes a cgroup of this test's own in the unified hierarchy.
func unifiedTestCgroup(t *testing.T, name string) (mnt, cg string) {
	t.Helper()
	needRoot(t)
	mnt = unifiedMountpoint()
	if mnt == "" {
		t.Skip("no unified hierarchy")
	}
	cg = fmt.Sprintf("/roost-test-%d-%s-%d", os.Getpid(), name, lastTestParent.Add(1))
	if err := os.Mkdir(filepath.Join(mnt, cg), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroupTree(cg) })
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
		t.Skipf("setting trusted.delegate: %v", err)
	}
	if ok, how := delegated(dir); !ok || how != "trusted.delegate=1" {
		t.Fatalf("delegated %v %q", ok, how)
	}
	isDelegated := func(c string) (bool, string) { return delegated(filepath.Join(mnt, c)) }
	// roostd in the delegated cgroup itself: not by default (see defaultParent).
	if parent, why := defaultParent("v2", cg, isDelegated); parent != CgroupParent || !strings.Contains(why, "DelegateSubgroup=supervisor") {
		t.Fatalf("in the delegated cgroup: %s: %s", parent, why)
	}
	// roostd in its supervisor leaf: sessions beneath the delegated cgroup.
	if parent, why := defaultParent("v2", cg+"/"+SupervisorCgroup, isDelegated); parent != cg+"/sessions" || !strings.Contains(why, "trusted.delegate=1") {
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
		if err := cgroups.WriteCgroupProc(filepath.Join(mnt, cg), cmd.Process.Pid); err != nil {
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
		if got := procCgroups(t, pid)[""]; got != cg+"/"+SupervisorCgroup {
			t.Errorf("pid %d is in %s", pid, got)
		}
	}
	// Again: a second start finds the leaf there.
	if err := enterLeaf(mnt, cg); err != nil {
		t.Fatal(err)
	}
}
