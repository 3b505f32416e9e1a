package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/manifest"
)

// EventExec records a command roostctl exec ran in a session: its start, or why it could
// not start, and its end. The detail names the exec's id and its command.
const EventExec = "session.exec"

// Exit codes of a command that never ran, as a shell gives them.
const (
	ExecRefusedCode  = 126 // the session's exec allowlist refused it
	ExecNotFoundCode = 127 // it could not be started: not found, a bad working directory
)

// execRuntime is a Runtime that can run one more command in a running session.
type execRuntime interface {
	Exec(ctx context.Context, spec containment.Spec, proc containment.Process, opts containment.ExecOptions) (*containment.Execution, error)
}

// ExecNotStarted is a command the session could not start: the exec itself was done (and
// recorded), the command ended before it began. Code is ExecRefusedCode or
// ExecNotFoundCode.
type ExecNotStarted struct {
	ExecID string
	Code   int
	Detail string
}

func (e *ExecNotStarted) Error() string { return e.Detail }

// Exec is a command running in a session, started by Manager.Exec.
type Exec struct {
	// ID names it in the session's events and trace.
	ID string
	*containment.Execution

	m       *Manager
	session string
	records string
	argv    []string
	began   time.Time
	once    sync.Once
	ended   chan struct{}
	code    int
	detail  string
}

// Exec starts one more command in a running session, with exactly its program's
// containment, and records it in the session's events and trace. The command is killed when
// ctx ends (its client has gone) or the session ends. Wait records its end.
func (m *Manager) Exec(ctx context.Context, id string, opts containment.ExecOptions) (*Exec, error) {
	if len(opts.Argv) == 0 || opts.Argv[0] == "" {
		return nil, fmt.Errorf("no command given: %w", errdefs.ErrInvalidArgument)
	}
	for _, kv := range opts.Env {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" || strings.ContainsRune(kv, 0) {
			return nil, fmt.Errorf("environment %q: want NAME=VALUE: %w", kv, errdefs.ErrInvalidArgument)
		}
	}
	rec, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	if err := execState(rec); err != nil {
		return nil, err
	}
	l := m.live.lookup(rec.ID)
	if l == nil {
		return nil, fmt.Errorf("session %s is %s but this daemon holds no process of it: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	// Held while the command starts: the session can neither end nor freeze meanwhile.
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec, err = m.Get(rec.ID); err != nil {
		return nil, err
	}
	if err := execState(rec); err != nil {
		return nil, err
	}
	proc := l.proc
	if proc == nil {
		return nil, fmt.Errorf("session %s has no process yet: %w", rec.ID, errdefs.ErrFailedPrecondition)
	}
	class, err := manifest.ParseClass(rec.Achieved)
	if err != nil {
		return nil, fmt.Errorf("session %s: %v: %w", rec.ID, err, errdefs.ErrDataLoss)
	}
	rt, ok := m.cfg.Runtimes[class].(execRuntime)
	if !ok {
		return nil, fmt.Errorf("session %s is %s, and this daemon cannot run commands in such a session: %w", rec.ID, class, errdefs.ErrNotImplemented)
	}
	man, policy, err := m.reg.manifest(rec)
	if err != nil {
		return nil, err
	}
	// The program's own start, rebuilt as launch built it: the command gets what it got.
	spec := m.launchSpec(rec, class, man, policy, l.ep)
	x := &Exec{ID: newExecID(), m: m, session: rec.ID, records: rec.RecordsDir, argv: opts.Argv, began: time.Now().UTC(), ended: make(chan struct{})}
	run, err := rt.Exec(ctx, spec, proc, opts)
	if err != nil {
		var se *containment.StartError
		if !errors.As(err, &se) {
			return nil, fmt.Errorf("session %s: exec: %w", rec.ID, err)
		}
		refused := &ExecNotStarted{ExecID: x.ID, Code: ExecNotFoundCode, Detail: se.Msg}
		if strings.HasPrefix(se.Msg, roostinit.RefusedPrefix) {
			refused.Code = ExecRefusedCode
		}
		x.code, x.detail = refused.Code, refused.Detail
		x.record(rec, fmt.Sprintf("%s of %s could not start: %s", x.ID, quoteArgv(x.argv), se.Msg), "exec_end")
		return nil, refused
	}
	x.Execution = run
	x.record(rec, fmt.Sprintf("%s started: %s (pid %d)", x.ID, quoteArgv(x.argv), run.Pid), "exec_start")
	m.cfg.Logger.Info("exec started", "session", rec.ID, "exec", x.ID, "pid", run.Pid, "command", quoteArgv(x.argv))
	go func() {
		select {
		case <-x.ended:
		case <-ctx.Done():
			_ = run.Kill()
		case <-proc.Done():
			// Nothing outlives its session; a sealed one's pid namespace ends it anyway.
			_ = run.Kill()
		}
	}()
	return x, nil
}

// execState refuses a session that is not running, naming its state.
func execState(rec *store.Record) error {
	switch rec.State {
	case store.Running:
		return nil
	case store.Paused:
		return fmt.Errorf("session %s is paused; resume it to run a command in it: %w", rec.ID, errdefs.ErrFailedPrecondition)
	}
	return fmt.Errorf("session %s is %s; a command runs only in a running session: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
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
			x.code, x.detail = info.Code, "killed by "+signalName(syscall.Signal(info.Signal))
		default:
			x.code, x.detail = info.Code, fmt.Sprintf("exited with code %d", info.Code)
		}
		rec, err := x.m.Get(x.session)
		if err != nil {
			x.m.cfg.Logger.Warn("exec ended in a session that is gone", "session", x.session, "exec", x.ID, "err", err)
			return
		}
		x.record(rec, fmt.Sprintf("%s of %s ended: %s", x.ID, quoteArgv(x.argv), x.detail), "exec_end")
		x.m.cfg.Logger.Info("exec ended", "session", x.session, "exec", x.ID, "detail", x.detail)
	})
	return x.code, x.detail
}

// record notes the exec in the registry's events and the session's trace. Neither failing
// changes what the command did, so it is logged, not returned.
func (x *Exec) record(rec *store.Record, detail, traceType string) {
	if err := x.m.reg.update(func(tx *store.Tx) error { return tx.Note(rec, EventExec, detail) }); err != nil {
		x.m.cfg.Logger.Warn("recording an exec", "session", rec.ID, "exec", x.ID, "err", err)
	}
	t := records.Trace{EventType: traceType, SessionID: rec.ID, Timestamp: time.Now().UTC(), ExecID: x.ID, Command: x.argv}
	if traceType == "exec_end" {
		code := x.code
		ms := time.Since(x.began).Milliseconds()
		t.ExitCode, t.Detail, t.DurationMS = &code, x.detail, &ms
	}
	if err := records.AppendTrace(x.records, t); err != nil {
		x.m.cfg.Logger.Warn("writing the trace", "session", rec.ID, "exec", x.ID, "err", err)
	}
}

// newExecID is an exec's id: "exec_" and 12 random hex digits.
func newExecID() string {
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
