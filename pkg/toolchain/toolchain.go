// Package toolchain resolves a capsule's shell.allow entries on this host: a program name
// (looked up on PATH), an absolute path (a file, or a directory whose every file may run),
// or a preset naming a whole toolchain (@git, @gcc, …), which expands to every program and
// helper that toolchain execs here — found by asking the toolchain itself (git --exec-path,
// gcc -print-prog-name, go env GOTOOLDIR), never by guessing versions or architectures.
//
// Entries resolve when a session is staged, so what a session may exec is decided, recorded
// and shown (explain) before it runs, and an entry that resolves to nothing is an error then.
package toolchain

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/manifest"
)

// DefaultPath is where names are looked up: the PATH a session gets unless its manifest sets
// one, and all of it inside /usr on a merged-/usr host (what a sealed root holds).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Entry is one shell.allow entry and what it resolved to.
type Entry struct {
	Entry string
	// Files may be executed; Trees are directories whose every file may.
	Files []string
	Trees []string
	// ReadTrees are directories the toolchain reads but does not execute from: an
	// interpreter's library, a compiler's headers. A session's view of the system trees
	// holds them (filesystem.system: allowlist).
	ReadTrees []string `json:",omitempty"`
	// Path are the directories of a preset's programs that DefaultPath lacks (go.dev's
	// /usr/local/go/bin): a session that names the preset finds its programs on its PATH.
	Path []string `json:",omitempty"`
}

// Resolver resolves entries. Presets are worked out once (asking a toolchain costs a process
// start) and kept for the Resolver's life: a daemon's.
type Resolver struct {
	mu      sync.Mutex
	presets map[string]Entry
}

// NewResolver returns an empty Resolver.
func NewResolver() *Resolver { return &Resolver{presets: map[string]Entry{}} }

// CapsuleView is where a session finds its capsule's files in a sealed root; an entry
// beneath it names a file of the capsule, in whichever view the session has.
const CapsuleView = "/capsule"

// Resolve resolves every entry, looking names up on path (DefaultPath when empty). Entries
// beneath CapsuleView are checked in capsuleDir (the capsule's files on the host) and kept
// as written, for the launch to place in the session's view. An entry that resolves to
// nothing is an error naming it.
func (r *Resolver) Resolve(entries []string, path, capsuleDir string) ([]Entry, error) {
	if path == "" {
		path = DefaultPath
	}
	out := make([]Entry, 0, len(entries))
	for i, e := range entries {
		if rest, ok := strings.CutPrefix(e, CapsuleView+"/"); ok && capsuleDir != "" {
			res, err := resolvePath(filepath.Join(capsuleDir, rest))
			if err != nil {
				return nil, fmt.Errorf("capabilities.shell.allow[%d]: %q: %v: %w", i, e, err, errdefs.ErrInvalidArgument)
			}
			res.Entry = e
			for i := range res.Files {
				res.Files[i] = e
			}
			for i := range res.Trees {
				res.Trees[i] = e
			}
			out = append(out, res)
			continue
		}
		res, err := r.resolve(e, path)
		if err != nil {
			return nil, fmt.Errorf("capabilities.shell.allow[%d]: %q: %w: %w", i, e, err, errdefs.ErrInvalidArgument)
		}
		out = append(out, res)
	}
	return out, nil
}

func (r *Resolver) resolve(entry, path string) (Entry, error) {
	var e Entry
	var err error
	switch {
	case strings.HasPrefix(entry, "@"):
		return r.preset(entry)
	case filepath.IsAbs(entry):
		e, err = resolvePath(entry)
	default:
		var file string
		file, err = lookPath(entry, path)
		e = Entry{Entry: entry, Files: []string{file}}
	}
	if err != nil {
		return Entry{}, err
	}
	for _, f := range e.Files {
		e.ReadTrees = append(e.ReadTrees, r.ReadTreesOf(f)...)
	}
	return e, nil
}

// presetOf names the preset a program of this name may belong to: an interpreter or
// compiler named alone (python3, node) still needs what its toolchain reads.
func presetOf(name string) string {
	switch {
	case strings.HasPrefix(name, "python"), strings.HasPrefix(name, "pip"):
		return "@python"
	case name == "node", name == "npm", name == "npx", name == "corepack":
		return "@node"
	case name == "git":
		return "@git"
	case name == "go", name == "gofmt":
		return "@go"
	case name == "gcc", name == "cc", name == "g++", name == "c++", name == "cpp":
		return "@gcc"
	}
	return ""
}

// ReadTreesOf is what a toolchain's program reads that it does not execute (its preset's
// ReadTrees) when file is one of a preset's programs, resolved: python3 named alone reads
// the standard library as @python's does. nil for any other file.
func (r *Resolver) ReadTreesOf(file string) []string {
	name := presetOf(filepath.Base(file))
	if name == "" {
		return nil
	}
	e, err := r.preset(name)
	if err != nil {
		return nil
	}
	real, err := filepath.EvalSymlinks(file)
	if err != nil {
		return nil
	}
	for _, f := range e.Files {
		if f == file || f == real {
			return e.ReadTrees
		}
		if rf, err := filepath.EvalSymlinks(f); err == nil && rf == real {
			return e.ReadTrees
		}
	}
	return nil
}

// resolvePath resolves an absolute entry: a file that executes, or a directory.
func resolvePath(entry string) (Entry, error) {
	resolved, err := filepath.EvalSymlinks(entry)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Entry{}, errors.New("no such file or directory on this host")
		}
		return Entry{}, err
	}
	info, err := os.Stat(resolved)
	if err != nil {
		return Entry{}, err
	}
	switch {
	case info.IsDir():
		return Entry{Entry: entry, Trees: []string{resolved}}, nil
	case !info.Mode().IsRegular():
		return Entry{}, fmt.Errorf("%s is not a regular file or a directory", resolved)
	case info.Mode().Perm()&0o111 == 0:
		return Entry{}, fmt.Errorf("%s is not executable", resolved)
	}
	return Entry{Entry: entry, Files: []string{entry}}, nil
}

// ErrNotOnPath is a name lookPath found no executable for.
var ErrNotOnPath = errors.New("not found on PATH")

// lookPath finds name as a shell does: the first executable regular file on path. Its error
// names the path and, when one is within two edits, the executable name probably meant.
func lookPath(name, path string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		candidate := filepath.Join(dir, name)
		if isExecutable(candidate) {
			return candidate, nil
		}
	}
	hint := ""
	if near := manifest.Closest(name, executables(path), 2); near != "" {
		hint = fmt.Sprintf("; did you mean %q?", near)
	}
	return "", fmt.Errorf("%w (%s)%s", ErrNotOnPath, path, hint)
}

func isExecutable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0
}

// executables lists the names of the executable regular files on path, once each.
func executables(path string) []string {
	seen := map[string]bool{}
	var out []string
	for _, dir := range filepath.SplitList(path) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, ent := range ents {
			if !seen[ent.Name()] && isExecutable(filepath.Join(dir, ent.Name())) {
				seen[ent.Name()] = true
				out = append(out, ent.Name())
			}
		}
	}
	return out
}

// Presets are the toolchains a capsule may name whole.
var presets = map[string]func() (Entry, error){
	"@shell":  shellPreset,
	"@git":    gitPreset,
	"@python": pythonPreset,
	"@node":   nodePreset,
	"@go":     goPreset,
	"@gcc":    gccPreset,
	"@make":   makePreset,
}

func (r *Resolver) preset(name string) (Entry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.presets[name]; ok {
		return e, nil
	}
	build, ok := presets[name]
	if !ok {
		return Entry{}, fmt.Errorf("no such preset (roost knows %s)", strings.Join(PresetNames(), ", "))
	}
	e, err := build()
	if err != nil {
		return Entry{}, err
	}
	e.Entry = name
	slices.Sort(e.Files)
	e.Files = slices.Compact(e.Files)
	e.Path = offPath(e.Files)
	r.presets[name] = e
	return e, nil
}

// offPath lists the directories of files that DefaultPath lacks, in files' order, once each.
func offPath(files []string) []string {
	var out []string
	for _, f := range files {
		dir := filepath.Dir(f)
		if !slices.Contains(filepath.SplitList(DefaultPath), dir) && !slices.Contains(out, dir) {
			out = append(out, dir)
		}
	}
	return out
}

// SessionPath is a session's PATH: declared, the manifest's env.PATH, which it keeps; or
// DefaultPath, then the directories its presets' programs lie in off it (entries are what
// its shell.allow resolved to).
func SessionPath(declared string, entries []Entry) string {
	if declared != "" {
		return declared
	}
	path := DefaultPath
	seen := map[string]bool{}
	for _, e := range entries {
		for _, dir := range e.Path {
			if !seen[dir] {
				seen[dir] = true
				path += ":" + dir
			}
		}
	}
	return path
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// shellTools is the POSIX toolset and what scripts around it reach for: coreutils, findutils,
// grep, sed, awk, diff, tar and its compressors. Those this host lacks are left out.
var shellTools = []string{
	"sh", "bash", "dash", "env", "ls", "cat", "cp", "mv", "rm", "mkdir", "rmdir", "ln", "chmod", "touch", "head", "tail",
	"wc", "sort", "uniq", "cut", "tr", "tee", "date", "echo", "printf", "test", "[", "basename", "dirname", "readlink",
	"realpath", "stat", "du", "df", "sleep", "true", "false", "yes", "seq", "expr", "id", "whoami", "uname", "mktemp",
	"xargs", "find", "grep", "egrep", "fgrep", "sed", "awk", "gawk", "mawk", "diff", "cmp", "patch", "tar", "gzip",
	"gunzip", "zcat", "xz", "unxz", "bzip2", "bunzip2", "nproc", "which", "od", "sha256sum", "md5sum", "base64",
	"timeout", "nice", "kill", "ps", "comm", "join", "paste", "split", "fold", "fmt", "nl", "rev", "tac", "install",
	"file", "less", "more",
}

// programs looks each name up on DefaultPath and keeps those found; at least the first must be.
func programs(names ...string) ([]string, error) {
	var out []string
	for i, n := range names {
		p, err := lookPath(n, DefaultPath)
		if err != nil {
			if i == 0 {
				return nil, fmt.Errorf("%s: %v", n, err)
			}
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

func shellPreset() (Entry, error) {
	files, err := programs(shellTools...)
	return Entry{Files: files}, err
}

func makePreset() (Entry, error) {
	files, err := programs("make")
	return Entry{Files: files}, err
}

// ask runs a toolchain's own program and returns its first line of output.
func ask(name string, args ...string) (string, error) {
	lines, err := askAll(name, args...)
	if err != nil || len(lines) == 0 {
		return "", err
	}
	return lines[0], nil
}

// askAll runs a toolchain's own program and returns its lines of output, trimmed.
func askAll(name string, args ...string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = []string{"PATH=" + DefaultPath, "LC_ALL=C"}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

// gitPreset is git and every helper it execs (git-core: git-remote-http, git-upload-pack, …),
// with the templates git init copies.
func gitPreset() (Entry, error) {
	files, err := programs("git", "git-upload-pack", "git-receive-pack", "git-upload-archive", "ssh")
	if err != nil {
		return Entry{}, err
	}
	core, err := ask(files[0], "--exec-path")
	if err != nil {
		return Entry{}, err
	}
	// git's data directory (the templates git init copies) is share/git-core under the
	// prefix its exec-path (lib/git-core or libexec/git-core) lies in.
	prefix := filepath.Dir(filepath.Dir(core))
	return Entry{Files: files, Trees: []string{core}, ReadTrees: dirs([]string{filepath.Join(prefix, "share", "git-core")})}, nil
}

// pythonPreset is the interpreter (what python3 resolves to, which a venv's python links to)
// and pip.
func pythonPreset() (Entry, error) {
	files, err := programs("python3", "pip3", "pip")
	if err != nil {
		return Entry{}, err
	}
	real, err := filepath.EvalSymlinks(files[0])
	if err != nil {
		return Entry{}, err
	}
	// sys.path as the interpreter has it: its standard library, lib-dynload, and the
	// site-packages directories pip is imported from.
	// ensurepip (python3 -m venv) installs pip from the wheels where the distribution keeps
	// them (WHEEL_PKG_DIR), when it set one.
	paths, err := askAll(files[0], "-I", "-c", "import sys, sysconfig; print('\\n'.join([p for p in sys.path if p] + [sysconfig.get_config_var('WHEEL_PKG_DIR') or '']))")
	if err != nil {
		return Entry{}, err
	}
	return Entry{Files: append(files, real), ReadTrees: dirs(paths)}, nil
}

// nodePreset is node and its package manager (npm and npx are scripts node runs), with the
// directories node loads modules from: its global paths, and the module directory each of
// those scripts' packages lies in (npm's dependencies are its neighbours there).
func nodePreset() (Entry, error) {
	files, err := programs("node", "npm", "npx", "corepack")
	if err != nil {
		return Entry{}, err
	}
	paths, err := askAll(files[0], "-e", "console.log(require('module').globalPaths.join('\\n'))")
	if err != nil {
		return Entry{}, err
	}
	for _, f := range files[1:] {
		if dir := ModulesDir(f); dir != "" {
			paths = append(paths, dir)
		}
	}
	return Entry{Files: files, ReadTrees: dirs(paths)}, nil
}

// ModulesDir is the directory of Node packages a script lies in, "" for a file that is not
// part of a package: where node finds the script's dependencies (its package's
// node_modules, and the packages beside it, as npm installs them globally).
func ModulesDir(file string) string {
	real, err := filepath.EvalSymlinks(file)
	if err != nil {
		return ""
	}
	for dir := filepath.Dir(real); dir != "/" && dir != "."; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "package.json")); err == nil {
			parent := filepath.Dir(dir)
			// A scoped package (@scope/name) lies one directory deeper.
			if strings.HasPrefix(filepath.Base(parent), "@") {
				parent = filepath.Dir(parent)
			}
			return parent
		}
	}
	return ""
}

// goInstall is where go.dev's release tarballs put the go command.
const goInstall = "/usr/local/go/bin"

// goPreset is the go command, gofmt, and the tool directory go build runs its compiler,
// linker and vet from.
func goPreset() (Entry, error) {
	// go.dev's tarballs install to /usr/local/go, off the default PATH (a session naming
	// @go gets /usr/local/go/bin on its own: see Entry.Path).
	goBin, err := lookPath("go", DefaultPath+":"+goInstall)
	if err != nil {
		return Entry{}, fmt.Errorf("go: %v", err)
	}
	files := []string{goBin}
	if gofmt, err := lookPath("gofmt", filepath.Dir(goBin)); err == nil {
		files = append(files, gofmt)
	}
	tools, err := ask(files[0], "env", "GOTOOLDIR")
	if err != nil {
		return Entry{}, err
	}
	// The standard library's sources and the toolchain's own packages.
	root, err := ask(files[0], "env", "GOROOT")
	if err != nil {
		return Entry{}, err
	}
	return Entry{Files: files, Trees: []string{tools}, ReadTrees: dirs([]string{root})}, nil
}

// gccPreset is the compiler drivers, the directory of the programs they run (cc1,
// collect2, lto-wrapper: gcc -print-prog-name=cc1's), and the assembler and linker.
func gccPreset() (Entry, error) {
	files, err := programs("gcc", "cc", "g++", "c++", "cpp")
	if err != nil {
		return Entry{}, err
	}
	var trees []string
	if cc1, err := ask(files[0], "-print-prog-name=cc1"); err == nil && filepath.IsAbs(cc1) {
		trees = append(trees, filepath.Dir(cc1))
	}
	if len(trees) == 0 {
		return Entry{}, errors.New("gcc does not say where cc1 is (gcc -print-prog-name=cc1)")
	}
	for _, tool := range []string{"as", "ld"} {
		name, err := ask(files[0], "-print-prog-name="+tool)
		if err != nil {
			continue
		}
		if !filepath.IsAbs(name) {
			if p, err := lookPath(name, DefaultPath); err == nil {
				name = p
			}
		}
		if filepath.IsAbs(name) {
			files = append(files, name)
			// ld is often a link to ld.bfd or ld.gold, which exec sees as themselves.
			if real, err := filepath.EvalSymlinks(name); err == nil && real != name {
				files = append(files, real)
			}
		}
	}
	return Entry{Files: files, Trees: trees, ReadTrees: gccReadTrees(files[0])}, nil
}

// gccReadTrees are what a compile and link read: gcc's own directory (crt files, libgcc,
// its headers), the system headers, and the multiarch library directories the linker
// searches (gcc -print-search-dirs). A library directory holding every other tree
// (/usr/lib, /lib) is left out: it would bring all of the host's programs into view.
func gccReadTrees(gcc string) []string {
	var out []string
	if install, err := askAll(gcc, "-print-search-dirs"); err == nil {
		for _, line := range install {
			key, val, ok := strings.Cut(line, ": ")
			if !ok {
				continue
			}
			switch key {
			case "install":
				out = append(out, val)
			case "libraries":
				for _, d := range filepath.SplitList(strings.TrimPrefix(val, "=")) {
					d = filepath.Clean(d)
					if d != "/lib" && d != "/usr/lib" && d != "/usr/lib64" && d != "/lib64" {
						out = append(out, d)
					}
				}
			}
		}
	}
	out = append(out, "/usr/include", "/usr/local/include")
	return dirs(out)
}

// dirs keeps the directories of paths that exist, resolved, sorted, once each.
func dirs(paths []string) []string {
	var out []string
	for _, p := range paths {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			continue
		}
		if info, err := os.Stat(real); err == nil && info.IsDir() {
			out = append(out, real)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Beneath says whether path is root or lies beneath it.
func Beneath(path, root string) bool {
	return path == root || strings.HasPrefix(path, strings.TrimSuffix(root, "/")+"/")
}

// Covers says whether what parent resolved to holds everything child resolved to: every
// file and tree of the child equals or lies beneath a file or tree of the parent's.
func Covers(parent, child []Entry) (string, bool) {
	var files, trees []string
	for _, e := range parent {
		files = append(files, e.Files...)
		trees = append(trees, e.Trees...)
	}
	within := func(p string) bool {
		if slices.Contains(files, p) {
			return true
		}
		return slices.ContainsFunc(trees, func(t string) bool { return Beneath(p, t) })
	}
	for _, e := range child {
		for _, p := range append(slices.Clone(e.Files), e.Trees...) {
			if !within(p) {
				return fmt.Sprintf("%s (from %q)", p, e.Entry), false
			}
		}
	}
	return "", true
}
