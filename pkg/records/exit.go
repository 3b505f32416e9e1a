package records

import (
	"encoding/json"
	"errors"
	"io/fs"
	"path/filepath"
	"time"
)

// Files roost-init writes in a session's records directory and roostd reads.
const (
	StdoutFile = "stdout.log"
	StderrFile = "stderr.log"
	// InitFile records the supervisor's and the program's process identities once the
	// program runs. A restarted roostd finds a live session through it.
	InitFile = "init.json"
	// InitLogFile holds what roost-init itself wrote to stderr: a crash's trace, if ever.
	InitLogFile = "init.log"
	// ExitFile records how the program ended.
	ExitFile = "exit.json"
)

// ExitInfo is how a program ended.
type ExitInfo struct {
	PID int `json:"pid,omitempty"`
	// Code is the exit code when the program exited; Signal the signal number when a signal
	// ended it (Code is then 128+Signal).
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
	// StartError is set when the program never started (e.g. its command was not found).
	StartError string    `json:"start_error,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	EndedAt    time.Time `json:"ended_at"`
	// OOMKilled is set by the daemon, not roost-init: the kernel's OOM killer acted in the
	// session's cgroup.
	OOMKilled bool `json:"oom_killed,omitempty"`
	// Logs is the final count of the program's output, as logs.json has it.
	Logs *LogStats `json:"logs,omitempty"`
	// Report is what the program said of its own end on its report pipe (roost-init's ExecSpec.Report):
	// one JSON object, an Outcome from roost-wasm, kept as it came (compacted). Absent when
	// it wrote nothing, or anything else (dropped, with a note in init.log).
	Report json.RawMessage `json:"report,omitempty"`
}

// Outcome statuses, for a program that ended abnormally in a way its exit code cannot say.
const (
	OutcomeCrashed         = "crashed"          // a trap: the guest's code failed
	OutcomeDeadlineReached = "deadline_reached" // the program's own deadline interrupted it
	OutcomeFuelExhausted   = "fuel_exhausted"   // the guest ran out of fuel
	OutcomeMemoryRefused   = "memory_refused"   // the guest's memory was refused beyond its cap
)

// Outcome is the report a program writes on its report pipe: roost-wasm's, when the guest
// ended with a trap, out of fuel, or at its deadline. Detail is one line of at most 1 KiB,
// Backtrace at most 8 KiB.
type Outcome struct {
	Status    string `json:"status"`
	Detail    string `json:"detail,omitempty"`
	Backtrace string `json:"backtrace,omitempty"`
}

// Outcome decodes Report; false when there is none or it is not an Outcome.
func (i ExitInfo) Outcome() (Outcome, bool) {
	var o Outcome
	if len(i.Report) == 0 || json.Unmarshal(i.Report, &o) != nil {
		return Outcome{}, false
	}
	return o, true
}

// ErrNoExitRecord means roost-init left no exit.json: it died without recording an end.
var ErrNoExitRecord = errors.New("no exit record")

// ReadExit reads a session's exit.json.
func ReadExit(recordsDir string) (ExitInfo, error) {
	var info ExitInfo
	err := ReadJSON(filepath.Join(recordsDir, ExitFile), &info)
	if errors.Is(err, fs.ErrNotExist) {
		return info, ErrNoExitRecord
	}
	return info, err
}

// ReadInit reads a session's init.json.
func ReadInit(recordsDir string) (ProcessRef, error) {
	var ref ProcessRef
	return ref, ReadJSON(filepath.Join(recordsDir, InitFile), &ref)
}
