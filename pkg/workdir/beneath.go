// Package workdir does what roostd, running as root, must do inside directories a capsule
// controls: every path is resolved beneath a root without following a symlink (openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), files are opened O_NOFOLLOW, copies keep links as
// links. A link a capsule planted is refused, never followed.
package workdir

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

var beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

func explain(rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%s: a symlink lies on the path; roost never follows one in a workdir", rel)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%s: leaves the directory", rel)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%s: not a directory", rel)
	}
	return fmt.Errorf("%s: %w", rel, err)
}

func openRoot(root string) (*os.File, error) {
	return os.OpenFile(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
}

// OpenDir opens rel beneath root as a directory (O_PATH when path is true).
func OpenDir(root, rel string, path bool) (*os.File, error) {
	r, err := openRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return openDirAt(r, rel, path)
}

func openDirAt(dir *os.File, rel string, path bool) (*os.File, error) {
	flags := uint64(unix.O_DIRECTORY | unix.O_CLOEXEC)
	if path {
		flags |= unix.O_PATH
	}
	fd, err := unix.Openat2(int(dir.Fd()), rel, &unix.OpenHow{Flags: flags, Resolve: uint64(beneath)})
	if err != nil {
		return nil, explain(rel, err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir.Name(), rel)), nil
}

// Owner is who a directory roost makes, or a tree it hands over, is given to.
type Owner struct{ UID, GID int }

// MkdirAll creates rel beneath root one component at a time, each opened beneath the last
// without following links. New directories get perm and, when owner is set, that owner;
// existing ones are left as they are.
func MkdirAll(root, rel string, perm os.FileMode, owner *Owner) error {
	cur, err := openRoot(root)
	if err != nil {
		return err
	}
	defer func() { cur.Close() }()
	for _, part := range strings.Split(filepath.Clean(rel), "/") {
		made := true
		if err := unix.Mkdirat(int(cur.Fd()), part, 0o700); err != nil {
			if !errors.Is(err, unix.EEXIST) {
				return explain(rel, err)
			}
			made = false
		}
		next, err := openDirAt(cur, part, false)
		if err != nil {
			return explain(rel, err)
		}
		cur.Close()
		cur = next
		if !made {
			continue
		}
		// Set on the descriptor just opened, never by name: the directory is the one made.
		if owner != nil {
			if err := unix.Fchown(int(cur.Fd()), owner.UID, owner.GID); err != nil {
				return explain(rel, err)
			}
		}
		if err := unix.Fchmod(int(cur.Fd()), uint32(perm.Perm())|modeBits(perm)); err != nil {
			return explain(rel, err)
		}
	}
	return nil
}

// modeBits turns os.FileMode's setgid and sticky flags into chmod's bits.
func modeBits(m os.FileMode) uint32 {
	var bits uint32
	if m&os.ModeSetgid != 0 {
		bits |= unix.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		bits |= unix.S_ISVTX
	}
	return bits
}

// Chown gives every entry of the tree at root (root included) to owner, walking it by
// descriptors and never following a link (a link itself is re-owned, not its target). With
// only set, an entry is re-owned only when only accepts it as it is now (its lstat). It is
// how a session's uid is given its workdir, and how an operator's workdir is handed back.
func Chown(root string, owner Owner, only func(st *unix.Stat_t) bool) error {
	top, err := os.OpenFile(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer top.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(top.Fd()), &st); err != nil {
		return err
	}
	if only == nil || only(&st) {
		if err := unix.Fchown(int(top.Fd()), owner.UID, owner.GID); err != nil {
			return fmt.Errorf("%s: %w", root, err)
		}
	}
	return chownDir(top, owner, only)
}

func chownDir(dir *os.File, owner Owner, only func(st *unix.Stat_t) bool) error {
	for {
		entries, err := dir.ReadDir(1024)
		for _, e := range entries {
			var st unix.Stat_t
			if err := unix.Fstatat(int(dir.Fd()), e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				return err
			}
			if only == nil || only(&st) {
				if err := unix.Fchownat(int(dir.Fd()), e.Name(), owner.UID, owner.GID, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
					return fmt.Errorf("%s: %w", filepath.Join(dir.Name(), e.Name()), err)
				}
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue
			}
			sub, err := openDirAt(dir, e.Name(), false)
			if err != nil {
				// Swapped for a link or gone since it was listed: nothing of it is ours to change.
				continue
			}
			err = chownDir(sub, owner, only)
			sub.Close()
			if err != nil {
				return err
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if len(entries) == 0 {
			return nil
		}
	}
}

// Symlink makes a link at rel beneath root pointing at target, replacing nothing.
func Symlink(root, rel, target string) error {
	dir, err := OpenDir(root, filepath.Dir(rel), true)
	if err != nil {
		return err
	}
	defer dir.Close()
	return unix.Symlinkat(target, int(dir.Fd()), filepath.Base(rel))
}

// WriteFile writes data to rel beneath root atomically (a temporary file renamed over it),
// never through a link.
func WriteFile(root, rel string, data []byte, perm os.FileMode) error {
	dir, err := OpenDir(root, filepath.Dir(rel), false)
	if err != nil {
		return err
	}
	defer dir.Close()
	name := filepath.Base(rel)
	tmp := "." + name + ".tmp"
	// A fresh inode, whatever was left at tmp (a link, a hard link to something else).
	if err := unix.Unlinkat(int(dir.Fd()), tmp, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return explain(rel, err)
	}
	fd, err := unix.Openat(int(dir.Fd()), tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm))
	if err != nil {
		return explain(rel, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := unix.Renameat(int(dir.Fd()), tmp, int(dir.Fd()), name); err != nil {
		_ = unix.Unlinkat(int(dir.Fd()), tmp, 0)
		return explain(rel, err)
	}
	return nil
}

// Copy copies the tree at src (beneath nothing: src is roost's to trust) into dst, which
// must exist, walking src by descriptors: no directory is reached through a link, files are
// opened O_NOFOLLOW, symlinks are copied as links, anything else is skipped. Top-level
// names in skip are left out.
func Copy(src, dst string, skip ...string) error {
	s, err := os.OpenFile(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer s.Close()
	d, err := os.OpenFile(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	return copyDir(s, d, skip)
}

func copyDir(src, dst *os.File, skip []string) error {
	entries, err := src.ReadDir(-1)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if contains(skip, name) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(int(src.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		// The copy is root's: no setuid, setgid or sticky bit survives it.
		perm := uint32(st.Mode & 0o777)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := unix.Mkdirat(int(dst.Fd()), name, perm|0o700); err != nil {
				return err
			}
			sub, err := openDirAt(src, name, false)
			if err != nil {
				return err
			}
			dsub, err := openDirAt(dst, name, false)
			if err != nil {
				sub.Close()
				return err
			}
			err = copyDir(sub, dsub, nil)
			sub.Close()
			dsub.Close()
			if err != nil {
				return err
			}
		case unix.S_IFLNK:
			buf := make([]byte, unix.PathMax)
			n, err := unix.Readlinkat(int(src.Fd()), name, buf)
			if err != nil {
				return err
			}
			if err := unix.Symlinkat(string(buf[:n]), int(dst.Fd()), name); err != nil {
				return err
			}
		case unix.S_IFREG:
			if err := copyFileAt(src, dst, name, perm); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFileAt(src, dst *os.File, name string, perm uint32) error {
	// O_NONBLOCK and the fstat: the entry may have been swapped for a FIFO or a device since
	// it was looked at, and opening one must neither block nor copy it.
	in, err := unix.Openat(int(src.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	inf := os.NewFile(uintptr(in), name)
	defer inf.Close()
	var st unix.Stat_t
	if err := unix.Fstat(in, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	out, err := unix.Openat(int(dst.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return err
	}
	outf := os.NewFile(uintptr(out), name)
	_, err = io.Copy(outf, inf)
	if cerr := outf.Close(); err == nil {
		err = cerr
	}
	return err
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
