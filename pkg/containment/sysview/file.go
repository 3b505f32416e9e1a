package sysview

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

type fileKind int

const (
	kindOther fileKind = iota
	kindScript
	kindELF
)

// fileInfo is what a file is to exec and to the loader. Once made it is not changed: a
// Cache hands the same one to every Resolve.
type fileInfo struct {
	id   fileID
	kind fileKind
	// interp and arg are a script's #! interpreter and its argument.
	interp, arg string
	elf         *elfObject
}

// scriptHead is as much of a script as the kernel reads for its #! line (BINPRM_BUF_SIZE).
const scriptHead = 256

// inspect reads what the regular file at canon (canonical, already resolved) is, from the
// cache when its identity has not changed.
func (r *resolver) inspect(canon string) (*fileInfo, error) {
	return r.inspectAt(unix.AT_FDCWD, canon, canon)
}

// inspectAt is inspect for the file name in the directory open as dirfd, canon being its
// path: a tree's walk opens each file relative to its directory, sparing the kernel a walk
// of the whole path for each.
func (r *resolver) inspectAt(dirfd int, name, canon string) (*fileInfo, error) {
	if info, ok := r.infos[canon]; ok {
		return info, nil
	}
	if dirfd == unix.AT_FDCWD {
		name = r.root + canon
	}
	if r.cache != nil {
		id, ok := r.nodes[canon].id, true
		if id == (fileID{}) {
			var st unix.Stat_t
			if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return nil, fmt.Errorf("%s: %w", canon, err)
			}
			id, ok = idOf(&st), st.Mode&unix.S_IFMT == unix.S_IFREG
		}
		if info := r.cache.file(r.root+canon, id); ok && info != nil {
			r.infos[canon] = info
			return info, nil
		}
	}
	info, err := readFile(dirfd, name, r.cache != nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", canon, err)
	}
	r.infos[canon] = info
	r.cache.putFile(r.root+canon, info)
	return info, nil
}

// fdReader reads a file through its descriptor: os.File would register each with the
// poller, for two or three reads.
type fdReader int

func (fd fdReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := unix.Pread(int(fd), p, off)
	if n < 0 {
		n = 0
	}
	return n, err
}

// readFile reads the head of the file name in dirfd and, for an ELF file, its program
// headers and dynamic section: a handful of reads, whatever the file's size. withID says
// the file's identity is wanted (for a cache), which costs an fstat more.
func readFile(dirfd int, name string, withID bool) (*fileInfo, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	info := &fileInfo{}
	if withID {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return info, nil
		}
		info.id = idOf(&st)
	}
	var buf [headSize]byte
	n, err := unix.Pread(fd, buf[:], 0)
	if err != nil {
		if errors.Is(err, unix.EISDIR) {
			return info, nil
		}
		return nil, err
	}
	head := buf[:n]
	switch {
	case bytes.HasPrefix(head, []byte("#!")):
		info.kind = kindScript
		info.interp, info.arg = Shebang(head[2:min(n, scriptHead)])
	case isELF(head):
		info.kind = kindELF
		o, err := parseELF(fdReader(fd), head)
		if err != nil {
			o = &elfObject{bad: err.Error()}
		}
		info.elf = o
	}
	return info, nil
}

// Shebang splits a #! line (what follows the #!) as the kernel does: the interpreter runs
// to the first space, tab or NUL; the rest of the line, trimmed, is its one argument.
func Shebang(line []byte) (name, arg string) {
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	spaceTab := func(r rune) bool { return r == ' ' || r == '\t' }
	line = bytes.TrimFunc(line, spaceTab)
	end := bytes.IndexFunc(line, func(r rune) bool { return spaceTab(r) || r == 0 })
	if end < 0 {
		return string(line), ""
	}
	name = string(line[:end])
	if line[end] != 0 {
		arg = string(bytes.TrimFunc(line[end:], spaceTab))
		arg, _, _ = cutNUL(arg)
	}
	return name, arg
}

func cutNUL(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// Cache keeps what Resolve read of files between calls, each entry checked against the
// file's device, inode, size and modification time before it is used: a Resolve that
// finds most files unchanged reads their metadata only. It is safe for concurrent use.
type Cache struct {
	mu    sync.Mutex
	files map[string]*fileInfo
	ld    struct {
		path string
		id   fileID
		c    *ldCache
	}
}

// maxCacheFiles bounds a Cache: past it the cache starts over, which costs one cold Resolve.
const maxCacheFiles = 1 << 17

// NewCache returns an empty Cache.
func NewCache() *Cache { return &Cache{files: map[string]*fileInfo{}} }

func (c *Cache) file(p string, id fileID) *fileInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	if info, ok := c.files[p]; ok && info.id == id {
		return info
	}
	return nil
}

func (c *Cache) putFile(p string, info *fileInfo) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.files) >= maxCacheFiles {
		clear(c.files)
	}
	c.files[p] = info
}

func (c *Cache) ldCache(p string, id fileID) (*ldCache, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ld.c != nil && c.ld.path == p && c.ld.id == id {
		return c.ld.c, true
	}
	return nil, false
}

func (c *Cache) putLdCache(p string, id fileID, lc *ldCache) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ld.path, c.ld.id, c.ld.c = p, id, lc
}
