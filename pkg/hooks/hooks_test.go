package hooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/metrics"
)

// *metrics.Metrics is the Observer roostd passes (metrics cannot import hooks: the
// assertion lives here).
var _ Observer = (*metrics.Metrics)(nil)

// Most tests here run the hooks through testdata/fake-roost-wasm, a shell stand-in for
// roost-wasm (cmd/roost-wasm, being written alongside this package) that keeps its
// command-line contract: exit codes 0/N/124/134, the trap line, no environment for the
// guest. Its "modules" are shell scripts standing for guests. TestRealRunner runs a Go
// guest built for wasip1 under the real bin/roost-wasm when it exists.

// recorder is an Observer and an EventSink.
type recorder struct {
	mu     sync.Mutex
	runs   map[string]int // hook/result
	events []event
}

type event struct {
	hook, subject string
	r             Result
}

func newRecorder() *recorder { return &recorder{runs: map[string]int{}} }

func (rec *recorder) HookRan(hook, result string, took time.Duration) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.runs[hook+"/"+result]++
}

func (rec *recorder) HookEvent(hook string, r Result, subject string) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.events = append(rec.events, event{hook: hook, subject: subject, r: r})
}

func (rec *recorder) count(hook, result string) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.runs[hook+"/"+result]
}

func (rec *recorder) snapshot() []event {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]event(nil), rec.events...)
}

// waitEvents waits until rec holds n events.
func (rec *recorder) waitEvents(t *testing.T, n int, within time.Duration) []event {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ev := rec.snapshot()
		if len(ev) >= n {
			return ev
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events after %s, want %d: %+v", len(ev), within, n, ev)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lockedBuffer collects slog output written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// env is a directory holding a copy of a test runner and the test's modules.
type env struct {
	dir, runner string
}

func newEnv(t *testing.T, runner string) *env {
	t.Helper()
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("testdata", runner))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{dir: dir, runner: filepath.Join(dir, "roost-wasm")}
	if err := os.WriteFile(e.runner, src, 0o755); err != nil {
		t.Fatal(err)
	}
	// A process forked elsewhere in the test binary while the file was open for writing
	// holds that descriptor until it execs, and exec of the file fails with ETXTBSY until
	// then: wait that out here, not in the middle of a test's timing.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := exec.Command(e.runner).Run()
		if !errors.Is(err, syscall.ETXTBSY) || time.Now().After(deadline) {
			break
		}
	}
	// What the fake runner logged of that run is no test's.
	_ = os.Remove(filepath.Join(dir, "runner.log"))
	return e
}

// module writes a guest (a shell script, for the fake runner) and returns its path.
func (e *env) module(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(e.dir, name+".sh")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) log(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.dir, "runner.log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func stageHook(name, module string, deadline int) config.Hook {
	return config.Hook{Name: name, On: config.HookStage, Module: module, DeadlineSeconds: deadline}
}

func endHook(name, module, overflow string) config.Hook {
	return config.Hook{Name: name, On: config.HookSessionEnd, Module: module, OnOverflow: overflow}
}

// Guests.
const (
	policyGuest = `input=$(cat)
case $input in
*'"capsule":"forbidden"'*)
	echo "  capsules named forbidden are not allowed here  "
	echo "a second line is not the reason"
	exit 1 ;;
esac
`
	loopGuest  = "while :; do :; done\n"
	trapGuest  = "echo 'about to trap' >&2\nkill -ABRT $$\n"
	oomGuest   = "echo 'runtime: out of memory: cannot allocate 4194304-byte block (16711680 in use)' >&2\necho 'fatal error: out of memory' >&2\necho 'goroutine 1 [running]:' >&2\nexit 2\n"
	allowGuest = "cat >/dev/null\nexit 0\n"
	echoGuest  = "cat\n"
)

func vetoGuest(reason string) string {
	return "cat >/dev/null\necho '" + reason + "'\nexit 3\n"
}

// A policy hook refuses capsules named forbidden, with its reason, and allows the others;
// the runner is called per the contract, with nothing of roostd's environment.
func TestStagePolicy(t *testing.T) {
	e := newEnv(t, "fake-roost-wasm")
	mod := e.module(t, "policy", policyGuest)
	rec := newRecorder()
	h := New([]config.Hook{stageHook("policy", mod, 0)}, NewExecRunner(Config{Runner: e.runner}), rec, rec, nil)
	defer h.Close(context.Background())

	err := h.Stage(context.Background(), "forbidden@1.0.0", []byte(`{"capsule":"forbidden"}`))
	if err == nil || err.Error() != `hook "policy" refused: capsules named forbidden are not allowed here` {
		t.Fatalf("forbidden: %v", err)
	}
	if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("not a failed precondition: %#v", err)
	}
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Hook != "policy" || refused.Result.Outcome != OutcomeVetoed || refused.Result.ExitCode != 1 {
		t.Errorf("%#v", refused)
	}
	if err := h.Stage(context.Background(), "builder@1.0.0", []byte(`{"capsule":"builder"}`)); err != nil {
		t.Fatalf("builder: %v", err)
	}
	ev := rec.snapshot()
	if len(ev) != 2 || ev[0].subject != "forbidden@1.0.0" || ev[0].r.Outcome != OutcomeVetoed || ev[1].subject != "builder@1.0.0" || ev[1].r.Outcome != OutcomeAllowed || ev[1].r.Reason != "" {
		t.Errorf("events: %+v", ev)
	}
	if rec.count("policy", "vetoed") != 1 || rec.count("policy", "allowed") != 1 {
		t.Errorf("runs: %v", rec.runs)
	}
	log := e.log(t)
	if want := "args run --module " + mod + " --memory-bytes 67108864 --deadline-seconds 30 --\n"; !strings.Contains(log, want) {
		t.Errorf("runner log %q lacks %q", log, want)
	}
	if !strings.Contains(log, "\nenv \n") {
		t.Errorf("the runner got an environment: %q", log)
	}
}

// Every way of not allowing refuses: the hook fails closed.
func TestStageFailsClosed(t *testing.T) {
	e := newEnv(t, "fake-roost-wasm")
	for _, tc := range []struct {
		name    string
		hook    config.Hook
		runner  string
		outcome string
		reason  string
		code    int
		min     time.Duration
	}{
		{name: "loops", hook: stageHook("loops", e.module(t, "loop", loopGuest), 1), outcome: OutcomeTimeout,
			reason: "it ran past its deadline of 1s", code: 124, min: time.Second},
		{name: "traps", hook: stageHook("traps", e.module(t, "trap", trapGuest), 1), outcome: OutcomeTrap,
			reason: "it trapped: wasm error: unreachable", code: 134},
		{name: "oom", hook: config.Hook{Name: "oom", On: config.HookStage, Module: e.module(t, "oom", oomGuest), MemoryBytes: 16 << 20},
			outcome: OutcomeOutOfMemory, reason: "it ran out of memory (16 MiB)", code: 2},
		{name: "silent", hook: stageHook("silent", e.module(t, "silent", "exit 7\n"), 1), outcome: OutcomeVetoed,
			reason: "it gave no reason (exit status 7)", code: 7},
		{name: "no-module", hook: stageHook("no-module", filepath.Join(e.dir, "absent.wasm"), 1), outcome: OutcomeFailed,
			reason: "it could not run: roost-wasm: " + filepath.Join(e.dir, "absent.wasm") + ": no such module", code: 1},
		{name: "no-runner", hook: stageHook("no-runner", e.module(t, "allow", allowGuest), 1), runner: "/nonexistent/roost-wasm",
			outcome: OutcomeFailed, reason: "it could not run: fork/exec /nonexistent/roost-wasm: no such file or directory", code: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runner := e.runner
			if tc.runner != "" {
				runner = tc.runner
			}
			rec := newRecorder()
			h := New([]config.Hook{tc.hook}, NewExecRunner(Config{Runner: runner}), rec, rec, nil)
			start := time.Now()
			err := h.Stage(context.Background(), "c@1", []byte(`{"capsule":"c"}`))
			took := time.Since(start)
			if want := fmt.Sprintf("hook %q refused: %s", tc.hook.Name, tc.reason); err == nil || err.Error() != want {
				t.Fatalf("%v, want %s", err, want)
			}
			if !errdefs.IsFailedPrecondition(err) {
				t.Errorf("not a failed precondition")
			}
			ev := rec.snapshot()
			if len(ev) != 1 || ev[0].r.Outcome != tc.outcome || ev[0].r.ExitCode != tc.code {
				t.Errorf("events: %+v", ev)
			}
			if rec.count(tc.hook.Name, tc.outcome) != 1 {
				t.Errorf("runs: %v", rec.runs)
			}
			if took < tc.min || took > tc.min+3*time.Second {
				t.Errorf("took %s", took)
			}
		})
	}
}

// Stage hooks run in configuration order and the first refusal wins: later ones do not run.
func TestStageOrder(t *testing.T) {
	e := newEnv(t, "fake-roost-wasm")
	rec := newRecorder()
	h := New([]config.Hook{
		stageHook("a", e.module(t, "a", allowGuest), 5),
		endHook("told", e.module(t, "told", echoGuest), ""),
		stageHook("b", e.module(t, "b", vetoGuest("b says no")), 5),
		stageHook("c", e.module(t, "c", vetoGuest("c says no")), 5),
	}, NewExecRunner(Config{Runner: e.runner}), rec, rec, nil)
	defer h.Close(context.Background())
	err := h.Stage(context.Background(), "x@1", []byte(`{}`))
	if err == nil || err.Error() != `hook "b" refused: b says no` {
		t.Fatal(err)
	}
	ev := rec.snapshot()
	if len(ev) != 2 || ev[0].hook != "a" || ev[0].r.Outcome != OutcomeAllowed || ev[1].hook != "b" || ev[1].r.Outcome != OutcomeVetoed {
		t.Errorf("events: %+v", ev)
	}
	if rec.count("c", "vetoed") != 0 || rec.count("told", "ok") != 0 {
		t.Errorf("runs: %v", rec.runs)
	}
}

// groupAlive lists the processes of process group pgid that are not zombies.
func groupAlive(t *testing.T, pgid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var alive []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 2 && fields[0] != "Z" && fields[2] == strconv.Itoa(pgid) {
			alive = append(alive, pid)
		}
	}
	return alive
}

// runnerPids are the pids the test runners logged.
func runnerPids(t *testing.T, log string) []int {
	t.Helper()
	var pids []int
	for _, l := range strings.Split(log, "\n") {
		var pid int
		if _, err := fmt.Sscanf(l, "pid %d", &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Cancelling Stage's context kills the runner's process group at once; the error is the
// context's, not a refusal.
func TestStageCancel(t *testing.T) {
	e := newEnv(t, "fake-roost-wasm")
	h := New([]config.Hook{stageHook("loops", e.module(t, "loop", loopGuest), 30)}, NewExecRunner(Config{Runner: e.runner}), nil, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	err := h.Stage(ctx, "x@1", nil)
	if !errors.Is(err, context.Canceled) || errdefs.IsFailedPrecondition(err) || err.Error() != `hook "loops" did not finish: context canceled` {
		t.Fatalf("%v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("took %s", took)
	}
	pids := runnerPids(t, e.log(t))
	if len(pids) != 1 {
		t.Fatalf("runner pids %v", pids)
	}
	// SIGKILL is delivered at once but a loaded host may take a moment to end what it hit:
	// wait for the group to go, and fail only if it never does.
	alive := groupAlive(t, pids[0])
	for deadline := time.Now().Add(5 * time.Second); len(alive) != 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		alive = groupAlive(t, pids[0])
	}
	if len(alive) != 0 {
		t.Errorf("the runner's group lives on: %v", alive)
	}
}

// A runner that ignores its deadline and SIGTERM is SIGKILLed, its whole process group
// with it (the guest's background sleep too), at deadline + slack, and the hook is reported
// as timed out.
func TestBackstop(t *testing.T) {
	e := newEnv(t, "stubborn-roost-wasm")
	mod := e.module(t, "loop", "sleep 1000 &\n"+loopGuest)
	rec := newRecorder()
	h := New([]config.Hook{stageHook("stuck", mod, 1)}, NewExecRunner(Config{Runner: e.runner, Slack: 500 * time.Millisecond}), rec, rec, nil)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- h.Stage(context.Background(), "x@1", nil) }()
	// The positive control of the check below: while the hook runs, its group (the runner,
	// the module's shell, the background sleep) is alive where groupAlive looks.
	var members []int
	for deadline := time.Now().Add(time.Second); len(members) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(filepath.Join(e.dir, "runner.log")); err == nil {
			if pids := runnerPids(t, string(b)); len(pids) == 1 {
				members = groupAlive(t, pids[0])
			}
		}
	}
	if len(members) < 2 {
		t.Errorf("the running hook's process group, before its deadline: %v", members)
	}
	err := <-done
	took := time.Since(start)
	if err == nil || err.Error() != `hook "stuck" refused: it ran past its deadline of 1s` {
		t.Fatal(err)
	}
	if took < 1500*time.Millisecond || took > 4*time.Second {
		t.Errorf("took %s", took)
	}
	if ev := rec.snapshot(); len(ev) != 1 || ev[0].r.Outcome != OutcomeTimeout || ev[0].r.ExitCode != -1 {
		t.Errorf("%+v", ev)
	}
	pids := runnerPids(t, e.log(t))
	if len(pids) != 1 {
		t.Fatalf("runner pids %v", pids)
	}
	// As above: the group's SIGKILL takes a moment to end it on a loaded host.
	alive := groupAlive(t, pids[0])
	for deadline := time.Now().Add(5 * time.Second); len(alive) != 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		alive = groupAlive(t, pids[0])
	}
	if len(alive) != 0 {
		t.Errorf("the runner's group lives on: %v", alive)
	}
}

// The runner runs as Config.Credential.
func TestCredential(t *testing.T) {
	testenv.NeedRoot(t, "changing uid needs root")
	e := newEnv(t, "fake-roost-wasm")
	mod := e.module(t, "allow", allowGuest)
	for d := e.dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(e.dir, "runner.log"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(e.dir, "runner.log"), 0o666)
	h := New([]config.Hook{stageHook("as-nobody", mod, 5)},
		NewExecRunner(Config{Runner: e.runner, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}), nil, nil, nil)
	if err := h.Stage(context.Background(), "x@1", nil); err != nil {
		t.Fatal(err)
	}
	if log := e.log(t); !strings.Contains(log, " uid 65534 ") {
		t.Errorf("runner log: %q", log)
	}
}

// A hook's output is bounded, and its reason is one clean line of at most ReasonLimit bytes;
// a trap's line, written last, survives a flood on stderr.
func TestOutputBounds(t *testing.T) {
	e := newEnv(t, "fake-roost-wasm")
	flood := e.module(t, "flood", `cat >/dev/null
printf 'no \033[31mred\033[0m\t'
head -c 2000 /dev/zero | tr '\0' 'r'
echo
head -c 1048576 /dev/zero | tr '\0' 'x'
head -c 200000 /dev/zero | tr '\0' 'e' >&2
exit 1
`)
	trapFlood := e.module(t, "trapflood", "head -c 200000 /dev/zero | tr '\\0' 'e' >&2\nkill -ABRT $$\n")
	rec := newRecorder()
	run := NewExecRunner(Config{Runner: e.runner})
	h := New([]config.Hook{stageHook("flood", flood, 5)}, run, rec, rec, nil)
	err := h.Stage(context.Background(), "x@1", nil)
	var refused *RefusedError
	if !errors.As(err, &refused) {
		t.Fatal(err)
	}
	r := refused.Result
	if !strings.HasPrefix(r.Reason, "no ?[31mred?[0m?rrr") || len(r.Reason) != ReasonLimit {
		t.Errorf("reason %q (%d bytes)", r.Reason, len(r.Reason))
	}
	for name, out := range map[string][]byte{"stdout": r.Stdout, "stderr": r.Stderr} {
		if len(out) > OutputLimit+64 || !bytes.Contains(out, []byte(" bytes left out]\n")) {
			t.Errorf("%s: %d bytes", name, len(out))
		}
	}
	res := run.Run(context.Background(), stageHook("trapflood", trapFlood, 5), nil)
	if res.Outcome != OutcomeTrap || res.Reason != "it trapped: wasm error: unreachable" {
		t.Errorf("%+v", res.Reason)
	}
}

func TestClassify(t *testing.T) {
	h := withDefaults(stageHook("h", "/m", 0))
	for _, tc := range []struct {
		code            int
		stdout, stderr  string
		outcome, reason string
	}{
		{0, "ignored\n", "", OutcomeAllowed, ""},
		{1, "\n", "", OutcomeVetoed, ""},
		{1, "  why  \nmore", "", OutcomeVetoed, "why"},
		{124, "", "", OutcomeTimeout, "it ran past its deadline of 30s"},
		{134, "", "guest said\nroost-wasm: trap: wasm error: out of bounds memory access\n", OutcomeTrap, "it trapped: wasm error: out of bounds memory access"},
		{134, "", "", OutcomeTrap, "it trapped: roost-wasm said nothing"},
		{134, "", "memory allocation of 1048576 bytes failed\nroost-wasm: trap: wasm error: unreachable\n", OutcomeOutOfMemory, "it ran out of memory (64 MiB)"},
		{2, "", "fatal error: out of memory\n", OutcomeOutOfMemory, "it ran out of memory (64 MiB)"},
		{143, "", "", OutcomeFailed, "it could not run: roost-wasm was terminated (exit 143)"},
		{2, "", "roost-wasm: --module: not a WebAssembly module\n", OutcomeFailed, "it could not run: roost-wasm: --module: not a WebAssembly module"},
	} {
		outcome, reason := classify(h, tc.code, []byte(tc.stdout), []byte(tc.stderr))
		if tc.reason == "" && tc.outcome == OutcomeVetoed {
			tc.reason = fmt.Sprintf("it gave no reason (exit status %d)", tc.code)
		}
		if outcome != tc.outcome || reason != tc.reason {
			t.Errorf("%d %q %q: %s %q, want %s %q", tc.code, tc.stdout, tc.stderr, outcome, reason, tc.outcome, tc.reason)
		}
	}
	for n, want := range map[int64]string{64 << 20: "64 MiB", 4 << 30: "4 GiB", 3 << 10: "3 KiB", 1536: "1536 bytes", 3 << 29: "1536 MiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
	if got := clean(strings.Repeat("é", 300)); len(got) != 512 || !strings.HasSuffix(got, "é") {
		t.Errorf("cut mid-character: %d bytes", len(got))
	}
	var b boundedBuffer
	for range 100 {
		b.Write(bytes.Repeat([]byte("a"), 1000))
	}
	b.Write([]byte("THE END"))
	if out := b.Bytes(); len(out) > OutputLimit+64 || !bytes.HasSuffix(out, []byte("aTHE END")) || !bytes.Contains(out, []byte("[roost: 34471 bytes left out]")) {
		t.Errorf("%d bytes, ends %q", len(out), out[len(out)-20:])
	}
}

// A session_end hook gets its input on stdin; its stdout reaches the sink with the
// session's id; exits are ok and failed.
func TestSessionEnd(t *testing.T) {
	e := newEnv(t, "fake-roost-wasm")
	rec := newRecorder()
	m := metrics.New(nil, func() map[string]int { return nil })
	h := New([]config.Hook{
		endHook("echo", e.module(t, "echo", echoGuest), ""),
		endHook("complain", e.module(t, "complain", vetoGuest("cannot reach the archive")), config.HookOverflowBlock),
		stageHook("policy", e.module(t, "policy", policyGuest), 5),
	}, NewExecRunner(Config{Runner: e.runner}), m, rec, nil)
	input := []byte(`{"session":"s-1","status":"exited","exit_code":0}`)
	h.SessionEnd("s-1", input)
	input[2] = 'X' // SessionEnd keeps its own copy.
	ev := rec.waitEvents(t, 2, 10*time.Second)
	byHook := map[string]event{}
	for _, e := range ev {
		byHook[e.hook] = e
	}
	if e := byHook["echo"]; e.subject != "s-1" || e.r.Outcome != OutcomeOK || string(e.r.Stdout) != `{"session":"s-1","status":"exited","exit_code":0}` {
		t.Errorf("echo: %+v %q", e, e.r.Stdout)
	}
	if e := byHook["complain"]; e.r.Outcome != OutcomeFailed || e.r.Reason != "cannot reach the archive" || e.r.ExitCode != 3 {
		t.Errorf("complain: %+v", e)
	}
	if err := h.Stage(context.Background(), "forbidden@1", []byte(`{"capsule":"forbidden"}`)); err == nil {
		t.Fatal("allowed")
	}
	h.Close(context.Background())
	m.HookRan("echo", OutcomeDropped, 0)

	rr := httptest.NewRecorder()
	m.Handler().ServeHTTP(rr, httptest.NewRequest("GET", "/metrics", nil))
	body := rr.Body.String()
	for _, want := range []string{
		`roost_hook_runs_total{hook="echo",result="ok"} 1`,
		`roost_hook_runs_total{hook="echo",result="dropped"} 1`,
		`roost_hook_runs_total{hook="complain",result="failed"} 1`,
		`roost_hook_runs_total{hook="policy",result="vetoed"} 1`,
		`roost_hook_seconds_count{hook="echo"} 1`,
		`roost_hook_seconds_count{hook="policy"} 1`,
		`roost_hook_seconds_bucket{hook="policy",le="+Inf"} 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// holdGuest holds the worker for a second when its input says "hold".
const holdGuest = `input=$(cat)
case $input in *hold*) sleep 1 ;; esac
echo "$input"
`

// waitQueue waits until w's queue holds n inputs.
func waitQueue(t *testing.T, w *worker, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(w.queue) != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d, want %d", len(w.queue), n)
		}
	}
}

// on_overflow: drop drops the newest inputs while the queue is full, counting each and
// logging once per burst.
func TestSessionEndDrop(t *testing.T) {
	e := newEnv(t, "fake-roost-wasm")
	rec := newRecorder()
	var logs lockedBuffer
	h := New([]config.Hook{endHook("slow", e.module(t, "hold", holdGuest), "")}, NewExecRunner(Config{Runner: e.runner}), rec, rec,
		slog.New(slog.NewTextHandler(&logs, nil)))
	w := h.ends[0]
	h.SessionEnd("s0", []byte("hold"))
	waitQueue(t, w, 0) // s0 runs, for a second
	for i := 1; i <= QueueLength; i++ {
		h.SessionEnd(fmt.Sprintf("s%d", i), []byte("hold"))
	}
	if len(w.queue) != QueueLength || rec.count("slow", OutcomeDropped) != 0 {
		t.Fatalf("queue %d, dropped %d", len(w.queue), rec.count("slow", OutcomeDropped))
	}
	start := time.Now()
	for i := range 10 {
		h.SessionEnd(fmt.Sprintf("over%d", i), []byte("hold"))
	}
	if took := time.Since(start); took > 100*time.Millisecond || rec.count("slow", OutcomeDropped) != 10 {
		t.Fatalf("dropping 10 took %s; dropped %d", took, rec.count("slow", OutcomeDropped))
	}
	if n := strings.Count(logs.String(), "hook queue full"); n != 1 {
		t.Errorf("%d warnings for one burst:\n%s", n, logs.String())
	}
	// s0 ends and s1 starts: a slot frees, the burst is over; the next overflow is another.
	waitQueue(t, w, QueueLength-1)
	h.SessionEnd("fits", []byte("hold"))
	h.SessionEnd("second-burst", []byte("hold"))
	if rec.count("slow", OutcomeDropped) != 11 || strings.Count(logs.String(), "hook queue full") != 2 || !strings.Contains(logs.String(), "dropped=10") {
		t.Errorf("dropped %d\n%s", rec.count("slow", OutcomeDropped), logs.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := h.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("close: %v", err)
	}
	// s0 ran, s1 was stopped, the 256 queued after it were dropped at Close.
	if rec.count("slow", OutcomeOK) != 1 || rec.count("slow", OutcomeFailed) != 1 || rec.count("slow", OutcomeDropped) != 11+QueueLength {
		t.Errorf("runs: %v", rec.runs)
	}
	ev := rec.snapshot()
	if len(ev) != 2 || ev[1].subject != "s1" || ev[1].r.Reason != "it did not finish: context canceled" {
		t.Errorf("events: %+v", ev)
	}
}

// on_overflow: block makes the call past a full queue wait until the worker takes an
// input; Close releases a waiting call.
func TestSessionEndBlock(t *testing.T) {
	e := newEnv(t, "fake-roost-wasm")
	rec := newRecorder()
	h := New([]config.Hook{endHook("slow", e.module(t, "hold", holdGuest), config.HookOverflowBlock)}, NewExecRunner(Config{Runner: e.runner}), rec, rec, nil)
	w := h.ends[0]
	h.SessionEnd("s0", []byte("hold"))
	waitQueue(t, w, 0)
	held := time.Now() // s0 ends about a second from now
	for i := 1; i <= QueueLength; i++ {
		h.SessionEnd(fmt.Sprintf("s%d", i), []byte("hold"))
	}
	returned := make(chan time.Time)
	go func() {
		h.SessionEnd("blocked", []byte("hold"))
		returned <- time.Now()
	}()
	select {
	case <-returned:
		t.Fatal("a call past a full queue did not wait")
	case <-time.After(300 * time.Millisecond):
	}
	select {
	case at := <-returned:
		if at.Sub(held) < 700*time.Millisecond {
			t.Errorf("returned %s after the hold began", at.Sub(held))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still blocked after the running input ended")
	}
	if ev := rec.snapshot(); len(ev) != 1 || ev[0].subject != "s0" || ev[0].r.Outcome != OutcomeOK {
		t.Errorf("events: %+v", ev)
	}
	// The queue is full again (s1 runs); the next call waits until Close releases it.
	go func() {
		h.SessionEnd("released", []byte("hold"))
		returned <- time.Now()
	}()
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := h.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("close: %v", err)
	}
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not release a waiting call")
	}
	if rec.count("slow", OutcomeOK) != 1 || rec.count("slow", OutcomeFailed) != 1 || rec.count("slow", OutcomeDropped) != QueueLength+1 {
		t.Errorf("runs: %v", rec.runs)
	}
}

// Close waits for a run in flight to end; inputs after Close are dropped.
func TestCloseWaits(t *testing.T) {
	e := newEnv(t, "fake-roost-wasm")
	rec := newRecorder()
	h := New([]config.Hook{endHook("slow", e.module(t, "hold", holdGuest), "")}, NewExecRunner(Config{Runner: e.runner}), rec, rec, nil)
	h.SessionEnd("s0", []byte("hold"))
	waitQueue(t, h.ends[0], 0)
	start := time.Now()
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("Close returned after %s, before the run ended", took)
	}
	if ev := rec.snapshot(); len(ev) != 1 || ev[0].r.Outcome != OutcomeOK || string(ev[0].r.Stdout) != "hold\n" {
		t.Errorf("events: %+v", ev)
	}
	h.SessionEnd("late", []byte("hold"))
	if rec.count("slow", OutcomeDropped) != 1 {
		t.Errorf("runs: %v", rec.runs)
	}
	if err := h.Close(context.Background()); err != nil {
		t.Errorf("second close: %v", err)
	}
}

// Without hooks nothing runs and nothing blocks; without a runner every hook refuses.
func TestNoHooksNoRunner(t *testing.T) {
	h := New(nil, nil, nil, nil, nil)
	if err := h.Stage(context.Background(), "x@1", nil); err != nil {
		t.Fatal(err)
	}
	h.SessionEnd("s", nil)
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	h = New([]config.Hook{stageHook("p", "/m.wasm", 0)}, nil, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := h.Stage(context.Background(), "x@1", nil); err == nil || err.Error() != `hook "p" refused: it could not run: roostd has no hook runner` {
		t.Fatal(err)
	}
}
