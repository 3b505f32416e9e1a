package containment

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"roost.dev/roost/pkg/manifest"
)

// Hostile tests of the trust boundary: no session runs as host root, a scoped session reads
// only the system trees and its own, and the daemon's secrets stay the daemon's.

// daemonSecrets lays out what a session must never read: a state directory as roostd keeps
// it (the key, the registry, another session's records and workdir), an upstream's key file
// in /etc, and a world-readable file under /srv. It returns the paths to probe.
func daemonSecrets(t *testing.T) []string {
	t.Helper()
	state := reachableDir(t)
	files := map[string]os.FileMode{
		"credential.key":                  0o600,
		"roost.db":                        0o600,
		"ledger.db":                       0o600,
		"records/ses_other/stdout.log":    0o600,
		"records/ses_other/exit.json":     0o600,
		"work/ses_other/notes.txt":        0o644,
		"artifacts/refs.db":               0o600,
		"containers/ses_other/state.json": 0o600,
	}
	dirs := map[string]os.FileMode{"records": 0o711, "records/ses_other": 0o711, "work": 0o711, "work/ses_other": 0o700,
		"artifacts": 0o711, "containers": 0o700, "containers/ses_other": 0o700}
	for d, mode := range dirs {
		if err := os.MkdirAll(filepath.Join(state, d), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(state, d), mode); err != nil {
			t.Fatal(err)
		}
	}
	// Another session's workdir is its own uid's.
	other := testIDs()
	if err := os.Chown(filepath.Join(state, "work/ses_other"), int(other.First), int(other.First)); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for f, mode := range files {
		p := filepath.Join(state, f)
		if err := os.WriteFile(p, []byte("SECRET "+f+"\n"), mode); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	key := fmt.Sprintf("/etc/roost-test-%d.key", os.Getpid())
	srv := fmt.Sprintf("/srv/roost-test-%d", os.Getpid())
	if err := os.WriteFile(key, []byte("sk-SECRET\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(srv, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(srv, "public.txt"), []byte("SECRET srv\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(key); os.RemoveAll(srv) })
	hostTmp, err := os.CreateTemp("", "roost-test-host-tmp-")
	if err != nil {
		t.Fatal(err)
	}
	hostTmp.WriteString("SECRET tmp\n")
	hostTmp.Close()
	os.Chmod(hostTmp.Name(), 0o644)
	t.Cleanup(func() { os.Remove(hostTmp.Name()) })
	return append(paths, key, filepath.Join(srv, "public.txt"), "/etc/shadow", hostTmp.Name(), filepath.Join(state, "records/ses_other"))
}

// readProbe is a script that tries to read every path, each attempt labelled by its path. A
// directory is read by listing it, a file by reading its bytes (ls of a file only looks at
// its directory).
func readProbe(paths []string) string {
	var b strings.Builder
	b.WriteString(tryScript)
	b.WriteString(`readpath() { if [ -d "$1" ]; then ls "$1"; else cat "$1"; fi; }` + "\n")
	for _, p := range paths {
		fmt.Fprintf(&b, "try %[1]q readpath %[1]q\n", p)
	}
	return b.String()
}

// expectRefused fails unless the session was refused every path with errno, and the same
// probe on the host read every one: the paths are there, and readable to whoever may.
func expectRefused(t *testing.T, out string, paths []string, errno syscall.Errno) {
	t.Helper()
	expectDenied(t, out, errno, paths...)
	expectAllowed(t, onHost(t, readProbe(paths)), paths...)
}

// A scoped session's reads are held by Landlock (and for root's files by DAC too): EACCES.
func TestHostileScopedCannotReadDaemonSecrets(t *testing.T) {
	paths := daemonSecrets(t)
	_, out, errOut, _ := scopedRun(t, "capabilities: {containment: scoped, shell: {allow: [cat, ls]}}", readProbe(paths))
	t.Logf("stderr:\n%s", errOut)
	expectRefused(t, out, paths, syscall.EACCES)
}

func TestHostileScopedWithUnixSocketsCannotReadDaemonSecrets(t *testing.T) {
	paths := daemonSecrets(t)
	_, out, _, _ := scopedRun(t, "capabilities: {containment: scoped, network: {unix_sockets: true}, shell: {allow: [cat, ls]}}", readProbe(paths))
	expectRefused(t, out, paths, syscall.EACCES)
}

// A sealed root holds none of them: ENOENT.
func TestHostileSealedCannotReadDaemonSecrets(t *testing.T) {
	paths := daemonSecrets(t)
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [cat, ls]}}", readProbe(paths))
	expectRefused(t, out, paths, syscall.ENOENT)
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
	probe := tryScript + "for d in " + strings.Join(refused, " ") + `; do try $d ls $d; done`
	_, out, _, _ := scopedRun(t, "capabilities: {containment: scoped, shell: {allow: [ls, cat]}}", probe+`
for d in /usr /etc /bin /proc; do try $d ls $d; done
try TMPDIR ls "$TMPDIR"
try workdir ls .`)
	expectAllowed(t, out, "/usr", "/etc", "/bin", "/proc", "TMPDIR", "workdir")
	expectDenied(t, out, syscall.EACCES, refused...)
	// The control: the host lists every one of them.
	expectAllowed(t, onHost(t, probe), refused...)
	if !slices.Contains(refused, "/tmp") || !slices.Contains(refused, "/root") {
		t.Fatalf("the host lacks /tmp or /root: %v", refused)
	}
}

// hostUID reads a running program's uid on the host, from the host's /proc.
func hostUID(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			return strings.Join(strings.Fields(rest), " ")
		}
	}
	t.Fatalf("no Uid line for pid %d", pid)
	return ""
}

// Two live sessions of each class run as host uids that are not root and not each other's.
func TestHostileNoSessionRunsAsHostRoot(t *testing.T) {
	needRoot(t)
	sealed, err := NewSealedRuntime(reachableDir(t), staticInit(t), testIDs())
	if err != nil {
		t.Fatal(err)
	}
	scoped, err := NewScopedRuntime(reachableDir(t), staticInit(t), testIDs())
	if err != nil {
		t.Fatal(err)
	}
	plain := NewProcessRuntime(staticInit(t))
	type runtime interface {
		Start(context.Context, Spec) (Process, error)
		Release(string) error
	}
	for _, c := range []struct {
		class manifest.Class
		rt    runtime
	}{{manifest.Sealed, sealed}, {manifest.Scoped, scoped}, {manifest.Advisory, plain}, {manifest.Unconfined, plain}} {
		t.Run(c.class.String(), func(t *testing.T) {
			var uids []string
			for i := range 2 {
				s := spec(t, "/bin/sleep", "30")
				s.SessionID = fmt.Sprintf("ses_uid_%s_%d", c.class, i)
				s.Class = c.class
				s.Policy = sealedPolicy(t, "capabilities: {containment: "+c.class.String()+"}")
				s.CapsuleDir = reachableDir(t)
				p, err := c.rt.Start(context.Background(), s)
				if err != nil {
					t.Fatalf("start: %v", err)
				}
				t.Cleanup(func() {
					_ = p.Signal(syscall.SIGKILL)
					waitDone(t, p)
					_ = c.rt.Release(s.SessionID)
				})
				uid := hostUID(t, p.Ref().PID)
				want := fmt.Sprint(s.IDs.First)
				if uid != strings.Repeat(want+" ", 3)+want {
					t.Fatalf("%s session runs as host uid %q, want %s for real, effective, saved and fs", c.class, uid, want)
				}
				uids = append(uids, uid)
			}
			if uids[0] == uids[1] {
				t.Fatalf("two live sessions share host uid %s", uids[0])
			}
		})
	}
}

// A session the operator lets run as root (sessions.allow_root) is the only one that does,
// and a Spec that names no ids is refused rather than run as root.
func TestHostileRootOnlyWhenAllowed(t *testing.T) {
	needRoot(t)
	plain := NewProcessRuntime(staticInit(t))
	s := spec(t, "/usr/bin/id", "-u")
	s.Class = manifest.Advisory
	s.IDs = IDs{}
	if _, err := plain.Start(context.Background(), s); err == nil || !strings.Contains(err.Error(), "no uid range") {
		t.Fatalf("a session without ids started: %v", err)
	}
	s.Root = true
	p, err := plain.Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, p)
	if out := readFile(t, filepath.Join(s.RecordsDir, StdoutFile)); out != "0\n" {
		t.Fatalf("an allowed root session ran as %q", out)
	}
	sealed, err := NewSealedRuntime(reachableDir(t), staticInit(t), testIDs())
	if err != nil {
		t.Fatal(err)
	}
	s = spec(t, "/usr/bin/true")
	s.Class, s.Root, s.IDs = manifest.Sealed, true, IDs{}
	s.Policy = sealedPolicy(t, "capabilities: {containment: sealed}")
	s.CapsuleDir = reachableDir(t)
	if _, err := sealed.Start(context.Background(), s); err == nil {
		t.Fatal("a sealed session started without a user namespace range")
	}
}

// Inside a sealed root, root is a user namespace's: the map names the session's range, and
// the workdir it wrote is owned on the host by the range's first uid.
func TestHostileSealedUserNamespace(t *testing.T) {
	_, out, _, s := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [cat, id, touch, ls]}}",
		`cat /proc/self/uid_map /proc/self/gid_map; id -u; touch /work/made; cat /capsule/ >/dev/null 2>&1; ls -ld /usr >/dev/null && echo usr-readable`)
	want := fmt.Sprintf("0 %d 65536", s.IDs.First)
	if strings.Count(strings.Join(strings.Fields(out), " "), want) != 2 {
		t.Fatalf("user namespace maps are not %q:\n%s", want, out)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(s.Dir, "made"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != s.IDs.First || st.Gid != s.IDs.First {
		t.Fatalf("a file the session made is owned by %d:%d on the host, want %d", st.Uid, st.Gid, s.IDs.First)
	}
}

// What helps a kernel exploit find its targets is masked in a sealed root: every read of
// these returns nothing.
//
// A masked file opens and reads empty. One that fails to open is not masked, only refused
// (/proc/slabinfo is root's alone): unmasked, a kernel bug could still reach it.
func TestHostileSealedProcMasked(t *testing.T) {
	files := []string{"/proc/kallsyms", "/proc/slabinfo", "/proc/vmallocinfo", "/proc/kcore", "/proc/keys", "/proc/interrupts", "/proc/timer_list", "/proc/sched_debug"}
	var script strings.Builder
	for _, f := range files {
		// The first 4 KiB tell empty from not: the host's /proc/kcore is its memory.
		fmt.Fprintf(&script, "if head -c 4096 %[1]s >\"$T/read\" 2>\"$T/err\"; then echo \"read %[1]s $(wc -c <\"$T/read\")\"; else echo \"denied %[1]s: $(cat \"$T/err\")\"; fi\n", f)
	}
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [cat, wc, head]}}", "T=/tmp\n"+script.String())
	// The control: the host reads every one it has, and finds something in it.
	host := onHost(t, script.String(), "T="+t.TempDir())
	probed := 0
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			t.Logf("%s: not on this kernel", f)
			continue
		}
		if strings.Contains(host, "read "+f+" 0\n") || !strings.Contains(host, "read "+f+" ") {
			t.Errorf("the host reads nothing of %s: the probe proves nothing of it:\n%s", f, host)
			continue
		}
		probed++
		if !strings.Contains(out, "read "+f+" 0\n") {
			t.Errorf("%s is not masked in a sealed session (want it to open and read empty):\n%s", f, out)
		}
	}
	if probed == 0 {
		t.Fatal("none of the files is on this kernel")
	}
}
