package sealed_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/cgtest"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/containment/sealer"
)

// parentOf is pid's parent pid and that parent's name.
func parentOf(t *testing.T, pid int) (int, string) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	ppid, _ := strconv.Atoi(fields[1])
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	return ppid, strings.TrimSpace(string(comm))
}

// A sealed session started through roost-sealer is roost-sealer's child, not roostd's; a
// roost-sealer killed while sessions run takes none of them with it, their ends are recorded
// as ever, and the next start brings up a new roost-sealer.
func TestSealerStartsAndSurvivesItsOwnDeath(t *testing.T) {
	opt := kit.Sealer(t)
	rt, err := kit.NewSealedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs(), opt)
	if err != nil {
		t.Fatal(err)
	}
	start := func(name, script string) (containment.Process, containment.Spec) {
		t.Helper()
		p, s := kit.StartSealed(t, rt, "ses_sealer_"+name, script, "capabilities: {containment: sealed, shell: {allow: [sleep, grep]}}")
		t.Cleanup(func() { _ = rt.Release(s.SessionID) })
		return p, s
	}

	first, firstSpec := start("first", `grep -E '^(Seccomp|CapEff):' /proc/self/status; sleep 2; exit 3`)
	sealerPID, name := parentOf(t, first.Ref().InitPID)
	if name != sealer.Name {
		t.Fatalf("the session's init is the child of %q (pid %d), want %s", name, sealerPID, sealer.Name)
	}
	if err := syscall.Kill(sealerPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	info := testkit.WaitDone(t, first)
	if info.Code != 3 {
		t.Fatalf("the session running when roost-sealer was killed ended %+v, want code 3", info)
	}
	out := testkit.ReadFile(t, filepath.Join(firstSpec.RecordsDir, containment.StdoutFile))
	for _, want := range []string{"Seccomp:\t2", "CapEff:\t0000000000000000"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// Its death is seen, and the next start gets a new one.
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(sealerPID, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	second, _ := start("second", `sleep 1`)
	newPID, name := parentOf(t, second.Ref().InitPID)
	if name != sealer.Name || newPID == sealerPID {
		t.Fatalf("the next session's init is the child of %q (pid %d); want a new %s (the old was %d)", name, newPID, sealer.Name, sealerPID)
	}
	if info := testkit.WaitDone(t, second); info.Code != 0 {
		t.Fatalf("second session: %+v", info)
	}
}

// A session whose program ends before roostd hears back gets its end all the same: the init
// roost-sealer reaps at once must not be mistaken for whatever process takes its pid.
func TestSealerQuickProgram(t *testing.T) {
	opt := kit.Sealer(t)
	rt, err := kit.NewSealedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs(), opt)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		p, s := kit.StartSealed(t, rt, fmt.Sprintf("ses_sealer_quick_%d", i), "exit 7", "capabilities: {containment: sealed}")
		if info := testkit.WaitDone(t, p); info.Code != 7 {
			t.Fatalf("exit %+v, want 7", info)
		}
		if err := rt.Release(s.SessionID); err != nil {
			t.Fatal(err)
		}
	}
}

// Release leaves nothing of a session roost-sealer started: not its cgroup, its
// libcontainer state or its note, whether its program has ended (the container's state
// never read by this process) or still runs (then Release ends it).
func TestSealerReleaseLeavesNothing(t *testing.T) {
	opt := kit.Sealer(t)
	rt, err := kit.NewSealedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs(), opt)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, script string
		ended        bool
	}{{"ended", "exit 0", true}, {"running", "sleep 30", false}} {
		t.Run(tc.name, func(t *testing.T) {
			p, s := kit.StartSealed(t, rt, "ses_sealer_release_"+tc.name, tc.script, "capabilities: {containment: sealed, shell: {allow: [sleep]}}")
			cg := rt.Cgroups().PlaceOf(s.SessionID).Path
			if tc.ended {
				testkit.WaitDone(t, p)
			} else {
				cgtest.ExpectDirs(t, cg, true)
			}
			if held, err := rt.Held(); err != nil || !slices.Contains(held, s.SessionID) {
				t.Fatalf("before Release, held %v (%v): the session's container is not among them", held, err)
			}
			if err := rt.Release(s.SessionID); err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("Release left the session running")
			}
			if held, err := rt.Held(); err != nil || slices.Contains(held, s.SessionID) {
				t.Errorf("after Release, held %v (%v)", held, err)
			}
			if held, err := rt.Cgroups().Held(); err != nil || slices.Contains(held, s.SessionID) {
				t.Errorf("after Release, the cgroup note is left: %v (%v)", held, err)
			}
			cgtest.ExpectDirs(t, cg, false)
		})
	}
}
