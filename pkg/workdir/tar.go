package workdir

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// ChunkBytes is the most one read of a file, or one piece of an archive, carries: what a
// stream's message holds, well within roostd's send and receive bounds.
const ChunkBytes = 256 << 10

// WriteTar writes a tar archive of rel beneath root to w: a directory's tree (names
// relative to it, its own entry left out), or one regular file or symlink (named by its
// base name). The walk is by descriptors, each directory opened beneath its parent with no
// symlink followed, so a tree changed under it (a directory swapped for a link) has
// nothing outside read: what moved is skipped. Directories, regular files and symlinks
// are archived, anything else skipped. A file is archived at its size when it was opened,
// a sparse one with its holes as zeros; one that shrinks meanwhile is padded with zeros.
//
// lim bounds the archive: its file data (apparent sizes) by Bytes, its entries by Inodes,
// and it stops with a ResourceExhausted error at the entry that would pass either. It
// holds at most OpenLevels directories open, refusing a tree deeper than that.
func WriteTar(w io.Writer, root, rel string, lim Limits) error {
	r, err := openRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	fd, st, err := openPath(int(r.Fd()), rel)
	if err != nil {
		return fileErr(rel, err)
	}
	unix.Close(fd)
	t := &tarrer{tw: tar.NewWriter(w), lim: lim, buf: make([]byte, ChunkBytes)}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		dfd, err := unix.Openat2(int(r.Fd()), rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: uint64(beneath)})
		if err != nil {
			return fileErr(rel, err)
		}
		dir := os.NewFile(uintptr(dfd), rel)
		err = t.dir(dir, rel, "", 1)
		dir.Close()
		if err != nil {
			return err
		}
	case unix.S_IFREG, unix.S_IFLNK:
		dir, err := openDirBeneath(root, path.Dir(rel))
		if err != nil {
			return err
		}
		err = t.entry(int(dir.Fd()), rel, path.Base(rel), 1)
		dir.Close()
		if err != nil {
			return err
		}
	default:
		return notRegular(rel, st.Mode)
	}
	return t.tw.Close()
}

type tarrer struct {
	tw    *tar.Writer
	lim   Limits
	bytes int64
	n     int64
	buf   []byte
}

// take counts an entry and its data, refusing what would pass the archive's bounds.
func (t *tarrer) take(rel string, size int64) error {
	if t.lim.Inodes > 0 && t.n+1 > t.lim.Inodes {
		return fmt.Errorf("%s: the archive would hold more than %d entries, resources.workdir_max_inodes: %w", rel, t.lim.Inodes, errdefs.ErrResourceExhausted)
	}
	if t.lim.Bytes > 0 && t.bytes+size > t.lim.Bytes {
		return fmt.Errorf("%s: the archive would carry more than %d bytes of file data, resources.workdir_max_bytes (a sparse file counts at its full size): %w", rel, t.lim.Bytes, errdefs.ErrResourceExhausted)
	}
	t.n++
	t.bytes += size
	return nil
}

// dir archives what the directory open at dir holds; rel names it for errors, name in the
// archive ("" for the archive's top).
func (t *tarrer) dir(dir *os.File, rel, name string, depth int) error {
	for {
		entries, err := dir.ReadDir(1024)
		for _, e := range entries {
			if err := t.entry(int(dir.Fd()), path.Join(rel, e.Name()), path.Join(name, e.Name()), depth); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(entries) == 0) {
			return nil
		}
		if err != nil {
			return fileErr(rel, err)
		}
	}
}

// entry archives the entry base(rel) of the directory at dirfd under name.
func (t *tarrer) entry(dirfd int, rel, name string, depth int) error {
	base := path.Base(rel)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		// Gone since it was listed.
		return nil
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if depth >= OpenLevels {
			return fmt.Errorf("%s: more than %d levels deep; roost archives no deeper: %w", rel, OpenLevels, errdefs.ErrResourceExhausted)
		}
		fd, err := unix.Openat2(dirfd, base, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: uint64(beneath)})
		if err != nil {
			// Swapped for a link, or gone, since it was looked at: nothing to archive.
			return nil
		}
		sub := os.NewFile(uintptr(fd), rel)
		defer sub.Close()
		if err := unix.Fstat(fd, &st); err != nil {
			return fileErr(rel, err)
		}
		if err := t.take(rel, 0); err != nil {
			return err
		}
		if err := t.tw.WriteHeader(header(&st, tar.TypeDir, name+"/", "")); err != nil {
			return err
		}
		return t.dir(sub, rel, name, depth+1)
	case unix.S_IFLNK:
		target, err := readlinkAt(dirfd, base)
		if err != nil {
			return nil
		}
		if err := t.take(rel, 0); err != nil {
			return err
		}
		return t.tw.WriteHeader(header(&st, tar.TypeSymlink, name, target))
	case unix.S_IFREG:
		f, st, err := openRegular(dirfd, base)
		if err != nil {
			// Swapped for something else since it was looked at.
			return nil
		}
		defer f.Close()
		if err := t.take(rel, st.Size); err != nil {
			return err
		}
		if err := t.tw.WriteHeader(header(&st, tar.TypeReg, name, "")); err != nil {
			return err
		}
		_, err = io.CopyBuffer(t.tw, io.LimitReader(io.MultiReader(f, zeros{}), st.Size), t.buf)
		return err
	}
	return nil
}

func header(st *unix.Stat_t, typ byte, name, link string) *tar.Header {
	h := &tar.Header{
		Typeflag: typ, Name: name, Linkname: link,
		Mode: int64(st.Mode & 0o7777),
		Uid:  int(st.Uid), Gid: int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()),
		Format:  tar.FormatPAX,
	}
	if typ == tar.TypeReg {
		h.Size = st.Size
	}
	return h
}

// zeros pads a file that shrank while it was archived.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// Unpacked is what ReadTar made.
type Unpacked struct {
	Directories, Files, Symlinks, Bytes int64
	// Skipped are the entries left out, "name: why", at most MaxSkipped; SkippedCount
	// counts them all.
	Skipped      []string
	SkippedCount int64
}

// MaxSkipped bounds the skipped entries Unpacked names.
const MaxSkipped = 100

// ReadTar unpacks the tar archive r into the directory rel beneath root, made when
// missing, everything owned by owner (nil: root's) and charged to b. Directories,
// regular files and symlinks are made (a symlink's target is kept as written: it is a
// link's text, never followed); an existing file or link is replaced, an existing
// directory kept. Hard links, devices, FIFOs and sockets are skipped. An entry named
// absolute or climbing out with ".." is refused (InvalidArgument), as is one reached
// through a symlink; the entries before it stay. Modes keep their 0777 bits only.
func ReadTar(r io.Reader, root, rel string, owner *Owner, b *Budget) (Unpacked, error) {
	var out Unpacked
	top, err := openRoot(root)
	if err != nil {
		return out, err
	}
	defer top.Close()
	dfd, err := mkdirs(int(top.Fd()), rel, 0o755, owner, b)
	if err != nil {
		return out, err
	}
	dest := os.NewFile(uintptr(dfd), rel)
	defer dest.Close()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("the archive: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		name, err := CleanRel(h.Name)
		if err != nil {
			return out, fmt.Errorf("archive entry %q: %w", h.Name, err)
		}
		where := path.Join(rel, name)
		skip := func(why string) {
			out.SkippedCount++
			if len(out.Skipped) < MaxSkipped {
				out.Skipped = append(out.Skipped, h.Name+": "+why)
			}
		}
		if name == "." {
			continue
		}
		mode := uint32(h.Mode) & 0o777
		switch h.Typeflag {
		case tar.TypeDir:
			fd, err := mkdirs(dfd, name, mode|0o700, owner, b)
			if err != nil {
				return out, err
			}
			unix.Close(fd)
			out.Directories++
		case tar.TypeReg, tar.TypeGNUSparse:
			n, err := unpackFile(dfd, tr, name, where, mode, owner, b)
			if err != nil {
				return out, err
			}
			out.Files++
			out.Bytes += n
		case tar.TypeSymlink:
			if err := unpackLink(dfd, name, where, h.Linkname, owner, b); err != nil {
				return out, err
			}
			out.Symlinks++
		case tar.TypeLink:
			skip("a hard link; roost makes none in a workdir")
		case tar.TypeChar, tar.TypeBlock:
			skip("a device node; roost makes none in a workdir")
		case tar.TypeFifo:
			skip("a FIFO; roost makes none in a workdir")
		default:
			skip(fmt.Sprintf("tar type %q; roost makes only directories, files and symlinks", h.Typeflag))
		}
	}
}

// parentOf makes (when missing) and opens the directory an archive entry goes in.
func parentOf(dfd int, name string, owner *Owner, b *Budget) (*os.File, error) {
	fd, err := mkdirs(dfd, path.Dir(name), 0o755, owner, b)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path.Dir(name)), nil
}

func unpackFile(dfd int, r io.Reader, name, where string, mode uint32, owner *Owner, b *Budget) (int64, error) {
	dir, err := parentOf(dfd, name, owner, b)
	if err != nil {
		return 0, err
	}
	nf, err := createIn(dir, path.Base(name), where, mode, false, owner, b)
	if err != nil {
		dir.Close()
		return 0, err
	}
	n, err := io.CopyBuffer(nf, r, make([]byte, ChunkBytes))
	if err != nil {
		nf.Abort()
		return 0, fmt.Errorf("%s: %w", where, err)
	}
	if _, err := nf.Commit(); err != nil {
		return 0, err
	}
	return n, nil
}

func unpackLink(dfd int, name, where, target string, owner *Owner, b *Budget) error {
	dir, err := parentOf(dfd, name, owner, b)
	if err != nil {
		return err
	}
	defer dir.Close()
	if err := b.take(where, blockBytes, 1); err != nil {
		return err
	}
	tmp := tempName(".roost-link-")
	if err := unix.Symlinkat(target, int(dir.Fd()), tmp); err != nil {
		return fileErr(where, err)
	}
	if owner != nil {
		if err := unix.Fchownat(int(dir.Fd()), tmp, owner.UID, groupFor(int(dir.Fd()), *owner), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			_ = unix.Unlinkat(int(dir.Fd()), tmp, 0)
			return fileErr(where, err)
		}
	}
	if err := unix.Renameat(int(dir.Fd()), tmp, int(dir.Fd()), path.Base(name)); err != nil {
		_ = unix.Unlinkat(int(dir.Fd()), tmp, 0)
		return fileErr(where, err)
	}
	return nil
}
