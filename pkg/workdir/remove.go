package workdir

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RemoveAll removes the tree at path, path included, as os.RemoveAll does but with two
// descriptors whatever the tree's depth (os.RemoveAll holds one per level, so a tree deeper
// than RLIMIT_NOFILE would outlive it): each directory's files are unlinked and its
// subdirectories moved up to the top, under a name of roost's, to be emptied in turn; the
// emptied directory is then removed. Nothing is followed: a link is removed as a link. A
// mount inside the tree is not entered and its mountpoint not removed (an error says so).
// A path that does not exist is no error.
func RemoveAll(path string) error {
	top, err := openDir(unix.AT_FDCWD, path)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
		// Not a directory (or a link to one): removed as it is.
		if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("removing %s: %w", path, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("removing %s: %w", path, err)
	}
	r := &remover{top: top, buf: make([]byte, direntBuf)}
	var stx unix.Statx_t
	if err := unix.Statx(top, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err == nil && stx.Mask&unix.STATX_MNT_ID != 0 {
		r.mnt, r.haveMnt = stx.Mnt_id, true
	}
	err = r.empty(top, true)
	unix.Close(top)
	if err != nil {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	if err := unix.Rmdir(path); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}

type remover struct {
	top    int
	buf    []byte
	lifted int
	// mnt is the top's mount: a directory on another is not entered.
	mnt     uint64
	haveMnt bool
}

// empty removes everything in the directory open at dir. For the top directory every
// subdirectory is emptied and removed; for another, its subdirectories are moved to the top.
func (r *remover) empty(dir int, top bool) error {
	for {
		// Each pass reads the directory from its start: what a pass removed is gone, what
		// it moved to the top (when dir is the top) is there for the next.
		if _, err := unix.Seek(dir, 0, 0); err != nil {
			return err
		}
		seen, done := 0, 0
		var firstErr error
		for {
			n, err := unix.Getdents(dir, r.buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return err
			}
			if n <= 0 {
				break
			}
			// The batch is copied out: removing entries while reading on is fine, but the
			// buffer is needed again below, for the subdirectory.
			var names []string
			for pos := 0; pos+19 <= n; {
				reclen := int(*(*uint16)(unsafe.Pointer(&r.buf[pos+16])))
				if reclen < 20 || pos+reclen > n {
					break
				}
				name := cString(r.buf[pos+19 : pos+reclen])
				pos += reclen
				if name != "." && name != ".." {
					names = append(names, name)
				}
			}
			for _, name := range names {
				seen++
				if err := r.remove(dir, name, top); err != nil {
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				done++
			}
		}
		if seen == 0 {
			return nil
		}
		if done == 0 {
			// A pass that removed nothing would be followed by the same pass.
			return firstErr
		}
	}
}

// remove removes the entry name of dir: unlinks it, or, a directory, empties and removes it
// (in the top directory) or moves it to the top (elsewhere).
func (r *remover) remove(dir int, name string, top bool) error {
	err := unix.Unlinkat(dir, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return fmt.Errorf("%s: %w", name, err)
	}
	if !top {
		for {
			r.lifted++
			err := unix.Renameat2(dir, name, r.top, fmt.Sprintf(".roost-rm-%d", r.lifted), unix.RENAME_NOREPLACE)
			switch {
			case err == nil, errors.Is(err, unix.ENOENT):
				return nil
			case errors.Is(err, unix.EEXIST):
				continue
			default:
				// EXDEV: a mount's root; EBUSY: a mountpoint. Neither is roost's to remove.
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	sub, err := openDir(dir, name)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	var stx unix.Statx_t
	if err := unix.Statx(sub, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil || (r.haveMnt && stx.Mnt_id != r.mnt) {
		unix.Close(sub)
		return fmt.Errorf("%s: a mount (or unreadable): not entered", name)
	}
	err = r.empty(sub, false)
	unix.Close(sub)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := unix.Unlinkat(dir, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
