package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/artifact"
)

// A capsule.yaml that is a symlink, to a manifest the capsule's owner may not even be able
// to read, is refused at stage: the manifest planned is the one the store read and keeps,
// never one reached through a link, whether in the operator's directory or in the blob.
func TestPlanRefusesALinkedManifest(t *testing.T) {
	s, err := artifact.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	elsewhere := filepath.Join(t.TempDir(), "capsule.yaml")
	if err := os.WriteFile(elsewhere, []byte("name: elsewhere\nversion: 1.0.0\nrun:\n  command: [bin/run]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(dir, "capsule.yaml")); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Artifacts: s}).Plan(Options{Capsule: dir}, true)
	if err == nil {
		t.Fatalf("planned %s@%s, the manifest at the link's end", p.Manifest.Name, p.Manifest.Version)
	}
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("a linked capsule.yaml: %v", err)
	}
}
