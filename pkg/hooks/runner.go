package hooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"
)

// Config is how ExecRunner starts the WASM runner.
type Config struct {
	// Runner is the path of the roost-wasm binary.
	Runner string
	// Credential, when set, is the uid, gid and groups the runner runs as. This package does
	// not contain the runner beyond what roost-wasm itself enforces (no preopens, no
	// environment, bounded memory, a deadline) and its own process group: the integrator
	// sets Credential to an unprivileged uid of the hooks' own, so that a guest escaping the
	// WASM runtime holds nothing of roostd's (and no session's).
	Credential *syscall.Credential
	// Compiled, when set, gives a hook module's compiled entry and its digest, which the
	// runner then deserializes instead of compiling the module on every run; ok false
	// leaves the runner to compile.
	Compiled func(module string) (entry, sha256 string, ok bool)
	// Slack is how long past a hook's deadline the host waits for roost-wasm to end the
	// guest itself (exit 124) before it SIGKILLs the runner's process group and reports a
	// timeout anyway; DefaultSlack when 0.
	Slack time.Duration
}

// DefaultSlack is Config.Slack's default: the host-side backstop fires at deadline+5s.
const DefaultSlack = 5 * time.Second

// Bounds of what a run's output keeps.
const (
	// OutputLimit bounds Result.Stdout and Result.Stderr each: past it a stream keeps its
	// first OutputLimit-outputTail bytes and its last outputTail, with a line between
	// saying how much was left out (a trap's message, written last, survives).
	OutputLimit = 64 << 10
	outputTail  = 8 << 10
	// ReasonLimit bounds a reason taken from a hook's output, in bytes.
	ReasonLimit = 512
)

// Exit codes of roost-wasm's contract.
const (
	exitTimeout = 124
	exitTrap    = 134
	exitTermed  = 143
)

// trapPrefix starts the line roost-wasm writes to stderr when the guest traps.
const trapPrefix = "roost-wasm: trap: "

// ExecRunner is the default Runner: each run is one roost-wasm process.
//
// The runner is started with no environment, "/" as its directory, the input on its stdin,
// in a process group of its own, as cfg.Credential when set:
//
//	roost-wasm run --module M --memory-bytes N --deadline-seconds S --
//
// No --preopen and no --env-from-self: the guest sees no file and no variable. Outcomes:
//   - exit 0: allowed.
//   - exit 124, or the host-side backstop (deadline + Slack, then SIGKILL to the process
//     group): timeout. The backstop covers a runner that hangs or ignores its deadline.
//   - a non-zero exit whose stderr has a line starting "fatal error: out of memory" or
//     "runtime: out of memory" (a Go guest whose memory.grow failed: it exits 2) or
//     "memory allocation of " (a Rust guest's, which then aborts with a trap): out_of_memory.
//     WASI has no out-of-memory signal of its own; the guest learns of it through a failed
//     memory.grow, so the guest's runtime is what says so.
//   - exit 134: trap; the reason is the message of stderr's "roost-wasm: trap: " line.
//   - exit 143 (the runner was sent SIGTERM), the runner killed by a signal, or a non-zero
//     exit whose stderr starts "roost-wasm: " (the runner refusing its arguments or the
//     module): failed.
//   - any other exit: vetoed, with stdout's first line as the reason.
//
// The exit code is the guest's choice as much as the runner's (a guest may proc_exit(124));
// every case but exit 0 refuses, so a guest can change only the label of its refusal.
// Cancelling ctx SIGKILLs the process group at once and reports failed.
type ExecRunner struct {
	cfg Config
}

// NewExecRunner returns a Runner that starts cfg.Runner.
func NewExecRunner(cfg Config) *ExecRunner {
	if cfg.Slack <= 0 {
		cfg.Slack = DefaultSlack
	}
	return &ExecRunner{cfg: cfg}
}

// Run runs h once with stdin as its input.
func (r *ExecRunner) Run(ctx context.Context, h Hook, stdin []byte) Result {
	h = withDefaults(h)
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return Result{Outcome: OutcomeFailed, ExitCode: -1, Reason: stopped(ctx)}
	}
	rctx, cancel := context.WithTimeout(ctx, h.Deadline()+r.cfg.Slack)
	defer cancel()
	args := []string{"run", "--module", h.Module,
		"--memory-bytes", strconv.FormatInt(h.MemoryBytes, 10),
		"--deadline-seconds", strconv.Itoa(h.DeadlineSeconds)}
	if r.cfg.Compiled != nil {
		if entry, sum, ok := r.cfg.Compiled(h.Module); ok {
			args = append(args, "--cache", entry, "--cache-sha256", sum)
		}
	}
	cmd := exec.CommandContext(rctx, r.cfg.Runner, append(args, "--")...)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdin = bytes.NewReader(stdin)
	stdout, stderr := &boundedBuffer{}, &boundedBuffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: r.cfg.Credential}
	// The group's leader is not reaped before Cancel runs, so its pid is still the group's.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// Nothing outlives the group's SIGKILL to hold the pipes; this bounds Wait regardless.
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	res := Result{ExitCode: -1, Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), Took: time.Since(start)}
	ps := cmd.ProcessState
	if ps == nil {
		res.Outcome, res.Reason = OutcomeFailed, "it could not run: "+err.Error()
		if ctx.Err() != nil {
			res.Reason = stopped(ctx)
		}
		return res
	}
	ws, _ := ps.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		switch {
		case ws.Signal() == syscall.SIGKILL && ctx.Err() != nil:
			res.Outcome, res.Reason = OutcomeFailed, stopped(ctx)
		case ws.Signal() == syscall.SIGKILL && errors.Is(rctx.Err(), context.DeadlineExceeded):
			res.Outcome, res.Reason = OutcomeTimeout, pastDeadline(h)
		default:
			res.Outcome, res.Reason = OutcomeFailed, fmt.Sprintf("it could not run: roost-wasm was killed by signal %d (%s)", ws.Signal(), ws.Signal())
		}
		return res
	}
	res.ExitCode = ps.ExitCode()
	res.Outcome, res.Reason = classify(h, res.ExitCode, res.Stdout, res.Stderr)
	return res
}

// classify judges a run that exited with code.
func classify(h Hook, code int, stdout, stderr []byte) (outcome, reason string) {
	lines := strings.Split(string(stderr), "\n")
	switch {
	case code == 0:
		return OutcomeAllowed, ""
	case code == exitTimeout:
		return OutcomeTimeout, pastDeadline(h)
	case hasLine(lines, "fatal error: out of memory", "runtime: out of memory", "memory allocation of "):
		return OutcomeOutOfMemory, fmt.Sprintf("it ran out of memory (%s)", formatBytes(h.MemoryBytes))
	case code == exitTrap:
		msg := firstLine(stderr)
		for _, l := range lines {
			if m, ok := strings.CutPrefix(l, trapPrefix); ok {
				msg = clean(m)
				break
			}
		}
		if msg == "" {
			msg = "roost-wasm said nothing"
		}
		return OutcomeTrap, "it trapped: " + msg
	case code == exitTermed:
		return OutcomeFailed, "it could not run: roost-wasm was terminated (exit 143)"
	case strings.HasPrefix(string(stderr), "roost-wasm: "):
		return OutcomeFailed, "it could not run: " + firstLine(stderr)
	}
	if reason := firstLine(stdout); reason != "" {
		return OutcomeVetoed, reason
	}
	return OutcomeVetoed, fmt.Sprintf("it gave no reason (exit status %d)", code)
}

func hasLine(lines []string, prefixes ...string) bool {
	for _, l := range lines {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				return true
			}
		}
	}
	return false
}

func pastDeadline(h Hook) string {
	return fmt.Sprintf("it ran past its deadline of %s", h.Deadline())
}

// stopped is the reason of a run its caller's context ended.
func stopped(ctx context.Context) string {
	return "it did not finish: " + context.Cause(ctx).Error()
}

// firstLine is out's first line, trimmed, printable and at most ReasonLimit bytes.
func firstLine(out []byte) string {
	line, _, _ := bytes.Cut(out, []byte("\n"))
	return clean(string(line))
}

// clean makes a guest's text fit a one-line reason: valid UTF-8, no control characters
// (they would reach operators' terminals through roostctl and logs), at most ReasonLimit
// bytes, cut on a character boundary.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	s = strings.TrimSpace(s)
	if len(s) > ReasonLimit {
		cut := ReasonLimit
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// formatBytes writes n in the largest binary unit that divides it.
func formatBytes(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d %s", n/u.size, u.name)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}

// boundedBuffer keeps a stream's first OutputLimit-outputTail bytes and its last outputTail.
// os/exec writes each stream from one goroutine, and reads it after Wait.
type boundedBuffer struct {
	head, tail []byte
	total      int64
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	b.total += int64(n)
	if room := OutputLimit - outputTail - len(b.head); room > 0 {
		take := min(room, len(p))
		b.head = append(b.head, p[:take]...)
		p = p[take:]
	}
	if len(p) > 0 {
		b.tail = append(b.tail, p...)
		if len(b.tail) > 2*outputTail {
			b.tail = append(b.tail[:0], b.tail[len(b.tail)-outputTail:]...)
		}
	}
	return n, nil
}

// Bytes is what was kept, with a line where bytes were left out.
func (b *boundedBuffer) Bytes() []byte {
	tail := b.tail
	if len(tail) > outputTail {
		tail = tail[len(tail)-outputTail:]
	}
	out := append([]byte(nil), b.head...)
	if left := b.total - int64(len(b.head)) - int64(len(tail)); left > 0 {
		out = fmt.Appendf(out, "\n[roost: %d bytes left out]\n", left)
	}
	return append(out, tail...)
}
