// Package idsweep clears what host ids left behind once their session is gone: it kills
// every process whose real, effective, saved or filesystem uid or gid is in a range, removes
// the SysV message queues, semaphore sets and shared-memory segments such an id owns or
// created, and removes the files such an id owns in the host's shared writable places
// (/tmp, /var/tmp, /dev/shm, /dev/mqueue). roostd sweeps a range before it hands it to the
// next session. It acts on the host (roostd's own namespaces) and knows nothing of
// sessions: the caller says which ranges are no one's.
package idsweep

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Range is a block of host ids: First and the Size-1 after it.
type Range struct {
	First, Size uint32
}

func (r Range) has(id uint64) bool {
	return id >= uint64(r.First) && id < uint64(r.First)+uint64(r.Size)
}

// Ranges are the ranges of one sweep.
type Ranges []Range

func (rs Ranges) has(id uint64) bool {
	for _, r := range rs {
		if r.has(id) {
			return true
		}
	}
	return false
}

// DefaultPlaces are the host's shared writable places a session's uid can leave files in.
var DefaultPlaces = []string{"/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue"}

// Sweeper sweeps ranges on this host.
type Sweeper struct {
	// Proc is where procfs is mounted ("/proc" when empty).
	Proc string
	// Places are walked for the ranges' files (DefaultPlaces when nil).
	Places []string
	// Settle bounds how long one round waits for killed processes to exit (1 s when 0).
	Settle time.Duration
	// KillFor bounds the whole kill phase (5 s when 0): a process that will not die (in an
	// uninterruptible sleep, say) leaves the range quarantined, to be swept again later,
	// rather than holding up the rm that asked.
	KillFor time.Duration
}

// Report is what a sweep found and removed.
type Report struct {
	Processes, IPC, Files int
}

// maxRounds bounds the kill rounds: a range whose processes keep appearing (a fork bomb
// racing the scan) after that many is reported, not given out.
const maxRounds = 64

// Sweep clears rs. It returns what it removed and, joined, everything it could not: the
// ranges are clean only when the error is nil.
func (s Sweeper) Sweep(rs Ranges) (Report, error) {
	var rep Report
	if len(rs) == 0 {
		return rep, nil
	}
	// Processes first: nothing of the ranges runs to make more while the rest goes.
	n, perr := s.kill(rs)
	rep.Processes = n
	n, ierr := s.removeIPC(rs)
	rep.IPC = n
	places := s.Places
	if places == nil {
		places = DefaultPlaces
	}
	var ferrs []error
	for _, p := range places {
		n, err := removeOwned(p, rs)
		rep.Files += n
		if err != nil {
			ferrs = append(ferrs, err)
		}
	}
	return rep, errors.Join(perr, ierr, errors.Join(ferrs...))
}

func (s Sweeper) proc() string {
	if s.Proc == "" {
		return "/proc"
	}
	return s.Proc
}

// owner is the ids /proc/<pid>/status gives a task.
type owner struct {
	ids    []uint64 // real, effective, saved and filesystem uids, then gids
	zombie bool
}

// parseStatus reads the Uid, Gid and State lines of a /proc/<pid>/status.
func parseStatus(data string) (owner, bool) {
	var o owner
	found := 0
	for line := range strings.Lines(data) {
		key, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch key {
		case "Uid", "Gid":
			f := strings.Fields(rest)
			if len(f) != 4 {
				return o, false
			}
			for _, v := range f {
				id, err := strconv.ParseUint(v, 10, 32)
				if err != nil {
					return o, false
				}
				o.ids = append(o.ids, id)
			}
			found++
		case "State":
			o.zombie = strings.HasPrefix(strings.TrimSpace(rest), "Z") || strings.HasPrefix(strings.TrimSpace(rest), "X")
		}
	}
	return o, found == 2
}

func (o owner) in(rs Ranges) bool {
	if o.zombie {
		// It runs nothing and holds nothing but its exit status.
		return false
	}
	for _, id := range o.ids {
		if rs.has(id) {
			return true
		}
	}
	return false
}

// taskIn says whether any task (thread) of pid runs as an id of rs: credentials are per
// thread, and a thread may change its own.
func (s Sweeper) taskIn(pid string, rs Ranges) bool {
	dir := filepath.Join(s.proc(), pid, "task")
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, t := range tasks {
		data, err := os.ReadFile(filepath.Join(dir, t.Name(), "status"))
		if err != nil {
			continue
		}
		if o, ok := parseStatus(string(data)); ok && o.in(rs) {
			return true
		}
	}
	return false
}

// kill SIGKILLs every process any of whose tasks runs as an id of rs, round after round,
// until a scan finds none. Each is signalled through a pidfd opened before its ids are
// read again, so a pid reused in between is never signalled.
func (s Sweeper) kill(rs Ranges) (int, error) {
	self := strconv.Itoa(os.Getpid())
	settle := s.Settle
	if settle == 0 {
		settle = time.Second
	}
	killFor := s.KillFor
	if killFor == 0 {
		killFor = 5 * time.Second
	}
	deadline := time.Now().Add(killFor)
	killed := 0
	for round := 0; round < maxRounds && time.Now().Before(deadline); round++ {
		entries, err := os.ReadDir(s.proc())
		if err != nil {
			return killed, fmt.Errorf("listing processes: %w", err)
		}
		var fds []int
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || e.Name() == self {
				continue
			}
			if !s.taskIn(e.Name(), rs) {
				continue
			}
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue // gone
			}
			// The pidfd holds the process: its pid is not reused while the fd is open.
			if !s.taskIn(e.Name(), rs) {
				unix.Close(fd)
				continue
			}
			if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
				unix.Close(fd)
				return killed, fmt.Errorf("killing pid %d: %w", pid, err)
			}
			killed++
			fds = append(fds, fd)
		}
		if len(fds) == 0 {
			return killed, nil
		}
		waitExit(fds, min(settle, max(time.Until(deadline), 0)))
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	return killed, fmt.Errorf("processes of uid ranges %s were still there after %s of SIGKILL rounds (a process that does not die, or one forking faster than the scan)", rs, time.Since(deadline.Add(-killFor)).Round(time.Millisecond))
}

// waitExit waits up to d for every pidfd to report its process's exit.
func waitExit(fds []int, d time.Duration) {
	deadline := time.Now().Add(d)
	pending := fds
	for len(pending) > 0 {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		pfds := make([]unix.PollFd, len(pending))
		for i, fd := range pending {
			pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
		}
		if _, err := unix.Poll(pfds, int(left.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		var still []int
		for i, p := range pfds {
			if p.Revents == 0 {
				still = append(still, pending[i])
			}
		}
		pending = still
	}
}

func (rs Ranges) String() string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%d-%d", r.First, uint64(r.First)+uint64(r.Size)-1)
	}
	return strings.Join(parts, ", ")
}
