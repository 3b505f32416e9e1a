package plan

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/sysview"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/toolchain"
)

// SystemInput is what a session's view of the host's system trees is worked out from.
type SystemInput struct {
	// Command is the session's command as recorded: a capsule's file on its host path, an
	// absolute path, or a name looked up on Path.
	Command []string
	Path    string
	// Shell is what its shell.allow resolved to; CapsuleDir where its capsule's files are on
	// the host (shell.allow names them beneath toolchain.CapsuleView).
	Shell      []toolchain.Entry
	CapsuleDir string
	// Runner is roost-wasm on the host, for a WASM session: it runs, the module does not.
	Runner string
	Policy *manifest.Policy
	// ReadTreesOf is what a toolchain's program reads beyond itself (toolchain's
	// Resolver.ReadTreesOf): a command of python3 alone reads its standard library.
	ReadTreesOf func(file string) []string
}

// SystemWant is what a session's allowlist asks of the host's system trees: its program (or
// a WASM session's runner), what shell.allow resolved to, the module trees its Node scripts
// load from, and the operator's host_read beneath the system trees.
func SystemWant(in SystemInput) sysview.Want {
	var w sysview.Want
	host := func(p string) string {
		if rest, ok := strings.CutPrefix(p, toolchain.CapsuleView+"/"); ok && in.CapsuleDir != "" {
			return filepath.Join(in.CapsuleDir, rest)
		}
		return p
	}
	file := func(p string) {
		w.Files = append(w.Files, p)
		// A script of a Node package (claude, codex, npm) loads the packages beside it.
		if dir := toolchain.ModulesDir(p); dir != "" {
			w.ReadTrees = append(w.ReadTrees, dir)
		}
	}
	switch {
	case in.Runner != "":
		file(in.Runner)
	case len(in.Command) > 0:
		if prog := lookPath(in.Command[0], in.Path); prog != "" {
			file(prog)
			if in.ReadTreesOf != nil {
				w.ReadTrees = append(w.ReadTrees, in.ReadTreesOf(prog)...)
			}
		}
	}
	for _, e := range in.Shell {
		for _, f := range e.Files {
			file(host(f))
		}
		for _, t := range e.Trees {
			w.ExecTrees = append(w.ExecTrees, host(t))
		}
		w.ReadTrees = append(w.ReadTrees, e.ReadTrees...)
	}
	if in.Policy != nil {
		for _, h := range in.Policy.Filesystem.HostRead {
			if sysview.System(h) {
				w.ReadTrees = append(w.ReadTrees, h)
			}
		}
	}
	return w
}

// lookPath finds a command's program as the session will: a path as it is, a name on path.
func lookPath(name, path string) string {
	if strings.Contains(name, "/") {
		return name
	}
	if path == "" {
		path = containment.DefaultPath
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if info, err := os.Stat(p); err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// System is what of the host's system trees a session of the plan would see, as explain
// shows it: the closure of its allowlist (worked out here, as its launch will) or, with
// filesystem.system: full, all of them.
func (pl *Planner) System(p *Plan, class manifest.Class, argv []string) *roostv1.SystemView {
	sv := &roostv1.SystemView{Mode: p.Policy.Filesystem.System, Holds: containment.SystemHolds(class, &p.Policy)}
	if sv.Mode == "" {
		sv.Mode = manifest.SystemAllowlist
	}
	if !Viewed(class, &p.Policy) {
		return sv
	}
	path := toolchain.SessionPath(p.Manifest.Env["PATH"], p.Shell)
	c, err := pl.Closure(SystemWant(SystemInput{
		Command: argv, Path: path, Shell: p.Shell, CapsuleDir: p.Ref.Root(), Policy: &p.Policy,
		ReadTreesOf: pl.tools.ReadTreesOf,
	}), path, false)
	if err != nil {
		sv.Missing = append(sv.Missing, "the closure cannot be worked out: "+err.Error())
		return sv
	}
	sv.Files, sv.Trees, sv.Missing, sv.Digest = c.Files, c.Trees, c.Missing, c.Digest
	return sv
}

// Viewed says whether a session of class with policy p sees only its allowlist's closure
// of the system trees: a contained one whose capsule does not ask for all of them.
func Viewed(class manifest.Class, p *manifest.Policy) bool {
	return (class == manifest.Scoped || class == manifest.Sealed) && p.Filesystem.System != manifest.SystemFull
}

// Command is the program's command line: run.command (or run.wasm's module) then run.args.
// A program named by a relative path with a slash (bin/agent) lives in the capsule directory,
// as a module always does. So does an argument after it that starts with ./ or ../ and names
// a file or directory of the capsule (python3 ./app.py): the program's working directory is
// the session's workdir, which does not hold the capsule's files, so read from there the
// argument would name nothing. One that names nothing in the capsule (an output file, say)
// or would lead out of it is the program's to read, from its workdir.
func Command(capsuleDir string, run manifest.Run) []string {
	if run.Wasm != "" {
		return append([]string{filepath.Join(capsuleDir, run.Wasm)}, run.Args...)
	}
	argv := append(append([]string{}, run.Command...), run.Args...)
	if !filepath.IsAbs(argv[0]) && strings.Contains(argv[0], "/") {
		argv[0] = filepath.Join(capsuleDir, argv[0])
	}
	for i := 1; i < len(argv); i++ {
		if p, ok := inCapsule(capsuleDir, argv[i]); ok {
			argv[i] = p
		}
	}
	return argv
}

// inCapsule is arg as a path of the capsule directory, when it is written relative to the
// current directory (./ or ../) and names something there without leading out of it.
func inCapsule(capsuleDir, arg string) (string, bool) {
	if capsuleDir == "" || !strings.HasPrefix(arg, "./") && !strings.HasPrefix(arg, "../") {
		return "", false
	}
	p := filepath.Join(capsuleDir, arg)
	if !strings.HasPrefix(p, filepath.Clean(capsuleDir)+"/") {
		return "", false
	}
	if _, err := os.Lstat(p); err != nil {
		return "", false
	}
	return p, true
}

// closureTTL is how long a closure worked out serves the launches that ask the same of the
// system trees: working one out again reads every file it holds (a millisecond for a
// program alone, several for @python @git @gcc), which a warm start cannot pay each time.
// A package upgraded meanwhile reaches the sessions launched after it.
const closureTTL = 30 * time.Second

// maxClosuresKept bounds the closures remembered: past it, the memory starts over.
const maxClosuresKept = 256

type closureEntry struct {
	c  *sysview.Closure
	at time.Time
}

// closures remembers the closures worked out lately, by what was asked.
type closures struct {
	mu      sync.Mutex
	entries map[string]closureEntry
}

// Closure is the closure of w on this host, path where its #!/usr/bin/env scripts' programs
// are looked up: worked out afresh when fresh says so, or none asked the same within
// closureTTL.
func (pl *Planner) Closure(w sysview.Want, path string, fresh bool) (*sysview.Closure, error) {
	key := strings.Join(w.Files, "\x00") + "\x01" + strings.Join(w.ExecTrees, "\x00") + "\x01" + strings.Join(w.ReadTrees, "\x00") + "\x01" + path
	now := time.Now()
	pl.closures.mu.Lock()
	e, ok := pl.closures.entries[key]
	pl.closures.mu.Unlock()
	if ok && !fresh && now.Sub(e.at) < closureTTL {
		return e.c, nil
	}
	c, err := sysview.Resolve(w, sysview.Options{Path: path, Cache: pl.system})
	if err != nil {
		return nil, err
	}
	pl.closures.mu.Lock()
	defer pl.closures.mu.Unlock()
	if pl.closures.entries == nil || len(pl.closures.entries) >= maxClosuresKept {
		pl.closures.entries = map[string]closureEntry{}
	}
	pl.closures.entries[key] = closureEntry{c: c, at: now}
	return c, nil
}
