package roostinit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// execMain is roost-exec: it applies the limits a process can only set on itself and execs
// the program in its place, keeping its pid. On failure it says why on execErrFD and exits
// 127; on success the exec closes execErrFD, which roost-init reads as "started".
func execMain() {
	errPipe := os.NewFile(execErrFD, "exec-error")
	fail := func(format string, args ...any) {
		fmt.Fprintf(errPipe, format, args...)
		os.Exit(127)
	}
	// Capabilities, no_new_privs and seccomp belong to a thread; execve keeps those of the
	// thread that calls it, so everything below happens on this one.
	runtime.LockOSThread()
	syscall.CloseOnExec(execErrFD)
	syscall.CloseOnExec(execSpecFD)
	syscall.CloseOnExec(execReportFD)
	var spec joinSpec
	if err := readSpec(execSpecFD, &spec); err != nil {
		fail("roost-exec: reading spec: %v", err)
	}
	// The report pipe takes OutcomeFD, execSpecFD's number, which readSpec has just closed:
	// now, before anything here opens a file that could take that number.
	if spec.Report {
		if err := unix.Dup3(execReportFD, OutcomeFD, 0); err != nil {
			fail("roost-exec: the report pipe: %v", err)
		}
		unix.Close(execReportFD)
	}
	spec.Env = outcomeEnv(spec.Env, spec.Report)
	if len(spec.Argv) == 0 {
		fail("roost-exec: empty command")
	}
	// Started ahead of its session (see spawnExec): the working directory was not there yet.
	if len(os.Args) > 1 && os.Args[1] == WarmArg && spec.Dir != "" {
		if err := os.Chdir(spec.Dir); err != nil {
			fail("roost-exec: working directory %s: %v", spec.Dir, err)
		}
	}
	for _, procs := range spec.Cgroups {
		if err := os.WriteFile(procs, []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			fail("roost-exec: joining the session's cgroup: %v", err)
		}
	}
	switch {
	case spec.NetNS != "":
		if err := joinNetNS(spec.NetNS); err != nil {
			fail("roost-exec: joining the session's network namespace: %v", err)
		}
	case spec.NewNetNS:
		if err := newNetNS(); err != nil {
			fail("roost-exec: a network namespace of its own: %v", err)
		}
	}
	if err := spec.Join.enterIPCNS(); err != nil {
		fail("roost-exec: joining the session's IPC namespace: %v", err)
	}
	// A sealed session's roost-init runs shielded from the OOM killer; the program must not
	// inherit that shield (raising the score needs no privilege).
	if data, err := os.ReadFile("/proc/self/oom_score_adj"); err == nil && strings.HasPrefix(strings.TrimSpace(string(data)), "-") {
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte("0"), 0); err != nil {
			fail("roost-exec: resetting oom_score_adj: %v", err)
		}
	}
	for _, rl := range spec.Rlimits {
		lim := syscall.Rlimit{Cur: rl.Value, Max: rl.Value}
		if rl.Resource == syscall.RLIMIT_CPU {
			// At the soft limit the kernel sends SIGXCPU, at the hard one SIGKILL. A second
			// between them lets the program (and roost's exit report) see why.
			lim.Max++
		}
		if err := syscall.Setrlimit(rl.Resource, &lim); err != nil {
			fail("%s: setrlimit to %d: %v", rl.Name, rl.Value, err)
		}
	}
	if err := spec.Join.enterMountNS(); err != nil {
		fail("roost-exec: joining the session's mount namespace: %v", err)
	}
	path, err := lookPath(spec.ruled(), envValue(spec.Env, "PATH"))
	if err != nil {
		fail("%v", err)
	}
	if err := spec.Join.checkAllowed(spec.Landlock, path, envValue(spec.Env, "PATH"), spec.Argv[0]); err != nil {
		fail("%v", err)
	}
	if spec.Mounts != nil {
		if err := privateMounts(spec.Mounts); err != nil {
			fail("roost-exec: the session's mounts: %v", err)
		}
		// The working directory was entered before the mounts stacked over it: enter it
		// again, or the program would work beneath them, on the mount it was meant to lose.
		if err := os.Chdir(spec.Dir); err != nil {
			fail("roost-exec: working directory %s: %v", spec.Dir, err)
		}
	}
	// Before the uid switch, which takes the privilege the sysctl needs; for a joined
	// command the namespace has it already, and writing it again changes nothing.
	if spec.MemfdNoExec {
		if err := SetMemfdNoExec(); err != nil {
			fail("roost-exec: vm.memfd_noexec in the session's pid namespace: %v", err)
		}
	}
	if spec.NoNewPrivileges || spec.User != nil {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			fail("roost-exec: no_new_privs: %v", err)
		}
	}
	// Landlock's rules are built while still root: they name paths by opening them, and
	// the session's uid may not be able to walk to each (its limits come from Landlock and
	// DAC together, not from what it can name).
	var allowed *execRuleSet
	if spec.Landlock != nil {
		if allowed, err = applyLandlock(spec.Landlock, path, envValue(spec.Env, "PATH")); err != nil {
			fail("roost-exec: Landlock: %v", err)
		}
	}
	if spec.User != nil {
		if err := becomeUser(*spec.User); err != nil {
			fail("roost-exec: becoming uid %d: %v", spec.User.UID, err)
		}
	}
	if spec.DropCapabilities {
		if err := dropCapabilities(); err != nil {
			fail("roost-exec: dropping capabilities: %v", err)
		}
	}
	if spec.Join != nil {
		if path, err = spec.Join.settle(spec.Argv[0], envValue(spec.Env, "PATH")); err != nil {
			fail("%v", err)
		}
	}
	// Nothing roostd holds, or whatever started roostd left open, reaches the program: every
	// descriptor past its stdio (and its report pipe) closes at exec.
	first := uint(3)
	if spec.Report {
		first = OutcomeFD + 1
	}
	if err := closeOnExecFrom(first); err != nil {
		fail("roost-exec: closing inherited descriptors: %v", err)
	}
	// The listener comes before the session's own filter, which need not allow seccomp(2)
	// to what it confines; the program and all it starts inherit both. A joined command is
	// not roost-init's child, and roost-init gives it no socket.
	if spec.WatchFD > 0 && spec.Join == nil {
		if spec.Refusals != nil && spec.Landlock != nil {
			watchExecs(spec.WatchFD, allowed, *spec.Refusals)
		} else {
			unix.Close(spec.WatchFD)
		}
	}
	if len(spec.Seccomp) > 0 {
		if err := loadSeccomp(spec.Seccomp); err != nil {
			fail("roost-exec: seccomp: %v", err)
		}
	}
	err = syscall.Exec(path, spec.Argv, spec.Env)
	if hint := execRefusal(spec.Landlock, err); hint != "" {
		fail("exec %s: %v: %s", path, err, hint)
	}
	fail("exec %s: %v", path, err)
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// lookPath finds a command the way a shell does: a name with a slash is used as it is, a
// bare name is searched on path.
func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		if err := executable(name); err != nil {
			return "", fmt.Errorf("command %s: %w", name, err)
		}
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		candidate := filepath.Join(dir, name)
		if executable(candidate) == nil {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("command %q not found on PATH (%s)", name, path)
}

func executable(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errors.New("no such file")
		}
		return err
	}
	if info.IsDir() {
		return errors.New("is a directory")
	}
	if info.Mode().Perm()&0o111 == 0 {
		return errors.New("is not executable")
	}
	return nil
}

// joinNetNS moves this thread (the one that execs) into the network namespace pinned at
// path. It must be a network namespace: a session given any other file would keep the host's.
func joinNetNS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}

// newNetNS moves this thread into a new network namespace and brings its loopback up.
func newNetNS() error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("reading lo's flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	return nil
}

// outcomeEnv is env with OutcomeFDEnv naming the report pipe when the program has one, and
// without it otherwise: nothing may send the program's report to a descriptor of its own.
func outcomeEnv(env []string, report bool) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, OutcomeFDEnv+"=") {
			out = append(out, kv)
		}
	}
	if report {
		out = append(out, OutcomeFDEnv+"="+strconv.Itoa(OutcomeFD))
	}
	return out
}

// closeOnExecFrom marks every descriptor from first on close-on-exec: close_range where the
// kernel has it (5.11), each open one by /proc/self/fd otherwise.
func closeOnExecFrom(first uint) error {
	err := unix.CloseRange(first, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil || (!errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL)) {
		return err
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd >= int(first) {
			syscall.CloseOnExec(fd)
		}
	}
	return nil
}
