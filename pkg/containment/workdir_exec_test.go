package containment_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/manifest"
)

// With workdir_exec, what the session builds runs, in scoped and in sealed, and the class
// still holds it: the host's files stay unreadable, its own mounts and namespaces stay.
func TestWorkdirExecKeepsTheClass(t *testing.T) {
	secret := fmt.Sprintf("/srv/roost-test-exec-%d", os.Getpid())
	os.WriteFile(secret, []byte("SECRET\n"), 0o644)
	t.Cleanup(func() { os.Remove(secret) })
	probe := testkit.TryScript + `cp /usr/bin/cat ./mycat && chmod +x ./mycat && ./mycat /etc/hostname >/dev/null && echo "built program ran"
try host ./mycat ` + secret + `
cp /usr/bin/true "$T/t" && chmod +x "$T/t" && "$T/t" && echo "scratch ran"`
	// The control: the host reads the file the built program may not.
	testkit.ExpectAllowed(t, testkit.OnHost(t, testkit.TryScript+"try host cat "+secret), "host")
	_, out, _, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, filesystem: {workdir_exec: true}, shell: {allow: [cp, chmod]}}",
		"T=$TMPDIR\n"+probe+"\ncp /usr/bin/true /dev/shm/t && /dev/shm/t && echo 'shm ran'")
	testkit.ExpectOutput(t, out, "built program ran", "scratch ran", "shm ran")
	// Landlock holds what it reads: /srv is none of the scoped trees.
	testkit.ExpectDenied(t, out, syscall.EACCES, "host")
	_, out, _, _ = kit.SealedRun(t, "capabilities: {containment: sealed, filesystem: {workdir_exec: true}, shell: {allow: [cp, chmod, cat, grep, tr]}}",
		"cd /work; T=/tmp\n"+probe+"\ngrep -c . /proc/self/uid_map >/dev/null && echo \"uid map $(cat /proc/self/uid_map | tr -s ' ')\"")
	// The user namespace stays: root inside is a host uid of the session's range, never 0.
	m := regexp.MustCompile(`uid map +0 (\d+) 65536`).FindStringSubmatch(out)
	if m == nil || m[1] == "0" {
		t.Fatalf("sealed with workdir_exec: no user namespace of the session's own range:\n%s", out)
	}
	testkit.ExpectOutput(t, out, "built program ran", "scratch ran")
	// The sealed root has no /srv.
	testkit.ExpectDenied(t, out, syscall.ENOENT, "host")
}

// Files move and link across directories of the trees a session writes (Landlock refuses
// reparenting unless REFER is handled and granted).
func TestRenamesAcrossDirectories(t *testing.T) {
	script := `mkdir -p a b && echo x > a/f && mv a/f b/f && echo "moved" && ln b/f a/g && echo "linked" && mv b "$T/b" && echo "moved to scratch"`
	_, out, errOut, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, shell: {allow: [mkdir, mv, ln]}}", "T=$TMPDIR\n"+script)
	testkit.ExpectOutput(t, out+errOut, "moved", "linked", "moved to scratch")
	_, out, errOut, _ = kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [mkdir, mv, ln]}}", "cd /work; T=/tmp\n"+script)
	testkit.ExpectOutput(t, out+errOut, "moved", "linked")
}

// Runtimes that reserve address space run: where a cgroup holds memory there is no RLIMIT_AS
// unless the manifest declares one; where none does, RLIMIT_AS is the ceiling, at a default
// sized for them.
func TestAddressSpaceLimitOnlyWhereNothingBetter(t *testing.T) {
	_, out, _, _ := kit.ScopedRun(t, "capabilities: {containment: scoped}", `echo "as=$(ulimit -v)"`)
	testkit.ExpectOutput(t, out, "as=unlimited")
	declared := policy(t, "capabilities: {resources: {memory_bytes: 1073741824}}")
	undeclared := policy(t, "")
	as := func(rls []containment.Rlimit) int64 {
		for _, r := range rls {
			if r.Resource == unix.RLIMIT_AS {
				return int64(r.Value)
			}
		}
		return -1
	}
	for _, class := range []manifest.Class{manifest.Unconfined, manifest.Advisory, manifest.Scoped, manifest.Sealed} {
		if got := as(containment.Rlimits(class, &declared)); got != 1073741824 {
			t.Errorf("%s, declared: RLIMIT_AS %d", class, got)
		}
		want := int64(-1)
		if class == manifest.Unconfined || class == manifest.Advisory {
			want = manifest.DefaultMemoryBytes
		}
		if got := as(containment.Rlimits(class, &undeclared)); got != want {
			t.Errorf("%s, undeclared: RLIMIT_AS %d, want %d", class, got, want)
		}
	}
	// What a class without a cgroup applies is what its program sees.
	s := kit.Spec(t, "/bin/sh", "-c", `ulimit -v`)
	s.Rlimits = containment.Rlimits(manifest.Advisory, &undeclared)
	p, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitDone(t, p)
	if got, want := testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile)), fmt.Sprintf("%d\n", manifest.DefaultMemoryBytes/1024); got != want {
		t.Fatalf("ulimit -v in a class without a cgroup: %q, want %q", got, want)
	}
	for class, want := range map[manifest.Class]string{manifest.Advisory: containment.Enforced, manifest.Scoped: containment.NotApplicable, manifest.Sealed: containment.NotApplicable} {
		for _, g := range containment.Grants(class, &undeclared, false, false) {
			if g.Key == "resources.memory_bytes" && g.Enforcement != want {
				t.Errorf("%s explains resources.memory_bytes as %s (%s), want %s", class, g.Enforcement, g.Mechanism, want)
			}
		}
	}
}

// A host tree the operator offers (filesystem.host_read) is readable, never writable, and
// nothing beside it is: bound read-only into a sealed root, named by a scoped session's
// Landlock rules.
func TestHostRead(t *testing.T) {
	offered := fmt.Sprintf("/srv/roost-test-opt-%d", os.Getpid())
	other := offered + "-other"
	for _, d := range []string{offered, other} {
		os.MkdirAll(d, 0o755)
		os.WriteFile(d+"/tool.txt", []byte("from "+d+"\n"), 0o644)
	}
	t.Cleanup(func() { os.RemoveAll(offered); os.RemoveAll(other) })
	script := testkit.TryScript + fmt.Sprintf(`try read-offered cat %[1]s/tool.txt
try write-offered touch %[1]s/x
try read-other cat %[2]s/tool.txt`, offered, other)
	caps := "filesystem: {host_read: [" + offered + "]}, shell: {allow: [cat, touch]}}"
	// Landlock: readable, never writable; nothing beside it.
	_, out, _, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, "+caps, script)
	testkit.ExpectAllowed(t, out, "read-offered")
	testkit.ExpectDenied(t, out, syscall.EACCES, "write-offered", "read-other")
	// Bound read-only into the root; nothing beside it there.
	_, out, _, _ = kit.SealedRun(t, "capabilities: {containment: sealed, "+caps, script)
	testkit.ExpectAllowed(t, out, "read-offered")
	testkit.ExpectDenied(t, out, syscall.EROFS, "write-offered")
	testkit.ExpectDenied(t, out, syscall.ENOENT, "read-other")
	// The control, last (a file it makes would be there for the sessions to touch): the
	// host does all three.
	testkit.ExpectAllowed(t, testkit.OnHost(t, script), "read-offered", "write-offered", "read-other")
}
