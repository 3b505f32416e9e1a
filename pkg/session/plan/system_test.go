package plan

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/manifest"
)

// explainSystem explains a capsule running git with the capabilities caps and returns what
// it says of the system trees.
func explainSystem(t *testing.T, caps string) *roostv1.SystemView {
	t.Helper()
	dir := t.TempDir()
	yaml := "name: sys\nversion: 1.0.0\nrun:\n  command: [/usr/bin/git, --version]\ncapabilities: " + caps + "\n"
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	pl := New(Config{})
	p, err := pl.Plan(Options{Capsule: dir}, false)
	if err != nil {
		t.Fatal(err)
	}
	return pl.Explain(p, func(manifest.Class) *roostv1.StartPath { return nil }).GetSystem()
}

// explain lists the closure a contained session's view holds: git, its loader and libc, and
// nothing its allowlist does not run (perl); with filesystem.system: full, and in a class
// without an allowlist, none, and it says what holds against the ELF loader.
func TestExplainListsTheSystemView(t *testing.T) {
	if _, err := os.Stat("/usr/bin/git"); err != nil {
		t.Fatalf("this test runs git's closure: %v", err)
	}
	sv := explainSystem(t, `{containment: sealed, shell: {allow: ["@shell"]}}`)
	if sv.GetMode() != manifest.SystemAllowlist || len(sv.GetDigest()) != 64 || !strings.Contains(sv.GetHolds(), "the ELF loader") {
		t.Fatalf("sealed, allowlist: %+v", sv)
	}
	has := func(suffix string) bool {
		return slices.ContainsFunc(sv.GetFiles(), func(f string) bool { return strings.HasSuffix(f, suffix) })
	}
	for _, want := range []string{"/git", "/libc.so.6", "/dash"} {
		if !has(want) {
			t.Errorf("the closure lacks %s: %q", want, sv.GetFiles())
		}
	}
	if has("/perl") {
		t.Errorf("the closure holds perl, which nothing allowed runs: %q", sv.GetFiles())
	}
	if !slices.Contains(sv.GetTrees(), "/usr/share/zoneinfo") {
		t.Errorf("the closure lacks the data trees: %q", sv.GetTrees())
	}
	full := explainSystem(t, `{containment: sealed, filesystem: {system: full}}`)
	if full.GetMode() != manifest.SystemFull || len(full.GetFiles()) != 0 || !strings.Contains(full.GetHolds(), "not the ELF loader") {
		t.Errorf("system: full: %+v", full)
	}
	plain := explainSystem(t, `{containment: unconfined}`)
	if len(plain.GetFiles()) != 0 || !strings.Contains(plain.GetHolds(), "no exec allowlist") {
		t.Errorf("unconfined: %+v", plain)
	}
}
