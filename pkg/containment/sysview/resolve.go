package sysview

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultPath is where a #!/usr/bin/env script's program is looked up unless Options.Path
// says otherwise: the PATH a session gets by default.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Want is what a session's allowlist asks of the system trees.
type Want struct {
	// Files may execute: absolute host paths, which may be symlinks and may be scripts.
	Files []string
	// ExecTrees are directories whose every file may execute (git's exec-path, gcc's
	// libexec directory, GOTOOLDIR): each file in them is followed as if it were in Files.
	ExecTrees []string
	// ReadTrees are directories a preset needs readable (python's stdlib, node's modules,
	// GOROOT): the ELF files in them (extension modules) are followed for the libraries
	// they need.
	ReadTrees []string
}

// Options say how Resolve looks at the host.
type Options struct {
	// Root is the directory taken as the host's root: every path is looked up beneath it,
	// symlinks included, as in a chroot. "" is "/".
	Root string
	// Path is where the program of a #!/usr/bin/env script is looked up ("" is DefaultPath).
	Path string
	// DataTrees replace DataTrees() when not nil.
	DataTrees []string
	// Cache, when set, keeps what Resolve read of each file between calls.
	Cache *Cache
}

// Closure is what of the host's system trees a session sees.
//
// Paths are host paths, canonical (free of symlinks) unless said otherwise. Only paths in
// the system trees (System) are in Files and Trees: a file elsewhere (a capsule's script,
// a program under /root) is followed for its interpreter and libraries all the same, and
// listed in Outside, for whoever places it in the session.
type Closure struct {
	// Root is Options.Root: where the paths below are on the host.
	Root string
	// Files are the regular files needed, sorted; none lies in a Tree.
	Files []string
	// Links are the symlinks met on the way, each at its own path (its parent directory
	// canonical: /lib64 and /usr/lib64/ld-linux-x86-64.so.2, never
	// /lib64/ld-linux-x86-64.so.2) to its target as readlink reads it. Links in a Tree are
	// left out: the tree's mount shows them. Links outside the system trees (Debian's
	// /etc/alternatives/cc, which /usr/bin/cc leads through) are listed, but a view does
	// not hold them: the session's /etc must.
	Links map[string]string
	// Trees are directories included whole, sorted, none inside another: the exec and read
	// trees, glibc's gconv modules and the data trees present on this host.
	Trees []string
	// Linked are the Trees no Want named (the data trees, gconv): small, read by every
	// program and rarely changed, a view holds their files itself (links, as Files), so a
	// session's root mounts only the trees its allowlist asked for. Their contents are as
	// they were when the view was built; the digest covers only their roots.
	Linked []string
	// Outside are the files and trees the closure reaches outside the system trees, sorted.
	Outside []string
	// Missing are what a file asks for and this host does not have, as "what (why)": a
	// library no search finds ("libfoo.so.1 (needed by /usr/bin/foo)"), a script's absent
	// interpreter. The loader would fail on them in the session as on the host.
	Missing []string
	// Skipped are files in trees that look like ELF or a script but cannot be used, as
	// "file: why"; nothing they would need was followed.
	Skipped []string
	// Why says, for each of Files, Trees and Outside, what brought it in first.
	Why map[string]string
	// Digest is a sha256 (hex) over Files, Links and Trees and each file's and tree root's
	// device, inode, size and modification time: it names the view built from the
	// closure, and changes when the host's files do. Not their change time: linking a file
	// into a view changes that, so a digest over it would never name a view built.
	Digest string

	// ids are the files' identities the digest was made from, for the builder to check
	// that it links the very files resolved.
	ids map[string]fileID
}

// DataTrees are the directories (and the one file) of data glibc and the common libraries
// read at run time, included whole where present: time zones, compiled locales, terminfo, CA certificates,
// OpenSSL's directory, libmagic's database.
func DataTrees() []string {
	return []string{
		"/usr/share/zoneinfo",
		"/usr/lib/locale",
		"/usr/share/terminfo",
		"/usr/lib/terminfo",
		"/usr/share/ca-certificates",
		"/usr/lib/ssl",
		"/usr/share/misc",
		// A file, which /etc/os-release links to: what Python's platform and pip's distro
		// read to name the system.
		"/usr/lib/os-release",
	}
}

// baseLibraries are what glibc dlopens behind every program's back: the NSS modules (the
// ones named in nsswitch.conf join them), libresolv, and libgcc_s, which pthread_cancel and
// backtrace load.
func baseLibraries() []string {
	return []string{"libnss_files.so.2", "libnss_dns.so.2", "libresolv.so.2", "libgcc_s.so.1"}
}

// System says whether p lies in the system trees a view holds: /usr, /bin, /sbin, /lib*,
// /opt.
func System(p string) bool {
	if !path.IsAbs(p) {
		return false
	}
	first, _, _ := strings.Cut(p[1:], "/")
	switch first {
	case "usr", "bin", "sbin", "opt":
		return true
	}
	return strings.HasPrefix(first, "lib")
}

// beneath says whether p is root or lies beneath it.
func beneath(p, root string) bool {
	return p == root || strings.HasPrefix(p, strings.TrimSuffix(root, "/")+"/")
}

// Resolve works out the closure of w on this host, reading files but running nothing: each
// file followed through its symlinks; a script to its #! interpreter (and, through
// /usr/bin/env, the program found on Options.Path); an ELF file to its loader (PT_INTERP)
// and its DT_NEEDED libraries, transitively, found where glibc's loader finds them
// (DT_RPATH or DT_RUNPATH with $ORIGIN, $LIB and $PLATFORM expanded, /etc/ld.so.cache, the
// default directories) and of the needer's class and machine. Every ELF file in ExecTrees
// and ReadTrees is followed too (a script in ExecTrees also), with the libraries glibc
// loads at run time (NSS modules, libresolv, libgcc_s, the gconv modules) and DataTrees.
//
// A library no search finds is no error, but listed in Missing; a file of w that does not
// exist, or an ELF file needed that cannot be read, is an error naming it.
// LD_LIBRARY_PATH and LD_PRELOAD are not looked at: they are the session's environment,
// which the closure does not depend on.
func Resolve(w Want, o Options) (*Closure, error) {
	r := newResolver(o)
	if err := r.loadLdCache(); err != nil {
		return nil, err
	}
	var scans []scan
	for _, t := range w.ExecTrees {
		canon, err := r.addTree(t, "exec tree")
		if err != nil {
			return nil, err
		}
		scans = append(scans, scan{canon, true})
	}
	for _, t := range w.ReadTrees {
		canon, err := r.addTree(t, "read tree")
		if err != nil {
			return nil, err
		}
		scans = append(scans, scan{canon, false})
	}
	data := o.DataTrees
	if data == nil {
		data = DataTrees()
	}
	for _, t := range data {
		r.addDataTree(t, "data tree")
	}
	for _, f := range w.Files {
		if err := r.addExec(f, "allowed", 0, true); err != nil {
			return nil, err
		}
	}
	// Exec trees first: which machines' programs may run decides which ELF files of the
	// read trees (libraries some program may load) are followed.
	for _, s := range scans {
		if s.exec {
			if err := r.scanTree(s.dir, true); err != nil {
				return nil, err
			}
		}
	}
	if err := r.drain(); err != nil {
		return nil, err
	}
	for _, s := range scans {
		if !s.exec {
			if err := r.scanTree(s.dir, false); err != nil {
				return nil, err
			}
		}
	}
	abis := make([]abi, 0, len(r.execABIs))
	for a := range r.execABIs {
		abis = append(abis, a)
	}
	slices.SortFunc(abis, func(x, y abi) int { return strings.Compare(x.String(), y.String()) })
	for _, a := range abis {
		if err := r.addBase(a); err != nil {
			return nil, err
		}
	}
	if err := r.drain(); err != nil {
		return nil, err
	}
	return r.closure(), nil
}

type scan struct {
	dir  string
	exec bool
}

// fileID is what tells one version of a file from another.
type fileID struct {
	dev, ino    uint64
	size, mtime int64
}

func idOf(st *unix.Stat_t) fileID {
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}
}

// node is what a path led to.
type node struct {
	canon string
	mode  fs.FileMode
	id    fileID // for a regular file or a directory
	err   error
}

type work struct {
	obj string
	// origin is $ORIGIN: the directory the object was found in as the loader names it (a
	// library's through the name it was opened by, the executable's canonical).
	origin string
	// chain is the DT_RPATH directories of the objects that led here, expanded, which
	// glibc searches after the object's own DT_RPATH.
	chain []string
}

type searchKey struct {
	name     string
	abi      abi
	dirs     string
	nodeflib bool
}

type found struct {
	asFound, canon string
}

type archInfo struct {
	triple, lib string
	defaults    []string
	flags       []int32
}

type resolver struct {
	root  string
	path  []string
	cache *Cache
	ld    *ldCache

	nodes  map[string]node
	infos  map[string]*fileInfo
	hwcaps map[string][]string
	search map[searchKey][]found
	arches map[abi]*archInfo
	// loaderDirs are where each machine's loader lives, canonical: the multiarch triple's
	// last witness when ld.so.cache names none.
	loaderDirs map[abi]string
	execABIs   map[abi]bool

	files map[string]bool // canonical, System and not
	trees map[string]bool // canonical, System and not
	// asked are the trees Want names (an exec or read tree): the data trees among them are
	// mounted, not copied into a view.
	asked   map[string]bool
	links   map[string]string
	why     map[string]string
	missing map[string]bool
	skipped []string
	done    map[string]bool
	scanned map[scan]bool
	queue   []work
}

func newResolver(o Options) *resolver {
	root := ""
	if o.Root != "" {
		// Absolute, so that a view built from the closure (in another directory, maybe
		// another process) finds the same files.
		if abs, err := filepath.Abs(o.Root); err == nil && abs != "/" {
			root = abs
		}
	}
	p := o.Path
	if p == "" {
		p = DefaultPath
	}
	return &resolver{
		root:       root,
		path:       filepath.SplitList(p),
		cache:      o.Cache,
		nodes:      map[string]node{},
		infos:      map[string]*fileInfo{},
		hwcaps:     map[string][]string{},
		search:     map[searchKey][]found{},
		arches:     map[abi]*archInfo{},
		loaderDirs: map[abi]string{},
		execABIs:   map[abi]bool{},
		files:      map[string]bool{},
		trees:      map[string]bool{},
		asked:      map[string]bool{},
		links:      map[string]string{},
		why:        map[string]string{},
		missing:    map[string]bool{},
		done:       map[string]bool{},
		scanned:    map[scan]bool{},
	}
}

// maxLinks is the kernel's bound on the symlinks one lookup follows (MAXSYMLINKS).
const maxLinks = 40

// resolve follows p (absolute) as the kernel would, beneath the root, and says what it led
// to; every symlink on the way is recorded.
func (r *resolver) resolve(p string) (node, error) {
	if !path.IsAbs(p) {
		return node{}, fmt.Errorf("%s: not an absolute path", p)
	}
	return r.walk("/", p, 0)
}

func (r *resolver) walk(cur, rel string, depth int) (node, error) {
	n := node{canon: cur, mode: fs.ModeDir}
	for rel != "" {
		var comp string
		comp, rel, _ = strings.Cut(rel, "/")
		switch comp {
		case "", ".":
			continue
		case "..":
			n = node{canon: path.Dir(n.canon), mode: fs.ModeDir}
			continue
		}
		if !n.mode.IsDir() {
			return node{}, &fs.PathError{Op: "lookup", Path: path.Join(n.canon, comp), Err: unix.ENOTDIR}
		}
		next, err := r.step(n.canon, comp, depth)
		if err != nil {
			return node{}, err
		}
		n = next
	}
	if n.id == (fileID{}) && n.mode.IsDir() {
		// A directory reached by "..", or the root: its identity is looked up when asked for.
		if m, ok := r.nodes[n.canon]; ok {
			return m, nil
		}
	}
	return n, nil
}

// step looks name up in dir (canonical), following it if it is a symlink.
func (r *resolver) step(dir, name string, depth int) (node, error) {
	p := path.Join(dir, name)
	if n, ok := r.nodes[p]; ok {
		return n, n.err
	}
	var st unix.Stat_t
	if err := unix.Lstat(r.root+p, &st); err != nil {
		n := node{err: &fs.PathError{Op: "lstat", Path: p, Err: err}}
		r.nodes[p] = n
		return n, n.err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		n := node{canon: p, mode: fileMode(st.Mode), id: idOf(&st)}
		r.nodes[p] = n
		return n, nil
	}
	if depth >= maxLinks {
		return node{}, &fs.PathError{Op: "lookup", Path: p, Err: unix.ELOOP}
	}
	target, err := readlink(r.root + p)
	if err != nil {
		return node{}, err
	}
	r.links[p] = target
	base := dir
	if path.IsAbs(target) {
		base = "/"
	}
	n, err := r.walk(base, target, depth+1)
	n.err = err
	r.nodes[p] = n
	return n, err
}

func readlink(p string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlink(p, buf)
		if err != nil {
			return "", &fs.PathError{Op: "readlink", Path: p, Err: err}
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		if len(buf) >= 1<<16 {
			return "", &fs.PathError{Op: "readlink", Path: p, Err: unix.ENAMETOOLONG}
		}
		buf = make([]byte, 2*len(buf))
	}
}

func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFREG:
	default:
		mode |= fs.ModeIrregular
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	return mode
}

func (r *resolver) note(p, why string) {
	if _, ok := r.why[p]; !ok {
		r.why[p] = why
	}
}

func (r *resolver) miss(what, why string) { r.missing[what+" ("+why+")"] = true }

func (r *resolver) addFile(canon, why string) {
	r.files[canon] = true
	r.note(canon, why)
}

func (r *resolver) addTree(p, why string) (string, error) {
	n, err := r.resolve(p)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", why, p, err)
	}
	if !n.mode.IsDir() {
		return "", fmt.Errorf("%s %s is not a directory", why, p)
	}
	r.trees[n.canon] = true
	r.asked[n.canon] = true
	r.note(n.canon, why)
	return n.canon, nil
}

// addDataTree adds p if it is a directory on this host.
func (r *resolver) addDataTree(p, why string) bool {
	n, err := r.resolve(p)
	if err == nil && n.mode.IsRegular() {
		r.addFile(n.canon, why)
		return false
	}
	if err != nil || !n.mode.IsDir() {
		return false
	}
	r.trees[n.canon] = true
	r.note(n.canon, why)
	return true
}

func (r *resolver) inTree(p string) bool {
	for t := range r.trees {
		if beneath(p, t) {
			return true
		}
	}
	return false
}

// maxScriptDepth is the kernel's bound on interpreters of interpreters
// (BINPRM_MAX_RECURSION): past it exec fails.
const maxScriptDepth = 4

// addExec adds the file at p, to be run, and what running it needs. must says p was asked
// for: its absence is an error, not a Missing entry.
func (r *resolver) addExec(p, why string, depth int, must bool) error {
	n, err := r.resolve(p)
	switch {
	case err != nil && !must && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)):
		r.miss(p, why)
		return nil
	case err != nil:
		return fmt.Errorf("%s: %w", p, err)
	case !n.mode.IsRegular() && must:
		return fmt.Errorf("%s is not a regular file", p)
	case !n.mode.IsRegular():
		r.miss(p, why+", not a regular file")
		return nil
	}
	r.addFile(n.canon, why)
	return r.followExec(n.canon, depth)
}

// followExec follows what running the regular file at canon needs.
func (r *resolver) followExec(canon string, depth int) error {
	info, err := r.inspect(canon)
	if err != nil {
		return err
	}
	switch info.kind {
	case kindScript:
		return r.followScript(canon, info, depth)
	case kindELF:
		o := info.elf
		if o.bad != "" {
			return fmt.Errorf("%s: %s", canon, o.bad)
		}
		a := abiOf(o)
		if o.interp != "" || len(o.needed) > 0 {
			r.execABIs[a] = true
		}
		if o.interp != "" {
			if n, err := r.resolve(o.interp); err == nil {
				if _, ok := r.loaderDirs[a]; !ok {
					r.loaderDirs[a] = path.Dir(n.canon)
				}
			}
			if err := r.addExec(o.interp, "ELF interpreter of "+canon, depth+1, false); err != nil {
				return err
			}
		}
		r.push(work{obj: canon, origin: path.Dir(canon)})
	}
	return nil
}

func (r *resolver) followScript(canon string, info *fileInfo, depth int) error {
	switch {
	case info.interp == "":
		r.skipped = append(r.skipped, canon+": its #! line names no interpreter")
		return nil
	case !path.IsAbs(info.interp):
		r.miss(info.interp, "#! interpreter of "+canon+", a relative path exec looks up from the working directory")
		return nil
	case depth >= maxScriptDepth:
		r.miss(info.interp, "#! interpreter of "+canon+", past the kernel's "+strconv.Itoa(maxScriptDepth)+" levels of interpreters")
		return nil
	}
	if err := r.addExec(info.interp, "#! interpreter of "+canon, depth+1, false); err != nil {
		return err
	}
	if path.Base(info.interp) != "env" {
		return nil
	}
	prog := envProgram(info.arg)
	if prog == "" {
		return nil
	}
	why := "program #!" + info.interp + " runs for " + canon
	if strings.Contains(prog, "/") {
		if !path.IsAbs(prog) {
			r.miss(prog, why+", a relative path")
			return nil
		}
		return r.addExec(prog, why, 0, false)
	}
	for _, dir := range r.path {
		if !path.IsAbs(dir) {
			continue
		}
		n, err := r.resolve(path.Join(dir, prog))
		if err != nil || !n.mode.IsRegular() || n.mode.Perm()&0o111 == 0 {
			continue
		}
		// env execs a new program: the interpreters' count starts over.
		return r.addExec(path.Join(dir, prog), why, 0, false)
	}
	r.miss(prog, why+", not on "+strings.Join(r.path, ":"))
	return nil
}

// envProgram is the program env runs given arg, a #! line's argument: the kernel passes it
// whole, so without -S it is the program's name, spaces and all.
func envProgram(arg string) string {
	if arg == "" {
		return ""
	}
	rest, ok := strings.CutPrefix(arg, "-S")
	if !ok {
		if strings.HasPrefix(arg, "-") {
			return ""
		}
		return arg
	}
	fields := strings.Fields(rest)
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		switch {
		case f == "-u" || f == "-C" || f == "--unset" || f == "--chdir":
			i++
		case strings.HasPrefix(f, "-"):
		case strings.Contains(f, "="):
		default:
			return f
		}
	}
	return ""
}

func (r *resolver) push(w work) { r.queue = append(r.queue, w) }

// drain follows the queued objects breadth first, so that what Why says brought a library
// in is the nearest object needing it.
func (r *resolver) drain() error {
	for len(r.queue) > 0 {
		w := r.queue[0]
		r.queue = r.queue[1:]
		if err := r.needs(w); err != nil {
			return err
		}
	}
	return nil
}

// needs finds the libraries the object w names and queues them in turn.
func (r *resolver) needs(w work) error {
	info, err := r.inspect(w.obj)
	if err != nil {
		return err
	}
	o := info.elf
	if o == nil {
		return nil
	}
	if o.bad != "" {
		return fmt.Errorf("%s: %s", w.obj, o.bad)
	}
	if len(o.needed) == 0 {
		return nil
	}
	// The same object reached twice needs the same, unless its search depends on where it
	// was found from.
	key := w.obj
	if usesOrigin(o) {
		key += "\x00" + w.origin
	}
	if !o.hasRunpath && len(w.chain) > 0 {
		key += "\x00" + strings.Join(w.chain, ":")
	}
	if r.done[key] {
		return nil
	}
	r.done[key] = true
	a := abiOf(o)
	var dirs, chain []string
	if o.hasRunpath {
		// DT_RUNPATH turns every DT_RPATH off for this object's own needs; its needers'
		// still apply to its libraries' (glibc walks the chain of loaders).
		dirs = r.expandPath(o.runpath, w.origin, a)
		chain = w.chain
	} else {
		own := r.expandPath(o.rpath, w.origin, a)
		dirs = append(slices.Clip(own), w.chain...)
		chain = dirs
	}
	for _, name := range o.needed {
		libs := r.find(name, a, dirs, o.nodeflib, w.origin)
		if len(libs) == 0 {
			r.miss(name, "needed by "+w.obj)
			continue
		}
		for _, f := range libs {
			r.addFile(f.canon, "needed by "+w.obj)
			r.push(work{obj: f.canon, origin: path.Dir(f.asFound), chain: chain})
		}
	}
	return nil
}

func usesOrigin(o *elfObject) bool {
	has := func(s string) bool { return strings.Contains(s, "$ORIGIN") || strings.Contains(s, "${ORIGIN}") }
	return has(o.rpath) || has(o.runpath) || slices.ContainsFunc(o.needed, has)
}

// find looks name up as glibc's loader does for an object of machine a whose own search
// path (DT_RPATH and its needers', or DT_RUNPATH) is dirs: each directory's glibc-hwcaps
// subdirectories, then itself; then ld.so.cache; then the default directories. It returns
// every file the loader could pick on some CPU: the first one found plain, and the
// glibc-hwcaps variants met before it.
func (r *resolver) find(name string, a abi, dirs []string, nodeflib bool, origin string) []found {
	if strings.Contains(name, "$") {
		var ok bool
		if name, ok = r.expandDST(name, origin, a); !ok {
			return nil
		}
	}
	if strings.Contains(name, "/") {
		// A path, which the loader opens as it is; a relative one is from the working
		// directory, which is the session's.
		if c, ok := r.candidate(name, a); ok && path.IsAbs(name) {
			return []found{{name, c}}
		}
		return nil
	}
	key := searchKey{name: name, abi: a, dirs: strings.Join(dirs, ":"), nodeflib: nodeflib}
	if f, ok := r.search[key]; ok {
		return f
	}
	var out []found
	plain := false
	for _, d := range dirs {
		if out, plain = r.tryDir(d, name, a, out); plain {
			break
		}
	}
	if !plain && !nodeflib {
		info := r.arch(a)
		for _, p := range r.ld.lookup(name, info.flags) {
			if c, ok := r.candidate(p, a); ok {
				out, plain = append(out, found{p, c}), true
			}
		}
		if !plain {
			for _, d := range info.defaults {
				if out, plain = r.tryDir(d, name, a, out); plain {
					break
				}
			}
		}
	}
	r.search[key] = out
	return out
}

// tryDir looks for name in dir's glibc-hwcaps subdirectories and in dir itself; plain says
// dir itself has it.
func (r *resolver) tryDir(dir, name string, a abi, out []found) ([]found, bool) {
	for _, sub := range r.hwcapsOf(dir) {
		p := dir + "/glibc-hwcaps/" + sub + "/" + name
		if c, ok := r.candidate(p, a); ok {
			out = append(out, found{p, c})
		}
	}
	p := strings.TrimSuffix(dir, "/") + "/" + name
	if c, ok := r.candidate(p, a); ok {
		return append(out, found{p, c}), true
	}
	return out, false
}

func (r *resolver) hwcapsOf(dir string) []string {
	if subs, ok := r.hwcaps[dir]; ok {
		return subs
	}
	var subs []string
	if n, err := r.resolve(dir + "/glibc-hwcaps"); err == nil && n.mode.IsDir() {
		if ents, err := os.ReadDir(r.root + n.canon); err == nil {
			for _, e := range ents {
				subs = append(subs, e.Name())
			}
		}
	}
	r.hwcaps[dir] = subs
	return subs
}

// candidate says whether p is a library the loader would take for an object of machine a:
// a regular ELF file of a's class, byte order and machine. It returns p canonical.
func (r *resolver) candidate(p string, a abi) (string, bool) {
	if !path.IsAbs(p) {
		return "", false
	}
	n, err := r.resolve(p)
	if err != nil || !n.mode.IsRegular() {
		return "", false
	}
	info, err := r.inspect(n.canon)
	if err != nil || info.kind != kindELF || !a.matches(info.elf) {
		return "", false
	}
	return n.canon, true
}

// arch is what the loader's search for machine a depends on. The multiarch triple comes
// from ld.so.cache (the directories its entries for a lie in), else from where a's loader
// lives; a host without one (Fedora's /usr/lib64) has none.
func (r *resolver) arch(a abi) *archInfo {
	if info, ok := r.arches[a]; ok {
		return info
	}
	info := &archInfo{flags: cacheFlags(a)}
	if r.ld != nil && len(info.flags) > 0 {
		count := map[string]int{}
		for _, entries := range r.ld.byName {
			for _, e := range entries {
				if slices.Contains(info.flags, e.flags) {
					if t, ok := multiarchOf(path.Dir(e.path)); ok {
						count[t]++
					}
				}
			}
		}
		best := 0
		for t, n := range count {
			if n > best || n == best && t < info.triple {
				info.triple, best = t, n
			}
		}
	}
	if info.triple == "" {
		info.triple, _ = multiarchOf(r.loaderDirs[a])
	}
	switch {
	case info.triple != "" && r.isDir("/lib/"+info.triple):
		// Debian's glibc is built with its libraries in /lib/<triple>, which $LIB names.
		info.lib = "lib/" + info.triple
	case a.class == elf.ELFCLASS64 && r.isDir("/lib64"):
		info.lib = "lib64"
	default:
		info.lib = "lib"
	}
	info.defaults = defaultDirs(info.triple, a)
	r.arches[a] = info
	return info
}

func (r *resolver) isDir(p string) bool {
	n, err := r.resolve(p)
	return err == nil && n.mode.IsDir()
}

// expandPath splits a DT_RPATH or DT_RUNPATH into its directories, dynamic string tokens
// expanded; an element that does not expand to an absolute path is dropped, as the loader
// drops it.
func (r *resolver) expandPath(list, origin string, a abi) []string {
	if list == "" {
		return nil
	}
	var out []string
	for _, e := range strings.Split(list, ":") {
		if strings.Contains(e, "$") {
			var ok bool
			if e, ok = r.expandDST(e, origin, a); !ok {
				continue
			}
		}
		if path.IsAbs(e) {
			out = append(out, e)
		}
	}
	return out
}

// expandDST expands $ORIGIN, $LIB and $PLATFORM (and their ${} forms) in s; ok is false for
// a token it cannot expand.
func (r *resolver) expandDST(s, origin string, a abi) (string, bool) {
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 {
			b.WriteString(s)
			return b.String(), true
		}
		b.WriteString(s[:i])
		s = s[i+1:]
		var tok string
		if rest, ok := strings.CutPrefix(s, "{"); ok {
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				return "", false
			}
			tok, s = rest[:end], rest[end+1:]
		} else {
			end := 0
			for end < len(s) && (s[end] == '_' || 'A' <= s[end] && s[end] <= 'Z' || 'a' <= s[end] && s[end] <= 'z' || '0' <= s[end] && s[end] <= '9') {
				end++
			}
			tok, s = s[:end], s[end:]
		}
		var v string
		switch tok {
		case "ORIGIN":
			v = origin
		case "LIB":
			v = r.arch(a).lib
		case "PLATFORM":
			v = platform(a)
		}
		if v == "" {
			return "", false
		}
		b.WriteString(v)
	}
}

// scanTree follows the files of the tree at dir (canonical): in an exec tree each one as
// if it were allowed, in a read tree the ELF files of the machines whose programs run.
func (r *resolver) scanTree(dir string, exec bool) error {
	s := scan{dir, exec}
	if r.scanned[s] {
		return nil
	}
	r.scanned[s] = true
	return r.scanDir(dir, exec)
}

func (r *resolver) scanDir(dir string, exec bool) error {
	f, err := os.Open(r.root + dir)
	if err != nil {
		return fmt.Errorf("tree %s: %w", dir, err)
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("tree %s: %w", dir, err)
	}
	dirfd := int(f.Fd())
	for _, e := range ents {
		p := dir + "/" + e.Name()
		switch t := e.Type(); {
		case t.IsDir():
			if err := r.scanDir(p, exec); err != nil {
				return err
			}
		case t.IsRegular():
			info, err := r.inspectAt(dirfd, e.Name(), p)
			if err != nil {
				return err
			}
			if err := r.scanFile(p, info, exec); err != nil {
				return err
			}
		case t&fs.ModeSymlink != 0:
			n, err := r.resolve(p)
			if err != nil || !n.mode.IsRegular() || r.inTree(n.canon) {
				// Dangling, a directory (not followed: a tree is what is under its root),
				// or a file some tree holds, scanned there.
				continue
			}
			r.addFile(n.canon, "link "+p+" in a tree")
			info, err := r.inspect(n.canon)
			if err != nil {
				return err
			}
			if err := r.scanFile(n.canon, info, exec); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *resolver) scanFile(p string, info *fileInfo, exec bool) error {
	switch info.kind {
	case kindScript:
		// A script in a tree runs only when its interpreter is on the allowlist in its own
		// right: the exec rules give a tree's scripts no interpreter (git-core's perl and
		// sh scripts need @shell or perl named). Following them would bring perl into every
		// @git session's view, where the ELF loader would run it.
		return nil
	case kindELF:
		o := info.elf
		if o.bad != "" {
			r.skipped = append(r.skipped, p+": "+o.bad)
			return nil
		}
		if exec {
			return r.followExec(p, 0)
		}
		if r.execABIs[abiOf(o)] {
			r.push(work{obj: p, origin: path.Dir(p)})
		}
	}
	return nil
}

// addBase adds what glibc loads for a's programs at run time, whether or not they name it:
// the base libraries, the NSS modules nsswitch.conf names, and the gconv modules.
func (r *resolver) addBase(a abi) error {
	names := baseLibraries()
	for _, svc := range r.nssServices() {
		names = append(names, "libnss_"+svc+".so.2")
	}
	for _, name := range names {
		for _, f := range r.find(name, a, nil, false, "") {
			r.addFile(f.canon, "loaded by glibc at run time")
			r.push(work{obj: f.canon, origin: path.Dir(f.asFound)})
		}
	}
	// iconv's modules are in gconv beside libc (glibc's $libdir/gconv).
	for _, f := range r.find("libc.so.6", a, nil, false, "") {
		dir := path.Dir(f.canon) + "/gconv"
		if r.addDataTree(dir, "gconv modules of "+f.canon) {
			if err := r.scanTree(dir, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// nssServices are the services nsswitch.conf names (libnss_<service>.so.2 for each, those
// present); none if it cannot be read.
func (r *resolver) nssServices() []string {
	data, err := os.ReadFile(r.root + "/etc/nsswitch.conf")
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		_, list, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		inAction := false
		for _, f := range strings.Fields(list) {
			if strings.HasPrefix(f, "[") {
				inAction = true
			}
			if inAction {
				inAction = !strings.HasSuffix(f, "]")
				continue
			}
			if !seen[f] && validService(f) && len(out) < 32 {
				seen[f] = true
				out = append(out, f)
			}
		}
	}
	return out
}

func validService(s string) bool {
	for _, c := range s {
		if !(c == '_' || c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return s != ""
}

// loadLdCache reads /etc/ld.so.cache. A cache that cannot be parsed the loader ignores, and
// so does this, saying so in Skipped.
func (r *resolver) loadLdCache() error {
	p := r.root + "/etc/ld.so.cache"
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("/etc/ld.so.cache: %w", err)
	}
	id := idOf(&st)
	if c, ok := r.cache.ldCache(p, id); ok {
		r.ld = c
		return nil
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("/etc/ld.so.cache: %w", err)
	}
	c, err := parseLdCache(data)
	if err != nil {
		r.skipped = append(r.skipped, "/etc/ld.so.cache: "+err.Error())
		return nil
	}
	r.ld = c
	r.cache.putLdCache(p, id, c)
	return nil
}

// closure puts together what was found.
func (r *resolver) closure() *Closure {
	c := &Closure{
		Root:  r.root,
		Links: map[string]string{},
		Why:   map[string]string{},
		ids:   map[string]fileID{},
	}
	if c.Root == "" {
		c.Root = "/"
	}
	var trees []string
	for t := range r.trees {
		if System(t) {
			trees = append(trees, t)
		} else {
			c.Outside = append(c.Outside, t)
		}
	}
	slices.Sort(trees)
	for _, t := range trees {
		if len(c.Trees) == 0 || !beneath(t, c.Trees[len(c.Trees)-1]) {
			c.Trees = append(c.Trees, t)
			if !r.asked[t] {
				c.Linked = append(c.Linked, t)
			}
		}
	}
	in := func(p string) bool {
		// c.Trees is sorted with none inside another: the one that could hold p is the last
		// one not after it.
		i, _ := slices.BinarySearch(c.Trees, p)
		if i < len(c.Trees) && c.Trees[i] == p {
			return true
		}
		return i > 0 && beneath(p, c.Trees[i-1])
	}
	for f := range r.files {
		switch {
		case !System(f):
			c.Outside = append(c.Outside, f)
		case !in(f):
			c.Files = append(c.Files, f)
		}
	}
	slices.Sort(c.Files)
	slices.Sort(c.Outside)
	for l, target := range r.links {
		if !in(l) {
			c.Links[l] = target
		}
	}
	for m := range r.missing {
		c.Missing = append(c.Missing, m)
	}
	slices.Sort(c.Missing)
	c.Skipped = slices.Compact(slices.Sorted(slices.Values(r.skipped)))
	for _, p := range slices.Concat(c.Files, c.Trees, c.Outside) {
		c.Why[p] = r.why[p]
	}

	h := sha256.New()
	fmt.Fprintf(h, "sysview 1\n")
	for _, f := range c.Files {
		id := r.nodes[f].id
		c.ids[f] = id
		fmt.Fprintf(h, "F %q %d %d %d %d\n", f, id.dev, id.ino, id.size, id.mtime)
	}
	for _, l := range slices.Sorted(maps.Keys(c.Links)) {
		fmt.Fprintf(h, "L %q %q\n", l, c.Links[l])
	}
	for _, t := range c.Trees {
		id := r.nodes[t].id
		fmt.Fprintf(h, "T %q %d %d %d %d\n", t, id.dev, id.ino, id.size, id.mtime)
	}
	c.Digest = hex.EncodeToString(h.Sum(nil))
	return c
}
