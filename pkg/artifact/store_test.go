package artifact

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func capsuleDir(t *testing.T, version, script string) string {
	t.Helper()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "capsule.yaml"), "name: worker\nversion: "+version+"\nrun:\n  command: [bin/run.sh]\n")
	write(t, filepath.Join(dir, "bin", "run.sh"), script)
	os.Chmod(filepath.Join(dir, "bin", "run.sh"), 0o755)
	os.Symlink("run.sh", filepath.Join(dir, "bin", "alias"))
	return dir
}

func TestPushResolveList(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := capsuleDir(t, "0.1.0", "#!/bin/sh\necho one\n")
	a, created, err := s.Push(src)
	if err != nil || !created || a.Ref() != "worker@0.1.0" || !strings.HasPrefix(a.SHA256, "sha256:") {
		t.Fatalf("push: %+v %v %v", a, created, err)
	}
	want, _ := DigestDir(src)
	if a.SHA256 != want {
		t.Fatalf("digest %s, want %s", a.SHA256, want)
	}
	// The stored tree is the pushed one, links as links.
	if got, _ := DigestDir(s.Dir(a)); got != want {
		t.Fatalf("stored tree digests to %s", got)
	}
	if link, err := os.Readlink(filepath.Join(s.Dir(a), "bin", "alias")); err != nil || link != "run.sh" {
		t.Fatalf("symlink copied as %q %v", link, err)
	}

	// The same bytes again: nothing new. Different bytes under the same version: refused.
	if again, created, err := s.Push(src); err != nil || created || again.SHA256 != a.SHA256 {
		t.Fatalf("re-push: %+v %v %v", again, created, err)
	}
	other := capsuleDir(t, "0.1.0", "#!/bin/sh\necho two\n")
	if _, _, err := s.Push(other); !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "new version") {
		t.Fatalf("different bytes under worker@0.1.0: %v", err)
	}
	if _, _, err := s.Push(capsuleDir(t, "0.2.0", "#!/bin/sh\necho two\n")); err != nil {
		t.Fatal(err)
	}
	list, _ := s.List()
	if len(list) != 2 || list[0].Ref() != "worker@0.1.0" || list[1].Ref() != "worker@0.2.0" {
		t.Fatalf("list %+v", list)
	}
	if _, err := s.Resolve("worker@9.9.9"); !errdefs.IsNotFound(err) {
		t.Fatalf("resolve of an unknown ref: %v", err)
	}
	bad := t.TempDir()
	write(t, filepath.Join(bad, "capsule.yaml"), "name: Bad\n")
	if _, _, err := s.Push(bad); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("push of an invalid capsule: %v", err)
	}
}

func TestParseRef(t *testing.T) {
	for in, ok := range map[string]bool{"worker@0.1.0": true, "a-b@1.0.0-rc.1+x": true, "./worker@0.1.0": false, "/abs@1.0.0": false, "worker": false, "Worker@1.0.0": false} {
		if _, _, got := ParseRef(in); got != ok {
			t.Errorf("ParseRef(%q) = %v", in, got)
		}
	}
}
