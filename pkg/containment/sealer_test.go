package containment

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/pkg/containment/sealer"
	"roost.dev/roost/pkg/manifest"
)

var (
	sealerOnce   sync.Once
	sealerClient *sealer.Client
	sealerErr    error
)

// testSealer is a roost-sealer built from cmd/roost-sealer as the Makefile builds it, shared by
// this test binary's sealed runtimes: sealed sessions start through it, as roostd's do. It
// ends with the test binary (its control socket closes).
func testSealer(t *testing.T) Option {
	t.Helper()
	needRoot(t)
	sealerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "roost-sealer-")
		if err != nil {
			sealerErr = err
			return
		}
		bin := filepath.Join(dir, sealer.Name)
		cmd := exec.Command("go", "build", "-tags", "seccomp", "-trimpath", "-o", bin, "roost.dev/roost/cmd/roost-sealer")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			sealerErr = fmt.Errorf("building roost-sealer: %v\n%s", err, out)
			return
		}
		sealerClient, sealerErr = sealer.NewClient(bin)
	})
	if sealerErr != nil {
		t.Fatal(sealerErr)
	}
	return WithSealer(sealerClient)
}

// sealedSpec is the start of script as sealed session id with the capabilities caps.
func sealedSpec(t *testing.T, id, caps, script string) Spec {
	t.Helper()
	s := spec(t, "/bin/sh", "-c", script)
	s.SessionID = id
	s.Class = manifest.Sealed
	s.Policy = sealedPolicy(t, caps)
	s.CapsuleDir = t.TempDir()
	s.Env = []string{"PATH=/usr/bin:/bin"}
	return s
}

// claimSandbox gives s a sandbox's ids and (unless "") records directory, as roostd gives
// them to the session that claims it.
func claimSandbox(t *testing.T, s *Spec, ids IDs, records string) {
	t.Helper()
	s.IDs = ids
	if err := os.Chown(s.Dir, int(ids.First), int(ids.First)); err != nil {
		t.Fatal(err)
	}
	if records == "" {
		return
	}
	if err := os.Remove(s.RecordsDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(records, s.RecordsDir); err != nil {
		t.Fatal(err)
	}
}

// startSealed starts script as sealed session id with the capabilities caps.
func startSealed(t *testing.T, rt *SealedRuntime, id, script, caps string) (Process, Spec) {
	t.Helper()
	s := sealedSpec(t, id, caps, script)
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		t.Fatalf("sealed start: %v", err)
	}
	return p, s
}

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
	opt := testSealer(t)
	rt, err := NewSealedRuntime(reachableDir(t), staticInit(t), testIDs(), opt)
	if err != nil {
		t.Fatal(err)
	}
	start := func(name, script string) (Process, Spec) {
		t.Helper()
		p, s := startSealed(t, rt, "ses_sealer_"+name, script, "capabilities: {containment: sealed, shell: {allow: [sleep, grep]}}")
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
	info := waitDone(t, first)
	if info.Code != 3 {
		t.Fatalf("the session running when roost-sealer was killed ended %+v, want code 3", info)
	}
	out := readFile(t, filepath.Join(firstSpec.RecordsDir, StdoutFile))
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
	if info := waitDone(t, second); info.Code != 0 {
		t.Fatalf("second session: %+v", info)
	}
}

// A session whose program ends before roostd hears back gets its end all the same: the init
// roost-sealer reaps at once must not be mistaken for whatever process takes its pid.
func TestSealerQuickProgram(t *testing.T) {
	opt := testSealer(t)
	rt, err := NewSealedRuntime(reachableDir(t), staticInit(t), testIDs(), opt)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		p, s := startSealed(t, rt, fmt.Sprintf("ses_sealer_quick_%d", i), "exit 7", "capabilities: {containment: sealed}")
		if info := waitDone(t, p); info.Code != 7 {
			t.Fatalf("exit %+v, want 7", info)
		}
		if err := rt.Release(s.SessionID); err != nil {
			t.Fatal(err)
		}
	}
}
