package idsweep

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
)

// Test ids, far above any host user's: swept is the range the sweep clears, spared one it
// must not touch.
var (
	swept  = Range{First: 0x5a000000, Size: 65536}
	spared = Range{First: 0x5b000000, Size: 65536}
)

const helperEnv = "IDSWEEP_TEST_HELPER"

// TestMain runs the test binary as the helper that leaves leftovers, when asked.
func TestMain(m *testing.M) {
	if tag := os.Getenv(helperEnv); tag != "" {
		os.Exit(leaveLeftovers(tag))
	}
	os.Exit(m.Run())
}

// leaveLeftovers is what a session's uid leaves on the host: a SysV shared-memory segment,
// a semaphore set and a message queue (0600), files in /tmp (0600, and a directory with
// one in it, and a link to a file it does not own) and in /dev/shm, and a process that
// outlives it. It prints their ids.
func leaveLeftovers(tag string) int {
	shm, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shmget:", err)
		return 1
	}
	sem, _, e := unix.Syscall(unix.SYS_SEMGET, unix.IPC_PRIVATE, 1, unix.IPC_CREAT|0o600)
	if e != 0 {
		fmt.Fprintln(os.Stderr, "semget:", e)
		return 1
	}
	msg, _, e := unix.Syscall(unix.SYS_MSGGET, unix.IPC_PRIVATE, unix.IPC_CREAT|0o600, 0)
	if e != 0 {
		fmt.Fprintln(os.Stderr, "msgget:", e)
		return 1
	}
	syscall.Umask(0o077)
	for _, f := range []string{"/tmp/" + tag + "-file", "/dev/shm/" + tag + "-shm"} {
		if err := os.WriteFile(f, []byte("secret of "+tag), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if err := os.MkdirAll("/tmp/"+tag+"-dir/deep/er", 0o700); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.WriteFile("/tmp/"+tag+"-dir/deep/er/f", []byte("x"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.Symlink(os.Getenv("IDSWEEP_TEST_TARGET"), "/tmp/"+tag+"-link"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// A daemon: its own session, its parent gone once this returns.
	d := exec.Command("sleep", "1000")
	d.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := d.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(shm, sem, msg, d.Process.Pid)
	return 0
}

// helperBinary is a copy of the test binary another uid may run (go test's own is in a
// directory only root may enter).
func helperBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "idsweep-helper")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "helper")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

type leftovers struct {
	tag                string
	shm, sem, msg, pid int
}

func leave(t *testing.T, uid uint32, target string) leftovers {
	t.Helper()
	tag := fmt.Sprintf("idsweep-test-%d-%d", os.Getpid(), uid)
	cmd := exec.Command(helperBinary(t), "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+tag, "IDSWEEP_TEST_TARGET="+target)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("leaving leftovers as uid %d: %v\n%s", uid, err, stderr.String())
	}
	l := leftovers{tag: tag}
	if _, err := fmt.Sscan(string(out), &l.shm, &l.sem, &l.msg, &l.pid); err != nil {
		t.Fatalf("helper said %q: %v", out, err)
	}
	t.Cleanup(func() {
		syscall.Kill(l.pid, syscall.SIGKILL)
		unix.SysvShmCtl(l.shm, unix.IPC_RMID, nil)
		unix.Syscall6(unix.SYS_SEMCTL, uintptr(l.sem), 0, unix.IPC_RMID, 0, 0, 0)
		unix.Syscall(unix.SYS_MSGCTL, uintptr(l.msg), unix.IPC_RMID, 0)
		for _, p := range []string{"/tmp/" + tag + "-file", "/dev/shm/" + tag + "-shm", "/tmp/" + tag + "-link"} {
			os.Remove(p)
		}
		os.RemoveAll("/tmp/" + tag + "-dir")
	})
	return l
}

// alive says whether pid runs (a zombie does not).
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(data), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

// reads is what the next holder of the uid finds: whether it can read the 0600 file and
// attach the segment, as that uid. It runs `cat` and the test binary's shmat probe.
func readsAs(t *testing.T, uid uint32, path string) error {
	t.Helper()
	cmd := exec.Command("cat", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func shmExists(id int) error {
	var d unix.SysvShmDesc
	_, err := unix.SysvShmCtl(id, unix.IPC_STAT, &d)
	return err
}

func semExists(id int) error {
	// GETPID needs no buffer.
	_, _, e := unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), 0, 11 /* GETPID */, 0, 0, 0)
	return errnoErr(e)
}

func msgExists(id int) error {
	var buf [256]byte
	_, _, e := unix.Syscall(unix.SYS_MSGCTL, uintptr(id), unix.IPC_STAT, unsafePointer(&buf))
	return errnoErr(e)
}

// TestSweepClearsTheRange: what one uid of a range left — SysV objects, files in /tmp and
// /dev/shm, a daemonised process — is there and readable by the next holder of that uid
// before the sweep (the attack works), and gone after it, with the specific errors;
// the same leftovers of a uid outside the range are untouched, and a link the range left
// goes without its target.
func TestSweepClearsTheRange(t *testing.T) {
	testenv.NeedRoot(t, "sweeping host ids")
	target := filepath.Join(t.TempDir(), "not-the-range's")
	if err := os.WriteFile(target, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	uid := swept.First + 7
	a := leave(t, uid, target)
	b := leave(t, spared.First+7, target)

	// Positive control: all of it is there, and the next holder of the uid reads it.
	for _, l := range []leftovers{a, b} {
		if err := errors.Join(shmExists(l.shm), semExists(l.sem), msgExists(l.msg)); err != nil {
			t.Fatalf("%s: the SysV objects are not there to sweep: %v", l.tag, err)
		}
		if !alive(l.pid) {
			t.Fatalf("%s: the daemon %d does not run", l.tag, l.pid)
		}
	}
	if err := readsAs(t, uid, "/tmp/"+a.tag+"-file"); err != nil {
		t.Fatalf("control: the next holder of uid %d cannot read what the last left: %v", uid, err)
	}

	rep, err := Sweeper{}.Sweep(Ranges{swept})
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	t.Logf("swept: %+v", rep)
	if rep.Processes < 1 || rep.IPC < 3 || rep.Files < 6 {
		t.Errorf("report %+v: want at least the daemon, 3 IPC objects and 6 entries", rep)
	}
	if err := shmExists(a.shm); !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EIDRM) {
		t.Errorf("shm %d after the sweep: %v, want EINVAL", a.shm, err)
	}
	if err := semExists(a.sem); !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EIDRM) {
		t.Errorf("sem %d after the sweep: %v, want EINVAL", a.sem, err)
	}
	if err := msgExists(a.msg); !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EIDRM) {
		t.Errorf("msg %d after the sweep: %v, want EINVAL", a.msg, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for alive(a.pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(a.pid) {
		t.Errorf("the range's daemon %d survived the sweep", a.pid)
	}
	for _, p := range []string{"/tmp/" + a.tag + "-file", "/dev/shm/" + a.tag + "-shm", "/tmp/" + a.tag + "-dir", "/tmp/" + a.tag + "-link"} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the sweep: %v, want ENOENT", p, err)
		}
	}
	if err := readsAs(t, uid, "/tmp/"+a.tag+"-file"); err == nil || !strings.Contains(err.Error(), "No such file") {
		t.Errorf("the next holder still reads the last one's file: %v", err)
	}
	if data, err := os.ReadFile(target); err != nil || string(data) != "keep" {
		t.Errorf("the link's target: %q %v", data, err)
	}
	// Outside the range nothing moved.
	if err := errors.Join(shmExists(b.shm), semExists(b.sem), msgExists(b.msg)); err != nil {
		t.Errorf("the sweep removed another range's SysV objects: %v", err)
	}
	if !alive(b.pid) {
		t.Errorf("the sweep killed another range's process %d", b.pid)
	}
	for _, p := range []string{"/tmp/" + b.tag + "-file", "/dev/shm/" + b.tag + "-shm", "/tmp/" + b.tag + "-dir/deep/er/f", "/tmp/" + b.tag + "-link"} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("the sweep removed another range's %s: %v", p, err)
		}
	}
}

// TestSweepSparesOthersFilesInTheRangesDirectory: a directory of the range that holds
// another user's file is not removed with it; it goes to root, so the next holder of the
// range cannot enter it.
func TestSweepSparesOthersFilesInTheRangesDirectory(t *testing.T) {
	testenv.NeedRoot(t, "sweeping host ids")
	place := t.TempDir()
	dir := filepath.Join(place, "shared")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	if err := os.Chown(dir, int(swept.First), int(swept.First)); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(dir, "theirs")
	if err := os.WriteFile(theirs, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, int(spared.First), int(spared.First)); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(dir, "mine")
	if err := os.WriteFile(mine, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(mine, int(swept.First), int(swept.First)); err != nil {
		t.Fatal(err)
	}
	if _, err := (Sweeper{Places: []string{place}}).Sweep(Ranges{swept}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(mine); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the range's file: %v", err)
	}
	if _, err := os.Lstat(theirs); err != nil {
		t.Errorf("another user's file: %v", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Sys().(*syscall.Stat_t); s.Uid != 0 || s.Gid != 0 || st.Mode().Perm() != 0o700 {
		t.Errorf("the range's directory is %d:%d %v, want root's 0700", s.Uid, s.Gid, st.Mode().Perm())
	}
}

func TestParseSysvipc(t *testing.T) {
	const shm = `       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap
         0          3   600                  4096  1234     0      0 1509949447 1509949447 1509949447 1509949447          0          0 1700000000                     0                     0
`
	objs, err := parseSysvipc(shm, "shmid")
	if err != nil || len(objs) != 1 || objs[0].id != 3 || objs[0].ids[0] != 1509949447 {
		t.Fatalf("%+v %v", objs, err)
	}
	for _, bad := range []string{"", "key shmid uid gid cuid\n", "key shmid uid gid cuid cgid\n0 x 1 1 1 1\n", "key shmid uid gid cuid cgid\n0 1 1\n"} {
		if _, err := parseSysvipc(bad, "shmid"); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzParseSysvipc(f *testing.F) {
	f.Add("key semid perms nsems uid gid cuid cgid otime ctime\n0 1 600 1 5 5 5 5 0 0\n")
	f.Add("key msqid perms cbytes qnum lspid lrpid uid gid cuid cgid stime rtime ctime\n")
	f.Fuzz(func(t *testing.T, data string) {
		objs, err := parseSysvipc(data, "semid")
		if err != nil {
			return
		}
		for _, o := range objs {
			if o.id < 0 || len(o.ids) != 4 {
				t.Fatalf("%+v", o)
			}
		}
	})
}

func TestParseStatus(t *testing.T) {
	o, ok := parseStatus("Name:\tx\nState:\tS (sleeping)\nUid:\t1\t2\t3\t4\nGid:\t5\t6\t7\t1509949447\n")
	if !ok || len(o.ids) != 8 || o.zombie || !o.in(Ranges{swept}) {
		t.Fatalf("%+v %v", o, ok)
	}
	if o, _ := parseStatus("State:\tZ (zombie)\nUid:\t1509949447\t0\t0\t0\nGid:\t0\t0\t0\t0\n"); o.in(Ranges{swept}) {
		t.Fatal("a zombie counted")
	}
	if _, ok := parseStatus("Uid:\t1\t2\nGid:\t1\t2\t3\t4\n"); ok {
		t.Fatal("short Uid line read")
	}
	_ = strconv.Itoa
}

func unsafePointer(b *[256]byte) uintptr { return uintptr(unsafe.Pointer(b)) }

// TestClaimRefusesAnOverlappingBlock: a second claimant of an overlapping block — another
// daemon, here a child process — is refused naming the holder's pid; a disjoint block is
// not; once the holder is gone its block is free again.
func TestClaimRefusesAnOverlappingBlock(t *testing.T) {
	dir := t.TempDir()
	held, err := Claim(dir, 1000, 2000)
	if err != nil {
		t.Fatal(err)
	}
	// A flock is per open file: another open file of this process conflicts as another
	// daemon's would.
	if _, err := Claim(dir, 1500, 2500); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the block 1000-1999 roostd pid %d sweeps", os.Getpid())) {
		t.Fatalf("an overlapping block: %v", err)
	}
	other, err := Claim(dir, 2000, 3000)
	if err != nil {
		t.Fatalf("a disjoint block: %v", err)
	}
	other.Release()
	held.Release()
	again, err := Claim(dir, 1500, 2500)
	if err != nil {
		t.Fatalf("after the holder let go: %v", err)
	}
	again.Release()
}

func FuzzParseStatus(f *testing.F) {
	f.Add("Name:\tx\nState:\tS (sleeping)\nUid:\t1\t2\t3\t4\nGid:\t5\t6\t7\t8\n")
	f.Add("Uid:\t1\nGid:\n")
	f.Fuzz(func(t *testing.T, data string) {
		if o, ok := parseStatus(data); ok && len(o.ids) < 8 {
			t.Fatalf("%+v", o)
		}
	})
}

func FuzzParseClaim(f *testing.F) {
	f.Add("1000-2000.42")
	f.Add(".lock")
	f.Fuzz(func(t *testing.T, name string) {
		if first, end, _, ok := parseClaim(name); ok && first >= end {
			t.Fatalf("%q: %d-%d", name, first, end)
		}
	})
}

// TestKillIsBounded: a process of the range that never goes (here one /proc keeps listing
// with the range's uid) leaves the sweep failed after KillFor, for the range to be
// quarantined, rather than holding up the rm that asked.
func TestKillIsBounded(t *testing.T) {
	testenv.NeedRoot(t, "signalling processes")
	victim := exec.Command("sleep", "60")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { victim.Process.Kill(); victim.Wait() })
	proc := t.TempDir()
	pid := fmt.Sprint(victim.Process.Pid)
	task := filepath.Join(proc, pid, "task", pid)
	if err := os.MkdirAll(task, 0o755); err != nil {
		t.Fatal(err)
	}
	status := fmt.Sprintf("State:\tS (sleeping)\nUid:\t%d\t%d\t%d\t%d\nGid:\t0\t0\t0\t0\n", swept.First, swept.First, swept.First, swept.First)
	if err := os.WriteFile(filepath.Join(task, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Sweeper{Proc: proc, Places: []string{}, KillFor: 300 * time.Millisecond, Settle: 50 * time.Millisecond}.Sweep(Ranges{swept})
	if err == nil || !strings.Contains(err.Error(), "were still there after") || !strings.Contains(err.Error(), "of SIGKILL rounds") {
		t.Fatalf("sweep: %v", err)
	}
}
