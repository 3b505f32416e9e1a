package containment_test

import (
	"debug/elf"
	"path/filepath"
	"strings"
	"testing"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/sysview"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/toolchain"
)

// Hostile capsules against the exec allowlist through the ELF loader: every dynamic program
// needs it executable, and it maps the program it is given with mmap, never asking for the
// exec right. So whatever a session can read it could run; its view of the system trees
// (filesystem.system: allowlist) holds only what its allowlist's programs are made of.

// loader is the ELF interpreter /bin/sh names: the one every session may execute.
func loader(t *testing.T) string {
	t.Helper()
	f, err := elf.Open("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			return strings.TrimRight(string(b), "\x00")
		}
	}
	t.Fatal("/bin/sh names no ELF interpreter")
	return ""
}

// withSystemView gives a spec the view of the system trees a stage gives its session: the
// closure of its program and of what its shell.allow resolves to, built once per closure.
func withSystemView(t *testing.T, views string) func(*containment.Spec) {
	return func(s *containment.Spec) {
		t.Helper()
		if s.Policy.Filesystem.System == manifest.SystemFull {
			return
		}
		entries, err := toolchain.NewResolver().Resolve(s.Policy.Shell.Allow, "", s.CapsuleDir)
		if err != nil {
			t.Fatal(err)
		}
		var w sysview.Want
		if prog := s.Argv[0]; strings.HasPrefix(prog, "/") && !strings.HasPrefix(prog, s.CapsuleDir) {
			w.Files = append(w.Files, prog)
		}
		s.Exec = []string{}
		for _, e := range entries {
			w.Files = append(w.Files, e.Files...)
			w.ExecTrees = append(w.ExecTrees, e.Trees...)
			w.ReadTrees = append(w.ReadTrees, e.ReadTrees...)
			s.Exec = append(s.Exec, e.Files...)
			s.ExecTrees = append(s.ExecTrees, e.Trees...)
		}
		c, err := sysview.Resolve(w, sysview.Options{})
		if err != nil {
			t.Fatal(err)
		}
		dir, err := sysview.NewBuilder(views).View(c)
		if err != nil {
			t.Fatal(err)
		}
		s.System = &containment.SystemView{Dir: dir, Files: c.Files, Trees: c.Trees, Linked: c.Linked, Digest: c.Digest}
	}
}

// loaderRun runs script under /bin/sh as a session of class (unconfined: the positive
// control) with the capabilities caps, and returns what it printed.
func loaderRun(t *testing.T, class manifest.Class, caps, script string) string {
	t.Helper()
	argv := []string{"/bin/sh", "-c", script}
	if class != manifest.Unconfined {
		_, out, se := execAllowRun(t, class, caps, execAllowCapsule(t, nil), argv, withSystemView(t, t.TempDir()))
		if se != nil {
			t.Fatalf("refused: %v", se)
		}
		return out
	}
	return unconfinedRun(t, caps, "", argv)
}

// The errno a class's view answers a file of the system trees outside it with: absent from
// a sealed root, unreadable under scoped's Landlock rules.
func outsideView(class manifest.Class) string {
	if class == manifest.Sealed {
		return "No such file or directory"
	}
	return "Permission denied"
}

// expectLoader fails unless out says the attempt ran (want "") or failed with want.
func expectLoader(t *testing.T, out, ran, want string) {
	t.Helper()
	switch {
	case want == "" && !strings.Contains(out, ran):
		t.Fatalf("the positive control did not run:\n%s", out)
	case want != "" && strings.Contains(out, ran):
		t.Fatalf("ESCAPED: the loader ran what the allowlist does not name:\n%s", out)
	case want != "" && !strings.Contains(out, want):
		t.Fatalf("refused, but not with %q:\n%s", want, out)
	}
	t.Logf("%s", out)
}

// ld.so /usr/bin/perl: perl is on no allowlist; the loader would map and run it.
func TestHostileLoaderRunsHostProgram(t *testing.T) {
	script := loader(t) + ` /usr/bin/perl -e 'print "ran perl\n"'; echo "rc=$?"`
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			expectLoader(t, loaderRun(t, class, "shell: {allow: []}", script), "ran perl", outsideView(class))
		})
		// filesystem.system: full is the opt-out: there the loader runs perl, which shows it is
		// the view that holds it.
		t.Run(class.String()+"_system_full", func(t *testing.T) {
			expectLoader(t, loaderRun(t, class, "shell: {allow: []}, filesystem: {system: full}", script), "ran perl", "")
		})
	}
	t.Run("unconfined", func(t *testing.T) {
		expectLoader(t, loaderRun(t, manifest.Unconfined, "shell: {allow: []}", script), "ran perl", "")
	})
}

// ld.so on a copy of an allowed program in the session's own trees (its workdir, /tmp): the
// copy's mapping fails, since those are mounted noexec.
func TestHostileLoaderRunsCopy(t *testing.T) {
	// The host's /tmp, where the unconfined control writes, is shared: a directory of the
	// session's own there.
	for name, dir := range map[string]string{"workdir": "$PWD", "tmp": "${TMPDIR:-/tmp}/loader.$$"} {
		script := `mkdir -p ` + dir + ` && cp /usr/bin/true ` + dir + `/copy && ` + loader(t) + ` ` + dir + `/copy && echo ran copy`
		for _, class := range execAllowClasses {
			t.Run(class.String()+"_"+name, func(t *testing.T) {
				expectLoader(t, loaderRun(t, class, `shell: {allow: [cp, mkdir, "true"]}`, script), "ran copy", "failed to map segment")
			})
		}
		t.Run("unconfined_"+name, func(t *testing.T) {
			expectLoader(t, loaderRun(t, manifest.Unconfined, `shell: {allow: [cp, mkdir, "true"]}`, script), "ran copy", "")
		})
	}
}

// ld.so --library-path and --preload: a library the session wrote, or one of the host's
// its allowlist does not need, loaded into an allowed program.
func TestHostileLoaderLibraryTricks(t *testing.T) {
	libz := "/usr/lib/" + multiarch(t) + "/libz.so.1"
	libc := "/usr/lib/" + multiarch(t) + "/libc.so.6"
	for name, c := range map[string]struct{ script, want func(manifest.Class) string }{
		// The session's copy of libc, first on the search path: mapping it from a noexec tree fails.
		"library_path": {
			script: func(manifest.Class) string {
				return `cp ` + libc + ` $PWD/libc.so.6 || exit 1; ` + loader(t) + ` --library-path $PWD /usr/bin/true && echo ran true`
			},
			want: func(manifest.Class) string { return "failed to map segment" },
		},
		// A host library outside the closure: not there to preload (the loader says so and
		// goes on without it).
		"preload": {
			script: func(manifest.Class) string {
				return `out=$(` + loader(t) + ` --preload ` + libz + ` /usr/bin/true 2>&1); case "$out" in *"cannot be preloaded"*) echo "$out";; *) echo ran true;; esac`
			},
			want: func(manifest.Class) string { return "cannot be preloaded" },
		},
	} {
		for _, class := range execAllowClasses {
			t.Run(class.String()+"_"+name, func(t *testing.T) {
				expectLoader(t, loaderRun(t, class, `shell: {allow: [cp, "true"]}`, c.script(class)), "ran true", c.want(class))
			})
		}
		t.Run("unconfined_"+name, func(t *testing.T) {
			expectLoader(t, loaderRun(t, manifest.Unconfined, `shell: {allow: [cp, "true"]}`, c.script(manifest.Unconfined)), "ran true", "")
		})
	}
}

// multiarch is this host's library directory's triple, from where libc lies.
func multiarch(t *testing.T) string {
	t.Helper()
	matches, _ := filepath.Glob("/usr/lib/*-linux-gnu*/libc.so.6")
	if len(matches) == 0 {
		t.Fatal("no /usr/lib/<triple>/libc.so.6 on this host")
	}
	return filepath.Base(filepath.Dir(matches[0]))
}
