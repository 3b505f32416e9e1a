package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// parent is a process's parent pid and the parent's name.
func parent(t *testing.T, pid int) (int, string) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ppid, _ := strconv.Atoi(fields[1])
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	return ppid, strings.TrimSpace(string(comm))
}

// roostd starts sealed containers through roost-sealer, not itself: a session's roost-init
// is roost-sealer's child. Killing roost-sealer takes no session with it, and the next
// sealed start brings up another.
func TestSealerStartsSealedSessions(t *testing.T) {
	d := newDaemon(t)
	caps := "capabilities:\n  containment: sealed\n  shell:\n    allow: [sleep]\n"
	id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "sleeper", "exec sleep 60", caps)))
	var pid int
	for deadline := time.Now().Add(30 * time.Second); pid == 0; time.Sleep(50 * time.Millisecond) {
		if pid = d.identity(id).Pid; pid == 0 && time.Now().After(deadline) {
			t.Fatalf("no program pid:\n%s", d.ok("inspect", id))
		}
	}
	initPID, name := parent(t, pid)
	if name != "roost-init" {
		t.Fatalf("the program's parent is %q, want roost-init", name)
	}
	sealerPID, name := parent(t, initPID)
	if name != "roost-sealer" {
		t.Fatalf("roost-init's parent is %q (pid %d), want roost-sealer", name, sealerPID)
	}
	if err := syscall.Kill(sealerPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if out := d.ok("run", capsule(t, "after", "echo started after", "capabilities:\n  containment: sealed\n")); !strings.Contains(out, "started after") {
		t.Fatalf("a sealed run after roost-sealer was killed: %q", out)
	}
	if s := d.inspect(id); s.State != "running" {
		t.Fatalf("the session running when roost-sealer was killed is %s: %s", s.State, s.Detail)
	}
	d.ok("stop", "--grace", "1s", id)
	if s := d.inspect(id); s.ExitStatus != "terminated" {
		t.Fatalf("stopped: %s %s", s.ExitStatus, s.Detail)
	}
}
