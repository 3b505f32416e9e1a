package sysview

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Builder builds the views of closures in a directory, one per digest: <dir>/<digest>, laid
// out like the host's root restricted to the closure. Each view is built once, by whichever
// goroutine or process asks first, and kept until Prune removes it.
type Builder struct {
	dir string

	mu      sync.Mutex
	flights map[string]*flight

	// hook, when set (by tests), is called as a build starts ("build", holding the
	// digest's lock) and once its view is in place ("built").
	hook func(stage, digest string)
}

type flight struct {
	done chan struct{}
	err  error
}

// NewBuilder returns a Builder keeping its views in dir, which it creates (0755: sessions
// reach their views through it) if need be.
func NewBuilder(dir string) *Builder {
	return &Builder{dir: dir, flights: map[string]*flight{}}
}

// Names in the builder's directory besides the views: the lock Prune takes exclusive and
// builds take shared, each digest's build lock, and views being built.
const (
	pruneLock = ".lock"
	tmpPrefix = ".tmp-"
)

// ErrReplaced is a file of a closure the host has replaced since it was resolved: resolve
// again.
var ErrReplaced = errors.New("replaced on the host since it was resolved")

func digestLock(digest string) string { return "." + digest + ".lock" }

func validDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// View returns the directory holding c's view, building it if no process has yet:
//
//   - each of c.Files at its path, a hard link to the host's file (the same inode: no
//     copy, and the host's owner and mode); where the builder's directory is on another
//     filesystem, a reflink or else a copy, with the file's owner, mode and times;
//   - each of c.Links in the system trees as a symlink, save the host's top-level
//     merged-/usr links (/bin -> usr/bin, /lib64 -> usr/lib64, …): the session's root
//     has its own, and the view holds what they lead to under usr/;
//   - an empty directory at each of c.Trees, for the host's tree to be mounted on;
//   - every other directory 0755.
//
// A view is built in a temporary directory and renamed into place, so a view under its
// digest's name is complete; asking for it again costs a stat. The view is the closure's
// as it was resolved: a file replaced on the host since is an error (resolve again).
func (b *Builder) View(c *Closure) (string, error) {
	if !validDigest(c.Digest) {
		return "", fmt.Errorf("view: closure digest %q is no sha256", c.Digest)
	}
	final := filepath.Join(b.dir, c.Digest)
	if fi, err := os.Lstat(final); err == nil && fi.IsDir() {
		return final, nil
	}
	b.mu.Lock()
	if f, ok := b.flights[c.Digest]; ok {
		b.mu.Unlock()
		<-f.done
		return final, f.err
	}
	f := &flight{done: make(chan struct{})}
	b.flights[c.Digest] = f
	b.mu.Unlock()

	f.err = b.build(c, final)
	b.mu.Lock()
	delete(b.flights, c.Digest)
	b.mu.Unlock()
	close(f.done)
	if f.err != nil {
		return "", f.err
	}
	return final, nil
}

func (b *Builder) build(c *Closure, final string) error {
	if _, err := os.Stat(b.dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(b.dir, 0o755); err != nil {
			return fmt.Errorf("view: %w", err)
		}
		// Whatever the umask: sessions' mounts of their views go through it.
		if err := os.Chmod(b.dir, 0o755); err != nil {
			return fmt.Errorf("view: %w", err)
		}
	}
	// Shared: builds of different digests go on together; Prune waits for them all.
	unlock, err := lockFile(filepath.Join(b.dir, pruneLock), unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer unlock()
	unlockDigest, err := lockFile(filepath.Join(b.dir, digestLock(c.Digest)), unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlockDigest()
	if fi, err := os.Lstat(final); err == nil && fi.IsDir() {
		// Another process built it while this one waited.
		return nil
	}
	if b.hook != nil {
		b.hook("build", c.Digest)
	}
	tmp, err := os.MkdirTemp(b.dir, tmpPrefix+c.Digest[:16]+"-")
	if err != nil {
		return fmt.Errorf("view: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = removeTree(b.dir, filepath.Base(tmp))
		}
	}()
	if err := populate(c, tmp); err != nil {
		return fmt.Errorf("view %s: %w", c.Digest, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("view: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("view: %w", err)
	}
	done = true
	if b.hook != nil {
		b.hook("built", c.Digest)
	}
	return nil
}

// lockFile takes a flock on the file at p, made if need be; flock's locks are per open
// file, so goroutines exclude each other as processes do.
func lockFile(p string, how int) (func(), error) {
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("view: lock %s: %w", p, err)
	}
	for {
		err = unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("view: lock %s: %w", p, err)
	}
	return func() { unix.Close(fd) }, nil
}

// mergedUsrLink says whether l -> target is one of a merged-/usr host's top-level links
// (/bin -> usr/bin), which a session's root has of its own.
func mergedUsrLink(l, target string) bool {
	name := strings.TrimPrefix(l, "/")
	if name == "" || strings.Contains(name, "/") {
		return false
	}
	t := strings.TrimSuffix(strings.TrimPrefix(target, "/"), "/")
	return t == "usr/"+name
}

func populate(c *Closure, tmp string) error {
	trees := slices.Clone(c.Trees)
	slices.Sort(trees)
	inTree := func(p string) bool {
		for _, t := range trees {
			if beneath(p, t) {
				return true
			}
		}
		return false
	}
	root := c.Root
	if root == "/" {
		root = ""
	}
	mk := dirMaker{root: tmp, made: map[string]bool{"/": true}}
	for _, t := range trees {
		if err := mk.all(t); err != nil {
			return err
		}
	}
	for _, t := range c.Linked {
		if err := linkTree(root+t, tmp+t, &mk, t); err != nil {
			return fmt.Errorf("%s: %w", t, err)
		}
	}
	for _, f := range c.Files {
		if inTree(f) {
			continue
		}
		if err := mk.all(path.Dir(f)); err != nil {
			return err
		}
		id, known := c.ids[f]
		if err := place(root+f, tmp+f, id, known); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	for l, target := range c.Links {
		if !System(l) || mergedUsrLink(l, target) || inTree(l) {
			continue
		}
		if err := mk.all(path.Dir(l)); err != nil {
			return err
		}
		if err := os.Symlink(target, tmp+l); err != nil {
			return err
		}
	}
	return nil
}

// linkTree puts the host's tree src (at dir in the view) into the view at dst: its
// directories made, its files linked (or copied, as place does), its symlinks as they
// read. Anything else (a socket, a device) is left out.
func linkTree(src, dst string, mk *dirMaker, dir string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		s, d, v := src+"/"+e.Name(), dst+"/"+e.Name(), dir+"/"+e.Name()
		switch t := e.Type(); {
		case t.IsDir():
			if err := mk.all(v); err != nil {
				return err
			}
			if err := linkTree(s, d, mk, v); err != nil {
				return err
			}
		case t.IsRegular():
			if err := place(s, d, fileID{}, false); err != nil {
				return fmt.Errorf("%s: %w", v, err)
			}
		case t&os.ModeSymlink != 0:
			target, err := os.Readlink(s)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, d); err != nil {
				return err
			}
		}
	}
	return nil
}

// dirMaker makes a view's directories, each 0755 whatever the umask.
type dirMaker struct {
	root string
	made map[string]bool
}

func (m *dirMaker) all(dir string) error {
	if m.made[dir] {
		return nil
	}
	if err := m.all(path.Dir(dir)); err != nil {
		return err
	}
	p := m.root + dir
	if err := unix.Mkdir(p, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return &os.PathError{Op: "mkdir", Path: p, Err: err}
	}
	if err := unix.Chmod(p, 0o755); err != nil {
		return &os.PathError{Op: "chmod", Path: p, Err: err}
	}
	m.made[dir] = true
	return nil
}

// place puts the host's file src at dst: a hard link, or where that cannot be (another
// filesystem; the inode's link count at its limit) a clone or a copy.
func place(src, dst string, id fileID, known bool) error {
	err := unix.Link(src, dst)
	if err == nil {
		if !known {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(dst, &st); err != nil {
			return err
		}
		if got := idOf(&st); got.dev != id.dev || got.ino != id.ino {
			return ErrReplaced
		}
		return nil
	}
	if !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.EMLINK) {
		return &os.LinkError{Op: "link", Old: src, New: dst, Err: err}
	}
	return copyFile(src, dst, id, known)
}

func copyFile(src, dst string, id fileID, known bool) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(in.Fd()), &st); err != nil {
		return err
	}
	if known && idOf(&st) != id {
		return errors.New("changed on the host since it was resolved")
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	// A clone shares the blocks, as the link would have shared the inode; without one
	// (another filesystem, or one that cannot), io.Copy's copy_file_range still copies
	// in the kernel.
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) != nil {
		if _, err := io.Copy(out, in); err != nil {
			return err
		}
	}
	// The owner first: chown clears the set-id bits chmod then puts back.
	if err := unix.Fchown(int(out.Fd()), int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Fchmod(int(out.Fd()), st.Mode&0o7777); err != nil {
		return err
	}
	if err := out.Sync(); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chtimes(dst, time.Unix(st.Atim.Unix()), time.Unix(st.Mtim.Unix()))
}

// Prune removes the views keep does not want, and what builds that died left behind. A
// view a session has mounted must be kept: its files would vanish under the session, and
// Prune refuses to go into a directory something is mounted on (a tree bound where the
// host can see it), so as never to remove the host's own files through a view. Prune waits
// for the builds under way, and builds wait for it.
func (b *Builder) Prune(keep func(digest string) bool) (removed []string, err error) {
	if _, err := os.Stat(b.dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	unlock, err := lockFile(filepath.Join(b.dir, pruneLock), unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ents, err := os.ReadDir(b.dir)
	if err != nil {
		return nil, err
	}
	var errs []error
	views := map[string]bool{}
	for _, e := range ents {
		name := e.Name()
		switch {
		case validDigest(name) && e.IsDir():
			if keep(name) {
				views[name] = true
				continue
			}
			if err := removeTree(b.dir, name); err != nil {
				views[name] = true
				errs = append(errs, fmt.Errorf("view %s: %w", name, err))
				continue
			}
			removed = append(removed, name)
		case strings.HasPrefix(name, tmpPrefix) && e.IsDir():
			if err := removeTree(b.dir, name); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	}
	// Each digest's lock goes with its view: no build holds one now.
	for _, e := range ents {
		name := e.Name()
		if d, ok := strings.CutSuffix(strings.TrimPrefix(name, "."), ".lock"); ok && validDigest(d) && !views[d] {
			if err := os.Remove(filepath.Join(b.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// removeTree removes name in dir and all beneath it, never going through a symlink or into
// a mount: a view's tree directories are where the host's trees get bound.
func removeTree(dir, name string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return removeAt(fd, name)
}

func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return &os.PathError{Op: "unlink", Path: name, Err: err}
	}
	fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_NO_XDEV | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH,
	})
	if errors.Is(err, unix.EXDEV) {
		return fmt.Errorf("%s has something mounted on it", name)
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: name, Err: err}
	}
	d := os.NewFile(uintptr(fd), name)
	names, err := d.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil {
				err = fmt.Errorf("%s: %w", name, err)
				break
			}
		}
	}
	d.Close()
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil {
		return &os.PathError{Op: "rmdir", Path: name, Err: err}
	}
	return nil
}
