package artifact

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/internal/testenv"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestDigestDir(t *testing.T) {
	a := t.TempDir()
	write(t, filepath.Join(a, "capsule.yaml"), "name: x\n")
	write(t, filepath.Join(a, "bin", "run.sh"), "#!/bin/sh\n")
	d1, err := DigestDir(a)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(d1, "sha256:") || len(d1) != len("sha256:")+64 {
		t.Fatalf("digest %q", d1)
	}

	// The same tree elsewhere hashes the same.
	b := t.TempDir()
	write(t, filepath.Join(b, "capsule.yaml"), "name: x\n")
	write(t, filepath.Join(b, "bin", "run.sh"), "#!/bin/sh\n")
	if d2, _ := DigestDir(b); d2 != d1 {
		t.Fatalf("same tree, different digests: %s %s", d1, d2)
	}

	// Content, mode, names and links all count.
	changes := []func(dir string){
		func(dir string) { write(t, filepath.Join(dir, "bin", "run.sh"), "#!/bin/bash\n") },
		func(dir string) { os.Chmod(filepath.Join(dir, "bin", "run.sh"), 0o755) },
		func(dir string) { os.Rename(filepath.Join(dir, "bin"), filepath.Join(dir, "sbin")) },
		func(dir string) { os.Symlink("/etc/passwd", filepath.Join(dir, "link")) },
		func(dir string) { os.Mkdir(filepath.Join(dir, "empty"), 0o755) },
	}
	for i, change := range changes {
		c := t.TempDir()
		write(t, filepath.Join(c, "capsule.yaml"), "name: x\n")
		write(t, filepath.Join(c, "bin", "run.sh"), "#!/bin/sh\n")
		change(c)
		if d, err := DigestDir(c); err != nil || d == d1 {
			t.Errorf("change %d did not change the digest (%v)", i, err)
		}
	}

	// A symlink is hashed as a link: changing what it points at outside the tree changes nothing.
	outside := filepath.Join(t.TempDir(), "target")
	write(t, outside, "one")
	os.Symlink(outside, filepath.Join(a, "link"))
	before, _ := DigestDir(a)
	write(t, outside, "two")
	if after, _ := DigestDir(a); after != before {
		t.Fatal("digest followed a symlink")
	}
}

func TestDigestDirRefusesSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Skip("mkfifo:", err)
	}
	if _, err := DigestDir(dir); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), dir+": fifo: ") || !strings.Contains(err.Error(), "not a fifo") {
		t.Fatalf("fifo accepted: %v", err)
	}
}

// ordinaryTree makes a tree with the modes a capsule usually has (0755 directories, 0644
// and 0755 files) and names that sort differently by path and by component ("a/x", "a-b").
func ordinaryTree(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(dir, 0o755))
	must(os.Chmod(dir, 0o755))
	write(t, filepath.Join(dir, "capsule.yaml"), "name: worker\nversion: 0.1.0\n")
	must(os.Mkdir(filepath.Join(dir, "bin"), 0o755))
	write(t, filepath.Join(dir, "bin", "run.sh"), "#!/bin/sh\necho hi\n")
	must(os.Chmod(filepath.Join(dir, "bin", "run.sh"), 0o755))
	must(os.Symlink("run.sh", filepath.Join(dir, "bin", "alias")))
	must(os.Mkdir(filepath.Join(dir, "a"), 0o755))
	write(t, filepath.Join(dir, "a", "x"), "inner")
	write(t, filepath.Join(dir, "a-b"), "")
	must(os.Mkdir(filepath.Join(dir, "empty"), 0o755))
	write(t, filepath.Join(dir, "Z"), "upper")
}

// A tree with ordinary modes keeps the digest it had before modes were normalised and the
// walk went by descriptors: capsule.sha256 recorded by older sessions still names it.
func TestDigestDirUnchangedForOrdinaryTrees(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tree")
	ordinaryTree(t, dir)
	// Recorded from the path-walking DigestDir this package had before.
	const before = "sha256:dedbe5b3735e64107ab6cc17e959c570c94327acdc76a0e9b00dfe312429a167"
	if d, err := DigestDir(dir); err != nil || d != before {
		t.Fatalf("digest %s (%v), was %s", d, err, before)
	}
}

// Only a file's execute bits count: the digest names the tree as a Store keeps it.
func TestDigestDirHashesNormalisedModes(t *testing.T) {
	plain := filepath.Join(t.TempDir(), "tree")
	ordinaryTree(t, plain)
	want, err := DigestDir(plain)
	if err != nil {
		t.Fatal(err)
	}
	odd := filepath.Join(t.TempDir(), "tree")
	ordinaryTree(t, odd)
	for path, mode := range map[string]os.FileMode{
		".":            0o700,
		"bin":          0o750 | os.ModeSetgid,
		"bin/run.sh":   0o744 | os.ModeSetuid,
		"a":            0o1777,
		"a/x":          0o600,
		"empty":        0o500,
		"capsule.yaml": 0o444,
		"Z":            0o660,
	} {
		if err := os.Chmod(filepath.Join(odd, path), mode); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := DigestDir(odd); err != nil || got != want {
		t.Fatalf("odd modes digest to %s (%v), the same tree with ordinary modes to %s", got, err, want)
	}
	// But the execute bit is kept.
	if err := os.Chmod(filepath.Join(odd, "a", "x"), 0o710); err != nil {
		t.Fatal(err)
	}
	if got, _ := DigestDir(odd); got == want {
		t.Fatal("making a file executable did not change the digest")
	}
}

func TestDigestDirRefusesSymlinkRoot(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "real", "f"), "x")
	os.Symlink("real", filepath.Join(dir, "link"))
	if _, err := DigestDir(filepath.Join(dir, "link")); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("a symlink as the root: %v", err)
	}
}

// A file larger than MaxBytes is refused from its size, before a byte is read: a sparse
// one costs nothing to make.
func TestDigestDirRefusesHugeTrees(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "huge"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(MaxBytes + 1); err != nil {
		t.Skip("truncate:", err)
	}
	start := time.Now()
	_, err = DigestDir(dir)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), fmt.Sprint(MaxBytes)) {
		t.Fatalf("a tree of %d bytes: %v", MaxBytes+1, err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("refusing took %s: the file was read", time.Since(start))
	}
}

// The path to a tree is walked by descriptors too: a link on it is followed when only root
// can have made it and nobody else can swap it, and refused, naming it, when anyone else
// may have planted or swapped it.
func TestDigestDirFollowsOnlyRootsLinksOnThePath(t *testing.T) {
	testenv.NeedRoot(t, "a link of another uid's is made with lchown")
	base := t.TempDir()
	write(t, filepath.Join(base, "real", "tree", "f"), "x")
	want, err := DigestDir(filepath.Join(base, "real", "tree"))
	if err != nil {
		t.Fatal(err)
	}
	link := func(target, path string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
	}
	dirMode := func(path string, mode os.FileMode) {
		t.Helper()
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
	}
	link("real", filepath.Join(base, "rel"))
	link(filepath.Join(base, "real"), filepath.Join(base, "abs"))
	link("../real", filepath.Join(base, "real", "up"))
	link("../real", filepath.Join(base, "sticky", "l"))
	dirMode(filepath.Join(base, "sticky"), 0o777|os.ModeSticky)
	link("../real", filepath.Join(base, "open", "l"))
	dirMode(filepath.Join(base, "open"), 0o777)
	link("../real", filepath.Join(base, "owned", "l"))
	if err := os.Chown(filepath.Join(base, "owned"), attackerUID, attackerUID); err != nil {
		t.Fatal(err)
	}
	link("real", filepath.Join(base, "theirs"))
	if err := os.Lchown(filepath.Join(base, "theirs"), attackerUID, attackerUID); err != nil {
		t.Fatal(err)
	}
	link("loop", filepath.Join(base, "loop"))
	write(t, filepath.Join(base, "file"), "x")

	for _, rel := range []string{"rel/tree", "abs/tree", "real/up/up/tree", "sticky/l/tree", "real/../real/./tree"} {
		if got, err := DigestDir(filepath.Join(base, rel)); err != nil || got != want {
			t.Errorf("%s, through root's links: %s, %v; want %s", rel, got, err, want)
		}
	}
	for rel, why := range map[string]string{
		"theirs/tree":  filepath.Join(base, "theirs") + ", on the path, is a symlink of uid 65534's",
		"owned/l/tree": filepath.Join(base, "owned", "l") + ", on the path, is a symlink in " + filepath.Join(base, "owned") + ", a directory of uid 65534's",
		"open/l/tree":  filepath.Join(base, "open", "l") + ", on the path, is a symlink in " + filepath.Join(base, "open") + ", a directory others may write",
		"loop/tree":    "more than 40 symlinks",
		"file/tree":    filepath.Join(base, "file") + " is not a directory",
		"rel":          "a symlink; roost never follows one as the tree",
		"missing/tree": "file does not exist",
	} {
		_, err := DigestDir(filepath.Join(base, rel))
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), why) {
			t.Errorf("%s: %v; want invalid, saying %q", rel, err, why)
		}
	}
}
