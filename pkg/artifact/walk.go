package artifact

import (
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/manifest"
)

// The walk reads trees roostd, as root, does not own: a program owning one may rename
// anything in it at any moment, a directory swapped for a symlink to /etc included. So no
// path is ever resolved twice: the root is opened once, and each entry is opened beneath
// its parent's descriptor, one component at a time, refusing any symlink on the way; what
// an entry is, is decided by fstat on the descriptor that is then read.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// maxLinks bounds the symlinks followed on the way to a tree, as the kernel bounds its own
// walk (MAXSYMLINKS).
const maxLinks = 40

// openTree opens the root of a tree to walk. The path to it is walked as the kernel would,
// one component at a time beneath the last one's descriptor, with one difference: a symlink
// on the way is followed only when it is root's, in a directory of root's no one else may
// change (or a sticky one, whose entries only their owners may rename); the walker's own uid
// counts as root's, for a roostd run as another user. Any other link is one a user may have
// planted, or swapped in for a directory of the path while roostd reads it, to send root
// into a directory that user cannot read: it is refused. A symlink as the tree itself is
// refused like any other.
func openTree(dir, label string) (*os.File, error) {
	start := "."
	if filepath.IsAbs(dir) {
		start = "/"
	}
	cur, err := unix.Open(start, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: opening %s: %w", label, start, err)
	}
	defer func() { unix.Close(cur) }()
	// at is where cur is, for errors.
	at := start
	rest := components(dir)
	for links := 0; len(rest) > 0; {
		name := rest[0]
		rest = rest[1:]
		next, err := unix.Openat2(cur, name, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		switch {
		case errors.Is(err, unix.ENOENT):
			return nil, fmt.Errorf("%s: %w: %w", label, fs.ErrNotExist, errdefs.ErrInvalidArgument)
		case err != nil:
			return nil, fmt.Errorf("%s: opening %s: %w", label, filepath.Join(at, name), err)
		}
		path := filepath.Join(at, name)
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil {
			unix.Close(next)
			return nil, fmt.Errorf("%s: %s: %w", label, path, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			unix.Close(cur)
			cur, at = next, path
			continue
		}
		target, err := followable(cur, next, &st, at, len(rest) == 0)
		unix.Close(next)
		if err != nil {
			return nil, fmt.Errorf("%s: %s%w", label, path, err)
		}
		if links++; links > maxLinks {
			return nil, fmt.Errorf("%s: more than %d symlinks on the path: %w", label, maxLinks, errdefs.ErrInvalidArgument)
		}
		// A relative link goes on from the directory it is in, cur.
		if filepath.IsAbs(target) {
			root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, fmt.Errorf("%s: opening /: %w", label, err)
			}
			unix.Close(cur)
			cur, at = root, "/"
		}
		rest = append(components(target), rest...)
	}
	fd, err := unix.Openat(cur, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// followable returns the target of the symlink open (O_PATH) at link, in the directory
// open at dir (at, for errors), when a walk to a tree may follow it; its error is worded to
// follow the link's path.
func followable(dir, link int, st *unix.Stat_t, at string, last bool) (string, error) {
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFLNK:
		return "", fmt.Errorf(" is not a directory: %w", errdefs.ErrInvalidArgument)
	case last:
		return "", fmt.Errorf(" is a symlink; roost never follows one as the tree: %w", errdefs.ErrInvalidArgument)
	}
	var parent unix.Stat_t
	if err := unix.Fstat(dir, &parent); err != nil {
		return "", fmt.Errorf(": looking at %s: %w", at, err)
	}
	trusted := func(uid uint32) bool { return uid == 0 || uid == uint32(os.Geteuid()) }
	var why string
	switch {
	case !trusted(st.Uid):
		why = fmt.Sprintf("of uid %d's", st.Uid)
	case !trusted(parent.Uid):
		why = fmt.Sprintf("in %s, a directory of uid %d's", at, parent.Uid)
	case parent.Mode&0o022 != 0 && parent.Mode&unix.S_ISVTX == 0:
		why = fmt.Sprintf("in %s, a directory others may write", at)
	}
	if why != "" {
		return "", fmt.Errorf(", on the path, is a symlink %s: roost follows only root's own links to a tree "+
			"(this one may have been planted, or swapped in for a directory while the tree was read): %w",
			why, errdefs.ErrInvalidArgument)
	}
	target, err := readlinkat(link, "")
	if err != nil {
		return "", fmt.Errorf(": reading the link: %w", err)
	}
	return target, nil
}

// components splits a path into the names a walk takes, "." dropped, ".." kept: it is the
// parent on disk of the directory reached, as the kernel takes it.
func components(path string) []string {
	var out []string
	for _, c := range strings.Split(path, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// tree is what one walk read.
type tree struct {
	digest  string
	entries int   // everything below the root
	files   int   // regular files
	bytes   int64 // their bytes
	// manifest is the top-level capsule.yaml as hashed (at most one byte over
	// manifest.MaxSize, enough for the parser to refuse it), nil when there is none.
	manifest []byte
}

// walker hashes a tree and, when it has a destination, copies it there in the same read.
type walker struct {
	label string // the tree as the caller named it, for errors
	lim   limits
	h     hash.Hash
	t     tree
}

func (w *walker) where(rel string) string {
	if rel == "." {
		return w.label
	}
	return w.label + ": " + rel
}

func (w *walker) invalid(rel, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", w.where(rel), fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

func (w *walker) changed(rel, why string) error {
	return fmt.Errorf("%s: changed while it was read (%s); try again: %w", w.where(rel), why, errdefs.ErrAborted)
}

func (w *walker) failed(rel string, err error) error {
	return fmt.Errorf("%s: %w", w.where(rel), err)
}

// root walks from the tree's root descriptor; dst, when not nil, is an empty directory the
// tree is copied into.
func (w *walker) root(src, dst *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return w.failed(".", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return w.invalid(".", "not a directory")
	}
	if dst != nil {
		if err := unix.Fchmod(int(dst.Fd()), dirMode); err != nil {
			return w.failed(".", err)
		}
	}
	// The same root descriptor serves a hash pass then a copy pass: list it from the start.
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return w.failed(".", err)
	}
	fmt.Fprintf(w.h, "dir %q %o\n", ".", dirMode)
	return w.dir(src, dst, ".", 0)
}

func (w *walker) dir(src, dst *os.File, rel string, depth int) error {
	names, err := w.list(src, rel)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := w.entry(src, dst, rel, name, depth); err != nil {
			return err
		}
	}
	return nil
}

// list reads a directory's names, sorted so that the digest does not depend on the order
// the filesystem keeps them in, and stops as soon as there are more than the bound allows.
func (w *walker) list(src *os.File, rel string) ([]string, error) {
	var names []string
	for {
		batch, err := src.Readdirnames(1024)
		names = append(names, batch...)
		if w.t.entries+len(names) > w.lim.files {
			return nil, w.invalid(rel, "more than %d entries: roost reads at most that many in a tree", w.lim.files)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, w.failed(rel, err)
		}
	}
	slices.Sort(names)
	return names, nil
}

func join(rel, name string) string {
	if rel == "." {
		return name
	}
	return rel + "/" + name
}

func (w *walker) entry(src, dst *os.File, parent, name string, depth int) error {
	rel := join(parent, name)
	w.t.entries++
	var st unix.Stat_t
	if err := unix.Fstatat(int(src.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return w.changed(rel, "gone")
		}
		return w.failed(rel, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return w.symlink(src, dst, rel, name)
	case unix.S_IFDIR, unix.S_IFREG:
		return w.open(src, dst, rel, name, depth)
	}
	return w.special(rel, st.Mode)
}

func (w *walker) special(rel string, mode uint32) error {
	return w.invalid(rel, "a capsule holds only files, directories and symlinks, not %s", typeName(mode))
}

func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "a fifo"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	}
	return fmt.Sprintf("a file of type %#o", mode&unix.S_IFMT)
}

// symlink records a link as a link: its target is read from the parent, never followed.
func (w *walker) symlink(src, dst *os.File, rel, name string) error {
	target, err := readlinkat(int(src.Fd()), name)
	if err != nil {
		switch {
		case errors.Is(err, unix.EINVAL):
			return w.changed(rel, "no longer a symlink")
		case errors.Is(err, unix.ENOENT):
			return w.changed(rel, "gone")
		}
		return w.failed(rel, err)
	}
	fmt.Fprintf(w.h, "symlink %q %q\n", rel, target)
	if dst == nil {
		return nil
	}
	if err := unix.Symlinkat(target, int(dst.Fd()), name); err != nil {
		return w.failed(rel, fmt.Errorf("storing the link: %w", err))
	}
	return nil
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// open opens an entry the listing said is a file or a directory; what it is now is what the
// descriptor's fstat says.
func (w *walker) open(src, dst *os.File, rel, name string, depth int) error {
	// O_NONBLOCK|O_NOCTTY: if the entry was swapped for a fifo or a device meanwhile,
	// opening it must neither hang nor take a terminal; fstat then refuses it.
	fd, err := unix.Openat2(int(src.Fd()), name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY,
		Resolve: beneath,
	})
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%s: a symlink lies on the path; roost never follows one (the tree changed while it was read): %w",
			w.where(rel), errdefs.ErrAborted)
	case errors.Is(err, unix.ENOENT):
		return w.changed(rel, "gone")
	case err != nil:
		return w.failed(rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return w.failed(rel, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return w.subdir(f, dst, rel, name, depth+1)
	case unix.S_IFREG:
		return w.file(f, dst, rel, name, &st)
	}
	return w.special(rel, st.Mode)
}

func (w *walker) subdir(src, dst *os.File, rel, name string, depth int) error {
	if depth > w.lim.depth {
		return w.invalid(rel, "nested more than %d directories deep: roost reads no deeper", w.lim.depth)
	}
	fmt.Fprintf(w.h, "dir %q %o\n", rel, dirMode)
	if dst == nil {
		return w.dir(src, nil, rel, depth)
	}
	sub, err := mkdirAt(dst, name)
	if err != nil {
		return w.failed(rel, fmt.Errorf("storing the directory: %w", err))
	}
	defer sub.Close()
	return w.dir(src, sub, rel, depth)
}

// mkdirAt makes and opens a directory of the copy, which is roostd's alone.
func mkdirAt(parent *os.File, name string) (*os.File, error) {
	if err := unix.Mkdirat(int(parent.Fd()), name, dirMode); err != nil {
		return nil, err
	}
	fd, err := unix.Openat2(int(parent.Fd()), name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: beneath,
	})
	if err != nil {
		return nil, err
	}
	// The mode is part of the digest: the umask must not change it.
	if err := unix.Fchmod(fd, dirMode); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// file hashes a regular file and copies it, from one read of its descriptor, so the copy
// holds exactly the bytes hashed.
func (w *walker) file(src, dst *os.File, rel, name string, st *unix.Stat_t) error {
	size := st.Size
	if w.t.bytes+size > w.lim.bytes {
		return w.invalid(rel, "the tree is larger than %d bytes: roost reads at most that much", w.lim.bytes)
	}
	w.t.files++
	w.t.bytes += size
	mode := fileMode(st.Mode)
	fmt.Fprintf(w.h, "file %q %o %d\n", rel, mode, size)

	sinks := []io.Writer{w.h}
	if rel == manifest.FileName {
		w.t.manifest = []byte{}
		sinks = append(sinks, &capture{buf: &w.t.manifest, max: manifest.MaxSize + 1})
	}
	var out *os.File
	if dst != nil {
		fd, err := unix.Openat(int(dst.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err != nil {
			return w.failed(rel, fmt.Errorf("storing the file: %w", err))
		}
		out = os.NewFile(uintptr(fd), name)
		defer out.Close()
		sinks = append(sinks, out)
	}
	// Exactly the size hashed in the header: a file growing under the walk is cut where
	// the header says, one shrinking is a change.
	n, err := io.Copy(io.MultiWriter(sinks...), io.LimitReader(src, size))
	if err != nil {
		return w.failed(rel, err)
	}
	if n != size {
		return w.changed(rel, fmt.Sprintf("%d bytes read of %d", n, size))
	}
	if out == nil {
		return nil
	}
	if err := out.Chmod(fs.FileMode(mode)); err != nil {
		return w.failed(rel, err)
	}
	if err := out.Close(); err != nil {
		return w.failed(rel, err)
	}
	return nil
}

// capture keeps the first max bytes written to it.
type capture struct {
	buf *[]byte
	max int
}

func (c *capture) Write(p []byte) (int, error) {
	if room := c.max - len(*c.buf); room > 0 {
		*c.buf = append(*c.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}
