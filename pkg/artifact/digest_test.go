package artifact

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
	if _, err := DigestDir(dir); err == nil || !strings.Contains(err.Error(), "fifo") {
		t.Fatalf("fifo accepted: %v", err)
	}
}
