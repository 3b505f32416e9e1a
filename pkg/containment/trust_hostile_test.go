package containment_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/manifest"
)

// Hostile tests of the trust boundary that hold for every class: no session runs as host
// root, but one the operator lets. What a scoped or sealed session may read of the host is
// tried with the class's other escapes.

// hostUID reads a running program's uid on the host, from the host's /proc.
func hostUID(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			return strings.Join(strings.Fields(rest), " ")
		}
	}
	t.Fatalf("no Uid line for pid %d", pid)
	return ""
}

// Two live sessions of each class run as host uids that are not root and not each other's.
func TestHostileNoSessionRunsAsHostRoot(t *testing.T) {
	testkit.NeedRoot(t)
	sealed, err := kit.NewSealedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs())
	if err != nil {
		t.Fatal(err)
	}
	scoped, err := kit.NewScopedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs())
	if err != nil {
		t.Fatal(err)
	}
	plain := kit.NewProcessRuntime(kit.Init(t))
	type runtime interface {
		Start(context.Context, containment.Spec) (containment.Process, error)
		Release(string) error
	}
	for _, c := range []struct {
		class manifest.Class
		rt    runtime
	}{{manifest.Sealed, sealed}, {manifest.Scoped, scoped}, {manifest.Advisory, plain}, {manifest.Unconfined, plain}} {
		t.Run(c.class.String(), func(t *testing.T) {
			var uids []string
			for i := range 2 {
				s := kit.Spec(t, "/bin/sleep", "30")
				s.SessionID = fmt.Sprintf("ses_uid_%s_%d", c.class, i)
				s.Class = c.class
				s.Policy = testkit.Policy(t, "capabilities: {containment: "+c.class.String()+"}")
				s.CapsuleDir = testkit.ReachableDir(t)
				p, err := c.rt.Start(context.Background(), s)
				if err != nil {
					t.Fatalf("start: %v", err)
				}
				t.Cleanup(func() {
					_ = p.Signal(syscall.SIGKILL)
					testkit.WaitDone(t, p)
					_ = c.rt.Release(s.SessionID)
				})
				uid := hostUID(t, p.Ref().PID)
				want := fmt.Sprint(s.IDs.First)
				if uid != strings.Repeat(want+" ", 3)+want {
					t.Fatalf("%s session runs as host uid %q, want %s for real, effective, saved and fs", c.class, uid, want)
				}
				uids = append(uids, uid)
			}
			if uids[0] == uids[1] {
				t.Fatalf("two live sessions share host uid %s", uids[0])
			}
		})
	}
}

// A session the operator lets run as root (sessions.allow_root) is the only one that does,
// and a Spec that names no ids is refused rather than run as root.
func TestHostileRootOnlyWhenAllowed(t *testing.T) {
	testkit.NeedRoot(t)
	plain := kit.NewProcessRuntime(kit.Init(t))
	s := kit.Spec(t, "/usr/bin/id", "-u")
	s.Class = manifest.Advisory
	s.IDs = containment.IDs{}
	if _, err := plain.Start(context.Background(), s); err == nil || !strings.Contains(err.Error(), "no uid range") {
		t.Fatalf("a session without ids started: %v", err)
	}
	s.Root = true
	p, err := plain.Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitDone(t, p)
	if out := testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile)); out != "0\n" {
		t.Fatalf("an allowed root session ran as %q", out)
	}
	sealed, err := kit.NewSealedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs())
	if err != nil {
		t.Fatal(err)
	}
	s = kit.Spec(t, "/usr/bin/true")
	s.Class, s.Root, s.IDs = manifest.Sealed, true, containment.IDs{}
	s.Policy = testkit.Policy(t, "capabilities: {containment: sealed}")
	s.CapsuleDir = testkit.ReachableDir(t)
	if _, err := sealed.Start(context.Background(), s); err == nil {
		t.Fatal("a sealed session started without a user namespace range")
	}
}
