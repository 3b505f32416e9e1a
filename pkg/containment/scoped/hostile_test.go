package scoped_test

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/containment"
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

// A scoped session has a pid namespace and a /proc of its own: it lists roost-init as its
// pid 1 and its program, nothing else, and a host process is not there to read or signal
// (ENOENT, ESRCH). The control: an advisory session, on the host's pid namespace,
// lists and reads the test process, and may not signal it (EPERM: it is there).
func TestHostileScopedSeesOnlyItsProcesses(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	// Builtins only where pids are listed: a forked subshell would list itself.
	probe := testkit.TryScript + `printf pids:; for p in /proc/[0-9]*; do printf ' %s' "${p#/proc/}"; done; echo
echo "self: $$"
printf 'init:'; cat /proc/1/cmdline | tr '\0' ' '; echo
try host-cmdline cat /proc/` + self + `/cmdline
try host-status cat /proc/` + self + `/status
try host-signal kill -0 ` + self + "\n"
	_, out, errOut, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, shell: {allow: [cat, tr]}}", probe)
	if pids, program := strings.Fields(lineAfter(out, "pids:")), lineAfter(out, "self: "); len(pids) != 2 || pids[0] != "1" || pids[1] != program {
		t.Errorf("a scoped session's processes, want roost-init (1) and its program (%s) only:\n%s%s", program, out, errOut)
	}
	testkit.ExpectOutput(t, out, "init:"+containment.InitName+" ")
	testkit.ExpectDenied(t, out, syscall.ENOENT, "host-cmdline", "host-status")
	testkit.ExpectDenied(t, out, syscall.ESRCH, "host-signal")

	_, out, _, _ = kit.AdvisoryRun(t, probe)
	if pids := strings.Fields(lineAfter(out, "pids:")); !slices.Contains(pids, self) || !slices.Contains(pids, "1") {
		t.Errorf("the advisory control lists no host pid 1 or test process %s:\n%s", self, out)
	}
	if strings.Contains(lineAfter(out, "init:"), containment.InitName) {
		t.Errorf("the advisory control's pid 1 is roost-init:\n%s", out)
	}
	testkit.ExpectAllowed(t, out, "host-cmdline", "host-status")
	testkit.ExpectDenied(t, out, syscall.EPERM, "host-signal")
}

// lineAfter is what follows prefix on the first line of out that starts with it.
func lineAfter(out, prefix string) string {
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			return rest
		}
	}
	return ""
}

// hostIPC makes a SysV shared memory segment, semaphore set and message queue and a POSIX
// message queue on the host, each open to every uid (0666), and removes them when the test
// ends. It returns the SysV key they share and the POSIX queue's name.
func hostIPC(t *testing.T) (int, string) {
	t.Helper()
	testkit.NeedRoot(t)
	key := 0x52000000 | os.Getpid()&0xffffff
	shm, err := unix.SysvShmGet(key, 4096, unix.IPC_CREAT|unix.IPC_EXCL|0o666)
	if err != nil {
		t.Fatalf("a host shm segment: %v", err)
	}
	t.Cleanup(func() { _, _ = unix.SysvShmCtl(shm, unix.IPC_RMID, nil) })
	sem, _, errno := unix.Syscall(unix.SYS_SEMGET, uintptr(key), 1, unix.IPC_CREAT|unix.IPC_EXCL|0o666)
	if errno != 0 {
		t.Fatalf("a host semaphore set: %v", errno)
	}
	t.Cleanup(func() { _, _, _ = unix.Syscall6(unix.SYS_SEMCTL, sem, 0, unix.IPC_RMID, 0, 0, 0) })
	msg, _, errno := unix.Syscall(unix.SYS_MSGGET, uintptr(key), unix.IPC_CREAT|unix.IPC_EXCL|0o666, 0)
	if errno != 0 {
		t.Fatalf("a host message queue: %v", errno)
	}
	t.Cleanup(func() { _, _, _ = unix.Syscall(unix.SYS_MSGCTL, msg, unix.IPC_RMID, 0) })
	name := fmt.Sprintf("roost-test-mq-%d", os.Getpid())
	// The kernel's mq_open takes the name without the C library's leading slash; the mode
	// is the umask's, set so any uid may open the queue.
	old := unix.Umask(0)
	mq, err := mqOpen(name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR, 0o666)
	unix.Umask(old)
	if err != nil {
		t.Fatalf("a host POSIX message queue: %v", err)
	}
	unix.Close(mq)
	t.Cleanup(func() { _ = mqUnlink(name) })
	return key, "/" + name
}

func mqOpen(name string, flags int, mode uint32) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return -1, err
	}
	fd, _, errno := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), uintptr(flags), uintptr(mode), 0, 0, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

func mqUnlink(name string) error {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0); errno != 0 {
		return errno
	}
	return nil
}

// ipcPython tries the host's IPC objects from a session, each attempt said as try says it:
// argv is the host's SysV key, its POSIX queue's name, a key of the session's own, and
// "make" or "find". It attaches the host's shm segment (shmget and shmat, as any uid may),
// gets its semaphore set and message queue and opens its POSIX queue; attaches the session's own segment (the
// control that SysV shm works there at all), made and then removed with "make", else one
// the session made before; and says whether /proc/sysvipc lists the host's segment.
const ipcPython = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
IPC_CREAT, IPC_RMID, SHM_RDONLY = 0o1000, 0, 0o10000
key, mq, own, make = int(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3]), sys.argv[4] == "make"

def say(label, ok):
    if ok:
        print("ok " + label)
    else:
        print("denied %s: %s" % (label, os.strerror(ctypes.get_errno())))

def attach(key, size, flags):
    shm = libc.shmget(key, size, flags)
    if shm < 0:
        return -1
    if libc.shmat(shm, None, SHM_RDONLY) == ctypes.c_void_p(-1).value:
        return -1
    return shm

say("host-shm", attach(key, 0, 0) >= 0)
say("host-sem", libc.semget(key, 0, 0) >= 0)
say("host-msg", libc.msgget(key, 0) >= 0)
say("host-mq", libc.mq_open(mq, os.O_RDONLY) >= 0)
mine = attach(own, 4096, IPC_CREAT | 0o600) if make else attach(own, 0, 0)
say("own-shm", mine >= 0)
if make and mine >= 0:
    libc.shmctl(mine, IPC_RMID, None)
keys = [l.split()[0] for l in open("/proc/sysvipc/shm").read().splitlines()[1:] if l.strip()]
print("listed: %s" % (str(key) in keys))
`

// A scoped session has an IPC namespace of its own: the host's SysV segments, semaphores and
// queues and its POSIX message queues are not there (ENOENT), though open to every uid, and
// /proc/sysvipc lists none of them. What the session makes for itself works. The control:
// an advisory session, in the host's IPC namespace, attaches and opens every one.
func TestHostileScopedCannotReachHostIPC(t *testing.T) {
	key, mq := hostIPC(t)
	probe := fmt.Sprintf("/usr/bin/python3 -c '%s' %d %s %d make", ipcPython, key, mq, key+1)
	_, out, errOut, _ := kit.ScopedRun(t, "capabilities: {containment: scoped, shell: {allow: [/usr/bin/python3]}}", probe)
	t.Logf("stderr:\n%s", errOut)
	testkit.ExpectDenied(t, out, syscall.ENOENT, "host-shm", "host-sem", "host-msg", "host-mq")
	testkit.ExpectAllowed(t, out, "own-shm")
	testkit.ExpectOutput(t, out, "listed: False")

	_, out, _, _ = kit.AdvisoryRun(t, probe)
	testkit.ExpectAllowed(t, out, "host-shm", "host-sem", "host-msg", "host-mq", "own-shm")
	testkit.ExpectOutput(t, out, "listed: True")
}
