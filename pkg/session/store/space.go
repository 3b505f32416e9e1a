package store

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// DiskSpace is what a filesystem has room for.
type DiskSpace struct {
	Free, Size         uint64
	FreeInodes, Inodes uint64
}

// StatDisk reads the room left on dir's filesystem.
func StatDisk(dir string) (DiskSpace, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return DiskSpace{}, err
	}
	unit := uint64(st.Frsize)
	if unit == 0 {
		unit = uint64(st.Bsize)
	}
	// Bavail, not Bfree: what sessions (unprivileged uids) may still write.
	return DiskSpace{Free: st.Bavail * unit, Size: st.Blocks * unit, FreeInodes: st.Ffree, Inodes: st.Files}, nil
}

// NoSpaceError says the state directory is full: what failed, how much is free, what to do.
func NoSpaceError(dir, what string) error {
	free := "no space"
	if d, err := StatDisk(dir); err == nil {
		free = fmt.Sprintf("%s free of %s", SizeOf(d.Free), SizeOf(d.Size))
	}
	return fmt.Errorf("%s: the state directory %s has %s; free space there (roostctl prune removes ended sessions and their files) and try again: %w",
		what, dir, free, errdefs.ErrResourceExhausted)
}

// IsNoSpace says a write failed for want of room (bbolt's resize error keeps only the
// words).
func IsNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) ||
		strings.Contains(err.Error(), syscall.ENOSPC.Error()) || strings.Contains(err.Error(), syscall.EDQUOT.Error())
}

// SizeOf writes n bytes for people: 1.5 KiB, 32.0 MiB.
func SizeOf(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for x := n / unit; x >= unit; x /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
