package scoped_test

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/containment/internal/testkit"
)

// Hostile scoped sessions: on the host's view, what they try to read or run of it.

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
	testenv.Need(t, "a dynamically linked /usr/bin/true", errors.New("it has no PT_INTERP"))
	return ""
}

// Without workdir_exec, a program the session writes does not run — not directly, and not
// through the dynamic loader either (which maps it with mmap, beyond Landlock's exec right):
// the trees the session writes are mounted noexec in its own mount namespace.
func TestHostileScopedLoaderCannotRunWorkdirBinary(t *testing.T) {
	ld := loader(t)
	probe := testkit.TryScript + fmt.Sprintf(`try copy cp /usr/bin/true ./mytrue
try chmod chmod +x ./mytrue
try copy-tmp cp /usr/bin/true "$TMPDIR/t"
try copy-shm cp /usr/bin/true /dev/shm/t
try directly ./mytrue
try loader %[1]s ./mytrue
try tmp %[1]s "$TMPDIR/t"
try shm %[1]s /dev/shm/t`, ld)
	_, out, _, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, shell: {allow: [cp, chmod]}}", probe)
	testkit.ExpectAllowed(t, out, "copy", "chmod", "copy-tmp", "copy-shm")
	// exec(2) of a file on a noexec mount is EACCES. The loader reads the file (Landlock
	// lets it) and fails to map it executable (the mount is noexec), and says so without
	// the errno.
	testkit.ExpectDenied(t, out, syscall.EACCES, "directly")
	testkit.ExpectDeniedSaying(t, out, "failed to map segment from shared object", "loader", "tmp", "shm")
	// The control: the same probe, in a session whose writable trees may exec, runs them all.
	_, out, _, _ = kit.ScopedRun(t, "capabilities: {containment: scoped, filesystem: {workdir_exec: true}, shell: {allow: [cp, chmod]}}", probe)
	testkit.ExpectAllowed(t, out, "copy", "chmod", "copy-tmp", "copy-shm", "directly", "loader", "tmp", "shm")
}

// A scoped session's reads are held by Landlock (and for root's files by DAC too): EACCES.
func TestHostileScopedCannotReadDaemonSecrets(t *testing.T) {
	paths := kit.DaemonSecrets(t)
	_, out, errOut, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, shell: {allow: [cat, ls]}}", testkit.ReadProbe(paths))
	t.Logf("stderr:\n%s", errOut)
	testkit.ExpectRefused(t, out, paths, syscall.EACCES)
}

func TestHostileScopedWithUnixSocketsCannotReadDaemonSecrets(t *testing.T) {
	paths := kit.DaemonSecrets(t)
	_, out, _, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, network: {unix_sockets: true}, shell: {allow: [cat, ls]}}", testkit.ReadProbe(paths))
	testkit.ExpectRefused(t, out, paths, syscall.EACCES)
}

// A scoped program reads the system trees, its workdir and TMPDIR, and nothing else of the
// host: not /root, /home, /var, /run, /srv, /mnt, /media or the host's /tmp, even where DAC
// would let any uid read.
func TestHostileScopedReadsOnlySystemTrees(t *testing.T) {
	// Only the trees this host has: one it lacks is refused for that alone.
	var refused []string
	for _, d := range []string{"/root", "/home", "/var", "/run", "/srv", "/mnt", "/media", "/tmp", "/sys", "/boot"} {
		if _, err := os.Stat(d); err == nil {
			refused = append(refused, d)
		} else {
			t.Logf("%s is absent on this host: not probed", d)
		}
	}
	probe := testkit.TryScript + "for d in " + strings.Join(refused, " ") + `; do try $d ls $d; done`
	_, out, _, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, shell: {allow: [ls, cat]}}", probe+`
for d in /usr /etc /bin /proc; do try $d ls $d; done
try TMPDIR ls "$TMPDIR"
try workdir ls .`)
	testkit.ExpectAllowed(t, out, "/usr", "/etc", "/bin", "/proc", "TMPDIR", "workdir")
	testkit.ExpectDenied(t, out, syscall.EACCES, refused...)
	// The control: the host lists every one of them.
	testkit.ExpectAllowed(t, testkit.OnHost(t, probe), refused...)
	if !slices.Contains(refused, "/tmp") || !slices.Contains(refused, "/root") {
		t.Fatalf("the host lacks /tmp or /root: %v", refused)
	}
}
