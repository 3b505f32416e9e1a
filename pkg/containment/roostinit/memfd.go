package roostinit

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// MemfdNoExecSysctl is vm.memfd_noexec (Linux 6.3 and later), whether memfds made in a pid
// namespace may execute. A memfd lives on the kernel's internal mount, which no Landlock
// rule and no noexec mount reaches, so without it a session could copy any program into one
// and run it past its exec allowlist. The value is the pid namespace's own, and those below
// it inherit it and cannot lower it. A write sets it in the writer's active pid namespace,
// whatever /proc it goes through, and needs CAP_SYS_ADMIN over that namespace's user
// namespace and, as any sysctl file, host root's uid. At 2, memfd_create(MFD_EXEC) fails
// with EACCES and every other memfd is made non-executable and sealed so (F_SEAL_EXEC): its
// exec fails with EACCES, by execveat(AT_EMPTY_PATH) or by /proc/self/fd alike.
const MemfdNoExecSysctl = "/proc/sys/vm/memfd_noexec"

// SetMemfdNoExec sets vm.memfd_noexec to 2 in the caller's pid namespace, and reads it back:
// a kernel that took the write and kept another value would leave memfds executable.
func SetMemfdNoExec() error {
	if err := os.WriteFile(MemfdNoExecSysctl, []byte("2\n"), 0); err != nil {
		return err
	}
	data, err := os.ReadFile(MemfdNoExecSysctl)
	if err != nil {
		return err
	}
	if v := strings.TrimSpace(string(data)); v != "2" {
		return fmt.Errorf("%s reads %q once 2 was written", MemfdNoExecSysctl, v)
	}
	return nil
}

// MemfdArg, second in roost-init's arguments, makes it the writer SetMemfdNoExecIn starts
// in a sealed container's pid namespace; the third is that namespace (see nsID), which it
// checks it is in before it writes.
const MemfdArg = "memfd-noexec"

// SetMemfdNoExecIn sets vm.memfd_noexec to 2 in the pid namespace of the process pid (a
// sealed container's init, not yet roost-init), from the host: nothing in a sealed session
// can set it for itself, as root there is not host root and holds no capability. A process
// never changes its own pid namespace, only where its children are born, so the write is a
// child's: roost-init, at init (its host path), started there as MemfdArg.
func SetMemfdNoExecIn(init string, pid int) error {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil {
		return fmt.Errorf("the container's pid namespace: %w", err)
	}
	defer ns.Close()
	target, err := nsID(ns)
	if err != nil {
		return err
	}
	// Were the container's pid namespace this process's, the write would set the host's.
	own, err := os.Open("/proc/self/ns/pid")
	if err != nil {
		return err
	}
	ownID, err := nsID(own)
	own.Close()
	if err != nil {
		return err
	}
	if ownID == target {
		return errors.New("the container's pid namespace is the host's")
	}
	done := make(chan error, 1)
	go func() {
		// setns(CLONE_NEWPID) changes where this thread's children are born, so the fork
		// must come from it, and no other goroutine may run on it after: the goroutine ends
		// locked, and the runtime ends the thread with it.
		runtime.LockOSThread()
		done <- startWriter(ns, init, target)
	}()
	return <-done
}

// startWriter runs on a thread of its own: it enters the pid namespace ns (for its
// children), starts the writer there and waits for it.
func startWriter(ns *os.File, init, target string) error {
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWPID); err != nil {
		return fmt.Errorf("setns into the container's pid namespace: %w", err)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer errR.Close()
	pid, err := syscall.ForkExec(init, []string{InitName, MemfdArg, target},
		&syscall.ProcAttr{Env: []string{}, Files: []uintptr{devnull.Fd(), devnull.Fd(), errW.Fd()}})
	errW.Close()
	if err != nil {
		return fmt.Errorf("starting %s in the container's pid namespace: %w", init, err)
	}
	msg, _ := io.ReadAll(io.LimitReader(errR, 4096))
	var status syscall.WaitStatus
	for {
		_, err = syscall.Wait4(pid, &status, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return err
	}
	if !status.Exited() || status.ExitStatus() != 0 {
		return fmt.Errorf("its writer in the container's pid namespace failed (%v): %s", status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// memfdMain is the writer: it sets the sysctl once it has seen that it runs in the pid
// namespace want.
func memfdMain(want string) int {
	if err := memfdWrite(want); err != nil {
		fmt.Fprintf(os.Stderr, "roost-init %s: %v\n", MemfdArg, err)
		return 1
	}
	return 0
}

func memfdWrite(want string) error {
	ns, err := os.Open("/proc/self/ns/pid")
	if err != nil {
		return err
	}
	got, err := nsID(ns)
	ns.Close()
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("runs in pid namespace %s, not the container's (%s)", got, want)
	}
	return SetMemfdNoExec()
}

// nsID names the namespace f is a handle of: its device and inode.
func nsID(f *os.File) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}
