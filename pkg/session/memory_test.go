package session

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/manifest"
)

// TestMemoryOptionOnlyLowers: stage's memory option lowers resources.cgroup_memory_bytes,
// the record keeps it and the policy a launch reads has it; one above the capsule's (or the
// default) is refused naming both, as --deadline's is.
func TestMemoryOptionOnlyLowers(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	dir := capsule(t, "true", "capabilities:\n  resources:\n    cgroup_memory_bytes: 1Gi\n")
	rec, err := m.Stage(StageOptions{Capsule: dir, MemoryBytes: 64 << 20})
	if err != nil || rec.MemoryLimit != 64<<20 {
		t.Fatalf("memory 64Mi: %v %v", rec, err)
	}
	_, p, err := m.reg.manifest(rec)
	if err != nil || p.Resources.CgroupMemoryBytes.Value != 64<<20 {
		t.Fatalf("the recorded policy's cgroup memory: %+v, %v", p.Resources.CgroupMemoryBytes, err)
	}
	// Without the option the capsule's own is kept, and recorded.
	if rec, err := m.Stage(StageOptions{Capsule: dir}); err != nil || rec.MemoryLimit != 1<<30 {
		t.Fatalf("no memory option: %v %v", rec, err)
	}
	_, err = m.Stage(StageOptions{Capsule: dir, MemoryBytes: 4 << 30})
	if want := "--memory 4Gi is above the capsule's resources.cgroup_memory_bytes (1Gi); it can only lower it"; !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("memory above the capsule's: %v, want %q", err, want)
	}
	undeclared := capsule(t, "true", "")
	_, err = m.Stage(StageOptions{Capsule: undeclared, MemoryBytes: 2 * manifest.DefaultCgroupMemoryBytes})
	if want := "--memory 8Gi is above the default cgroup memory (4Gi; the capsule declares no resources.cgroup_memory_bytes)"; !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("memory above the default: %v, want %q", err, want)
	}
	if _, err := m.Stage(StageOptions{Capsule: dir, MemoryBytes: -1}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("negative memory: %v", err)
	}
}
