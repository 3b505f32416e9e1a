// Package containment holds a session's program: it probes what the host can deliver,
// decides each session's class, reports how every grant is enforced, and starts and
// re-attaches the program under roost-init, the small supervisor that outlives roostd and
// records how the program ended.
package containment

import (
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/manifest"
)

// Names this package shares with roost-init.
const (
	StdoutFile = roostinit.StdoutFile
	StderrFile = roostinit.StderrFile
	InitFile   = roostinit.InitFile
	ExitFile   = roostinit.ExitFile
	InitName   = roostinit.InitName
	ExecName   = roostinit.ExecName
)

type (
	// Rlimit is one resource limit applied to the program before it starts.
	Rlimit = roostinit.Rlimit
	// ProcessRef identifies a running session's processes across daemon restarts.
	ProcessRef = roostinit.ProcessRef
	// ExitInfo is how a program ended, as roost-init recorded it.
	ExitInfo = roostinit.ExitInfo
)

var (
	// ErrNoExitRecord means roost-init left no exit.json.
	ErrNoExitRecord = roostinit.ErrNoExitRecord
	// ErrGone means the process a ProcessRef names no longer exists.
	ErrGone = roostinit.ErrGone
)

// ReadExit reads a session's exit.json.
func ReadExit(recordsDir string) (ExitInfo, error) { return roostinit.ReadExit(recordsDir) }

// ReadInit reads a session's init.json.
func ReadInit(recordsDir string) (ProcessRef, error) { return roostinit.ReadInit(recordsDir) }

// RunHelper runs roost-init or roost-exec when args[0] names one, and exits; it returns
// false otherwise. A binary that may be started as roost-init calls it first thing in main.
func RunHelper(args []string) bool { return roostinit.Run(args) }

// Spec is everything needed to start one session's program.
type Spec struct {
	SessionID string
	Class     manifest.Class
	// Argv is the command line; Argv[0] is an absolute path or a name looked up on the PATH
	// of Env.
	Argv []string
	Env  []string
	// Dir is the program's working directory: the session's workdir on the host.
	Dir        string
	RecordsDir string
	CapsuleDir string
	Rlimits    []Rlimit
	// Policy is the session's resolved policy; runtimes that hold it with the kernel
	// (sealed) read their limits and mounts from it.
	Policy *manifest.Policy
	// NetNS is a pinned network namespace the session joins instead of a new one (its
	// endpoint listens in it).
	NetNS string
	// Task is the host path of the task text a sealed session finds at SealedTaskPath.
	Task string
}
