// Package outcome says how a session ended, in its record's words: the exit status, code
// and one-line detail made from how its program ended (exit.json) and why roost was ending
// it (the record's end request), and the trace line of that end. It reads a record and
// the session's records directory; it changes neither, and runs nothing.
package outcome

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
)

// Classify turns how a program ended, and why roost was ending it, into an exit status.
// exitErr is the error reading its exit record, if there was one.
func Classify(rec *store.Record, info containment.ExitInfo, exitErr error) (store.ExitStatus, *int, string) {
	if exitErr != nil {
		if errors.Is(exitErr, containment.ErrNoExitRecord) {
			return store.StatusLost, nil, "the session's supervisor ended without recording how the program ended"
		}
		return store.StatusLost, nil, "the session's exit record is unreadable: " + exitErr.Error()
	}
	if info.StartError != "" {
		return store.StatusStartFailed, nil, info.StartError
	}
	code := info.Code
	how := fmt.Sprintf("exited with code %d", code)
	if info.Signal != 0 {
		how = "killed by " + SignalName(syscall.Signal(info.Signal))
	}
	switch {
	case rec.EndRequest == store.EndDeadline:
		return store.StatusDeadlineReached, &code, fmt.Sprintf("deadline of %s reached; %s", rec.Deadline, how)
	case rec.EndRequest == store.EndWorkdir, rec.EndRequest == store.EndParent:
		return store.StatusTerminated, &code, rec.EndDetail + "; " + how
	case rec.EndRequest == store.EndStop && rec.EndDetail != "":
		return store.StatusTerminated, &code, "stopped: " + rec.EndDetail + "; " + how
	case rec.EndRequest == store.EndStop:
		return store.StatusTerminated, &code, "stopped by roostctl stop; " + how
	case rec.EndRequest == store.EndKill && info.Signal != 0 && info.Signal == rec.EndSignal:
		return store.StatusTerminated, &code, "killed by roostctl kill with " + SignalName(syscall.Signal(info.Signal))
	case info.OOMKilled:
		return store.StatusCrashed, &code, store.DetailOOM
	case rec.Wasm != nil && hasOutcome(info):
		// The runner says how its guest ended when the code cannot: a trap, fuel, its own
		// deadline. Only the runner writes there: the guest has no descriptor but its stdio.
		o, _ := info.Outcome()
		return wasmOutcome(o, code)
	case info.Signal != 0:
		switch syscall.Signal(info.Signal) {
		case syscall.SIGXCPU:
			how += ": resources.cpu_seconds used up"
		case syscall.SIGXFSZ:
			how += ": a file reached resources.max_file_size_bytes"
		}
		return store.StatusCrashed, &code, how
	case code == 0:
		return store.StatusOK, &code, how
	default:
		return store.StatusError, &code, how
	}
}

// SignalName names a signal the way operators write it.
func SignalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return fmt.Sprintf("signal %d", int(sig))
}

// hintHead is how much of the start of a session's stderr LandlockHint reads.
const hintHead = 64 << 10

// LandlockHint adds a pointer to explain to the detail of a session under Landlock (scoped
// and sealed) that exited non-zero with "Permission denied" near the start of its stderr:
// Landlock's refusals are bare EACCES, and the program's own message never says roost made
// them. (Landlock's audit records, on kernels that have them, go to the audit log, which
// roostd does not read.) The detail stays one line.
func LandlockHint(rec *store.Record, status store.ExitStatus, detail string) string {
	if status != store.StatusError || (rec.Achieved != manifest.Scoped.String() && rec.Achieved != manifest.Sealed.String()) || rec.RecordsDir == "" {
		return detail
	}
	f, err := os.Open(filepath.Join(rec.RecordsDir, containment.StderrFile))
	if err != nil {
		return detail
	}
	defer f.Close()
	head, _ := io.ReadAll(io.LimitReader(f, hintHead))
	if !bytes.Contains(head, []byte("Permission denied")) {
		return detail
	}
	capsule := rec.Capsule.Source
	if capsule == "" {
		capsule = rec.Capsule.Name + "@" + rec.Capsule.Version
	}
	return detail + "; hint: roost limits what this session may read, write and execute (Landlock, shell.allow); see roostctl explain " + capsule
}

func hasOutcome(info containment.ExitInfo) bool {
	_, ok := info.Outcome()
	return ok
}

// wasmOutcome is a WASM session's end as its runner reported it.
func wasmOutcome(o containment.Outcome, code int) (store.ExitStatus, *int, string) {
	detail := o.Detail
	if o.Backtrace != "" {
		detail += "\n" + o.Backtrace
	}
	switch o.Status {
	case containment.OutcomeDeadlineReached:
		return store.StatusDeadlineReached, &code, "limits.deadline_seconds reached; the runner interrupted the guest: " + detail
	case containment.OutcomeFuelExhausted:
		return store.StatusCrashed, &code, "limits.wasm_fuel spent: " + detail
	default:
		return store.StatusCrashed, &code, detail
	}
}

// Trace is the session_end line of an ended session's trace.
func Trace(rec *store.Record) records.Trace {
	t := records.Trace{
		EventType:  "session_end",
		SessionID:  rec.ID,
		Timestamp:  rec.EndedAt,
		ExitStatus: string(rec.ExitStatus),
		ExitCode:   rec.ExitCode,
		Detail:     rec.Detail,
		Tokens:     &rec.Tokens, InputTokens: &rec.InputTokens, OutputTokens: &rec.OutputTokens,
	}
	if e := rec.Egress; e != nil {
		t.Egress = &records.Egress{Connections: e.Connections, Denied: e.Denied, BytesUp: e.BytesUp, BytesDown: e.BytesDown, Used: e.Used}
	}
	if !rec.StartedAt.IsZero() {
		ms := rec.EndedAt.Sub(rec.StartedAt).Milliseconds()
		t.DurationMS = &ms
	}
	return t
}
