package workdir

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"unsafe"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// The file operations below serve an operator reaching into a session's workdir, which the
// session may be changing under them to make roostd read or write outside it. Each path is
// resolved beneath the workdir with openat2 (no symlink, no magic link, no climbing out),
// an entry is opened O_PATH and looked at with fstat before anything is read from it (a
// FIFO, socket or device node is never opened for reading or writing, so nothing blocks
// and no driver runs), and what is written goes to a fresh file renamed into place.

// CleanRel checks rel, a path relative to a workdir, and returns it cleaned: "." for the
// workdir itself. An absolute path, or one whose ".." climbs out, is InvalidArgument.
func CleanRel(rel string) (string, error) {
	if strings.HasPrefix(rel, "/") {
		return "", fmt.Errorf("path %q: absolute; paths are relative to the workdir: %w", rel, errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(rel, 0) {
		return "", fmt.Errorf("path %q: holds a NUL byte: %w", rel, errdefs.ErrInvalidArgument)
	}
	clean := path.Clean("./" + rel)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("path %q: climbs out of the workdir: %w", rel, errdefs.ErrInvalidArgument)
	}
	return clean, nil
}

// fileErr says what err means for rel, classed for the API.
func fileErr(rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%s: a symlink lies on the path; roost never follows one in a workdir: %w", rel, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%s: leaves the workdir: %w", rel, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%s: not a directory: %w", rel, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.EISDIR):
		return fmt.Errorf("%s: is a directory: %w", rel, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%s: no such file or directory: %w", rel, errdefs.ErrNotFound)
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%s: already exists: %w", rel, errdefs.ErrAlreadyExists)
	case errors.Is(err, unix.ENOTEMPTY):
		return fmt.Errorf("%s: directory not empty (remove it recursively): %w", rel, errdefs.ErrFailedPrecondition)
	}
	return fmt.Errorf("%s: %w", rel, err)
}

// notRegular refuses an entry of type mode where only a regular file will do.
func notRegular(rel string, mode uint32) error {
	if mode&unix.S_IFMT == unix.S_IFLNK {
		return fmt.Errorf("%s: a symlink; roost never follows one in a workdir: %w", rel, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("%s: %s, not a regular file; roost opens no other kind in a workdir: %w", rel, TypeName(mode), errdefs.ErrInvalidArgument)
}

// TypeName names the kind of entry st_mode says.
func TypeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	}
	return "an entry of unknown type"
}

// openPath opens rel beneath the directory at dirfd as O_PATH, not following a symlink at
// its end either (a symlink there is opened as itself), and fstats it.
func openPath(dirfd int, rel string) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: uint64(beneath)})
	if err != nil {
		return -1, st, err
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, err
	}
	return fd, st, nil
}

// reopen opens for reading the inode an O_PATH descriptor holds, whatever its name now
// names: through /proc/self/fd, which leads to the inode itself, not to a path.
func reopen(pathfd int, flags int) (int, error) {
	for {
		fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pathfd), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// openRegular opens rel beneath dirfd for reading, refusing anything but a regular file
// before it is opened for more than its inode.
func openRegular(dirfd int, rel string) (*os.File, unix.Stat_t, error) {
	pfd, st, err := openPath(dirfd, rel)
	if err != nil {
		return nil, st, fileErr(rel, err)
	}
	defer unix.Close(pfd)
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, st, notRegular(rel, st.Mode)
	}
	fd, err := reopen(pfd, unix.O_RDONLY)
	if err != nil {
		return nil, st, fileErr(rel, err)
	}
	return os.NewFile(uintptr(fd), rel), st, nil
}

// Entry is what lstat says of one entry, with a symlink's target.
type Entry struct {
	Name string
	Stat unix.Stat_t
	Link string
}

// OpenRegular opens rel beneath root for reading: a regular file only, reached through no
// symlink.
func OpenRegular(root, rel string) (*os.File, unix.Stat_t, error) {
	r, err := openRoot(root)
	if err != nil {
		return nil, unix.Stat_t{}, err
	}
	defer r.Close()
	return openRegular(int(r.Fd()), rel)
}

// Lstat describes rel beneath root, a symlink as itself.
func Lstat(root, rel string) (Entry, error) {
	r, err := openRoot(root)
	if err != nil {
		return Entry{}, err
	}
	defer r.Close()
	fd, st, err := openPath(int(r.Fd()), rel)
	if err != nil {
		return Entry{}, fileErr(rel, err)
	}
	defer unix.Close(fd)
	e := Entry{Name: path.Base(rel), Stat: st}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		if e.Link, err = readlinkAt(fd, ""); err != nil {
			return Entry{}, fileErr(rel, err)
		}
	}
	return e, nil
}

func readlinkAt(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// MaxPage is the most entries one ReadDir returns.
const MaxPage = 1000

// ReadDir lists up to n entries (at most MaxPage) of the directory rel beneath root, in
// the directory's own order, starting at cookie (0 for the first) and returns the cookie
// the next page starts at, 0 when none is left. Memory is bounded by n, whatever the
// directory holds.
func ReadDir(root, rel string, cookie int64, n int) ([]Entry, int64, error) {
	if n <= 0 || n > MaxPage {
		n = MaxPage
	}
	r, err := openRoot(root)
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	fd, err := unix.Openat2(int(r.Fd()), rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: uint64(beneath)})
	if err != nil {
		return nil, 0, dirErr(int(r.Fd()), rel, rel, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Seek(fd, cookie, io.SeekStart); err != nil {
		return nil, 0, fmt.Errorf("%s: page token: %v: %w", rel, err, errdefs.ErrInvalidArgument)
	}
	var out []Entry
	var last int64
	buf := make([]byte, direntBuf)
	for {
		k, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, 0, fileErr(rel, err)
		}
		if k == 0 {
			return out, 0, nil
		}
		for b := buf[:k]; len(b) > 0; {
			d := (*unix.Dirent)(unsafe.Pointer(&b[0]))
			rec := b[:d.Reclen]
			b = b[d.Reclen:]
			name := direntName(rec)
			if name == "." || name == ".." {
				last = d.Off
				continue
			}
			if len(out) == n {
				// One more is there: the next page starts after the last one returned.
				return out, last, nil
			}
			last = d.Off
			e := Entry{Name: name}
			if err := unix.Fstatat(fd, name, &e.Stat, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				// Gone since it was listed.
				continue
			}
			if e.Stat.Mode&unix.S_IFMT == unix.S_IFLNK {
				e.Link, _ = readlinkAt(fd, name)
			}
			out = append(out, e)
		}
	}
}

// direntName is the name in one dirent64 record.
func direntName(rec []byte) string {
	name := rec[unsafe.Offsetof(unix.Dirent{}.Name):]
	for i, c := range name {
		if c == 0 {
			return string(name[:i])
		}
	}
	return string(name)
}

// openDirBeneath opens the directory rel beneath root (O_PATH), its errors classed.
func openDirBeneath(root, rel string) (*os.File, error) {
	r, err := openRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	fd, err := unix.Openat2(int(r.Fd()), rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: uint64(beneath)})
	if err != nil {
		return nil, dirErr(int(r.Fd()), rel, rel, err)
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// dirErr is fileErr for a directory that would not open at name beneath dirfd: a symlink
// there fails O_DIRECTORY|O_NOFOLLOW as ENOTDIR, and is said to be a symlink.
func dirErr(dirfd int, name, rel string, err error) error {
	if errors.Is(err, unix.ENOTDIR) {
		if fd, st, perr := openPath(dirfd, name); perr == nil {
			unix.Close(fd)
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = unix.ELOOP
			}
		} else {
			err = perr
		}
	}
	return fileErr(rel, err)
}

// splitRel is rel's directory and base name; rel must not be ".".
func splitRel(rel string) (string, string) {
	return path.Dir(rel), path.Base(rel)
}

// Remove removes rel beneath root: a file, symlink or special file as itself, a directory
// when it is empty or recursive is set. The workdir itself is not removed.
func Remove(root, rel string, recursive bool) error {
	if rel == "." {
		return fmt.Errorf("path %q: the workdir itself; roost removes only what is in it: %w", rel, errdefs.ErrInvalidArgument)
	}
	dirRel, name := splitRel(rel)
	dir, err := openDirBeneath(root, dirRel)
	if err != nil {
		return err
	}
	defer dir.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fileErr(rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(int(dir.Fd()), name, 0); err != nil {
			return fileErr(rel, err)
		}
		return nil
	}
	if !recursive {
		if err := unix.Unlinkat(int(dir.Fd()), name, unix.AT_REMOVEDIR); err != nil {
			return fileErr(rel, err)
		}
		return nil
	}
	// Through the parent's descriptor, which names the directory itself: RemoveAll opens
	// its top O_NOFOLLOW and walks by descriptors, so a swap of the name for a link only
	// has the link removed.
	return RemoveAll(fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), name))
}

// BudgetError is a write refused before it took the session past one of its bounds.
type BudgetError struct {
	Rel string
	// Inodes: the bound is resources.workdir_max_inodes, not bytes.
	Inodes bool
	// Used is what the session held with what the write had taken, More what it was about
	// to take, Limit the bound.
	Used, More, Limit int64
}

func (e *BudgetError) Error() string {
	if e.Inodes {
		return fmt.Sprintf("%s: the session's trees hold %d files and directories, the most resources.workdir_max_inodes (%d) allows", e.Rel, e.Used, e.Limit)
	}
	return fmt.Sprintf("%s: the session's trees hold %d bytes; %d more would pass resources.workdir_max_bytes (%d)", e.Rel, e.Used, e.More, e.Limit)
}

func (e *BudgetError) Unwrap() error { return errdefs.ErrResourceExhausted }

// Budget is what writes may add to a session's trees: Limit its bounds (0 is none), Used
// what it holds, as Measure counts, and what the writes took since.
type Budget struct {
	Limit Limits
	Used  Usage
}

// take counts bytes and inodes about to be allocated, refusing them when they would pass
// a bound. A nil Budget bounds nothing.
func (b *Budget) take(rel string, bytes, inodes int64) error {
	if b == nil {
		return nil
	}
	if b.Limit.Bytes > 0 && b.Used.Bytes+bytes > b.Limit.Bytes {
		return &BudgetError{Rel: rel, Used: b.Used.Bytes, More: bytes, Limit: b.Limit.Bytes}
	}
	if b.Limit.Inodes > 0 && b.Used.Inodes+inodes > b.Limit.Inodes {
		return &BudgetError{Rel: rel, Inodes: true, Used: b.Used.Inodes, More: inodes, Limit: b.Limit.Inodes}
	}
	b.Used.Bytes += bytes
	b.Used.Inodes += inodes
	return nil
}

// blockBytes is what a new directory or link is charged: one block.
const blockBytes = 4096

// groupFor is the group a new entry in the directory at dirfd gets: the directory's own
// when it is setgid (as the kernel would give it), the owner's otherwise.
func groupFor(dirfd int, owner Owner) int {
	var st unix.Stat_t
	if err := unix.Fstat(dirfd, &st); err == nil && st.Mode&unix.S_ISGID != 0 {
		return int(st.Gid)
	}
	return owner.GID
}

// MakeDirs makes rel beneath root with perm, owned by owner (nil: left root's), charged to
// b. With parents the missing directories above it are made too and an existing directory
// is no error; without, its parent must exist and it must not.
func MakeDirs(root, rel string, perm uint32, parents bool, owner *Owner, b *Budget) error {
	if !parents {
		if rel == "." {
			return fileErr(rel, unix.EEXIST)
		}
		dirRel, name := splitRel(rel)
		dir, err := openDirBeneath(root, dirRel)
		if err != nil {
			return err
		}
		defer dir.Close()
		d, err := mkdirAt(int(dir.Fd()), name, rel, perm, owner, b, false)
		if err != nil {
			return err
		}
		unix.Close(d)
		return nil
	}
	r, err := openRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	d, err := mkdirs(int(r.Fd()), rel, perm, owner, b)
	if err != nil {
		return err
	}
	unix.Close(d)
	return nil
}

// mkdirs makes each missing component of rel beneath the directory at dirfd, and returns
// the last one opened.
func mkdirs(dirfd int, rel string, perm uint32, owner *Owner, b *Budget) (int, error) {
	cur, err := unix.Dup(dirfd)
	if err != nil {
		return -1, err
	}
	if rel == "." {
		return cur, nil
	}
	for _, part := range strings.Split(rel, "/") {
		next, err := mkdirAt(cur, part, rel, perm, owner, b, true)
		unix.Close(cur)
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// mkdirAt makes name in the directory at dirfd and returns it opened; with existing
// a directory already there is opened instead.
func mkdirAt(dirfd int, name, rel string, perm uint32, owner *Owner, b *Budget, existing bool) (int, error) {
	open := func() (int, error) {
		return unix.Openat2(dirfd, name, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: uint64(beneath)})
	}
	if existing {
		if fd, err := open(); err == nil {
			return fd, nil
		} else if !errors.Is(err, unix.ENOENT) {
			return -1, dirErr(dirfd, name, rel, err)
		}
	}
	if err := b.take(rel, blockBytes, 1); err != nil {
		return -1, err
	}
	if err := unix.Mkdirat(dirfd, name, 0o700); err != nil && !(existing && errors.Is(err, unix.EEXIST)) {
		return -1, fileErr(rel, err)
	}
	fd, err := open()
	if err != nil {
		return -1, dirErr(dirfd, name, rel, err)
	}
	// On the descriptor just opened, never by name: the directory is the one made.
	if owner != nil {
		if err := unix.Fchown(fd, owner.UID, groupFor(dirfd, *owner)); err != nil {
			unix.Close(fd)
			return -1, fileErr(rel, err)
		}
	}
	if err := unix.Fchmod(fd, perm&0o777); err != nil {
		unix.Close(fd)
		return -1, fileErr(rel, err)
	}
	return fd, nil
}

// NewFile is a file being written: its data go to a temporary file beside rel, put in
// place by Commit, thrown away by Abort.
type NewFile struct {
	dir        *os.File
	f          *os.File
	tmp, name  string
	rel        string
	perm       uint32
	createOnly bool
	budget     *Budget
	written    int64
}

// CreateFile starts writing rel beneath root: a regular file of mode perm (0777 bits),
// owned by owner (nil: root's), charged to b. A symlink or directory at rel is refused
// now; with createOnly, so is anything at rel, and again when the file is put in place.
func CreateFile(root, rel string, perm uint32, createOnly bool, owner *Owner, b *Budget) (*NewFile, error) {
	if rel == "." {
		return nil, fmt.Errorf("path %q: the workdir itself, a directory: %w", rel, errdefs.ErrInvalidArgument)
	}
	dirRel, name := splitRel(rel)
	dir, err := openDirBeneath(root, dirRel)
	if err != nil {
		return nil, err
	}
	nf, err := createIn(dir, name, rel, perm, createOnly, owner, b)
	if err != nil {
		dir.Close()
	}
	return nf, err
}

func createIn(dir *os.File, name, rel string, perm uint32, createOnly bool, owner *Owner, b *Budget) (*NewFile, error) {
	var st unix.Stat_t
	switch err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && createOnly:
		return nil, fileErr(rel, unix.EEXIST)
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return nil, fmt.Errorf("%s: a symlink; roost never writes through one in a workdir: %w", rel, errdefs.ErrInvalidArgument)
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return nil, fileErr(rel, unix.EISDIR)
	case err != nil && !errors.Is(err, unix.ENOENT):
		return nil, fileErr(rel, err)
	}
	if err := b.take(rel, 0, 1); err != nil {
		return nil, err
	}
	tmp := tempName(".roost-write-")
	fd, err := unix.Openat(int(dir.Fd()), tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fileErr(rel, err)
	}
	nf := &NewFile{dir: dir, f: os.NewFile(uintptr(fd), tmp), tmp: tmp, name: name, rel: rel, perm: perm & 0o777, createOnly: createOnly, budget: b}
	if owner != nil {
		if err := unix.Fchown(fd, owner.UID, groupFor(int(dir.Fd()), *owner)); err != nil {
			nf.Abort()
			return nil, fileErr(rel, err)
		}
	}
	return nf, nil
}

// tempName is a fresh name for what is made beside its target before it is renamed there.
func tempName(prefix string) string {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	return prefix + hex.EncodeToString(rnd[:])
}

// Write appends p, refusing it when it would pass the budget.
func (nf *NewFile) Write(p []byte) (int, error) {
	if err := nf.budget.take(nf.rel, int64(len(p)), 0); err != nil {
		return 0, err
	}
	n, err := nf.f.Write(p)
	nf.written += int64(n)
	return n, err
}

// Commit puts the file in place and returns what it is.
func (nf *NewFile) Commit() (unix.Stat_t, error) {
	var st unix.Stat_t
	fd := int(nf.f.Fd())
	err := unix.Fchmod(fd, nf.perm)
	if err == nil {
		err = nf.f.Sync()
	}
	if err == nil {
		err = unix.Fstat(fd, &st)
	}
	if err == nil && nf.budget != nil {
		// Charged what it allocates, blocks and metadata, in place of the data written.
		nf.budget.Used.Bytes -= nf.written
		err = nf.budget.take(nf.rel, st.Blocks*512, 0)
	}
	if err == nil {
		if nf.createOnly {
			err = unix.Renameat2(int(nf.dir.Fd()), nf.tmp, int(nf.dir.Fd()), nf.name, unix.RENAME_NOREPLACE)
		} else {
			err = unix.Renameat(int(nf.dir.Fd()), nf.tmp, int(nf.dir.Fd()), nf.name)
		}
		if err != nil {
			err = fileErr(nf.rel, err)
		}
	}
	if err != nil {
		nf.Abort()
		return st, err
	}
	nf.f.Close()
	nf.dir.Close()
	return st, nil
}

// Abort throws the file away.
func (nf *NewFile) Abort() {
	nf.f.Close()
	_ = unix.Unlinkat(int(nf.dir.Fd()), nf.tmp, 0)
	nf.dir.Close()
}
