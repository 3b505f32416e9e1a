package dirs

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/config"
)

// sealChild names, in the environment of the test binary run again in a mount namespace
// of its own, the directory it works in.
const sealChild = "ROOST_DIRS_SEAL_TEST_BASE"

// nobody is the unprivileged host user who comes across a session's files.
const nobody = 65534

// A setuid file a session leaves in its workdir does not run as its owner for a host user,
// and a device node there does not open, once the trees are sealed; on a plain directory
// of the same kind of filesystem both do. The mounts are made in a mount namespace of the
// test's own (the test binary run again, unshared): the host's are left as they were.
func TestSealIgnoresSetuidAndDevices(t *testing.T) {
	if base := os.Getenv(sealChild); base != "" {
		sealInOwnNamespace(t, base)
		return
	}
	testenv.NeedRoot(t, "mounting, in a mount namespace of the test's own")
	base := t.TempDir()
	// nobody must pass through to the files it runs.
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSealIgnoresSetuidAndDevices$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), sealChild+"="+base)
	// Go makes / private in the new namespace (MS_REC|MS_PRIVATE), so nothing propagates out.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	testenv.Need(t, "a mount namespace of the test's own", unshareErr(err))
	if err != nil || !strings.Contains(string(out), "--- PASS: TestSealIgnoresSetuidAndDevices") {
		t.Fatalf("in its own mount namespace: %v\n%s", err, out)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), base) {
		t.Fatalf("the test's mounts reached the host's namespace:\n%s", mounts)
	}
}

// unshareErr is err when it says the namespace could not be made at all (the test then
// needs what it lacks), nil otherwise.
func unshareErr(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) && (errno == syscall.EPERM || errno == syscall.EINVAL) {
		return err
	}
	return nil
}

func sealInOwnNamespace(t *testing.T, base string) {
	// A filesystem of the test's own, which honours setuid bits and device nodes whatever
	// the host's /tmp is mounted with.
	fs := filepath.Join(base, "fs")
	if err := os.Mkdir(fs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("roost-seal-test", fs, "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatalf("a tmpfs in the test's namespace: %v", err)
	}
	owner := int(config.DefaultFirstID)

	// The positive controls: unsealed, the file runs as its owner and the node opens.
	plain := filepath.Join(fs, "plain")
	if err := os.Mkdir(plain, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := runSetuid(t, plain, owner); got != strconv.Itoa(owner) {
		t.Fatalf("a setuid file owned by %d on a plain directory runs as euid %s: the test cannot tell sealed from not", owner, got)
	}
	if err := openDevice(t, plain); err != nil {
		t.Fatalf("a device node on a plain directory: %v: the test cannot tell sealed from not", err)
	}

	// A space in the path: mountinfo writes it \040, and the mounts must still be found.
	state := filepath.Join(fs, "state dir")
	// records a symlink to a directory elsewhere: the bind is of where it leads.
	elsewhere := filepath.Join(fs, "elsewhere")
	if err := os.MkdirAll(filepath.Join(elsewhere, RecordsDir), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(state, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(elsewhere, RecordsDir), filepath.Join(state, RecordsDir)); err != nil {
		t.Fatal(err)
	}
	if err := Prepare(state); err != nil {
		t.Fatal(err)
	}
	// An operator's own mount at one tree, noexec: remounted, not stacked, noexec kept.
	home := filepath.Join(state, HomesDir)
	if err := unix.Mount("roost-home", home, "tmpfs", unix.MS_NOEXEC, "mode=0711"); err != nil {
		t.Fatal(err)
	}
	trees := append(Trees(state), filepath.Join(state, "tmp"))
	if problems := CheckSealed(trees[:4]...); len(problems) != 4 {
		t.Fatalf("before sealing, doctor's check finds %d problems in 4 trees: %q", len(problems), problems)
	}
	for range 2 {
		if err := Seal(trees...); err != nil {
			t.Fatal(err)
		}
	}
	if problems := CheckSealed(trees...); len(problems) != 0 {
		t.Fatalf("after sealing: %q", problems)
	}
	records := filepath.Join(elsewhere, RecordsDir)
	for _, dir := range []string{filepath.Join(state, WorkDir), home, filepath.Join(state, ChildrenDir), records, filepath.Join(state, "tmp")} {
		mounts, err := mountsAt(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(mounts) != 1 {
			t.Fatalf("%s: %d mounts after two Seals, want 1", dir, len(mounts))
		}
		opts := strings.Split(mounts[0].Options, ",")
		if !slices.Contains(opts, "nosuid") || !slices.Contains(opts, "nodev") {
			t.Errorf("%s is mounted %s", dir, mounts[0].Options)
		}
		if dir == home && !slices.Contains(opts, "noexec") {
			t.Errorf("%s lost noexec: %s", dir, mounts[0].Options)
		}
	}
	for _, dir := range []string{state, filepath.Join(state, RecordsDir)} {
		if mounted, err := isMountPoint(dir); err != nil || mounted {
			t.Fatalf("%s is a mount point: %v %v", dir, mounted, err)
		}
	}

	work := filepath.Join(state, WorkDir, "ses_0123456789abcdef0123456789abcdef")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := runSetuid(t, work, owner); got != strconv.Itoa(nobody) {
		t.Fatalf("a setuid file owned by %d in a sealed workdir runs as euid %s, want %d", owner, got, nobody)
	}
	if err := openDevice(t, work); !errors.Is(err, unix.EACCES) {
		t.Fatalf("a device node in a sealed workdir opens: %v, want EACCES", err)
	}
}

// runSetuid copies id(1) into dir as a session's setuid file (owned by owner, mode 4755),
// runs it as nobody, and returns the effective uid it printed.
func runSetuid(t *testing.T, dir string, owner int) string {
	t.Helper()
	path := filepath.Join(dir, "id")
	src, err := os.Open("/usr/bin/id")
	testenv.Need(t, "/usr/bin/id", err)
	defer src.Close()
	dst, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	// chown clears setuid: the mode comes after.
	if err := os.Lchown(path, owner, owner); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, "-u")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -u as uid %d: %v\n%s", path, nobody, err, out)
	}
	return strings.TrimSpace(string(out))
}

// openDevice makes a node of /dev/null's device in dir and opens it.
func openDevice(t *testing.T, dir string) error {
	t.Helper()
	path := filepath.Join(dir, "null")
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err == nil {
		f.Close()
	}
	return err
}
