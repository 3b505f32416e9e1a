package sysview

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
)

// fakeRoot lays out a small merged-/usr system beneath a temporary directory, every ELF
// file written by fakeELF: prog finds its libraries through DT_RUNPATH with $ORIGIN, the
// cache, the default directories of a multiarch triple only the cache names, $LIB,
// $PLATFORM and a glibc-hwcaps subdirectory, past a library of the wrong class.
func fakeRoot(t testing.TB) string {
	root := t.TempDir()
	lib := func(needed ...string) []byte { return fakeELF{needed: needed}.bytes() }
	tree(t, root, map[string]any{
		"bin":   "->usr/bin",
		"lib":   "->usr/lib",
		"lib64": "->usr/lib64",
		"usr/bin/prog": fakeELF{
			interp:  "/lib64/ld-fake.so.2",
			needed:  []string{"liba.so.1", "libb.so.1", "libd.so.1", "libnone.so.1"},
			runpath: "$ORIGIN/../lib/prog",
		}.bytes(),
		"usr/bin/tool":                                              []byte("#!/usr/bin/env prog\n"),
		"usr/bin/script":                                            []byte("#!/bin/sh -e\necho hi\n"),
		"usr/bin/sh":                                                "->dash",
		"usr/bin/dash":                                              lib(),
		"usr/bin/env":                                               lib(),
		"usr/lib64/ld-fake.so.2":                                    "->/lib/x86_64-linux-gnu/ld-fake.so.2",
		"usr/lib/x86_64-linux-gnu/ld-fake.so.2":                     lib(),
		"usr/lib/prog/liba.so.1":                                    lib("libc.so.6"),
		"usr/lib/prog/libb.so.1":                                    fakeELF{class: elf.ELFCLASS32, machine: elf.EM_386}.bytes(),
		"usr/lib/x86_64-linux-gnu/libb.so.1":                        "->libb.so.1.0",
		"usr/lib/x86_64-linux-gnu/libb.so.1.0":                      lib("libc.so.6"),
		"usr/lib/x86_64-linux-gnu/libc.so.6":                        lib(),
		"usr/lib/x86_64-linux-gnu/libd.so.1":                        fakeELF{needed: []string{"libe.so.1"}, runpath: "/$LIB/d"}.bytes(),
		"usr/lib/x86_64-linux-gnu/d/libe.so.1":                      fakeELF{needed: []string{"libf.so.1"}, rpath: "/opt/${PLATFORM}"}.bytes(),
		"opt/x86_64/libf.so.1":                                      lib(),
		"usr/lib/x86_64-linux-gnu/gconv/MOD.so":                     lib("libgconvdep.so.1"),
		"usr/lib/x86_64-linux-gnu/libgconvdep.so.1":                 lib(),
		"usr/lib/x86_64-linux-gnu/libnss_files.so.2":                lib("libc.so.6"),
		"usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libb.so.1": lib("libc.so.6"),
		"usr/share/zoneinfo/UTC":                                    []byte("TZif"),
		"etc/nsswitch.conf":                                         []byte("passwd: files [NOTFOUND=return] fake\nhosts: files dns # comment\n"),
		"etc/ld.so.cache": ldCacheBytes([]testCacheEntry{
			{"libc.so.6", 0x0303, "/lib/x86_64-linux-gnu/libc.so.6", 0},
			{"libc.so.6", 0x0803, "/usr/libx32/libc.so.6", 0},
			{"libnss_files.so.2", 0x0303, "/lib/x86_64-linux-gnu/libnss_files.so.2", 0},
		}),
	})
	return root
}

func fakeWant() Want {
	return Want{Files: []string{"/usr/bin/prog", "/usr/bin/tool", "/bin/script"}}
}

func fakeOptions(root string) Options {
	return Options{Root: root, Path: "/usr/bin", DataTrees: []string{"/usr/share/zoneinfo", "/usr/share/absent"}}
}

func TestResolveFollowsTheLoadersSearch(t *testing.T) {
	root := fakeRoot(t)
	c, err := Resolve(fakeWant(), fakeOptions(root))
	if err != nil {
		t.Fatal(err)
	}
	wantFiles := []string{
		"/opt/x86_64/libf.so.1",
		"/usr/bin/dash",
		"/usr/bin/env",
		"/usr/bin/prog",
		"/usr/bin/script",
		"/usr/bin/tool",
		"/usr/lib/prog/liba.so.1",
		"/usr/lib/x86_64-linux-gnu/d/libe.so.1",
		"/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libb.so.1",
		"/usr/lib/x86_64-linux-gnu/ld-fake.so.2",
		"/usr/lib/x86_64-linux-gnu/libb.so.1.0",
		"/usr/lib/x86_64-linux-gnu/libc.so.6",
		"/usr/lib/x86_64-linux-gnu/libd.so.1",
		"/usr/lib/x86_64-linux-gnu/libgconvdep.so.1",
		"/usr/lib/x86_64-linux-gnu/libnss_files.so.2",
	}
	if !slices.Equal(c.Files, wantFiles) {
		t.Errorf("Files:\n got %q\nwant %q", c.Files, wantFiles)
	}
	wantLinks := map[string]string{
		"/bin":                                "usr/bin",
		"/lib":                                "usr/lib",
		"/lib64":                              "usr/lib64",
		"/usr/bin/sh":                         "dash",
		"/usr/lib64/ld-fake.so.2":             "/lib/x86_64-linux-gnu/ld-fake.so.2",
		"/usr/lib/x86_64-linux-gnu/libb.so.1": "libb.so.1.0",
	}
	if !maps.Equal(c.Links, wantLinks) {
		t.Errorf("Links:\n got %q\nwant %q", c.Links, wantLinks)
	}
	wantTrees := []string{"/usr/lib/x86_64-linux-gnu/gconv", "/usr/share/zoneinfo"}
	if !slices.Equal(c.Trees, wantTrees) {
		t.Errorf("Trees: got %q, want %q", c.Trees, wantTrees)
	}
	if want := []string{"libnone.so.1 (needed by /usr/bin/prog)"}; !slices.Equal(c.Missing, want) {
		t.Errorf("Missing: got %q, want %q", c.Missing, want)
	}
	if len(c.Outside) != 0 || len(c.Skipped) != 0 {
		t.Errorf("Outside %q, Skipped %q: want none", c.Outside, c.Skipped)
	}
	for p, why := range map[string]string{
		"/usr/bin/prog":                          "allowed",
		"/usr/lib/x86_64-linux-gnu/ld-fake.so.2": "ELF interpreter of /usr/bin/prog",
		"/usr/bin/dash":                          "#! interpreter of /usr/bin/script",
		"/usr/lib/x86_64-linux-gnu/d/libe.so.1":  "needed by /usr/lib/x86_64-linux-gnu/libd.so.1",
		"/usr/lib/x86_64-linux-gnu/gconv":        "gconv modules of /usr/lib/x86_64-linux-gnu/libc.so.6",
	} {
		if c.Why[p] != why {
			t.Errorf("Why[%s] = %q, want %q", p, c.Why[p], why)
		}
	}
	if c.Root != root || len(c.Digest) != 64 {
		t.Errorf("Root %q, Digest %q", c.Root, c.Digest)
	}
}

// The links a closure records reproduce every path it was asked for: followed through
// Links alone, each ends at one of Files.
func TestLinksReproduceThePaths(t *testing.T) {
	root := fakeRoot(t)
	c, err := Resolve(fakeWant(), fakeOptions(root))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/lib64/ld-fake.so.2", "/bin/script", "/bin/sh", "/lib/x86_64-linux-gnu/libb.so.1"} {
		got := followLinks(t, c.Links, p)
		if !slices.Contains(c.Files, got) {
			t.Errorf("%s leads through Links to %s, not one of Files", p, got)
		}
	}
}

// followLinks resolves p as the kernel would on a tree holding only links.
func followLinks(t *testing.T, links map[string]string, p string) string {
	t.Helper()
	cur := "/"
	rest := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for hops := 0; len(rest) > 0; {
		comp := rest[0]
		rest = rest[1:]
		next := filepath.Join(cur, comp)
		target, ok := links[next]
		if !ok {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			t.Fatalf("%s: a loop in Links", p)
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(strings.Trim(target, "/"), "/"), rest...)
	}
	return cur
}

func TestDigest(t *testing.T) {
	root := fakeRoot(t)
	resolve := func() *Closure {
		t.Helper()
		c, err := Resolve(fakeWant(), fakeOptions(root))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	first := resolve()
	if again := resolve(); again.Digest != first.Digest {
		t.Fatalf("the digest changed with nothing changed: %s, then %s", first.Digest, again.Digest)
	}
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu/libb.so.1.0")
	when := time.Now().Add(-time.Hour)
	if err := os.Chtimes(lib, when, when); err != nil {
		t.Fatal(err)
	}
	touched := resolve()
	if touched.Digest == first.Digest {
		t.Fatal("the digest did not change with a library's mtime")
	}
	// A library replaced by another file (a package upgrade) changes it too.
	data, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib+".new", data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(lib+".new", when, when); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(lib+".new", lib); err != nil {
		t.Fatal(err)
	}
	if replaced := resolve(); replaced.Digest == touched.Digest {
		t.Fatal("the digest did not change with a library's inode")
	}
}

func TestResolveErrors(t *testing.T) {
	root := fakeRoot(t)
	tree(t, root, map[string]any{
		"usr/bin/broken": fakeELF{needed: []string{"libc.so.6"}}.bytes()[:100],
		"usr/bin/dir":    "/",
	})
	for _, tc := range []struct {
		w    Want
		want string
	}{
		{Want{Files: []string{"/usr/bin/absent"}}, "/usr/bin/absent"},
		{Want{Files: []string{"/usr/bin/dir"}}, "/usr/bin/dir is not a regular file"},
		{Want{Files: []string{"/usr/bin/broken"}}, "/usr/bin/broken: "},
		{Want{Files: []string{"relative"}}, "relative: not an absolute path"},
		{Want{ExecTrees: []string{"/usr/absent"}}, "exec tree /usr/absent"},
		{Want{ReadTrees: []string{"/usr/bin/prog"}}, "read tree /usr/bin/prog is not a directory"},
	} {
		_, err := Resolve(tc.w, fakeOptions(root))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got error %v, want one containing %q", tc.w, err, tc.want)
		}
	}
}

// Files outside the system trees are followed but left to the caller; trees hold their
// files, and a tree's links to elsewhere bring their targets in.
func TestResolveTreesAndOutside(t *testing.T) {
	root := fakeRoot(t)
	tree(t, root, map[string]any{
		"capsule/run":                          []byte("#!/usr/bin/prog\n"),
		"usr/libexec/tool/helper":              fakeELF{interp: "/lib64/ld-fake.so.2", needed: []string{"libhelper.so.1"}}.bytes(),
		"usr/libexec/tool/script":              []byte("#!/bin/sh\n"),
		"usr/libexec/tool/noInterp":            []byte("#!\n"),
		"usr/libexec/tool/bad":                 []byte("\x7fELF\x02\x01\x01"),
		"usr/libexec/tool/link":                "->../../lib/x86_64-linux-gnu/libgconvdep.so.1",
		"usr/libexec/tool/dangling":            "->nowhere",
		"usr/libexec/tool/lib/libhelper.so.1":  fakeELF{needed: []string{"libc.so.6"}}.bytes(),
		"usr/libexec/tool/sub":                 "->lib",
		"usr/share/mods/mod.so":                fakeELF{needed: []string{"libmod.so.1"}}.bytes(),
		"usr/share/mods/other-arch.so":         fakeELF{class: elf.ELFCLASS32, machine: elf.EM_386, needed: []string{"libx.so.1"}}.bytes(),
		"usr/share/mods/script.py":             []byte("#!/usr/bin/absent\n"),
		"usr/lib/x86_64-linux-gnu/libmod.so.1": fakeELF{}.bytes(),
	})
	w := Want{
		Files:     []string{"/capsule/run"},
		ExecTrees: []string{"/usr/libexec/tool"},
		ReadTrees: []string{"/usr/share/mods"},
	}
	o := fakeOptions(root)
	o.Path = "/usr/libexec/tool/lib"
	c, err := Resolve(w, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"/usr/bin/prog", "/usr/lib/x86_64-linux-gnu/libmod.so.1", "/usr/lib/x86_64-linux-gnu/libgconvdep.so.1"} {
		if !slices.Contains(c.Files, f) {
			t.Errorf("%s is not in Files %q", f, c.Files)
		}
	}
	// A tree's script brings no interpreter: it runs only with one the allowlist names.
	if slices.Contains(c.Files, "/usr/bin/dash") {
		t.Errorf("the exec tree's #!/bin/sh script brought /bin/sh in: %q", c.Files)
	}
	for _, f := range c.Files {
		if beneath(f, "/usr/libexec/tool") || beneath(f, "/usr/share/mods") {
			t.Errorf("%s, in a tree, is in Files", f)
		}
	}
	for l := range c.Links {
		if beneath(l, "/usr/libexec/tool") {
			t.Errorf("link %s, in a tree, is in Links", l)
		}
	}
	if want := []string{"/capsule/run"}; !slices.Equal(c.Outside, want) {
		t.Errorf("Outside: got %q, want %q", c.Outside, want)
	}
	for _, tr := range []string{"/usr/libexec/tool", "/usr/share/mods"} {
		if !slices.Contains(c.Trees, tr) {
			t.Errorf("%s is not in Trees %q", tr, c.Trees)
		}
	}
	// The 32-bit module is of no machine a program here runs as: nothing of it is
	// followed; the read tree's script is not run.
	for _, m := range c.Missing {
		if strings.Contains(m, "libx.so.1") || strings.Contains(m, "absent") {
			t.Errorf("Missing holds %q", m)
		}
	}
	wantSkipped := []string{"/usr/libexec/tool/bad: ELF header truncated"}
	if !slices.Equal(c.Skipped, wantSkipped) {
		t.Errorf("Skipped: got %q, want %q", c.Skipped, wantSkipped)
	}
}

func TestEnvProgram(t *testing.T) {
	for arg, want := range map[string]string{
		"python3":              "python3",
		"python3 -u":           "python3 -u",
		"-S python3 -u":        "python3",
		"-S -i A=1 -u X node":  "node",
		"-Spython3":            "python3",
		"-i":                   "",
		"":                     "",
		"-S":                   "",
		"-S --chdir /tmp perl": "perl",
	} {
		if got := envProgram(arg); got != want {
			t.Errorf("envProgram(%q) = %q, want %q", arg, got, want)
		}
	}
}

func TestCacheKeepsResultsUntilFilesChange(t *testing.T) {
	root := fakeRoot(t)
	o := fakeOptions(root)
	o.Cache = NewCache()
	cold, err := Resolve(fakeWant(), o)
	if err != nil {
		t.Fatal(err)
	}
	warm, err := Resolve(fakeWant(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cold.Files, warm.Files) || cold.Digest != warm.Digest {
		t.Fatalf("a warm Resolve differs: %q / %q", cold.Files, warm.Files)
	}
	// prog changed: it needs libgconvdep now, which a stale cache entry would miss.
	prog := filepath.Join(root, "usr/bin/prog")
	if err := os.WriteFile(prog, fakeELF{interp: "/lib64/ld-fake.so.2", needed: []string{"libgconvdep.so.1"}}.bytes(), 0o755); err != nil {
		t.Fatal(err)
	}
	changed, err := Resolve(fakeWant(), o)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(changed.Files, "/usr/lib/prog/liba.so.1") {
		t.Errorf("the cache kept prog's old needs: %q", changed.Files)
	}
}

// hostFile skips (or, on CI, fails) a test needing p on this host.
func hostFile(t *testing.T, p string) {
	t.Helper()
	_, err := os.Stat(p)
	testenv.Need(t, p, err)
}

// lddLibraries are the libraries ldd lists for p, canonical: what the loader itself maps.
func lddLibraries(t *testing.T, p string) []string {
	t.Helper()
	out, err := exec.Command("ldd", p).Output()
	testenv.Need(t, "ldd", err)
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		var lib string
		switch {
		case len(fields) >= 3 && fields[1] == "=>" && strings.HasPrefix(fields[2], "/"):
			lib = fields[2]
		case len(fields) >= 1 && strings.HasPrefix(fields[0], "/"):
			lib = fields[0]
		default:
			continue
		}
		canon, err := filepath.EvalSymlinks(lib)
		if err != nil {
			t.Fatal(err)
		}
		libs = append(libs, canon)
	}
	return libs
}

func interpOf(t *testing.T, p string) string {
	t.Helper()
	f, err := elf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			return strings.TrimRight(string(b), "\x00")
		}
	}
	t.Fatalf("%s names no loader", p)
	return ""
}

func TestResolveGitOnThisHost(t *testing.T) {
	hostFile(t, "/usr/bin/git")
	c, err := Resolve(Want{Files: []string{"/usr/bin/git"}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	has := func(base string) bool {
		return slices.ContainsFunc(c.Files, func(f string) bool { return strings.HasPrefix(filepath.Base(f), base) })
	}
	for _, lib := range []string{"libc.so.6", "libpcre2-8.so", "libz.so", "libnss_files.so.2", "libgcc_s.so.1"} {
		if !has(lib) {
			t.Errorf("no %s in Files %q", lib, c.Files)
		}
	}
	loader := interpOf(t, "/usr/bin/git")
	canon, err := filepath.EvalSymlinks(loader)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(c.Files, canon) {
		t.Errorf("the loader %s (%s) is not in Files", loader, canon)
	}
	if got := followLinks(t, c.Links, loader); got != canon {
		t.Errorf("%s through Links leads to %s, want %s", loader, got, canon)
	}
	if target, err := os.Readlink("/lib64"); err == nil && loader == "/lib64/ld-linux-x86-64.so.2" {
		if c.Links["/lib64"] != target {
			t.Errorf("Links[/lib64] = %q, want %q", c.Links["/lib64"], target)
		}
		want, _ := os.Readlink("/usr/lib64/ld-linux-x86-64.so.2")
		if c.Links["/usr/lib64/ld-linux-x86-64.so.2"] != want {
			t.Errorf("Links[/usr/lib64/ld-linux-x86-64.so.2] = %q, want %q", c.Links["/usr/lib64/ld-linux-x86-64.so.2"], want)
		}
	}
	for _, lib := range lddLibraries(t, "/usr/bin/git") {
		if !slices.Contains(c.Files, lib) {
			t.Errorf("ldd maps %s for git; it is not in Files", lib)
		}
	}
	if len(c.Missing) != 0 {
		t.Errorf("Missing: %q", c.Missing)
	}
}

// What the loader maps for each program of the presets (ldd, which runs it) is in the
// closure Resolve works out without running anything.
func TestResolveCoversLdd(t *testing.T) {
	w := presetWant(t)
	c, err := Resolve(w, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var progs []string
	progs = append(progs, w.Files...)
	for _, dir := range w.ExecTrees {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			if f, err := elf.Open(p); err == nil {
				if f.Type == elf.ET_EXEC || f.Type == elf.ET_DYN {
					progs = append(progs, p)
				}
				f.Close()
			}
		}
	}
	if len(progs) < 10 {
		t.Fatalf("only %d programs to check: %q", len(progs), progs)
	}
	for _, p := range progs {
		for _, lib := range lddLibraries(t, p) {
			if !slices.Contains(c.Files, lib) && !slices.ContainsFunc(c.Trees, func(tr string) bool { return beneath(lib, tr) }) {
				t.Errorf("ldd maps %s for %s; the closure lacks it", lib, p)
			}
		}
	}
}

func TestResolvePythonStdlib(t *testing.T) {
	hostFile(t, "/usr/bin/python3")
	stdlib := pythonStdlib(t)
	c, err := Resolve(Want{Files: []string{"/usr/bin/python3"}, ReadTrees: []string{stdlib}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ssl, _ := filepath.Glob(filepath.Join(stdlib, "lib-dynload", "_ssl.*.so"))
	if len(ssl) == 0 {
		testenv.Need(t, "python's _ssl extension module", fmt.Errorf("none in %s/lib-dynload", stdlib))
	}
	for _, lib := range lddLibraries(t, ssl[0]) {
		if !slices.Contains(c.Files, lib) {
			t.Errorf("%s needs %s; it is not in Files", ssl[0], lib)
		}
	}
	if !slices.ContainsFunc(c.Files, func(f string) bool { return strings.HasPrefix(filepath.Base(f), "libssl.so") }) {
		t.Errorf("no libssl in Files %q", c.Files)
	}
	canonStdlib, _ := filepath.EvalSymlinks(stdlib)
	if !slices.Contains(c.Trees, canonStdlib) {
		t.Errorf("%s is not in Trees %q", canonStdlib, c.Trees)
	}
	if target, err := os.Readlink("/usr/bin/python3"); err == nil && c.Links["/usr/bin/python3"] != target {
		t.Errorf("Links[/usr/bin/python3] = %q, want %q", c.Links["/usr/bin/python3"], target)
	}
	for _, f := range c.Files {
		for _, tr := range c.Trees {
			if beneath(f, tr) {
				t.Errorf("%s lies in the tree %s", f, tr)
			}
		}
	}
}

func TestResolveEnvScriptOnThisHost(t *testing.T) {
	hostFile(t, "/usr/bin/env")
	python := ""
	for _, dir := range filepath.SplitList(DefaultPath) {
		if _, err := os.Stat(filepath.Join(dir, "python3")); err == nil {
			python = filepath.Join(dir, "python3")
			break
		}
	}
	if python == "" {
		testenv.Need(t, "python3 on "+DefaultPath, os.ErrNotExist)
	}
	canonPython, _ := filepath.EvalSymlinks(python)
	canonEnv, _ := filepath.EvalSymlinks("/usr/bin/env")
	dir := t.TempDir()
	for i, line := range []string{"#!/usr/bin/env python3\n", "#!/usr/bin/env -S python3 -u\n"} {
		script := filepath.Join(dir, "s"+string(rune('0'+i)))
		if err := os.WriteFile(script, []byte(line+"print(1)\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		c, err := Resolve(Want{Files: []string{script}}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		canonScript, _ := filepath.EvalSymlinks(script)
		if !slices.Contains(c.Outside, canonScript) || slices.Contains(c.Files, canonScript) {
			t.Errorf("%q: the script is not Outside alone: Files %q, Outside %q", line, c.Files, c.Outside)
		}
		for _, f := range []string{canonEnv, canonPython} {
			if !slices.Contains(c.Files, f) {
				t.Errorf("%q: %s is not in Files %q", line, f, c.Files)
			}
		}
		if !slices.ContainsFunc(c.Files, func(f string) bool { return filepath.Base(f) == "libc.so.6" }) {
			t.Errorf("%q: no libc in Files", line)
		}
	}
}

func TestResolveMissingOnThisHost(t *testing.T) {
	hostFile(t, "/usr/bin/true")
	f, err := elf.Open("/usr/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	machine, class := f.Machine, f.Class
	f.Close()
	loader := interpOf(t, "/usr/bin/true")
	dir := t.TempDir()
	prog := filepath.Join(dir, "prog")
	data := fakeELF{class: class, machine: machine, interp: loader, needed: []string{"libc.so.6", "libsysview-absent.so.7"}}.bytes()
	if err := os.WriteFile(prog, data, 0o755); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "mods", "mod.so")
	tree(t, dir, map[string]any{"mods/mod.so": fakeELF{class: class, machine: machine, needed: []string{"libz.so.1"}}.bytes()})
	c, err := Resolve(Want{Files: []string{prog}, ReadTrees: []string{filepath.Dir(lib)}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	canon, _ := filepath.EvalSymlinks(prog)
	if want := []string{"libsysview-absent.so.7 (needed by " + canon + ")"}; !slices.Equal(c.Missing, want) {
		t.Errorf("Missing: got %q, want %q", c.Missing, want)
	}
	if !slices.ContainsFunc(c.Files, func(f string) bool { return filepath.Base(f) == "libc.so.6" }) {
		t.Errorf("no libc in Files %q", c.Files)
	}
	if _, err := os.Stat("/lib/x86_64-linux-gnu/libz.so.1"); err == nil || machine != elf.EM_X86_64 {
		if !slices.ContainsFunc(c.Files, func(f string) bool { return strings.HasPrefix(filepath.Base(f), "libz.so.1") }) {
			t.Errorf("the read tree's module needs libz; it is not in Files %q", c.Files)
		}
	}
}

// presetWant is the Want of @python, @git and @gcc on this host, worked out by asking the
// toolchains as pkg/toolchain does.
func presetWant(t testing.TB) Want {
	t.Helper()
	ask := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).Output()
		testenv.Need(t, name, err)
		return strings.TrimSpace(string(out))
	}
	var w Want
	for _, p := range []string{"python3", "git", "gcc", "cc", "g++", "as", "ld"} {
		path, err := exec.LookPath(p)
		testenv.Need(t, p, err)
		if !strings.HasPrefix(path, "/usr/") {
			// A shim off the system trees (pyenv's): the system's own instead.
			path = "/usr/bin/" + p
		}
		w.Files = append(w.Files, path)
	}
	w.ReadTrees = []string{pythonStdlib(t)}
	w.ExecTrees = []string{ask("git", "--exec-path"), filepath.Dir(ask("gcc", "-print-prog-name=cc1"))}
	return w
}

func pythonStdlib(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("/usr/bin/python3", "-c", `import sysconfig;print(sysconfig.get_paths()["stdlib"])`).Output()
	testenv.Need(t, "python3", err)
	return strings.TrimSpace(string(out))
}
