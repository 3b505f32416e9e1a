package roostinit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Join is what makes roost-exec start one more command in a session that already runs
// (roostctl exec) rather than the session's program: the rest of its ExecSpec is the
// program's own, so the command gets exactly the program's containment.
type Join struct {
	// Program is the session's program, as its view names it. The exec allowlist is built
	// around it, as it was for the program; the command is one more file it must allow.
	Program string `json:"program"`
	// MountNS, when set, names the session program's mount namespace (roostd hands it as a
	// descriptor, /proc/self/fd/N), which the command joins instead of making its own.
	MountNS string `json:"mount_ns,omitempty"`
	// IPCNS, when set, names the session program's IPC namespace, likewise: SysV objects and
	// POSIX message queues are the session's. (Its pid namespace is joined by whoever starts
	// roost-exec: setns into one only places the caller's children there, and roost-exec
	// becomes the command without a fork.)
	IPCNS string `json:"ipc_ns,omitempty"`
	// Dir is the command's working directory in the session's view. It is entered once the
	// command's uid and Landlock domain are taken, so a directory the session made (a
	// symlink out of its workdir) leads nowhere its program could not go.
	Dir string `json:"dir"`
}

// joinSpec is what roost-exec reads: an ExecSpec, and Join when it starts an extra command.
type joinSpec struct {
	ExecSpec
	Join *Join `json:"join,omitempty"`
}

// JoinSpec is roost-exec's spec for an extra command in a running session.
func JoinSpec(exec ExecSpec, join Join) any { return joinSpec{ExecSpec: exec, Join: &join} }

// RefusedPrefix starts roost-exec's error for a command the exec allowlist refuses.
const RefusedPrefix = "refused by shell.allow: "

// enterMountNS moves this thread into the session's mount namespace. The kernel refuses
// setns(CLONE_NEWNS) to a thread that shares its filesystem context (every Go thread
// does), so the thread takes a context of its own first; execve keeps the thread's
// namespaces. The working directory is then the namespace's root until settle.
func (j *Join) enterMountNS() error {
	if j == nil || j.MountNS == "" {
		return nil
	}
	f, err := os.Open(j.MountNS)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("a filesystem context of its own: %w", err)
	}
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("setns: %w", err)
	}
	return nil
}

// enterIPCNS moves this thread into the session's IPC namespace; execve keeps the thread's
// namespaces.
func (j *Join) enterIPCNS() error {
	if j == nil || j.IPCNS == "" {
		return nil
	}
	f, err := os.Open(j.IPCNS)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWIPC)
}

// ruled is the program the exec allowlist is built around: the session's for a joined
// command, else the one about to run.
func (s *joinSpec) ruled() string {
	if s.Join != nil {
		return s.Join.Program
	}
	return s.Argv[0]
}

// checkAllowed refuses, in words, a command the session's exec allowlist does not hold:
// Landlock would refuse its exec anyway, with a bare EACCES. program is the session's
// program as found on path.
func (j *Join) checkAllowed(l *Landlock, program, path string, argv0 string) error {
	if j == nil || l == nil {
		return nil
	}
	cmd, err := lookPath(commandIn(argv0, j.Dir), path)
	if err != nil {
		return err
	}
	resolved, err := filepath.EvalSymlinks(cmd)
	if err != nil {
		return fmt.Errorf("command %s: %w", argv0, err)
	}
	allowed, err := execRules(l, program, path)
	if err != nil {
		return err
	}
	if slices.Contains(allowed, resolved) {
		return nil
	}
	trees, err := execTrees(l)
	if err != nil {
		return err
	}
	for _, t := range append(trees, l.WritableExec...) {
		if resolved == t || strings.HasPrefix(resolved, strings.TrimSuffix(t, "/")+"/") {
			return nil
		}
	}
	name := argv0
	if resolved != argv0 {
		name += " (" + resolved + ")"
	}
	return errors.New(RefusedPrefix + name + " is not in the session's exec allowlist")
}

// commandIn is argv0 as exec finds it from dir: a relative name with a slash is dir's.
func commandIn(argv0, dir string) string {
	if strings.Contains(argv0, "/") && !filepath.IsAbs(argv0) {
		return filepath.Join(dir, argv0)
	}
	return argv0
}

// settle enters the command's working directory, as the command's uid and under its
// Landlock domain, and finds the command from there.
func (j *Join) settle(argv0, path string) (string, error) {
	if err := os.Chdir(j.Dir); err != nil {
		return "", fmt.Errorf("working directory %s: %w", j.Dir, err)
	}
	return lookPath(argv0, path)
}
