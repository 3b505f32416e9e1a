package toolchain

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/manifest"
)

// The presets the manifest accepts are the ones this package resolves.
func TestPresetNamesMatchTheManifest(t *testing.T) {
	if !slices.Equal(PresetNames(), manifest.ShellPresets) {
		t.Fatalf("toolchain presets %v, manifest presets %v", PresetNames(), manifest.ShellPresets)
	}
}

// Each preset this host has a toolchain for expands to files that exist and run, and the
// trees the toolchain execs its helpers from.
func TestPresetsResolveOnThisHost(t *testing.T) {
	r := NewResolver()
	for _, c := range []struct {
		preset, tool string
		wantTree     bool
	}{
		{"@shell", "sh", false}, {"@git", "git", true}, {"@python", "python3", false}, {"@node", "node", false},
		{"@go", "go", true}, {"@gcc", "gcc", true}, {"@make", "make", false},
	} {
		t.Run(c.preset, func(t *testing.T) {
			if _, err := lookPath(c.tool, DefaultPath); err != nil {
				t.Skipf("%s is not installed here", c.tool)
			}
			entries, err := r.Resolve([]string{c.preset}, "", "")
			if err != nil {
				t.Fatal(err)
			}
			e := entries[0]
			if e.Entry != c.preset || len(e.Files) == 0 || (c.wantTree && len(e.Trees) == 0) {
				t.Fatalf("%s: %+v", c.preset, e)
			}
			for _, f := range e.Files {
				if info, err := os.Stat(f); err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
					t.Errorf("%s: %s is not an executable file (%v)", c.preset, f, err)
				}
			}
			for _, d := range e.Trees {
				if info, err := os.Stat(d); err != nil || !info.IsDir() {
					t.Errorf("%s: %s is not a directory (%v)", c.preset, d, err)
				}
			}
		})
	}
}

func TestResolveEntries(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "data")
	os.WriteFile(plain, nil, 0o644)
	r := NewResolver()
	got, err := r.Resolve([]string{"ls", "/usr/bin", "/usr/bin/env"}, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Files[0] != "/usr/local/bin/ls" && !strings.HasSuffix(got[0].Files[0], "/ls") || len(got[1].Trees) != 1 || got[2].Files[0] != "/usr/bin/env" {
		t.Fatalf("%+v", got)
	}
	for entry, want := range map[string]string{
		"no-such-program-x": "not found on PATH",
		"/no/such/file":     "no such file or directory",
		plain:               "not executable",
		"/dev/null":         "not a regular file or a directory",
	} {
		_, err := r.Resolve([]string{"ls", entry}, "", "")
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "shell.allow[1]") {
			t.Errorf("%s: %v (want %q)", entry, err, want)
		}
	}
}

func TestCovers(t *testing.T) {
	parent := []Entry{{Entry: "@gcc", Files: []string{"/usr/bin/gcc"}, Trees: []string{"/usr/lib/gcc"}}, {Entry: "ls", Files: []string{"/usr/bin/ls"}}}
	for _, c := range []struct {
		child []Entry
		ok    bool
	}{
		{[]Entry{{Entry: "ls", Files: []string{"/usr/bin/ls"}}}, true},
		{[]Entry{{Entry: "/usr/lib/gcc/x/12", Trees: []string{"/usr/lib/gcc/x/12"}}}, true},
		{[]Entry{{Entry: "/usr/lib/gcc/x/cc1", Files: []string{"/usr/lib/gcc/x/cc1"}}}, true},
		{[]Entry{{Entry: "cat", Files: []string{"/usr/bin/cat"}}}, false},
		{[]Entry{{Entry: "/usr/lib", Trees: []string{"/usr/lib"}}}, false},
		{[]Entry{{Entry: "/usr/lib/gccx", Trees: []string{"/usr/lib/gccx"}}}, false},
	} {
		if what, ok := Covers(parent, c.child); ok != c.ok {
			t.Errorf("%+v: covered %v (%s), want %v", c.child, ok, what, c.ok)
		}
	}
}

// An entry in the capsule is checked in the capsule's files on the host and kept as the
// session names it.
func TestResolveCapsuleEntries(t *testing.T) {
	capsule := t.TempDir()
	os.WriteFile(filepath.Join(capsule, "tool.sh"), []byte("#!/bin/sh\n"), 0o755)
	r := NewResolver()
	got, err := r.Resolve([]string{"/capsule/tool.sh"}, "", capsule)
	if err != nil || got[0].Files[0] != "/capsule/tool.sh" {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := r.Resolve([]string{"/capsule/missing.sh"}, "", capsule); err == nil || !strings.Contains(err.Error(), "/capsule/missing.sh") {
		t.Fatalf("a missing capsule file: %v", err)
	}
}

// A preset whose programs lie off DefaultPath puts their directory on the session's PATH;
// one on it adds nothing, and a manifest's own PATH is kept as it is.
func TestPresetPath(t *testing.T) {
	goBin, err := lookPath("go", DefaultPath+":"+goInstall)
	testenv.Need(t, "go", err)
	r := NewResolver()
	entries, err := r.Resolve([]string{"@go", "@shell"}, "", "")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	if dir := filepath.Dir(goBin); !slices.Contains(filepath.SplitList(DefaultPath), dir) {
		want = []string{dir}
	}
	if !slices.Equal(entries[0].Path, want) || len(entries[1].Path) != 0 {
		t.Fatalf("@go's Path %v, want %v; @shell's %v, want none", entries[0].Path, want, entries[1].Path)
	}
	path := SessionPath("", entries)
	if got, _ := lookPath("go", path); got != goBin {
		t.Errorf("go on the session's PATH %s is %q, want %s", path, got, goBin)
	}
	if !strings.HasPrefix(path, DefaultPath) {
		t.Errorf("the session's PATH %s does not begin with the default", path)
	}
	if got := SessionPath("/opt/bin:/usr/bin", entries); got != "/opt/bin:/usr/bin" {
		t.Errorf("a declared PATH became %s", got)
	}
}

func TestOffPath(t *testing.T) {
	got := offPath([]string{"/usr/bin/a", "/usr/local/go/bin/go", "/usr/local/go/bin/gofmt", "/opt/x/bin/y"})
	if want := []string{"/usr/local/go/bin", "/opt/x/bin"}; !slices.Equal(got, want) {
		t.Fatalf("offPath: %v, want %v", got, want)
	}
}
