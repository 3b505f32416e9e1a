package containment

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment/roostinit"
)

const noFollow = syscall.O_NOFOLLOW

// StartTime returns a process's start time in clock ticks since boot.
func StartTime(pid int) (uint64, error) { return roostinit.StartTime(pid) }

// ExitWatch delivers a process's end, whether or not it is our child, through a pidfd
// registered with the Go runtime's poller, so a thousand watched sessions cost no thread.
type ExitWatch struct {
	done chan struct{}
	file *os.File
}

// Done is closed once the process has ended.
func (w *ExitWatch) Done() <-chan struct{} { return w.done }

// EndedWatch is the watch of a process already gone (a program quicker than its start).
func EndedWatch() *ExitWatch {
	w := &ExitWatch{done: make(chan struct{})}
	close(w.done)
	return w
}

// WatchExit opens a pidfd for pid and checks that it still names the process that started
// at start (when start is non-zero). ErrGone when it does not.
func WatchExit(pid int, start uint64) (*ExitWatch, error) {
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
	w := &ExitWatch{done: make(chan struct{}), file: os.NewFile(uintptr(fd), "pidfd")}
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
		_ = rc.Read(func(fd uintptr) bool { return exited(int(fd)) })
	}()
	return w, nil
}

// exited says whether the pidfd's process has ended. A poll that a signal interrupts
// (the Go runtime preempts goroutines with SIGURG) looks again: read as an end, it would
// have roostd record a live session lost and kill it.
func exited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			// Only a pidfd that is no longer one fails here; nothing is left to wait for.
			return true
		}
		return n > 0
	}
}

// InitTag is what roost-init's command line names its session (or sandbox) by: a digest of
// the id, not the id. Every user of the host reads command lines in ps, and a session's id
// names its workdir and records beneath the state directory.
func InitTag(id string) string {
	h := sha256.Sum256([]byte("roost-init\x00" + id))
	return "s" + hex.EncodeToString(h[:10])
}

// FindInit looks for a running roost-init of the session: the one way to find a supervisor
// started by a daemon that died before roost-init wrote init.json.
func FindInit(sessionID string) (pid int, ok bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	want := []byte(InitName + "\x00" + InitTag(sessionID) + "\x00")
	// A roost-init started before the tag named the session by its id.
	old := []byte(InitName + "\x00" + sessionID + "\x00")
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && (bytes.Equal(cmdline, want) || bytes.Equal(cmdline, old)) {
			return n, true
		}
	}
	return 0, false
}
