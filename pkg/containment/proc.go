package containment

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

const noFollow = syscall.O_NOFOLLOW

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

// ErrGone means the process a ProcessRef names no longer exists.
var ErrGone = errors.New("process is gone")

// exitWatch delivers a process's end, whether or not it is our child, through a pidfd
// registered with the Go runtime's poller, so a thousand watched sessions cost no thread.
type exitWatch struct {
	done chan struct{}
	file *os.File
}

// watchExit opens a pidfd for pid and checks that it still names the process that started
// at start (when start is non-zero). ErrGone when it does not.
func watchExit(pid int, start uint64) (*exitWatch, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, ErrGone
		}
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	// Check the start time only after the pidfd is open: from here on the fd names one
	// process, so a match proves it is the one recorded.
	if start != 0 {
		if got, err := StartTime(pid); err != nil || got != start {
			unix.Close(fd)
			return nil, ErrGone
		}
	}
	w := &exitWatch{done: make(chan struct{}), file: os.NewFile(uintptr(fd), "pidfd")}
	rc, err := w.file.SyscallConn()
	if err != nil {
		w.file.Close()
		return nil, err
	}
	go func() {
		defer close(w.done)
		defer w.file.Close()
		// A pidfd polls readable once its process has exited. Returning false parks this
		// goroutine in the poller until then.
		_ = rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, 0)
			return err != nil || n > 0
		})
	}()
	return w, nil
}

// signalGroup sends sig to the process group led by pid.
func signalGroup(pid int, sig syscall.Signal) error {
	if pid <= 1 {
		return fmt.Errorf("refusing to signal process group %d", pid)
	}
	err := unix.Kill(-pid, sig)
	if errors.Is(err, unix.ESRCH) {
		return ErrGone
	}
	return err
}
