package e2e

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
)

// TestRoostdShutdownWithFollower: SIGTERM ends roostd promptly even with a follower of
// events attached, the follower hears that roostd is shutting down (Unavailable, so it
// resumes once roostd is back), and roostd's last line says it stopped and how long the
// shutdown took.
func TestRoostdShutdownWithFollower(t *testing.T) {
	d := newDaemon(t)
	d.ok("run", "examples/hello")

	follower := exec.Command(filepath.Join(binDir, "roostctl"), "events", "--follow", "--json")
	follower.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	var followErr lockedBuffer
	follower.Stderr = &followErr
	pipe, _ := follower.StdoutPipe()
	if err := follower.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Process.Kill(); follower.Wait() })
	// The follower is attached once it has replayed the run's first event.
	first := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pipe)
		once := sync.Once{}
		for sc.Scan() {
			once.Do(func() { close(first) })
		}
	}()
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatalf("the follower printed no event; stderr: %s", followErr.String())
	}

	start := time.Now()
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.cmd.Wait()
	took := time.Since(start)
	t.Logf("roostd exited %v after SIGTERM", took)
	// Before, roostd waited out a fixed 2 s for followers to go away on their own.
	if took > 1500*time.Millisecond {
		t.Errorf("roostd took %v to exit after SIGTERM with a follower attached", took)
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("roostd exited %d:\n%s", code, d.log)
	}
	log := d.log.String()
	lines := strings.Split(strings.TrimSpace(log), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, `msg="roostd stopped"`) || !strings.Contains(last, "shutdown=") {
		t.Errorf("roostd's last line is not its stop with the shutdown's length: %s", last)
	}
	// The follower is told why and resumes later (it keeps running, waiting for roostd).
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(followErr.String(), "lost roostd") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if msg := followErr.String(); !strings.Contains(msg, "roostd is shutting down") || !strings.Contains(msg, "resuming") {
		t.Errorf("follower's stderr: %q", msg)
	}
}

// TestRoostdFatalErrorOnce: a fatal error is said once, whether it is a usage error or
// one serve meets.
func TestRoostdFatalErrorOnce(t *testing.T) {
	state := stateDir(t)
	for _, c := range []struct {
		args []string
		says string
		code int
	}{
		{[]string{"--bogus"}, "unknown flag: --bogus", 2},
		{[]string{"--state-dir", state, "--socket", filepath.Join(state, "s.sock"), "--metrics-addr", "", "--config", filepath.Join(state, "missing.yaml")}, "missing.yaml", 1},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "roostd"), c.args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		var code int
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != c.code {
			t.Errorf("roostd %v: exit %d (%v), want %d\n%s", c.args, code, err, c.code, stderr.String())
		}
		if n := strings.Count(stderr.String(), c.says); n != 1 {
			t.Errorf("roostd %v: %q said %d times:\n%s", c.args, c.says, n, stderr.String())
		}
	}
}

// TestExamplesDelegateAndLimits: examples/delegate fails when its spawn does (and passes
// once the worker is pushed); examples/limits shows ROOST_CREDENTIAL as set, never its value.
func TestExamplesDelegateAndLimits(t *testing.T) {
	d := newDaemon(t)
	res := d.ctl("run", "examples/limits")
	if res.code != 0 || !strings.Contains(res.stdout, "ROOST_CREDENTIAL=(set") || strings.Contains(res.stdout, "roost1.") {
		t.Errorf("examples/limits: %+v", res)
	}
	// No worker pushed: the spawn is refused, and the parent says so and fails.
	res = d.ctl("run", "examples/delegate")
	if res.code != 1 || !strings.Contains(res.stderr, "spawn failed") {
		t.Errorf("examples/delegate without its worker: %+v", res)
	}
	d.ok("push", "examples/worker")
	res = d.ctl("run", "examples/delegate")
	if res.code != 0 || !strings.Contains(res.stdout, "the worker's answer: 6 words") {
		t.Errorf("examples/delegate: %+v", res)
	}
}

// TestOperatorMessages: what an operator meets in a terminal says what is true, once.
func TestOperatorMessages(t *testing.T) {
	d := newDaemon(t)

	// A misspelt shell.allow name is refused at stage, with where roost looked and the
	// name it probably meant; the error names the file the operator wrote.
	dir := capsule(t, "typo", "true", "capabilities:\n  containment: sealed\n  shell:\n    allow: [pythn3]\n")
	res := d.ctl("run", dir)
	if res.code != 125 || !strings.Contains(res.stderr, `capabilities.shell.allow[0]: "pythn3": not found on PATH`) || !strings.Contains(res.stderr, filepath.Join(dir, "capsule.yaml")) {
		t.Errorf("run with shell.allow [pythn3]: %+v", res)
	}
	// The suggestion needs a python3 to suggest; without one this check is not made, which
	// on CI (where .ci/run installs python3) is a failure. The rest of the test goes on.
	if _, err := exec.LookPath("python3"); err != nil {
		if testenv.OnCI() {
			t.Errorf("python3 is missing on CI: the did-you-mean goes unchecked: %v", err)
		} else {
			t.Logf("no python3 here: the did-you-mean goes unchecked: %v", err)
		}
	} else if !strings.Contains(res.stderr, `did you mean "python3"?`) {
		t.Errorf("no did-you-mean: %s", res.stderr)
	}

	// --deadline above the capsule's is refused.
	res = d.ctl("run", "--deadline", "2h", capsule(t, "short", "true", "capabilities:\n  limits:\n    deadline_seconds: 600\n"))
	if res.code != 125 || !strings.Contains(res.stderr, "--deadline 2h0m0s is above the capsule's limits.deadline_seconds (600 s); it can only lower it") {
		t.Errorf("run --deadline 2h: %+v", res)
	}

	// pause of an advisory session, and rm of a live one.
	id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "sleeper", "sleep 30", "capabilities:\n  containment: advisory\n")))
	res = d.ctl("pause", id)
	if res.code != 1 || !strings.Contains(res.stderr, "pause needs a cgroup: scoped or sealed") || strings.Count(res.stderr, id) != 1 {
		t.Errorf("pause of an advisory session: %+v", res)
	}
	res = d.ctl("rm", id)
	if res.code != 1 || !strings.Contains(res.stderr, "roostctl rm -f") || strings.Count(res.stderr, id) != 1 || strings.Count(res.stderr, "stop it") != 1 {
		t.Errorf("rm of a live session: %+v", res)
	}
	d.ok("stop", id)

	// explain --oci of a capsule that would not run sealed says so, on stderr, and stdout
	// stays the spec alone.
	res = d.ctl("explain", "--oci", capsule(t, "adv", "true", "capabilities:\n  containment: advisory\n"))
	if res.code != 0 || !strings.Contains(res.stderr, "would run advisory, not sealed") || !strings.HasPrefix(strings.TrimSpace(res.stdout), "{") {
		t.Errorf("explain --oci of an advisory capsule: %+v", res)
	}
}
