package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// runTimes is when inspect says a session started and ended.
func (d *daemon) runTimes(id string) (started, ended time.Time) {
	d.t.Helper()
	var s struct {
		StartedAt time.Time `json:"started_at"`
		EndedAt   time.Time `json:"ended_at"`
	}
	if err := json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &s); err != nil {
		d.t.Fatal(err)
	}
	return s.StartedAt, s.EndedAt
}

// timedLines splits `logs --timestamps` output into each line's time and text.
func timedLines(t *testing.T, out string) ([]time.Time, []string) {
	t.Helper()
	var times []time.Time
	var lines []string
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		stamp, text, ok := strings.Cut(l, " ")
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if !ok || err != nil || len(stamp) != len("2006-01-02T15:04:05.000000000Z07:00") && !strings.HasSuffix(stamp, "Z") {
			t.Fatalf("line %q: no time (%v)", l, err)
		}
		times = append(times, at)
		lines = append(lines, text)
	}
	return times, lines
}

// A capsule prints lines apart: logs --timestamps times them, in order, within the run;
// --since between two of them prints the later ones, --tail 2 the last two; a bad flag
// value is a usage error that names it.
func TestLogsCLITimesTailSince(t *testing.T) {
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "apart", "echo one; sleep 0.4; echo two; sleep 0.4; echo three; sleep 0.4; echo four; echo err >&2", "")))
	if res := d.ctl("wait", id); res.code != 0 {
		t.Fatalf("wait: %+v", res)
	}
	started, ended := d.runTimes(id)
	times, lines := timedLines(t, d.ok("logs", "--timestamps", id))
	if strings.Join(lines, ",") != "one,two,three,four" {
		t.Fatalf("lines %q", lines)
	}
	// A time is when roost-init took the bytes from the pipe; the end, when it saw the
	// program exit: the last read can come a scheduler's moment after that.
	const slack = 200 * time.Millisecond
	for i, at := range times {
		if at.Before(started.Add(-slack)) || at.After(ended.Add(slack)) {
			t.Fatalf("line %d at %s: outside the run, %s to %s", i, at.Format(time.RFC3339Nano), started.Format(time.RFC3339Nano), ended.Format(time.RFC3339Nano))
		}
		if i > 0 && at.Sub(times[i-1]) < 300*time.Millisecond {
			t.Fatalf("line %d at %s, %s after the one before: the sleeps are 400ms", i, at, at.Sub(times[i-1]))
		}
	}
	// stderr's line is timed on stderr.
	res := d.ctl("logs", "-t", id)
	if _, errLines := timedLines(t, res.stderr); len(errLines) != 1 || errLines[0] != "err" {
		t.Fatalf("stderr %q", res.stderr)
	}

	between := times[1].Add(times[2].Sub(times[1]) / 2).Format(time.RFC3339Nano)
	if out := d.ok("logs", "--since", between, id); out != "three\nfour\n" {
		t.Fatalf("--since %s: %q", between, out)
	}
	if out := d.ok("logs", "--since", "1h", id); out != "one\ntwo\nthree\nfour\n" {
		t.Fatalf("--since 1h: %q", out)
	}
	if res := d.ctl("logs", "--since", "1ms", id); res.code != 0 || res.stdout != "" || res.stderr != "" {
		t.Fatalf("--since 1ms, long after the end: %+v", res)
	}
	if out := d.ok("logs", "--tail", "2", id); out != "three\nfour\n" {
		t.Fatalf("--tail 2: %q", out)
	}
	if out := d.ok("logs", "--tail", "0", id); out != "" {
		t.Fatalf("--tail 0: %q", out)
	}
	if res := d.ctl("logs", "--tail", "1", "--since", between, "-t", id); !strings.HasSuffix(res.stdout, " four\n") || strings.Count(res.stdout, "\n") != 1 {
		t.Fatalf("--tail 1 --since -t: %+v", res)
	}
	for _, bad := range [][]string{{"--since", "yesterday"}, {"--since", "-5m"}, {"--tail", "-1"}, {"--tail", "x"}} {
		res := d.ctl(append([]string{"logs", id}, bad...)...)
		if res.code != 2 || !strings.Contains(res.stderr, bad[0]) {
			t.Fatalf("logs %s %s: %+v", bad[0], bad[1], res)
		}
	}
}

// logsFollower is a roostctl process following logs.
type logsFollower struct {
	cmd         *exec.Cmd
	out, errOut *lockedBuffer
}

func (d *daemon) followLogs(args ...string) *logsFollower {
	d.t.Helper()
	f := &logsFollower{out: &lockedBuffer{}, errOut: &lockedBuffer{}}
	f.cmd = exec.Command(filepath.Join(binDir, "roostctl"), args...)
	f.cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	f.cmd.Stdout, f.cmd.Stderr = f.out, f.errOut
	if err := f.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() {
		if f.cmd.ProcessState == nil {
			f.cmd.Process.Kill()
			f.cmd.Wait()
		}
	})
	return f
}

// wait waits for the follower to exit, for at most timeout.
func (f *logsFollower) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f.cmd.Wait() }()
	select {
	case <-done:
		return f.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		f.cmd.Process.Signal(syscall.SIGQUIT)
		<-done
		t.Fatalf("%v did not end: stdout %q, stderr %q", f.cmd.Args, f.out.String(), f.errOut.String())
		return -1
	}
}

// lockedBuffer is a bytes.Buffer a process writes while the test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logsWaitFor waits until the buffer holds s.
func logsWaitFor(t *testing.T, b *lockedBuffer, s string, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !strings.Contains(b.String(), s); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %q; have %q", timeout, s, b.String())
		}
	}
}

// logs -f (and run, which follows the same way) across two roostd restarts, one clean and
// one kill -9, while the capsule keeps writing: each follower says it lost roostd, resumes
// once it is back, and prints every line exactly once; one that began with --tail 2 prints
// the two lines before it started and every one after.
func TestLogsCLIFollowResumesAcrossRestarts(t *testing.T) {
	d := newDaemon(t)
	const n = 300 // 15 s: longer than the two restarts take
	script := fmt.Sprintf("i=1; while [ $i -le %d ]; do echo line $i; echo err $i >&2; i=$((i+1)); sleep 0.05; done", n)
	dir := capsule(t, "chatty", script, "")
	id := strings.TrimSpace(d.ok("run", "--detach", dir))
	all := d.followLogs("logs", "-f", id)
	timed := d.followLogs("logs", "-f", "-t", id)
	logsWaitFor(t, all.out, "line 5\n", 20*time.Second)
	tail := d.followLogs("logs", "-f", "--tail", "2", id)
	ran := d.followLogs("run", dir)
	logsWaitFor(t, tail.out, "\n", 10*time.Second)
	logsWaitFor(t, ran.out, "line 3\n", 10*time.Second)

	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("roostd after SIGTERM: %v\n%s", err, d.log)
	}
	time.Sleep(700 * time.Millisecond) // the capsules write on meanwhile
	d.start()
	// Each follower is back once it prints a line written after the restart (gRPC may wait
	// out a reconnect backoff of a second or so first).
	resumed := func() {
		t.Helper()
		last := strings.TrimSuffix(d.ok("logs", "--tail", "1", id), "\n")
		for _, f := range []*logsFollower{all, timed, tail, ran} {
			logsWaitFor(t, f.out, last+"\n", 20*time.Second)
		}
	}
	resumed()
	d.kill9()
	time.Sleep(700 * time.Millisecond) // as above: the capsules write on while no daemon runs
	d.start()
	resumed()

	var want, wantErr strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
		fmt.Fprintf(&wantErr, "err %d\n", i)
	}
	for _, f := range []*logsFollower{all, timed, tail, ran} {
		code := f.wait(t, 60*time.Second)
		out, errOut := f.out.String(), f.errOut.String()
		if code != 0 || strings.Count(errOut, "roostctl: lost roostd (") < 2 || strings.Count(errOut, "; resuming once it is back\n") < 2 {
			t.Fatalf("%v: exit %d, stderr %q", f.cmd.Args, code, errOut)
		}
		var notices []string
		var errLines []string
		for _, l := range strings.SplitAfter(errOut, "\n") {
			if strings.HasPrefix(l, "roostctl: ") {
				notices = append(notices, l)
			} else if l != "" {
				errLines = append(errLines, l)
			}
		}
		gotErr := strings.Join(errLines, "")
		if f == timed {
			times, lines := timedLines(t, out)
			out = strings.Join(lines, "\n") + "\n"
			for i := 1; i < len(times); i++ {
				if times[i].Before(times[i-1]) {
					t.Fatalf("-t: line %d at %s, before the one before it", i, times[i])
				}
			}
			_, errText := timedLines(t, gotErr)
			gotErr = strings.Join(errText, "\n") + "\n"
		}
		w, we := want.String(), wantErr.String()
		if f == tail {
			// Each stream's last two lines when it began, then everything after.
			w, we = logsFromLine(t, w, out, 4), logsFromLine(t, we, gotErr, 4)
		}
		if out != w || gotErr != we {
			t.Fatalf("%v: stdout %q\nstderr %q (notices %q)", f.cmd.Args, out, gotErr, notices)
		}
	}
}

// logsFromLine is want from the line got begins with, which must be at least the least-th.
func logsFromLine(t *testing.T, want, got string, least int) string {
	t.Helper()
	first, _, _ := strings.Cut(got, "\n")
	i := strings.Index(want, first+"\n")
	if first == "" || i < 0 || strings.Count(want[:i], "\n") < least-1 {
		t.Fatalf("begins with %q", first)
	}
	return want[i:]
}
