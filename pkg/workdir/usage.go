package workdir

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Usage is what a set of directory trees holds on disk.
type Usage struct {
	// Bytes is what is allocated: every entry's st_blocks × 512, so a sparse file counts
	// what it holds and a link what the link itself takes.
	Bytes int64
	// Inodes counts every file, directory, link and special file once (the roots
	// included); a file with several hard links counts once, whatever it is called.
	Inodes int64
	// LinkNames counts the further names of files with several hard links (each file's
	// first name is in Inodes), LinkBytes what those files hold, once per further name:
	// what a copy, which makes each name a file of its own, would add.
	LinkNames, LinkBytes int64
}

// Limits are the bounds a measurement stops at; 0 is no bound.
type Limits struct {
	Bytes, Inodes int64
}

// Past says whether u is past either of l's bounds.
func (u Usage) Past(l Limits) bool {
	return (l.Bytes > 0 && u.Bytes > l.Bytes) || (l.Inodes > 0 && u.Inodes > l.Inodes)
}

// ErrMoved: a directory more than OpenLevels below its root moved (or went) while it was
// being counted, so the walk could not climb back to where it was. Only a tree that deep,
// changing under the walk, does that; the caller decides (measure again, or take it as past
// the limit). Never is what lies there skipped silently.
var ErrMoved = errors.New("a directory deep in the tree moved while it was being counted")

// OpenLevels is how many levels of a tree the walk holds open at once, besides its root:
// the deepest ones. A tree deeper than that is still walked to its bottom, its upper
// levels closed on the way down and opened again through ".." (checked to be the same
// directory) on the way up, so no tree's depth costs more descriptors than this.
const OpenLevels = 128

// direntBuf is how much of a directory one getdents64 reads.
const direntBuf = 16 << 10

// Measure walks the trees at roots and adds up what they hold, stopping as soon as the
// total is past lim (the Usage returned then is only as far as it got, already past).
//
// The walk is by descriptors alone: each root is opened O_NOFOLLOW, each directory opened
// relative to its parent's descriptor, each entry looked at with statx(AT_SYMLINK_NOFOLLOW)
// relative to its directory. No path is ever built, so no depth and no name length hides
// anything (a path longer than PATH_MAX is no different from a short one), and no symlink
// is followed. A directory on another mount (one roost or the operator put there: a session
// can make no mount the host sees) counts as an entry and is not entered; mounts are told
// apart by mount id, not device, so a btrfs subvolume a session makes is counted like any
// directory. A root that lies inside another root is counted once, as itself. A root that
// does not exist is skipped.
//
// The error reports what could not be looked at (a directory that would not open, say);
// the Usage is then a floor. With ErrMoved among them, part of a tree deeper than
// OpenLevels changed while it was being walked.
func Measure(roots []string, lim Limits) (Usage, error) {
	w := &walker{lim: lim, roots: make(map[fileID]bool, len(roots))}
	type root struct {
		fd int
		id fileID
	}
	var open []root
	defer func() {
		for _, r := range open {
			if r.fd >= 0 {
				unix.Close(r.fd)
			}
		}
	}()
	for _, path := range roots {
		fd, err := openDir(unix.AT_FDCWD, path)
		if err != nil {
			if !errors.Is(err, unix.ENOENT) {
				w.fail(fmt.Errorf("%s: %w", path, err))
			}
			continue
		}
		var stx unix.Statx_t
		if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, statxMask, &stx); err != nil {
			unix.Close(fd)
			w.fail(fmt.Errorf("%s: %w", path, err))
			continue
		}
		id := idOf(&stx)
		if w.roots[id] {
			unix.Close(fd)
			continue
		}
		w.roots[id] = true
		open = append(open, root{fd, id})
	}
	for i := range open {
		r := &open[i]
		w.walk(r.fd, r.id)
		// walk closed it.
		r.fd = -1
		if w.u.Past(w.lim) || w.moved {
			break
		}
	}
	return w.u, errors.Join(w.errs...)
}

// fileID names an inode.
type fileID struct{ dev, ino uint64 }

func idOf(stx *unix.Statx_t) fileID {
	return fileID{dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor), ino: stx.Ino}
}

const statxMask = unix.STATX_TYPE | unix.STATX_NLINK | unix.STATX_INO | unix.STATX_BLOCKS | unix.STATX_MNT_ID

type walker struct {
	lim   Limits
	u     Usage
	roots map[fileID]bool
	// links holds the files with several links already counted.
	links map[fileID]struct{}
	errs  []error
	moved bool
	free  [][]byte
}

// level is one directory on the way down from a root.
type level struct {
	// fd is -1 while the level is closed (more than OpenLevels above the bottom).
	fd int
	id fileID
	// buf[pos:end] is what is read of the directory and not yet looked at.
	buf      []byte
	pos, end int
	// cookie is the d_off of the last entry looked at: where to read on from once the
	// level is opened again.
	cookie int64
}

func (w *walker) fail(err error) {
	// A handful says what went wrong; thousands would only cost memory.
	if len(w.errs) < 8 {
		w.errs = append(w.errs, err)
	}
}

func (w *walker) buffer() []byte {
	if n := len(w.free); n > 0 {
		b := w.free[n-1]
		w.free = w.free[:n-1]
		return b
	}
	return make([]byte, direntBuf)
}

func (w *walker) count(stx *unix.Statx_t) {
	w.u.Inodes++
	w.u.Bytes += int64(stx.Blocks) * 512
}

func openDir(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// walk counts the tree whose root directory is open at fd (and closes fd).
func (w *walker) walk(fd int, rootID fileID) {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, statxMask, &stx); err != nil {
		unix.Close(fd)
		w.fail(err)
		return
	}
	mnt, haveMnt := stx.Mnt_id, stx.Mask&unix.STATX_MNT_ID != 0
	w.count(&stx)
	levels := []level{{fd: fd, id: rootID, buf: w.buffer()}}
	// Levels [1, firstOpen) are closed; level 0 (the root) and [firstOpen, len) are open.
	firstOpen := 1
	defer func() {
		for i := range levels {
			if levels[i].fd >= 0 {
				unix.Close(levels[i].fd)
			}
		}
	}()
	for len(levels) > 0 && !w.u.Past(w.lim) {
		lv := &levels[len(levels)-1]
		if lv.pos >= lv.end {
			n, err := unix.Getdents(lv.fd, lv.buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n <= 0 {
				if err != nil {
					w.fail(fmt.Errorf("reading a directory: %w", err))
				}
				// Done with this directory: back to its parent.
				done := levels[len(levels)-1]
				levels = levels[:len(levels)-1]
				if len(levels) > 0 && len(levels)-1 < firstOpen && len(levels)-1 > 0 {
					if !w.reopen(&levels[len(levels)-1], len(levels)-1, done.fd) {
						unix.Close(done.fd)
						w.free = append(w.free, done.buf)
						w.moved = true
						w.fail(ErrMoved)
						return
					}
					firstOpen--
				}
				unix.Close(done.fd)
				w.free = append(w.free, done.buf)
				continue
			}
			lv.pos, lv.end = 0, n
		}
		// struct linux_dirent64 { u64 d_ino; s64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
		rec := lv.buf[lv.pos:lv.end]
		if len(rec) < 19 {
			lv.pos = lv.end
			continue
		}
		off := *(*int64)(unsafe.Pointer(&rec[8]))
		reclen := int(*(*uint16)(unsafe.Pointer(&rec[16])))
		if reclen < 20 || reclen > len(rec) {
			lv.pos = lv.end
			continue
		}
		lv.pos += reclen
		lv.cookie = off
		name := rec[19:reclen]
		if name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0)) {
			continue
		}
		// The name is NUL-terminated in place: statx reads it there, nothing is copied.
		if err := statxAt(lv.fd, &name[0], &stx); err != nil {
			if err != unix.ENOENT {
				w.fail(fmt.Errorf("looking at an entry: %w", err))
			}
			continue
		}
		if stx.Mode&unix.S_IFMT != unix.S_IFDIR {
			if stx.Nlink > 1 {
				id := idOf(&stx)
				if _, seen := w.links[id]; seen {
					w.u.LinkNames++
					w.u.LinkBytes += int64(stx.Blocks) * 512
					continue
				}
				if w.links == nil {
					w.links = make(map[fileID]struct{})
				}
				w.links[id] = struct{}{}
			}
			w.count(&stx)
			continue
		}
		id := idOf(&stx)
		if id != rootID && w.roots[id] {
			// Another root, counted on its own.
			continue
		}
		w.count(&stx)
		if haveMnt && stx.Mnt_id != mnt {
			// Another mount's root: counted, not entered.
			continue
		}
		sub, err := openDir(lv.fd, cString(name))
		if err != nil {
			if err != unix.ENOENT && err != unix.ENOTDIR && err != unix.ELOOP {
				w.fail(fmt.Errorf("opening a directory: %w", err))
			}
			continue
		}
		// Who the walk climbs back to is who it opened, not who the name first showed.
		if err := unix.Statx(sub, "", unix.AT_EMPTY_PATH, statxMask, &stx); err != nil || stx.Mode&unix.S_IFMT != unix.S_IFDIR || (haveMnt && stx.Mnt_id != mnt) {
			unix.Close(sub)
			continue
		}
		levels = append(levels, level{fd: sub, id: idOf(&stx), buf: w.buffer()})
		if len(levels)-firstOpen > OpenLevels {
			// Close the shallowest open level; its cookie says where it was.
			c := &levels[firstOpen]
			unix.Close(c.fd)
			c.fd = -1
			w.free = append(w.free, c.buf)
			c.buf, c.pos, c.end = nil, 0, 0
			firstOpen++
		}
	}
}

// beforeReopen, when set (by tests), is called with the depth of a closed level about to
// be opened again.
var beforeReopen func(depth int)

// reopen opens lv, a closed level, as the parent of the directory open at child, checks it
// is the directory it was, and seeks to where its listing stopped.
func (w *walker) reopen(lv *level, depth, child int) bool {
	if beforeReopen != nil {
		beforeReopen(depth)
	}
	fd, err := openDir(child, "..")
	if err != nil {
		return false
	}
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, statxMask, &stx); err != nil || idOf(&stx) != lv.id {
		unix.Close(fd)
		return false
	}
	if _, err := unix.Seek(fd, lv.cookie, 0); err != nil {
		unix.Close(fd)
		return false
	}
	lv.fd, lv.buf, lv.pos, lv.end = fd, w.buffer(), 0, 0
	return true
}

func statxAt(dirfd int, name *byte, stx *unix.Statx_t) error {
	for {
		_, _, errno := unix.Syscall6(unix.SYS_STATX, uintptr(dirfd), uintptr(unsafe.Pointer(name)),
			uintptr(unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT), uintptr(statxMask), uintptr(unsafe.Pointer(stx)), 0)
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return errno
	}
}

// cString is the NUL-terminated name at the start of b.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
