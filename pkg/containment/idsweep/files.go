package idsweep

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// maxDepth bounds the walk of a place: one descriptor per level is open at once.
const maxDepth = 256

// removeOwned removes, beneath place, every entry an id of rs owns (as uid or gid) in a
// directory the range could reach. It
// walks by descriptors, never following a link nor leaving place's filesystem, so
// whatever another user renames or swaps meanwhile, it removes only entries of rs beneath
// place. Within a directory of rs it removes only what rs owns too; a directory of rs still
// holding another user's files is given to root (0700), not left to the next holder of
// the range.
func removeOwned(place string, rs Ranges) (int, error) {
	fd, err := unix.Open(place, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", place, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("%s: %w", place, err)
	}
	w := walker{rs: rs, dev: st.Dev}
	err = w.dir(fd, place, 0)
	return w.removed, err
}

type walker struct {
	rs      Ranges
	dev     uint64
	removed int
}

func (w *walker) owned(st *unix.Stat_t) bool {
	return w.rs.has(uint64(st.Uid)) || w.rs.has(uint64(st.Gid))
}

// dir removes what rs owns in the directory open at fd (path names it in errors).
func (w *walker) dir(fd int, path string, depth int) error {
	if depth >= maxDepth {
		return fmt.Errorf("%s: more than %d levels deep", path, maxDepth)
	}
	names, err := readNames(fd)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	var errs []error
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("%s/%s: %w", path, name, err))
			}
			continue
		}
		if st.Dev != w.dev {
			continue // another filesystem mounted here: not this place's
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if w.owned(&st) {
				if err := unix.Unlinkat(fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("removing %s/%s: %w", path, name, err))
					continue
				}
				w.removed++
			}
			continue
		}
		// Only a directory the range could search can hold what it made: one no id of the
		// range could enter (a go-build or t.TempDir tree, 0700 and another's) is not walked.
		if !w.owned(&st) && st.Mode&0o001 == 0 {
			continue
		}
		if err := w.subdir(fd, name, path+"/"+name, &st, depth); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// subdir walks the directory name of fd, which fstatat found as st, and removes it when rs
// owns it and it is left empty.
func (w *walker) subdir(fd int, name, path string, st *unix.Stat_t, depth int) error {
	sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return nil // swapped meanwhile: what it is now is not what was looked at
	}
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer unix.Close(sub)
	var now unix.Stat_t
	if err := unix.Fstat(sub, &now); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if now.Dev != st.Dev || now.Ino != st.Ino {
		return nil
	}
	if err := w.dir(sub, path, depth+1); err != nil {
		return err
	}
	if !w.owned(&now) {
		return nil
	}
	err = unix.Unlinkat(fd, name, unix.AT_REMOVEDIR)
	switch {
	case err == nil:
		w.removed++
		return nil
	case errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST):
		// Another user's files are in it: theirs to keep, but the directory is no longer
		// the range's to enter.
		if err := unix.Fchown(sub, 0, 0); err != nil {
			return fmt.Errorf("giving %s to root: %w", path, err)
		}
		if err := unix.Fchmod(sub, 0o700); err != nil {
			return fmt.Errorf("giving %s to root: %w", path, err)
		}
		return nil
	default:
		return fmt.Errorf("removing %s: %w", path, err)
	}
}

// readNames lists a directory open at fd, without . and ...
func readNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "")
	defer f.Close()
	return f.Readdirnames(-1)
}
