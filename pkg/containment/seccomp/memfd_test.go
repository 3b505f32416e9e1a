//go:build seccomp

package seccomp_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"roost.dev/roost/internal/testenv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment/seccomp"
)

// The test binary plays a filtered child when started with these: childEnv names the
// compiled filter, attemptEnv the attempt it makes under it.
const (
	childEnv   = "ROOST_SECCOMP_TEST_FILTER"
	attemptEnv = "ROOST_SECCOMP_TEST_ATTEMPT"
	payloadEnv = "ROOST_SECCOMP_TEST_PAYLOAD"
)

func TestMain(m *testing.M) {
	if name := os.Getenv(payloadEnv); name != "" {
		fmt.Println("ok", name)
		os.Exit(0)
	}
	if path := os.Getenv(childEnv); path != "" {
		os.Exit(child(path, os.Getenv(attemptEnv)))
	}
	os.Exit(m.Run())
}

// child loads the filter at path on every thread and makes one attempt, saying "ok NAME" or
// "denied NAME: ERRNO".
func child(path, attempt string) int {
	prog, err := os.ReadFile(path)
	if err != nil {
		fmt.Println("child:", err)
		return 2
	}
	if err := load(prog); err != nil {
		fmt.Println("child: loading the filter:", err)
		return 2
	}
	denied := func(err error) int {
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			fmt.Printf("denied %s: %v\n", attempt, err)
			return 1
		}
		fmt.Printf("denied %s: %s\n", attempt, unix.ErrnoName(errno))
		return 1
	}
	switch attempt {
	case "mfd_exec", "mfd_plain":
		flags := unix.MFD_CLOEXEC
		if attempt == "mfd_exec" {
			flags |= unix.MFD_EXEC
		}
		fd, err := unix.MemfdCreate("probe", flags)
		if err != nil {
			return denied(err)
		}
		unix.Close(fd)
		fmt.Println("ok", attempt)
		return 0
	case "execveat_empty":
		fd, err := unix.MemfdCreate("probe", unix.MFD_CLOEXEC)
		if err != nil {
			return denied(err)
		}
		f := os.NewFile(uintptr(fd), "memfd")
		self, err := os.Open("/proc/self/exe")
		if err != nil {
			return denied(err)
		}
		if _, err := io.Copy(f, self); err != nil {
			return denied(err)
		}
		return denied(execveat(int(f.Fd()), "", unix.AT_EMPTY_PATH, attempt))
	case "execveat_path":
		return denied(execveat(unix.AT_FDCWD, "/proc/self/exe", 0, attempt))
	}
	fmt.Println("child: no attempt", attempt)
	return 2
}

// execveat runs pathname at dirfd as the payload named name.
func execveat(dirfd int, pathname string, flags int, name string) error {
	argv, err := syscall.SlicePtrFromStrings([]string{"payload"})
	if err != nil {
		return err
	}
	envv, err := syscall.SlicePtrFromStrings([]string{payloadEnv + "=" + name})
	if err != nil {
		return err
	}
	p, err := unix.BytePtrFromString(pathname)
	if err != nil {
		return err
	}
	_, _, errno := unix.Syscall6(unix.SYS_EXECVEAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)),
		uintptr(unsafe.Pointer(&argv[0])), uintptr(unsafe.Pointer(&envv[0])), uintptr(flags), 0)
	return errno
}

// load installs the compiled filter as roost-exec does, on every thread.
func load(program []byte) error {
	const size = int(unsafe.Sizeof(unix.SockFilter{}))
	if len(program) == 0 || len(program)%size != 0 {
		return errors.New("malformed filter")
	}
	filters := make([]unix.SockFilter, len(program)/size)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&filters[0])), len(program)), program)
	prog := unix.SockFprog{Len: uint16(len(filters)), Filter: &filters[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	if errno != 0 {
		return errno
	}
	return nil
}

// run compiles the profile of o and makes attempt under it in a child, returning what it said.
func run(t *testing.T, o seccomp.Options, attempt string) string {
	t.Helper()
	profile, err := seccomp.Profile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}, o)
	if err != nil {
		t.Fatal(err)
	}
	bpf, err := seccomp.Compile(profile)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "filter.bpf")
	if err := os.WriteFile(path, bpf, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{childEnv + "=" + path, attemptEnv + "=" + attempt}
	out, _ := cmd.CombinedOutput()
	return strings.TrimSpace(string(out))
}

// NoMemfdExec, the fallback where the kernel has no vm.memfd_noexec, refuses exactly an
// executable memfd and running a descriptor's file, with EACCES; without it both work, and
// so does what the rule leaves alone either way.
func TestNoMemfdExec(t *testing.T) {
	if v, err := os.ReadFile("/proc/sys/vm/memfd_noexec"); err == nil && strings.TrimSpace(string(v)) != "0" {
		testenv.Need(t, "a host whose vm.memfd_noexec is 0", fmt.Errorf("it is %s: memfds do not execute here unfiltered", strings.TrimSpace(string(v))))
	}
	// Before 6.3 the kernel knows no MFD_EXEC: unfiltered, it is EINVAL.
	mfdExec := "ok mfd_exec"
	if fd, err := unix.MemfdCreate("probe", unix.MFD_EXEC); err != nil {
		mfdExec = "denied mfd_exec: " + unix.ErrnoName(err.(syscall.Errno))
	} else {
		unix.Close(fd)
	}
	for _, c := range []struct {
		attempt   string
		with, out string
	}{
		{"mfd_exec", "denied mfd_exec: EACCES", mfdExec},
		{"execveat_empty", "denied execveat_empty: EACCES", "ok execveat_empty"},
		{"mfd_plain", "ok mfd_plain", "ok mfd_plain"},
		{"execveat_path", "ok execveat_path", "ok execveat_path"},
	} {
		t.Run(c.attempt, func(t *testing.T) {
			if got := run(t, seccomp.Options{NoMemfdExec: true}, c.attempt); got != c.with {
				t.Errorf("with NoMemfdExec: %q, want %q", got, c.with)
			}
			if got := run(t, seccomp.Options{}, c.attempt); got != c.out {
				t.Errorf("without: %q, want %q", got, c.out)
			}
		})
	}
}

// The rules replace moby's unconditional allow of memfd_create and execveat: were it kept,
// it would win over the refusal.
func TestNoMemfdExecRules(t *testing.T) {
	profile, err := seccomp.Profile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}, seccomp.Options{NoMemfdExec: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"memfd_create", "execveat"} {
		var rules int
		for _, sc := range profile.Syscalls {
			for _, n := range sc.Names {
				if n != name {
					continue
				}
				rules++
				if sc.Action == specs.ActAllow && len(sc.Args) == 0 {
					t.Errorf("%s is still allowed outright", name)
				}
			}
		}
		if rules != 2 {
			t.Errorf("%s has %d rules, want the allowed and the refused", name, rules)
		}
	}
}
