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

// ErrPastLimit is a copy that stopped before it would have gone past the limit it was given;
// the error is a *LimitError.
var ErrPastLimit = errors.New("the copy would go past its limit")

// LimitError is where and how a copy stopped at its limit.
type LimitError struct {
	// Rel is the entry being copied, relative to the copy's root.
	Rel string
	// Inodes: the copy stopped at its limit of entries, not bytes.
	Inodes bool
	// Used is what the copy had taken, More what it was about to take, Limit its bound.
	Used, More, Limit int64
}

func (e *LimitError) Error() string {
	if e.Inodes {
		return fmt.Sprintf("%s: %v: %d files and directories copied, the most it may make", e.Rel, ErrPastLimit, e.Used)
	}
	return fmt.Sprintf("%s: %v: %d bytes allocated by the copy, %d more would pass the %d it may take", e.Rel, ErrPastLimit, e.Used, e.More, e.Limit)
}

func (e *LimitError) Unwrap() error { return ErrPastLimit }

// Copy copies the tree at src (beneath nothing: src is roost's to trust) into dst, which
// must exist, walking src by descriptors: no directory is reached through a link, files are
// opened O_NOFOLLOW, symlinks are copied as links, anything else is skipped. Top-level
// names in skip are left out.
//
// Regular files are copied sparse: only their data is written (the extents SEEK_DATA and
// SEEK_HOLE find), their holes stay holes and ftruncate gives the copy its size, so a copy
// allocates what its source does, not its apparent size. A file is copied as far as its
// size when it was opened: one growing under the copy is cut there.
//
// With lim, the copy stops before it allocates more than lim.Bytes or makes more than
// lim.Inodes entries, counted as Measure counts (a directory and a link as what their
// source allocates, a file as the data written, then as what the copy allocates), and
// returns an error wrapping ErrPastLimit; what it copied is left for the caller to remove.
// The bound holds however src changes meanwhile: the tree may be a running session's, which
// can fill the holes a measurement of it found.
func Copy(src, dst string, lim Limits, skip ...string) error {
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
	c := &copier{lim: lim}
	return c.dir(s, d, ".", skip)
}

// copier is one Copy: its bound and what it has taken of it.
type copier struct {
	lim  Limits
	used Usage
	// buf serves copies between filesystems copy_file_range cannot join.
	buf []byte
}

// take counts bytes and inodes the copy is about to allocate, refusing them when they
// would take it past its limit.
func (c *copier) take(rel string, bytes, inodes int64) error {
	if c.lim.Bytes > 0 && c.used.Bytes+bytes > c.lim.Bytes {
		return &LimitError{Rel: rel, Used: c.used.Bytes, More: bytes, Limit: c.lim.Bytes}
	}
	if c.lim.Inodes > 0 && c.used.Inodes+inodes > c.lim.Inodes {
		return &LimitError{Rel: rel, Inodes: true, Used: c.used.Inodes, More: inodes, Limit: c.lim.Inodes}
	}
	c.used.Bytes += bytes
	c.used.Inodes += inodes
	return nil
}

func (c *copier) dir(src, dst *os.File, rel string, skip []string) error {
	entries, err := src.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	for _, e := range entries {
		name := e.Name()
		if contains(skip, name) {
			continue
		}
		if err := c.entry(src, dst, filepath.Join(rel, name), name); err != nil {
			return err
		}
	}
	return nil
}

func (c *copier) entry(src, dst *os.File, rel, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(int(src.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	// The copy is root's: no setuid, setgid or sticky bit survives it.
	perm := uint32(st.Mode & 0o777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := c.take(rel, st.Blocks*512, 1); err != nil {
			return err
		}
		if err := unix.Mkdirat(int(dst.Fd()), name, perm|0o700); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		sub, err := openDirAt(src, name, false)
		if err != nil {
			return err
		}
		defer sub.Close()
		dsub, err := openDirAt(dst, name, false)
		if err != nil {
			return err
		}
		defer dsub.Close()
		return c.dir(sub, dsub, rel, nil)
	case unix.S_IFLNK:
		if err := c.take(rel, st.Blocks*512, 1); err != nil {
			return err
		}
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(int(src.Fd()), name, buf)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if err := unix.Symlinkat(string(buf[:n]), int(dst.Fd()), name); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
	case unix.S_IFREG:
		return c.file(src, dst, rel, name, perm)
	}
	return nil
}

func (c *copier) file(src, dst *os.File, rel, name string, perm uint32) error {
	// O_NONBLOCK and the fstat: the entry may have been swapped for a FIFO or a device since
	// it was looked at, and opening one must neither block nor copy it.
	in, err := unix.Openat(int(src.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer unix.Close(in)
	var st unix.Stat_t
	if err := unix.Fstat(in, &st); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	if err := c.take(rel, 0, 1); err != nil {
		return err
	}
	out, err := unix.Openat(int(dst.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	outf := os.NewFile(uintptr(out), name)
	taken, err := c.data(in, out, rel, st.Size)
	if err == nil {
		err = unix.Ftruncate(out, st.Size)
	}
	if err == nil {
		// What the copy allocates, blocks and metadata, is what it is charged, in place of
		// the data written.
		var got unix.Stat_t
		if err = unix.Fstat(out, &got); err == nil {
			c.used.Bytes -= taken
			err = c.take(rel, got.Blocks*512, 0)
		}
	}
	if cerr := outf.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("%s: %w", rel, cerr)
	}
	return err
}

// data copies the data extents of in below size to the same offsets of out, and returns
// how many bytes it took of the copy's limit for them.
func (c *copier) data(in, out int, rel string, size int64) (taken int64, err error) {
	for off := int64(0); off < size; {
		start, err := unix.Seek(in, off, unix.SEEK_DATA)
		switch {
		case errors.Is(err, unix.ENXIO):
			// No data past off: the rest is a hole, or the file shrank under the copy.
			return taken, nil
		case errors.Is(err, unix.EINVAL):
			// No SEEK_DATA here: all of it is data.
			start = off
		case err != nil:
			return taken, fmt.Errorf("%s: %w", rel, err)
		}
		end := size
		if err == nil {
			if end, err = unix.Seek(in, start, unix.SEEK_HOLE); err != nil {
				return taken, fmt.Errorf("%s: %w", rel, err)
			}
			end = min(end, size)
		}
		if start >= end {
			return taken, nil
		}
		if err := c.take(rel, end-start, 0); err != nil {
			return taken, err
		}
		taken += end - start
		if err := c.extent(in, out, start, end-start); err != nil {
			return taken, fmt.Errorf("%s: %w", rel, err)
		}
		off = end
	}
	return taken, nil
}

// extent copies n bytes at off from in to out, in the kernel when it can.
func (c *copier) extent(in, out int, off, n int64) error {
	for n > 0 {
		roff, woff := off, off
		k, err := unix.CopyFileRange(in, &roff, out, &woff, int(min(n, 1<<30)), 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EXDEV), errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP):
			return c.pcopy(in, out, off, n)
		case err != nil:
			return err
		case k == 0:
			// The file shrank under the copy: the copy's end stays a hole.
			return nil
		}
		off += int64(k)
		n -= int64(k)
	}
	return nil
}

// pcopy is extent for files copy_file_range cannot join: read, then written, at off.
func (c *copier) pcopy(in, out int, off, n int64) error {
	if c.buf == nil {
		c.buf = make([]byte, 1<<20)
	}
	for n > 0 {
		k, err := unix.Pread(in, c.buf[:min(n, int64(len(c.buf)))], off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if k == 0 {
			return nil
		}
		for w := 0; w < k; {
			m, err := unix.Pwrite(out, c.buf[w:k], off+int64(w))
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return err
			}
			w += m
		}
		off += int64(k)
		n -= int64(k)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
