package containment

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/manifest"
)

// loader is the dynamic loader /usr/bin/true names: always on a session's exec allowlist,
// since every dynamically linked program needs it.
func loader(t *testing.T) string {
	t.Helper()
	f, err := elf.Open("/usr/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			data := make([]byte, p.Filesz)
			if _, err := p.ReadAt(data, 0); err != nil {
				t.Fatal(err)
			}
			return strings.TrimRight(string(data), "\x00")
		}
	}
	t.Skip("/usr/bin/true is statically linked")
	return ""
}

// Without workdir_exec, a program the session writes does not run — not directly, and not
// through the dynamic loader either (which maps it with mmap, beyond Landlock's exec right):
// the trees the session writes are mounted noexec in its own mount namespace.
func TestHostileScopedLoaderCannotRunWorkdirBinary(t *testing.T) {
	ld := loader(t)
	probe := tryScript + fmt.Sprintf(`try copy cp /usr/bin/true ./mytrue
try chmod chmod +x ./mytrue
try copy-tmp cp /usr/bin/true "$TMPDIR/t"
try copy-shm cp /usr/bin/true /dev/shm/t
try directly ./mytrue
try loader %[1]s ./mytrue
try tmp %[1]s "$TMPDIR/t"
try shm %[1]s /dev/shm/t`, ld)
	_, out, _, _ := scopedRun(t, "capabilities: {containment: scoped, shell: {allow: [cp, chmod]}}", probe)
	expectAllowed(t, out, "copy", "chmod", "copy-tmp", "copy-shm")
	// exec(2) of a file on a noexec mount is EACCES. The loader reads the file (Landlock
	// lets it) and fails to map it executable (the mount is noexec), and says so without
	// the errno.
	expectDenied(t, out, syscall.EACCES, "directly")
	expectDeniedSaying(t, out, "failed to map segment from shared object", "loader", "tmp", "shm")
	// The control: the same probe, in a session whose writable trees may exec, runs them all.
	_, out, _, _ = scopedRun(t, "capabilities: {containment: scoped, filesystem: {workdir_exec: true}, shell: {allow: [cp, chmod]}}", probe)
	expectAllowed(t, out, "copy", "chmod", "copy-tmp", "copy-shm", "directly", "loader", "tmp", "shm")
}

// With workdir_exec, what the session builds runs, in scoped and in sealed, and the class
// still holds it: the host's files stay unreadable, its own mounts and namespaces stay.
func TestWorkdirExecKeepsTheClass(t *testing.T) {
	secret := fmt.Sprintf("/srv/roost-test-exec-%d", os.Getpid())
	os.WriteFile(secret, []byte("SECRET\n"), 0o644)
	t.Cleanup(func() { os.Remove(secret) })
	probe := tryScript + `cp /usr/bin/cat ./mycat && chmod +x ./mycat && ./mycat /etc/hostname >/dev/null && echo "built program ran"
try host ./mycat ` + secret + `
cp /usr/bin/true "$T/t" && chmod +x "$T/t" && "$T/t" && echo "scratch ran"`
	// The control: the host reads the file the built program may not.
	expectAllowed(t, onHost(t, tryScript+"try host cat "+secret), "host")
	_, out, _, _ := scopedRun(t, "capabilities: {containment: scoped, filesystem: {workdir_exec: true}, shell: {allow: [cp, chmod]}}",
		"T=$TMPDIR\n"+probe+"\ncp /usr/bin/true /dev/shm/t && /dev/shm/t && echo 'shm ran'")
	expectOutput(t, out, "built program ran", "scratch ran", "shm ran")
	// Landlock holds what it reads: /srv is none of the scoped trees.
	expectDenied(t, out, syscall.EACCES, "host")
	_, out, _, _ = sealedRun(t, "capabilities: {containment: sealed, filesystem: {workdir_exec: true}, shell: {allow: [cp, chmod, cat, grep]}}",
		"cd /work; T=/tmp\n"+probe+"\ngrep -c . /proc/self/uid_map >/dev/null && echo \"uid map $(cat /proc/self/uid_map | tr -s ' ')\"")
	if strings.Contains(out, "uid map  0 0 ") {
		t.Fatalf("sealed with workdir_exec escaped:\n%s", out)
	}
	expectOutput(t, out, "built program ran", "scratch ran")
	// The sealed root has no /srv.
	expectDenied(t, out, syscall.ENOENT, "host")
}

// Files move and link across directories of the trees a session writes (Landlock refuses
// reparenting unless REFER is handled and granted).
func TestRenamesAcrossDirectories(t *testing.T) {
	script := `mkdir -p a b && echo x > a/f && mv a/f b/f && echo "moved" && ln b/f a/g && echo "linked" && mv b "$T/b" && echo "moved to scratch"`
	_, out, errOut, _ := scopedRun(t, "capabilities: {containment: scoped, shell: {allow: [mkdir, mv, ln]}}", "T=$TMPDIR\n"+script)
	expectOutput(t, out+errOut, "moved", "linked", "moved to scratch")
	_, out, errOut, _ = sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [mkdir, mv, ln]}}", "cd /work; T=/tmp\n"+script)
	expectOutput(t, out+errOut, "moved", "linked")
}

// Runtimes that reserve address space run: where a cgroup holds memory there is no RLIMIT_AS
// unless the manifest declares one; where none does, RLIMIT_AS is the ceiling, at a default
// sized for them.
func TestAddressSpaceLimitOnlyWhereNothingBetter(t *testing.T) {
	_, out, _, _ := scopedRun(t, "capabilities: {containment: scoped}", `echo "as=$(ulimit -v)"`)
	expectOutput(t, out, "as=unlimited")
	declared := policy(t, "capabilities: {resources: {memory_bytes: 1073741824}}")
	undeclared := policy(t, "")
	as := func(rls []Rlimit) int64 {
		for _, r := range rls {
			if r.Resource == unix.RLIMIT_AS {
				return int64(r.Value)
			}
		}
		return -1
	}
	for _, class := range []manifest.Class{manifest.Unconfined, manifest.Advisory, manifest.Scoped, manifest.Sealed} {
		if got := as(Rlimits(class, &declared)); got != 1073741824 {
			t.Errorf("%s, declared: RLIMIT_AS %d", class, got)
		}
		want := int64(-1)
		if class == manifest.Unconfined || class == manifest.Advisory {
			want = manifest.DefaultMemoryBytes
		}
		if got := as(Rlimits(class, &undeclared)); got != want {
			t.Errorf("%s, undeclared: RLIMIT_AS %d, want %d", class, got, want)
		}
	}
	// What a class without a cgroup applies is what its program sees.
	s := spec(t, "/bin/sh", "-c", `ulimit -v`)
	s.Rlimits = Rlimits(manifest.Advisory, &undeclared)
	p, err := NewProcessRuntime(SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, p)
	if got, want := readFile(t, filepath.Join(s.RecordsDir, StdoutFile)), fmt.Sprintf("%d\n", manifest.DefaultMemoryBytes/1024); got != want {
		t.Fatalf("ulimit -v in a class without a cgroup: %q, want %q", got, want)
	}
	for class, want := range map[manifest.Class]string{manifest.Advisory: Enforced, manifest.Scoped: NotApplicable, manifest.Sealed: NotApplicable} {
		for _, g := range Grants(class, &undeclared, false, false) {
			if g.Key == "resources.memory_bytes" && g.Enforcement != want {
				t.Errorf("%s explains resources.memory_bytes as %s (%s), want %s", class, g.Enforcement, g.Mechanism, want)
			}
		}
	}
}

// A scoped session has a /dev/shm of its own: writable, bounded, and not the host's.
func TestScopedPrivateShm(t *testing.T) {
	name := fmt.Sprintf("roost-test-shm-%d", os.Getpid())
	_, out, errOut, _ := scopedRun(t, "capabilities: {containment: scoped, shell: {allow: [df]}}",
		`echo data > /dev/shm/`+name+` && echo "shm writable"; df -k /dev/shm | tail -1`)
	expectOutput(t, out, "shm writable")
	if _, err := os.Stat("/dev/shm/" + name); err == nil {
		os.Remove("/dev/shm/" + name)
		t.Fatalf("the session wrote the host's /dev/shm:\n%s%s", out, errOut)
	}
}

// A sealed root has the /etc that name lookups need.
func TestSealedEtc(t *testing.T) {
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [grep]}}",
		`grep -q '^tcp' /etc/protocols && echo protocols; grep -q '^http' /etc/services && echo services; grep -q '^root:x:0:0:root:/root:' /etc/passwd && echo passwd`)
	expectOutput(t, out, "protocols", "services", "passwd")
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
	script := tryScript + fmt.Sprintf(`try read-offered cat %[1]s/tool.txt
try write-offered touch %[1]s/x
try read-other cat %[2]s/tool.txt`, offered, other)
	caps := "filesystem: {host_read: [" + offered + "]}, shell: {allow: [cat, touch]}}"
	// Landlock: readable, never writable; nothing beside it.
	_, out, _, _ := scopedRun(t, "capabilities: {containment: scoped, "+caps, script)
	expectAllowed(t, out, "read-offered")
	expectDenied(t, out, syscall.EACCES, "write-offered", "read-other")
	// Bound read-only into the root; nothing beside it there.
	_, out, _, _ = sealedRun(t, "capabilities: {containment: sealed, "+caps, script)
	expectAllowed(t, out, "read-offered")
	expectDenied(t, out, syscall.EROFS, "write-offered")
	expectDenied(t, out, syscall.ENOENT, "read-other")
	// The control, last (a file it makes would be there for the sessions to touch): the
	// host does all three.
	expectAllowed(t, onHost(t, script), "read-offered", "write-offered", "read-other")
}
