package containment

import (
	"fmt"

	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/workdir"
)

// Names this package shares with roost-init.
const (
	OutcomeDeadlineReached = records.OutcomeDeadlineReached
	OutcomeFuelExhausted   = records.OutcomeFuelExhausted
	StdoutFile             = records.StdoutFile
	StderrFile             = records.StderrFile
	InitFile               = records.InitFile
	ExitFile               = records.ExitFile
	InitName               = roostinit.InitName
	ExecName               = roostinit.ExecName
)

type (
	// Rlimit is one resource limit applied to the program before it starts.
	Rlimit = roostinit.Rlimit
	// ProcessRef identifies a running session's processes across daemon restarts.
	ProcessRef = records.ProcessRef
	// ExitInfo is how a program ended, as roost-init recorded it.
	ExitInfo = records.ExitInfo
	// Outcome is what a program (roost's WASM runner) reported of its own end.
	Outcome = records.Outcome
)

var (
	// ErrNoExitRecord means roost-init left no exit.json.
	ErrNoExitRecord = records.ErrNoExitRecord
	// ErrGone means the process a ProcessRef names no longer exists.
	ErrGone = roostinit.ErrGone
)

// ReadExit reads a session's exit.json.
func ReadExit(recordsDir string) (ExitInfo, error) { return records.ReadExit(recordsDir) }

// ReadInit reads a session's init.json.
func ReadInit(recordsDir string) (ProcessRef, error) { return records.ReadInit(recordsDir) }

// RunHelper runs roost-init or roost-exec when args[0] names one, and exits; it returns
// false otherwise. A binary that may be started as roost-init calls it first thing in main.
func RunHelper(args []string) bool { return roostinit.Run(args) }

const (
	// ChildrenRoot is where, relative to a session's workdir, its children's workdirs are.
	ChildrenRoot = ".roost"
	// DefaultPath is the PATH roost-init is started with inside a sealed root, and a
	// rehearsal's program.
	DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// DevShmBytes bounds a session's /dev/shm (sealed, and scoped's private one); it is
	// memory, charged to the session's cgroup too.
	DevShmBytes = 64 << 20
)

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
	// LogMaxBytes is what roost-init keeps of each output stream at most (head and newest
	// bytes); 0 takes resources.log_max_bytes from Policy, or the default.
	LogMaxBytes int64
	// Policy is the session's resolved policy; runtimes that hold it with the kernel
	// (sealed) read their limits and mounts from it.
	Policy *manifest.Policy
	// NetNS is a pinned network namespace the session joins instead of a new one (its
	// endpoint listens in it).
	NetNS string
	// Task is the host path of the task text a sealed session finds at sealed.TaskPath.
	Task string
	// Exec lists what the program may exec besides itself (files, or names looked up on its
	// PATH); ExecTrees directories whose every file may run. Both come from shell.allow,
	// resolved when the session was staged.
	Exec      []string
	ExecTrees []string
	// Home is the session's home directory on the host (a sealed session's /root): its own,
	// writable, apart from the workdir so tools' caches stay out of the work.
	Home string
	// Children lists directories where the session's children work, outside its workdir
	// (a parent without a sealed root reaches them through links): it may read them.
	Children []string
	// IDs is the session's host uid/gid range. Root instead runs a session that is not
	// sealed as host root (the operator's sessions.allow_root names its capsule); a Spec
	// with neither is refused, so no forgotten field ever means root.
	IDs  IDs
	Root bool
	// Runner and WasmModule, for a WASM session (run.wasm), are roost-wasm and the
	// session's compiled module on the host: Argv runs the runner (in the session's view),
	// which reads the module, and gets a report pipe to say how its guest ended.
	Runner, WasmModule string
	// System, when set, is the part of the host's system trees the session sees
	// (filesystem.system: allowlist); nil is all of them (filesystem.system: full).
	System *SystemView
	// Shell is the login shell the session's passwd entry names (a path in its view): what
	// Codex and others run commands with, whatever SHELL says. "" leaves the passwd as the
	// class has it.
	Shell string
}

// SystemView is the part of the host's system trees (/usr, the /bin, /sbin, /lib* links,
// /opt) a contained session sees: the closure of its allowlist. The ELF loader maps what it
// is given without an exec, so a program it can read is a program it can run: the view
// holds only what the allowlist's programs are made of.
type SystemView struct {
	// Dir is the view built from the closure: the host's root cut down to Files (the same
	// inodes), with a directory at each of Trees to bind it on. A sealed root has Dir's usr
	// (and, on a host whose /bin, /sbin and /lib* are no links into /usr, those) in place of
	// the host's.
	Dir string
	// Files are the closure's files and Trees the directories it holds whole, on the host's
	// paths: what a scoped session's Landlock rules let it read of the system trees.
	Files, Trees []string
	// Linked are the Trees Dir holds itself (the data every program reads): a sealed root
	// mounts the others onto Dir's directories for them.
	Linked []string
	// Digest names the closure: sessions with the same one share Dir.
	Digest string
}

// IDs is a host uid/gid range: a sealed session's user namespace maps 0..Size-1 onto
// First..First+Size-1; the program of a session of another class runs as First.
type IDs struct {
	First uint32 `json:"first"`
	Size  uint32 `json:"size"`
}

// ExecAllowlist is what Landlock lets the program exec besides itself: what stage resolved, or for a
// Spec without that, shell.allow's names, looked up by roost-exec on the program's PATH.
func (s Spec) ExecAllowlist() []string {
	if s.Exec != nil || s.Policy == nil {
		return s.Exec
	}
	return s.Policy.Shell.Allow
}

// Owner is who owns what roost makes in the session's workdir: nil for host root.
func (s Spec) Owner() (*workdir.Owner, error) {
	u, err := s.User()
	if u == nil || err != nil {
		return nil, err
	}
	return &workdir.Owner{UID: int(u.UID), GID: int(u.GID)}, nil
}

// User is who the program runs as on the host: nil for host root.
func (s Spec) User() (*roostinit.User, error) {
	if s.Root && s.Class != manifest.Sealed {
		return nil, nil
	}
	if s.IDs.Size == 0 || s.IDs.First == 0 {
		return nil, fmt.Errorf("session %s has no uid range to run as", s.SessionID)
	}
	return &roostinit.User{UID: s.IDs.First, GID: s.IDs.First}, nil
}
