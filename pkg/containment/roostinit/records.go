// Package roostinit is roost-init, the small supervisor each session runs under, and
// roost-exec, the stage that applies a process's own limits and execs the program. It is
// kept apart, with almost no dependencies, because it is its own binary (cmd/roost-init):
// it starts twice per session launch, so its start-up cost is paid on every launch.
//
// roost-init outlives roostd. It records the program's identity in init.json once it runs
// and how it ended in exit.json, so a restarted daemon learns what happened while it was
// away. It also carries the program's output from pipes into the records directory, each
// stream held to resources.log_max_bytes (see records.LogsFile).
package roostinit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
	"roost.dev/roost/pkg/records"
)

// The records directory's files and how a program's end is recorded there are
// pkg/records'; roost-init writes them.
const (
	StdoutFile  = records.StdoutFile
	StderrFile  = records.StderrFile
	InitFile    = records.InitFile
	InitLogFile = records.InitLogFile
	ExitFile    = records.ExitFile

	OutcomeFuelExhausted = records.OutcomeFuelExhausted
)

type (
	ExitInfo = records.ExitInfo
	Outcome  = records.Outcome
)

// InitSpec is what roostd hands roost-init on its spec pipe.
type InitSpec struct {
	Exec ExecSpec `json:"exec"`
	// LogMaxBytes is resources.log_max_bytes: what is kept of each output stream at most
	// (records.DefaultLogMaxBytes when 0).
	LogMaxBytes int64 `json:"log_max_bytes,omitempty"`
}

// ExecSpec is the program's start, handed on to roost-exec.
type ExecSpec struct {
	Argv    []string `json:"argv"`
	Env     []string `json:"env"`
	Dir     string   `json:"dir"`
	Rlimits []Rlimit `json:"rlimits"`
	// Landlock, when set, confines the program before it starts.
	Landlock *Landlock `json:"landlock,omitempty"`
	// Cgroups lists cgroup.procs files the program joins before it starts.
	Cgroups []string `json:"cgroups,omitempty"`
	// NoNewPrivileges sets no_new_privs: nothing the program execs gains privileges.
	NoNewPrivileges bool `json:"no_new_privileges,omitempty"`
	// DropCapabilities empties every capability set, the bounding set included, so not
	// even root regains one at exec.
	DropCapabilities bool `json:"drop_capabilities,omitempty"`
	// Seccomp is a compiled seccomp BPF program (struct sock_filter entries, native byte
	// order) loaded last before exec.
	Seccomp []byte `json:"seccomp,omitempty"`
	// Mounts, when set, gives the program a mount namespace of its own (roost-init starts
	// roost-exec in one): the host's view, with the changes listed.
	Mounts *Mounts `json:"mounts,omitempty"`
	// User, when set, is the unprivileged uid and gid the program runs as. roost-exec
	// switches to it once it has done what needs root (cgroup, rlimits), with no
	// supplementary groups, an empty bounding set and no_new_privs, so nothing the program
	// execs (a setuid binary included) runs as anyone else.
	User *User `json:"user,omitempty"`
	// NetNS, when set, is a pinned network namespace the program joins (while still root):
	// the session's own, with loopback and its endpoint only.
	NetNS string `json:"netns,omitempty"`
	// NewNetNS gives the program a network namespace of its own with loopback only, when
	// there is no pinned one to join.
	NewNetNS bool `json:"new_netns,omitempty"`
	// Report hands the program a pipe for one outcome report (see Outcome): it finds it at
	// descriptor OutcomeFD, named by OutcomeFDEnv in its environment. roost-init keeps what
	// it writes there in exit.json. Without Report the program gets no such descriptor, and
	// OutcomeFDEnv is taken out of its environment.
	Report bool `json:"report,omitempty"`
	// MemfdNoExec sets vm.memfd_noexec to 2 in roost-exec's pid namespace, the session's,
	// before the program (see SetMemfdNoExec): no memfd made there executes. It needs host
	// root, which a scoped session's roost-exec is until it drops it; a sealed one's never
	// is (the host sets it for a sealed container: SetMemfdNoExecIn).
	MemfdNoExec bool `json:"memfd_noexec,omitempty"`
	// Refusals, when set with Landlock, has the execs the allowlist refuses recorded in the
	// records directory (records.RefusalsFile): roost-exec installs a seccomp listener on
	// execve and execveat for the program and everything it starts, and roost-init serves
	// it. Only the program's own process tree: a command roostctl exec starts is not
	// roost-init's to watch, and gets none.
	Refusals *Refusals `json:"refusals,omitempty"`
	// WatchFD is roost-exec's descriptor of the socket the listener goes to: roost-init
	// sets it on the spec it hands on, never roostd.
	WatchFD int `json:"watch_fd,omitempty"`
}

// Mounts is what a scoped session's private mount namespace changes in the host's view.
type Mounts struct {
	// Shm is the size of a private tmpfs over /dev/shm (0: the host's, which Landlock keeps
	// out of reach); ShmExec lets what is written there execute.
	Shm     int64 `json:"shm,omitempty"`
	ShmExec bool  `json:"shm_exec,omitempty"`
	// NoExec lists trees bound over themselves noexec: nothing there executes, not even
	// through the dynamic loader (ld.so maps a program with mmap, which Landlock's exec
	// right does not cover; a noexec mount refuses PROT_EXEC maps).
	NoExec []string `json:"noexec,omitempty"`
	// Proc mounts a procfs of the program's pid namespace over /proc (roost-init is born in
	// one of the session's own): the host's lists every process on it.
	Proc bool `json:"proc,omitempty"`
	// ResolvConf is a file bound read-only over /etc/resolv.conf (over what it links to,
	// when it is a link): the host's names nameservers the session's network namespace
	// cannot reach, this one the session's own resolver.
	ResolvConf string `json:"resolv_conf,omitempty"`
	// Passwd is a file bound read-only over /etc/passwd: the host's with an entry for the
	// session's uid, which the host's lacks.
	Passwd string `json:"passwd,omitempty"`
}

// User is a host uid and gid.
type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// Report is roost-init's one line to roostd: the program runs (Ref), or why it could not
// start (Error).
type Report struct {
	Ref   *records.ProcessRef `json:"ref,omitempty"`
	Error string              `json:"error,omitempty"`
}

// Rlimit is one resource limit applied to the program before it starts.
type Rlimit struct {
	// Name is the manifest key it comes from, e.g. "resources.max_open_files".
	Name     string `json:"name"`
	Resource int    `json:"resource"`
	Value    uint64 `json:"value"`
}

// The report pipe a program gets with ExecSpec.Report.
const (
	// OutcomeFD is the program's descriptor of the pipe's write end.
	OutcomeFD = 3
	// OutcomeFDEnv names the variable that tells the program OutcomeFD.
	OutcomeFDEnv = "ROOST_REPORT_FD"
	// MaxOutcomeSize bounds what roost-init reads from the pipe; a longer report is dropped.
	MaxOutcomeSize = 16 << 10
)

// ParseReport checks what a program wrote on its report pipe: one JSON object of at most
// MaxOutcomeSize bytes. It returns the object compacted, or why it is refused.
func ParseReport(data []byte) (json.RawMessage, error) {
	if len(data) > MaxOutcomeSize {
		return nil, fmt.Errorf("longer than %d bytes", MaxOutcomeSize)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("not one JSON object: %w", err)
	}
	if obj == nil {
		return nil, errors.New("not one JSON object: null")
	}
	var out bytes.Buffer
	if err := json.Compact(&out, data); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// ErrGone means a process no longer exists.
var ErrGone = errors.New("process is gone")

// writeJSONDurably writes v as name in the directory dirfd so that a crash leaves either
// the old file or the whole new one: a temporary file, fsync, rename, fsync of the directory.
func writeJSONDurably(dirfd int, name string, v any) error {
	return writeJSON(dirfd, name, v, true)
}

// writeJSONAtomically is writeJSONDurably without the fsyncs: readers never see a partial
// file, but a host crash may lose it.
func writeJSONAtomically(dirfd int, name string, v any) error {
	return writeJSON(dirfd, name, v, false)
}

// tmpName is the temporary file writeJSON renames to name.
func tmpName(name string) string { return name + ".tmp" }

func writeJSON(dirfd int, name string, v any, sync bool) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := tmpName(name)
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", tmp, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	// A write that fails (a full disk) leaves no partial temporary file holding space.
	discard := func(err error) error {
		f.Close()
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return err
	}
	if _, err := f.Write(append(data, '\n')); err != nil {
		return discard(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			return discard(err)
		}
	}
	if err := f.Close(); err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return err
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, name); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if !sync {
		return nil
	}
	return unix.Fsync(dirfd)
}

// StartTime returns a process's start time in clock ticks since boot (field 22 of
// /proc/<pid>/stat). Together with the pid it names one process for the life of the host.
func StartTime(pid int) (uint64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses; fields resume after the
	// last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	fields := bytes.Fields(data[i+1:])
	// fields[0] is field 3 (state); the start time is field 22.
	const idx = 22 - 3
	if len(fields) <= idx {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	return strconv.ParseUint(string(fields[idx]), 10, 64)
}

// SignalGroup sends sig to the process group led by pid.
func SignalGroup(pid int, sig syscall.Signal) error {
	if pid <= 1 {
		return fmt.Errorf("refusing to signal process group %d", pid)
	}
	err := syscall.Kill(-pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return ErrGone
	}
	return err
}
