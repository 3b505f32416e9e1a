// Package exec runs one more command in a running session (roostctl exec), with exactly
// its program's containment, and records it: in the session's events and in its trace.
// It starts the command in a session the manager holds for it; it neither finds nor
// changes the session itself.
package exec

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/outcome"
	"roost.dev/roost/pkg/session/store"
)

// Exit codes of a command that never ran, as a shell gives them.
const (
	RefusedCode  = 126 // the session's exec allowlist refused it
	NotFoundCode = 127 // it could not be started: not found, a bad working directory
)

// Runtime is a session runtime that can run one more command in a running session.
type Runtime interface {
	Exec(ctx context.Context, spec containment.Spec, proc containment.Process, opts containment.ExecOptions) (*containment.Execution, error)
}

// Journal keeps the session's events: Note adds one to the registry's log.
type Journal interface {
	Note(sessionID, eventType, detail string) error
}

// Target is the running session a command starts in, as its launch started it.
type Target struct {
	Session    string
	RecordsDir string
	// Spec is the program's own start: the command gets what it got.
	Spec    containment.Spec
	Proc    containment.Process
	Runtime Runtime
}

// NotStarted is a command the session could not start: the exec itself was done (and
// recorded), the command ended before it began. Code is RefusedCode or NotFoundCode.
type NotStarted struct {
	ExecID string
	Code   int
	Detail string
}

func (e *NotStarted) Error() string { return e.Detail }

// Exec is a command running in a session, started by Start.
type Exec struct {
	// ID names it in the session's events and trace.
	ID string
	*containment.Execution

	journal Journal
	log     *slog.Logger
	session string
	records string
	argv    []string
	began   time.Time
	once    sync.Once
	ended   chan struct{}
	code    int
	detail  string
}

// Check refuses options that name no command or carry a malformed environment.
func Check(opts containment.ExecOptions) error {
	if len(opts.Argv) == 0 || opts.Argv[0] == "" {
		return fmt.Errorf("no command given: %w", errdefs.ErrInvalidArgument)
	}
	for _, kv := range opts.Env {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" || strings.ContainsRune(kv, 0) {
			return fmt.Errorf("environment %q: want NAME=VALUE: %w", kv, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Start starts the command in t and records it. The command is killed when ctx ends (its
// client has gone) or the session's process ends. Wait records its end. The caller holds
// the session so that it can neither end nor freeze while the command starts.
func Start(ctx context.Context, t Target, j Journal, log *slog.Logger, opts containment.ExecOptions) (*Exec, error) {
	return start(ctx, t, j, log, opts, ctx.Done())
}

// start is Start, the command killed when gone is closed (never when it is nil) rather
// than when ctx ends: ctx bounds only the start.
func start(ctx context.Context, t Target, j Journal, log *slog.Logger, opts containment.ExecOptions, gone <-chan struct{}) (*Exec, error) {
	x := &Exec{ID: newID(), journal: j, log: log, session: t.Session, records: t.RecordsDir, argv: opts.Argv, began: time.Now().UTC(), ended: make(chan struct{})}
	run, err := t.Runtime.Exec(ctx, t.Spec, t.Proc, opts)
	if err != nil {
		var se *containment.StartError
		if !errors.As(err, &se) {
			return nil, fmt.Errorf("session %s: exec: %w", t.Session, err)
		}
		refused := &NotStarted{ExecID: x.ID, Code: NotFoundCode, Detail: se.Msg}
		if strings.HasPrefix(se.Msg, roostinit.RefusedPrefix) {
			refused.Code = RefusedCode
		}
		x.code, x.detail = refused.Code, refused.Detail
		x.record(fmt.Sprintf("%s of %s could not start: %s", x.ID, quoteArgv(x.argv), se.Msg), "exec_end")
		return nil, refused
	}
	x.Execution = run
	x.record(fmt.Sprintf("%s started: %s (pid %d)", x.ID, quoteArgv(x.argv), run.Pid), "exec_start")
	log.Info("exec started", "session", t.Session, "exec", x.ID, "pid", run.Pid, "command", quoteArgv(x.argv))
	go func() {
		select {
		case <-x.ended:
		case <-gone:
			_ = run.Kill()
		case <-t.Proc.Done():
			// Nothing outlives its session; a sealed one's pid namespace ends it anyway.
			_ = run.Kill()
		}
	}()
	return x, nil
}

// Wait waits for the command to end, records its end and returns its exit code (128+N for
// signal N) and how it ended in words. What it wrote may still be in its pipes: Close them
// once read.
func (x *Exec) Wait() (int, string) {
	x.once.Do(func() {
		defer close(x.ended)
		info, err := x.Execution.Wait()
		switch {
		case err != nil:
			x.code, x.detail = 255, "roost lost the command: "+err.Error()
		case info.Signal != 0:
			x.code, x.detail = info.Code, "killed by "+outcome.SignalName(syscall.Signal(info.Signal))
		default:
			x.code, x.detail = info.Code, fmt.Sprintf("exited with code %d", info.Code)
		}
		x.record(fmt.Sprintf("%s of %s ended: %s", x.ID, quoteArgv(x.argv), x.detail), "exec_end")
		x.log.Info("exec ended", "session", x.session, "exec", x.ID, "detail", x.detail)
	})
	return x.code, x.detail
}

// record notes the exec in the registry's events and the session's trace. Neither failing
// changes what the command did, so it is logged, not returned.
func (x *Exec) record(detail, traceType string) {
	if err := x.journal.Note(x.session, store.EventExec, detail); errdefs.IsNotFound(err) {
		x.log.Warn("exec ended in a session that is gone", "session", x.session, "exec", x.ID, "err", err)
		return
	} else if err != nil {
		x.log.Warn("recording an exec", "session", x.session, "exec", x.ID, "err", err)
	}
	t := records.Trace{EventType: traceType, SessionID: x.session, Timestamp: time.Now().UTC(), ExecID: x.ID, Command: x.argv}
	if traceType == "exec_end" {
		code := x.code
		ms := time.Since(x.began).Milliseconds()
		t.ExitCode, t.Detail, t.DurationMS = &code, x.detail, &ms
	}
	if err := records.AppendTrace(x.records, t); err != nil {
		x.log.Warn("writing the trace", "session", x.session, "exec", x.ID, "err", err)
	}
}

// newID is an exec's id: "exec_" and 12 random hex digits.
func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "exec_" + hex.EncodeToString(b)
}

// quoteArgv writes a command line as a shell would read it back.
func quoteArgv(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && !strings.ContainsFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
