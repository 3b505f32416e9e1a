package idsweep

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// DefaultClaims is where daemons note the blocks of ids they sweep.
const DefaultClaims = "/run/roost/ids"

// Claimed is a block of ids this process holds, host-wide, until Release.
type Claimed struct {
	f *os.File
}

// Claim holds the block of ids [first, end) for this process, host-wide: a sweep kills
// whatever runs on a range it frees, so two daemons sweeping one block would kill each
// other's sessions (and hand two sessions one uid). In dir each daemon keeps an entry
// naming its block, locked while it lives; a block overlapping one a live daemon holds is
// refused, naming that daemon's pid. An entry whose daemon is gone is removed.
func Claim(dir string, first, end uint64) (*Claimed, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("id block claims: %w", err)
	}
	// One claimant at a time: two daemons starting together cannot both see the other's
	// block missing.
	guard, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("id block claims: %w", err)
	}
	defer guard.Close()
	if err := unix.Flock(int(guard.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("id block claims: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("id block claims: %w", err)
	}
	for _, e := range entries {
		f, l, pid, ok := parseClaim(e.Name())
		if !ok {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if !held(path) {
			os.Remove(path)
			continue
		}
		if f < end && first < l {
			return nil, fmt.Errorf("host ids %d-%d overlap the block %d-%d roostd pid %d sweeps: give each roostd on a host a block of its own (sessions.ids in its config): %w",
				first, end-1, f, l-1, pid, errdefs.ErrFailedPrecondition)
		}
	}
	path := filepath.Join(dir, fmt.Sprintf("%d-%d.%d", first, end, os.Getpid()))
	c, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("id block claims: %w", err)
	}
	if err := unix.Flock(int(c.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		c.Close()
		return nil, fmt.Errorf("id block claims: %s: %w", path, err)
	}
	return &Claimed{f: c}, nil
}

// held says whether the daemon of the entry at path still holds it.
func held(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	return errors.Is(err, unix.EWOULDBLOCK)
}

// parseClaim reads an entry's name: first-end.pid.
func parseClaim(name string) (first, end uint64, pid int, ok bool) {
	block, p, found := strings.Cut(name, ".")
	if !found {
		return 0, 0, 0, false
	}
	a, b, found := strings.Cut(block, "-")
	if !found {
		return 0, 0, 0, false
	}
	var err1, err2, err3 error
	first, err1 = strconv.ParseUint(a, 10, 64)
	end, err2 = strconv.ParseUint(b, 10, 64)
	pid, err3 = strconv.Atoi(p)
	return first, end, pid, err1 == nil && err2 == nil && err3 == nil && first < end
}

// Release lets the block go.
func (c *Claimed) Release() {
	os.Remove(c.f.Name())
	c.f.Close()
}
