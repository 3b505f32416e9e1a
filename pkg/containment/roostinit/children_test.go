package roostinit

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

func startSleepers(t testing.TB, n int) []int {
	t.Helper()
	var pids []int
	for range n {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		pids = append(pids, cmd.Process.Pid)
	}
	return pids
}

// The kernel's children lists name exactly the children a walk of every process finds,
// whichever thread forked them.
func TestChildrenOfMatchesScan(t *testing.T) {
	want := startSleepers(t, 5)
	got := ChildrenOf(os.Getpid())
	scanned := scanChildren(os.Getpid())
	for _, pid := range want {
		if !slices.Contains(got, pid) {
			t.Errorf("ChildrenOf misses child %d: %v", pid, got)
		}
	}
	slices.Sort(got)
	slices.Sort(scanned)
	if !slices.Equal(got, scanned) {
		t.Errorf("ChildrenOf %v, a walk of /proc %v", got, scanned)
	}
}

// What roost-init pays to find its children each time it reaps one at a session's end:
// per child from the children lists, per process on the host from a walk.
func BenchmarkChildrenOf(b *testing.B) {
	startSleepers(b, 3)
	for b.Loop() {
		ChildrenOf(os.Getpid())
	}
}

func BenchmarkScanChildren(b *testing.B) {
	startSleepers(b, 3)
	for b.Loop() {
		scanChildren(os.Getpid())
	}
}
