package roostinit

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment/sysview"
)

// Landlock is what roost-exec confines with Landlock before it execs the program. Rules are
// built in the program's own view (inside a sealed root, names resolve there).
type Landlock struct {
	// Exec lists what may be executed besides the program itself: names looked up on the
	// program's PATH, or absolute paths. The interpreters they need (the ELF dynamic
	// loader, a script's #! line) are allowed with them. Nothing else may be executed.
	Exec []string `json:"exec"`
	// NoExec lists trees the session can write. Nothing at or beneath one becomes an exec
	// rule: Landlock's rule holds an inode, and whatever the session writes into it later
	// would execute. The FS write trees are always such trees; NoExec adds those Landlock
	// does not list (a sealed root's /work and /tmp, the workdir around a scope).
	NoExec []string `json:"no_exec,omitempty"`
	// ExecTrees lists directories shell.allow names (a tree, or a toolchain's helpers):
	// every file beneath may execute. None may hold, or lie in, a tree the session writes.
	ExecTrees []string `json:"exec_trees,omitempty"`
	// WritableExec lists the trees the session writes that execute whatever is in them: its
	// workdir and scratch directories under filesystem.workdir_exec, where the class, not
	// the allowlist, holds what runs.
	WritableExec []string `json:"writable_exec,omitempty"`
	// FS, when set, confines file access too (scoped sessions, on the host's view).
	FS *LandlockFS `json:"fs,omitempty"`
}

// LandlockFS is where a confined program may read and write.
type LandlockFS struct {
	// Read lists trees readable (and listable).
	Read []string `json:"read"`
	// Write lists trees writable: files made, changed and removed, directories too.
	Write []string `json:"write"`
	// WriteFiles lists single files writable (devices such as /dev/null).
	WriteFiles []string `json:"write_files"`
	// ReadFiles lists single files readable.
	ReadFiles []string `json:"read_files,omitempty"`
	// List lists trees whose directories may be listed, and no file in them read but by
	// another rule.
	List []string `json:"list,omitempty"`
}

const (
	readRights  = ll.AccessFSReadFile | ll.AccessFSReadDir
	writeRights = readRights | ll.AccessFSWriteFile | ll.AccessFSRemoveDir | ll.AccessFSRemoveFile |
		ll.AccessFSMakeDir | ll.AccessFSMakeReg | ll.AccessFSMakeSym | ll.AccessFSMakeFifo |
		ll.AccessFSMakeSock | ll.AccessFSTruncate | ll.AccessFSRefer
	fileWriteRights = ll.AccessFSReadFile | ll.AccessFSWriteFile | ll.AccessFSTruncate | ll.AccessFSIoctlDev
	allFSRights     = writeRights | ll.AccessFSExecute | ll.AccessFSMakeChar | ll.AccessFSMakeBlock | ll.AccessFSIoctlDev
)

// applyLandlock restricts the calling thread (and what it execs) to the rules. program is
// the program about to be exec'd, as found on path, the program's PATH. The caller has
// locked its OS thread and execs from it: the program inherits that thread's domain, and
// roost-exec's other threads end at the exec. Restricting every thread instead (go-landlock's
// Restrict, through libpsx on kernels before Landlock's TSYNC) signals each of them in turn
// (`go test -bench LandlockRestrict ./pkg/containment/roostinit/`). It returns what the
// exec rules hold, for the exec listener to judge by; nil when the kernel has no Landlock
// and nothing is enforced.
func applyLandlock(l *Landlock, program, path string) (*execRuleSet, error) {
	cfg, rules, set, err := landlockRules(l, program, path)
	if err != nil {
		return nil, err
	}
	fd, flags, err := cfg.NewRulesetFD(rules...)
	if err != nil || fd < 0 {
		return nil, err
	}
	defer unix.Close(fd)
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("no_new_privs: %w", err)
	}
	if err := ll.LandlockRestrictSelf(fd, flags); err != nil {
		return nil, fmt.Errorf("landlock_restrict_self: %w", err)
	}
	return set, nil
}

// landlockRules is the session's Landlock ruleset: what it handles, and the rules; set is
// what its exec rules hold.
func landlockRules(l *Landlock, program, path string) (_ landlock.Config, _ []landlock.Rule, set *execRuleSet, _ error) {
	execs, err := execRules(l, program, path)
	if err != nil {
		return landlock.Config{}, nil, nil, err
	}
	rules := []landlock.Rule{landlock.PathAccess(ll.AccessFSExecute, execs...)}
	trees, err := execTrees(l)
	if err != nil {
		return landlock.Config{}, nil, nil, err
	}
	set = &execRuleSet{files: execs, trees: append(slices.Clone(trees), l.WritableExec...)}
	if len(trees) > 0 {
		rules = append(rules, landlock.PathAccess(ll.AccessFSExecute, trees...))
	}
	if len(l.WritableExec) > 0 {
		rules = append(rules, landlock.PathAccess(ll.AccessFSExecute, l.WritableExec...).IgnoreIfMissing())
	}
	// Once a ruleset exists, Landlock refuses to move or link a file across directories
	// unless REFER is handled and granted: granted everywhere here, since mounts and DAC
	// already decide where the session may write.
	handled := landlock.AccessFSSet(ll.AccessFSExecute | ll.AccessFSRefer)
	rules = append(rules, landlock.PathAccess(ll.AccessFSRefer, "/"))
	if fs := l.FS; fs != nil {
		handled = allFSRights
		if len(fs.Read) > 0 {
			rules = append(rules, landlock.PathAccess(readRights, fs.Read...).IgnoreIfMissing())
		}
		if len(fs.Write) > 0 {
			rules = append(rules, landlock.PathAccess(writeRights, fs.Write...).IgnoreIfMissing())
		}
		if len(fs.ReadFiles) > 0 {
			rules = append(rules, landlock.PathAccess(ll.AccessFSReadFile, fs.ReadFiles...).IgnoreIfMissing())
		}
		if len(fs.List) > 0 {
			rules = append(rules, landlock.PathAccess(ll.AccessFSReadDir, fs.List...).IgnoreIfMissing())
		}
		if len(fs.WriteFiles) > 0 {
			rules = append(rules, landlock.PathAccess(fileWriteRights, fs.WriteFiles...).IgnoreIfMissing())
		}
	}
	// Scoped: signals and abstract unix sockets reach only processes in the same Landlock
	// domain, so a program running as root on the host's view cannot signal roostd or any
	// other root process (a same-uid kill needs no capability).
	cfg := landlock.Config{HandledAccessFS: handled, Scoped: ll.ScopeSignal | ll.ScopeAbstractUnixSocket}
	return cfg.BestEffort(), rules, set, nil
}

// maxInterpreterDepth bounds the chain of interpreters followed (a script's interpreter a
// script, and so on). The kernel gives up after five rewrites (exec_binprm), the last
// one's ELF loader opened too: a longer chain fails at exec, so nothing past it needs a
// rule, and a capsule cannot make roost-exec read files without end.
const maxInterpreterDepth = 6

// execFile is a file bound for the exec allowlist.
type execFile struct {
	// path is where it resolves: absolute, no symlinks. The rule is made on it, so what was
	// checked is what Landlock opens.
	path string
	// name is how it was named (a #! line's text, a shell.allow entry's path); of says,
	// for an interpreter, whose it is.
	name, of string
	depth    int
}

func (f execFile) String() string {
	if f.of == "" {
		return f.name
	}
	return f.name + " (" + f.of + ")"
}

// execRules lists the files Landlock lets the program execute: itself, what shell.allow
// names, and every interpreter those need. Each is an executable regular file outside the
// trees the session can write, or the launch is refused: a rule on a directory allows
// everything beneath it, and a rule on a file the session can write allows whatever it
// writes there.
func execRules(l *Landlock, program, path string) ([]string, error) {
	g := newExecGuard(l)
	var queue []execFile
	// Every ELF binary names the same loader: it is checked once.
	checked := map[string]bool{}
	add := func(desc, name, of string, depth int) error {
		if checked[name] {
			return nil
		}
		checked[name] = true
		resolved, err := g.check(name)
		if err != nil {
			return fmt.Errorf("%s %w", desc, err)
		}
		for _, f := range queue {
			if f.path == resolved {
				return nil
			}
		}
		queue = append(queue, execFile{path: resolved, name: name, of: of, depth: depth})
		return nil
	}
	// The program is exec'd now, from here: a relative name means the working directory.
	abs, err := filepath.Abs(program)
	if err != nil {
		return nil, err
	}
	if err := add("command "+program, abs, "", 0); err != nil {
		return nil, err
	}
	for _, e := range l.Exec {
		name, found := findExec(e, path)
		if !found {
			// Nothing to execute: the allowlist gains nothing.
			continue
		}
		desc := fmt.Sprintf("shell.allow entry %q", e)
		if name != e {
			desc += " (" + name + ")"
		}
		if err := add(desc, name, "", 0); err != nil {
			return nil, err
		}
	}
	for i := 0; i < len(queue); i++ {
		f := queue[i]
		if f.depth >= maxInterpreterDepth {
			continue
		}
		interps, err := interpreters(f.path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, in := range interps {
			name := in.name
			if in.onPath {
				var found bool
				if name, found = findExec(in.name, path); !found {
					continue
				}
			}
			desc := fmt.Sprintf("%s: its %s %q", f, in.kind, in.name)
			if name != in.name {
				desc += " (" + name + ")"
			}
			if err := add(desc, name, fmt.Sprintf("the %s of %s", in.kind, f.name), f.depth+1); err != nil {
				return nil, err
			}
		}
	}
	out := make([]string, len(queue))
	for i, f := range queue {
		out[i] = f.path
	}
	return out, nil
}

// findExec finds what a shell.allow entry or a #!/usr/bin/env target names: a bare name
// on PATH, or a path as it is. found is false when there is nothing there to execute.
func findExec(name, path string) (_ string, found bool) {
	if strings.Contains(name, "/") {
		_, err := os.Stat(name)
		return name, !missing(err)
	}
	p, err := lookPath(name, path)
	if err != nil {
		return "", false
	}
	// A relative PATH entry (".") names the working directory, the workdir: made absolute,
	// the check sees where it is.
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	return p, true
}

// missing says whether err means there is no file at a path (a component of it a file
// included).
func missing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// execGuard checks a file bound for the allowlist against the trees the session can write.
type execGuard struct {
	noExec []string
	// trees are noExec's directories as the kernel names them (device and inode): a tree
	// bind-mounted elsewhere, or reached through a symlink, is still the same tree.
	trees []inode
	// dirs caches the inodes of the directories walked: most files share /usr/bin.
	dirs map[string]inode
}

type inode struct{ dev, ino uint64 }

func inodeOf(info fs.FileInfo) (inode, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return inode{}, false
	}
	return inode{dev: st.Dev, ino: st.Ino}, true
}

func newExecGuard(l *Landlock) *execGuard {
	g := &execGuard{dirs: map[string]inode{}}
	trees := slices.Clone(l.NoExec)
	if l.FS != nil {
		trees = append(trees, l.FS.Write...)
	}
	for _, t := range trees {
		info, err := os.Stat(t)
		if err != nil {
			// A tree that does not exist holds nothing to execute.
			continue
		}
		if in, ok := inodeOf(info); ok {
			g.noExec = append(g.noExec, t)
			g.trees = append(g.trees, in)
		}
	}
	return g
}

// execTrees checks the directories shell.allow names: each a directory, neither beneath a
// tree the session writes nor holding one (a rule on /usr would not reach the workdir, a rule
// on / would), resolved as Landlock will open it.
func execTrees(l *Landlock) ([]string, error) {
	if len(l.ExecTrees) == 0 {
		return nil, nil
	}
	g := newExecGuard(l)
	var writable []string
	for _, t := range g.noExec {
		if r, err := filepath.EvalSymlinks(t); err == nil {
			writable = append(writable, r)
		}
	}
	out := make([]string, 0, len(l.ExecTrees))
	for _, t := range l.ExecTrees {
		resolved, err := filepath.EvalSymlinks(t)
		if err != nil {
			return nil, fmt.Errorf("shell.allow tree %s: %w", t, err)
		}
		info, err := os.Stat(resolved)
		if err != nil {
			return nil, fmt.Errorf("shell.allow tree %s: %w", t, err)
		}
		if !info.IsDir() {
			return nil, fmt.Errorf("shell.allow tree %s is no longer a directory", t)
		}
		if tree, ok := g.beneath(resolved, info); ok {
			return nil, fmt.Errorf("shell.allow tree %s lies in %s, which the session can write; nothing there executes", t, tree)
		}
		for _, w := range writable {
			if w == resolved || strings.HasPrefix(w, strings.TrimSuffix(resolved, "/")+"/") {
				return nil, fmt.Errorf("shell.allow tree %s holds %s, which the session can write; nothing there executes, so the tree cannot be an exec rule (name what in it may run, or grant filesystem.workdir_exec)", t, w)
			}
		}
		out = append(out, resolved)
	}
	return out, nil
}

// check resolves name as exec would, following symlinks, and returns where it leads if
// that is an executable regular file outside every tree the session can write. Its error
// completes a sentence about name.
func (g *execGuard) check(name string) (string, error) {
	if name == "" {
		return "", errors.New("is empty")
	}
	if !filepath.IsAbs(name) {
		// The kernel looks a relative name up from the working directory: the workdir.
		return "", errors.New("is a relative path, which exec looks up from the working directory (the session's workdir); roost allows only an absolute one")
	}
	resolved, err := filepath.EvalSymlinks(name)
	if missing(err) {
		return "", errors.New("does not exist")
	}
	if err != nil {
		return "", fmt.Errorf("cannot be resolved: %w", err)
	}
	info, err := os.Stat(resolved)
	if err != nil {
		return "", err
	}
	is := "is"
	if resolved != name {
		is = "resolves to " + resolved + ", which is"
	}
	switch {
	case info.IsDir():
		return "", fmt.Errorf("%s a directory, not an executable file; roost never turns a directory into an exec rule", is)
	case !info.Mode().IsRegular():
		return "", fmt.Errorf("%s not a regular file; only an executable file becomes an exec rule", is)
	case info.Mode().Perm()&0o111 == 0:
		return "", fmt.Errorf("%s not executable (no execute bit)", is)
	}
	if tree, ok := g.beneath(resolved, info); ok {
		lies := "lies in"
		if resolved != name {
			lies = "resolves to " + resolved + ", in"
		}
		return "", fmt.Errorf("%s %s, which the session can write; nothing there executes", lies, tree)
	}
	return resolved, nil
}

// beneath says which no-exec tree, if any, holds the file at resolved (a path free of
// symlinks): the file or one of its ancestors is that tree's directory.
func (g *execGuard) beneath(resolved string, info fs.FileInfo) (string, bool) {
	if len(g.trees) == 0 {
		return "", false
	}
	in, ok := inodeOf(info)
	for p := resolved; ok; {
		if i := slices.Index(g.trees, in); i >= 0 {
			return g.noExec[i], true
		}
		if p == "/" {
			break
		}
		p = filepath.Dir(p)
		if in, ok = g.dirs[p]; !ok {
			if info, err := os.Stat(p); err == nil {
				in, ok = inodeOf(info)
				g.dirs[p] = in
			}
		}
	}
	return "", false
}

// interpreter is what executing a file needs executed with it.
type interpreter struct {
	kind string
	name string
	// onPath: name is looked up on PATH, as #!/usr/bin/env does.
	onPath bool
}

// scriptHead is as much of a script as the kernel reads for its #! line (BINPRM_BUF_SIZE).
const scriptHead = 256

// interpreters lists what executing file needs executed with it: the dynamic loader an ELF
// binary names, a #! script's interpreter (and, through env, the program it runs). A file
// that cannot be read or is neither has none. A #! line with no interpreter is an error.
func interpreters(file string) ([]interpreter, error) {
	// Raw descriptors: os.File would register each with the poller, for one or two reads.
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil
	}
	defer unix.Close(fd)
	// One read holds a #! line, and an ELF binary's program headers and loader name as
	// linkers lay them out.
	head := make([]byte, 4096)
	n, err := unix.Pread(fd, head, 0)
	if err != nil {
		return nil, nil
	}
	head = head[:n]
	if rest, ok := bytes.CutPrefix(head[:min(n, scriptHead)], []byte("#!")); ok {
		name, arg := sysview.Shebang(rest)
		if name == "" {
			return nil, errors.New("its #! line names no interpreter")
		}
		out := []interpreter{{kind: "#! interpreter", name: name}}
		// #!/usr/bin/env python3: env runs the named program from PATH.
		if filepath.Base(name) == "env" {
			fields := strings.Fields(arg)
			if len(fields) > 0 && fields[0] == "-S" {
				fields = fields[1:]
			}
			if len(fields) > 0 && !strings.HasPrefix(fields[0], "-") {
				out = append(out, interpreter{kind: "#!/usr/bin/env program", name: fields[0], onPath: true})
			}
		}
		return out, nil
	}
	name, ok := elfInterpreter(fd, head)
	if !ok {
		return nil, nil
	}
	if name == "" {
		return nil, errors.New("its ELF interpreter (PT_INTERP) is empty or cannot be read")
	}
	return []interpreter{{kind: "ELF interpreter", name: name}}, nil
}

// elfInterpreter reads the loader (PT_INTERP) an ELF binary names, from its program headers
// alone as the kernel does (debug/elf would read every section header too). head is the
// file's start; ok is false for a file that is no ELF binary or names no loader.
func elfInterpreter(fd int, head []byte) (name string, ok bool) {
	if len(head) < 64 || string(head[:4]) != elf.ELFMAG {
		return "", false
	}
	var bo binary.ByteOrder
	switch elf.Data(head[elf.EI_DATA]) {
	case elf.ELFDATA2LSB:
		bo = binary.LittleEndian
	case elf.ELFDATA2MSB:
		bo = binary.BigEndian
	default:
		return "", false
	}
	is64 := elf.Class(head[elf.EI_CLASS]) == elf.ELFCLASS64
	var phoff uint64
	var phentsize, phnum int
	if is64 {
		phoff, phentsize, phnum = bo.Uint64(head[32:]), int(bo.Uint16(head[54:])), int(bo.Uint16(head[56:]))
	} else {
		phoff, phentsize, phnum = uint64(bo.Uint32(head[28:])), int(bo.Uint16(head[42:])), int(bo.Uint16(head[44:]))
	}
	// The kernel refuses program headers past 64 KiB; so does this.
	if phentsize < 32 || phnum*phentsize > 65536 {
		return "", false
	}
	read := func(off uint64, size int) []byte {
		if off <= uint64(len(head)) && uint64(size) <= uint64(len(head))-off {
			return head[off : off+uint64(size)]
		}
		buf := make([]byte, size)
		if off > math.MaxInt64 {
			return nil
		}
		if n, err := unix.Pread(fd, buf, int64(off)); err != nil || n != size {
			return nil
		}
		return buf
	}
	phdrs := read(phoff, phnum*phentsize)
	for i := 0; i+phentsize <= len(phdrs); i += phentsize {
		ph := phdrs[i:]
		if elf.ProgType(bo.Uint32(ph)) != elf.PT_INTERP {
			continue
		}
		var off, size uint64
		if is64 {
			if phentsize < 40 {
				return "", false
			}
			off, size = bo.Uint64(ph[8:]), bo.Uint64(ph[32:])
		} else {
			off, size = uint64(bo.Uint32(ph[4:])), uint64(bo.Uint32(ph[16:]))
		}
		// The kernel takes at most PATH_MAX.
		data := read(off, int(min(size, 4096)))
		name, _, _ = strings.Cut(string(data), "\x00")
		return name, true
	}
	return "", false
}
