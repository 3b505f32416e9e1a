package artifact

import (
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"slices"

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

// openTree opens the root of a tree to walk. A symlink as the root is refused like any
// other: only the path's last component is checked, the caller names the rest.
func openTree(dir, label string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	// O_DIRECTORY|O_NOFOLLOW refuses a symlink with ENOTDIR; the lstat only words the error.
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR) && isSymlink(dir):
		return nil, fmt.Errorf("%s: a symlink; roost never follows one: %w", label, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.ENOTDIR):
		return nil, fmt.Errorf("%s: not a directory: %w", label, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.ENOENT):
		return nil, fmt.Errorf("%s: %w: %w", label, fs.ErrNotExist, errdefs.ErrInvalidArgument)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	return os.NewFile(uintptr(fd), dir), nil
}

func isSymlink(path string) bool {
	info, err := os.Lstat(path)
	return err == nil && info.Mode()&fs.ModeSymlink != 0
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
