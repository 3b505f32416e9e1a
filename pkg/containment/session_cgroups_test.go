package containment_test

import (
	"context"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ocgroups "github.com/opencontainers/cgroups"
	cgroupsmanager "github.com/opencontainers/cgroups/manager"

	"roost.dev/roost/internal/cgtest"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/containment/scoped"
	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
)

// Advisory and unconfined sessions leave roostd's cgroup: roost-init and the program are in
// <parent>/<session> in every hierarchy, never in the caller's; the program, an unprivileged
// uid, cannot move itself out (into the root of a hierarchy, or back into roostd's); Release
// removes the cgroup everywhere.
func TestCgroupsPlainSessionsHaveTheirOwn(t *testing.T) {
	testkit.NeedRoot(t)
	own := cgtest.ProcCgroups(t, os.Getpid())
	// Every cgroup.procs the program might try to move itself into: each hierarchy's root
	// and this test process's own cgroups.
	var targets []string
	for _, mnt := range cgtest.Hierarchies() {
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
			c := kit.TestCgroups(t, "")
			rt := kit.NewProcessRuntime(containment.SelfInit, containment.WithCgroups(c))
			probe := testkit.TryScript + `move() { echo $$ > "$1"; }
for f in ` + strings.Join(targets, " ") + `; do try $f move $f; done
`
			s := kit.Spec(t, "/bin/sh", "-c", probe+`echo ready; sleep 30`)
			s.SessionID = "ses_plain_" + class.String()
			s.Class = class
			p, err := rt.Start(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Signal(syscall.SIGKILL) })
			out := testkit.WaitOutput(t, s, "ready")
			// The files are root's: the program's uid may not write them. The control: a
			// shell of the host's root moves itself into each (and ends).
			testkit.ExpectDenied(t, out, syscall.EACCES, targets...)
			testkit.ExpectAllowed(t, testkit.OnHost(t, probe), targets...)
			cg := path.Join(c.Parent(), s.SessionID)
			ref := p.Ref()
			cgtest.ExpectIn(t, "roost-init", ref.InitPID, cg)
			cgtest.ExpectIn(t, "the program", ref.PID, cg)
			for h, p := range cgtest.ProcCgroups(t, ref.PID) {
				if own[h] == p {
					t.Errorf("the program shares the test's cgroup %s in hierarchy %q", p, h)
				}
			}
			cgtest.ExpectDirs(t, cg, true)
			u, err := p.(containment.Meter).Usage()
			if err != nil || u.Pids < 2 || u.MemoryBytes <= 0 {
				t.Errorf("usage %+v, %v", u, err)
			}
			testkit.KillAndWait(t, p)
			if err := rt.Release(s.SessionID); err != nil {
				t.Fatal(err)
			}
			cgtest.ExpectDirs(t, cg, false)
		})
	}
}

// Scoped and sealed sessions' cgroups, limits and all, are under the configured parent in
// every hierarchy; roost-init is in it too; Release removes them everywhere.
func TestCgroupsScopedAndSealedUnderTheParent(t *testing.T) {
	testkit.NeedRoot(t)
	c, scoped, sealed := kernelRuntimes(t)
	for _, tc := range []struct {
		class manifest.Class
		rt    interface {
			Start(context.Context, containment.Spec) (containment.Process, error)
			Release(string) error
		}
	}{{manifest.Scoped, scoped}, {manifest.Sealed, sealed}} {
		t.Run(tc.class.String(), func(t *testing.T) {
			s := readySpec(t, "ses_under_"+tc.class.String(), tc.class, "resources: {cgroup_pids_max: 77}")
			p := startReady(t, tc.rt, s)
			cg := path.Join(c.Parent(), s.SessionID)
			cgtest.ExpectDirs(t, cg, true)
			ref := p.Ref()
			cgtest.ExpectIn(t, "roost-init", ref.InitPID, cg)
			cgtest.ExpectIn(t, "the program", ref.PID, cg)
			if _, err := os.Stat(filepath.Join(cgroups.FallbackParent, s.SessionID)); err == nil {
				t.Errorf("a cgroup at %s/%s too", cgroups.FallbackParent, s.SessionID)
			}
			// The limits are the session's own.
			for _, mnt := range cgtest.Hierarchies() {
				for _, f := range []string{"pids.max"} {
					if data, err := os.ReadFile(filepath.Join(mnt, cg, f)); err == nil && strings.TrimSpace(string(data)) != "77" {
						t.Errorf("%s: %q", filepath.Join(mnt, cg, f), data)
					}
				}
			}
			if held, _ := c.Held(); !slices.Contains(held, s.SessionID) {
				t.Errorf("the session's cgroup is not noted: %v", held)
			}
			testkit.KillAndWait(t, p)
			if err := tc.rt.Release(s.SessionID); err != nil {
				t.Fatal(err)
			}
			cgtest.ExpectDirs(t, cg, false)
			if held, _ := c.Held(); slices.Contains(held, s.SessionID) {
				t.Errorf("the note outlived Release: %v", held)
			}
		})
	}
}

// After roostd dies with a session running and comes back configured with another parent,
// the session's cgroup is where it was noted: Held lists it, Attach reads it, Release
// removes it from every hierarchy.
func TestCgroupsFoundAfterACrash(t *testing.T) {
	testkit.NeedRoot(t)
	state := t.TempDir()
	before := kit.TestCgroups(t, state)
	s := kit.Spec(t, "/bin/sh", "-c", "echo ready; sleep 30")
	s.SessionID = "ses_crash"
	p, err := kit.NewProcessRuntime(containment.SelfInit, containment.WithCgroups(before)).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Signal(syscall.SIGKILL) })
	testkit.WaitOutput(t, s, "ready")
	cg := path.Join(before.Parent(), s.SessionID)
	// The daemon is gone without a Release; the next one puts new sessions elsewhere.
	after := kit.TestCgroups(t, state)
	rt := kit.NewProcessRuntime(containment.SelfInit, containment.WithCgroups(after))
	if held, err := rt.Held(); err != nil || !slices.Equal(held, []string{s.SessionID}) {
		t.Fatalf("held %v, %v", held, err)
	}
	ref := p.Ref()
	again, err := rt.Attach(s.SessionID, s.RecordsDir, &ref)
	if err != nil {
		t.Fatal(err)
	}
	if u, err := again.(containment.Meter).Usage(); err != nil || u.Pids < 2 {
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
	cgtest.ExpectDirs(t, cg, false)
	if held, _ := rt.Held(); len(held) != 0 {
		t.Errorf("held after Release: %v", held)
	}
}

// A session recorded before the parent was configurable has its cgroup at /roost/<id>,
// and no note: Attach and Release still find it.
func TestCgroupsAtTheOldLocation(t *testing.T) {
	testkit.NeedRoot(t)
	old, err := cgroups.New(cgroups.Config{Parent: cgroups.FallbackParent})
	if err != nil {
		t.Fatal(err)
	}
	suffix := strconv.Itoa(os.Getpid())

	t.Run("bare", func(t *testing.T) {
		id := "ses_old_bare_" + suffix
		cg := path.Join(cgroups.FallbackParent, id)
		m, err := cgroupsmanager.New(&ocgroups.Cgroup{Path: cg, Resources: &ocgroups.Resources{}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cgtest.RemoveTree(cg) })
		cmd := exec.Command("/bin/sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		if err := m.Apply(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		cgtest.ExpectDirs(t, cg, true)
		for _, r := range []interface{ Release(string) error }{
			kit.NewProcessRuntime(containment.SelfInit, containment.WithCgroups(kit.TestCgroups(t, t.TempDir()))),
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
		cgtest.ExpectDirs(t, cg, false)
	})

	for _, class := range []manifest.Class{manifest.Scoped, manifest.Sealed} {
		t.Run(class.String(), func(t *testing.T) {
			state := testkit.ReachableDir(t)
			type runtime interface {
				Start(context.Context, containment.Spec) (containment.Process, error)
				Attach(string, string, *containment.ProcessRef) (containment.Process, error)
				Release(string) error
			}
			mk := func(c *cgroups.Sessions) runtime {
				if class == manifest.Scoped {
					r, err := kit.NewScopedRuntime(state, kit.Init(t), kit.IDs(), containment.WithCgroups(c))
					if err != nil {
						t.Fatal(err)
					}
					return r
				}
				r, err := kit.NewSealedRuntime(state, kit.Init(t), kit.IDs(), containment.WithCgroups(c))
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			s := readySpec(t, "ses_old_"+class.String()+"_"+suffix, class, "")
			cg := path.Join(cgroups.FallbackParent, s.SessionID)
			t.Cleanup(func() { cgtest.RemoveTree(cg) })
			p := startReady(t, mk(old), s)
			cgtest.ExpectDirs(t, cg, true)
			// The next daemon's parent is elsewhere, and it has no note of the session.
			rt := mk(kit.TestCgroups(t, ""))
			ref := p.Ref()
			again, err := rt.Attach(s.SessionID, s.RecordsDir, &ref)
			if err != nil {
				t.Fatal(err)
			}
			if u, err := again.(containment.Meter).Usage(); err != nil || u.Pids < 1 {
				t.Errorf("usage of the re-attached session: %+v, %v", u, err)
			}
			if f, ok := again.(containment.Freezer); ok {
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
			cgtest.ExpectDirs(t, cg, false)
		})
	}
}

// A scoped or sealed session's usage carries its cgroup's ceilings, the ones its manifest
// declared; an advisory session's cgroup holds none, and says 0.
func TestUsageLimits(t *testing.T) {
	testkit.NeedRoot(t)
	c, scoped, sealed := kernelRuntimes(t)
	advisory := kit.NewProcessRuntime(containment.SelfInit, containment.WithCgroups(c))
	const mem = 96 << 20
	for _, tc := range []struct {
		class manifest.Class
		rt    interface {
			Start(context.Context, containment.Spec) (containment.Process, error)
		}
		mem, pids int64
	}{{manifest.Scoped, scoped, mem, 77}, {manifest.Sealed, sealed, mem, 77}, {manifest.Advisory, advisory, 0, 0}} {
		t.Run(tc.class.String(), func(t *testing.T) {
			s := readySpec(t, "ses_usage_"+tc.class.String(), tc.class, "resources: {cgroup_pids_max: 77, cgroup_memory_bytes: 100663296}")
			p := startReady(t, tc.rt, s)
			u, err := p.(containment.Meter).Usage()
			if err != nil {
				t.Fatal(err)
			}
			if u.MemoryLimitBytes != tc.mem || u.PidsLimit != tc.pids {
				t.Errorf("limits: memory %d, pids %d; want %d, %d", u.MemoryLimitBytes, u.PidsLimit, tc.mem, tc.pids)
			}
			if u.MemoryBytes <= 0 || u.Pids < 1 {
				t.Errorf("counters: %+v", u)
			}
			testkit.KillAndWait(t, p)
		})
	}
}

// kernelRuntimes are a scoped and a sealed runtime whose sessions' cgroups go under one test
// parent, c.
func kernelRuntimes(t *testing.T) (c *cgroups.Sessions, scoped *scoped.Runtime, sealed *sealed.Runtime) {
	t.Helper()
	state := testkit.ReachableDir(t)
	c = kit.TestCgroups(t, state)
	var err error
	if scoped, err = kit.NewScopedRuntime(state, kit.Init(t), kit.IDs(), containment.WithCgroups(c)); err != nil {
		t.Fatal(err)
	}
	if sealed, err = kit.NewSealedRuntime(state, kit.Init(t), kit.IDs(), containment.WithCgroups(c)); err != nil {
		t.Fatal(err)
	}
	return c, scoped, sealed
}

// readySpec is a session of class that says ready and sleeps. A scoped or sealed one gets a
// policy of its class, with resources (a capabilities entry, or "") as given; an advisory
// one none.
func readySpec(t *testing.T, id string, class manifest.Class, resources string) containment.Spec {
	t.Helper()
	s := kit.Spec(t, "/bin/sh", "-c", "echo ready; sleep 30")
	s.SessionID, s.Class = id, class
	if class != manifest.Advisory {
		caps := "containment: " + class.String() + ", shell: {allow: [sleep]}"
		if resources != "" {
			caps += ", " + resources
		}
		s.Policy = testkit.Policy(t, "capabilities: {"+caps+"}")
		s.CapsuleDir = t.TempDir()
	}
	if class == manifest.Sealed {
		s.Env = []string{"PATH=/usr/bin:/bin", "HOME=/work"}
	}
	return s
}

// startReady starts s under rt and returns once it has said ready; the test's end kills it.
func startReady(t *testing.T, rt interface {
	Start(context.Context, containment.Spec) (containment.Process, error)
}, s containment.Spec) containment.Process {
	t.Helper()
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Signal(syscall.SIGKILL) })
	testkit.WaitOutput(t, s, "ready")
	return p
}
