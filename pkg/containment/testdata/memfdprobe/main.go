// memfdprobe is the program of the memfd hostile tests' sessions: it tries to run a program
// from an anonymous file each way a session could, and says for each "ok NAME" (the copy
// ran) or "denied NAME: ERRNO (text)". The copy is of itself, static, so that nothing but
// the exec of the memfd can refuse it: not a dynamic loader, not a missing file.
//
// memfdprobe NAME... tries each attempt named in a child of its own, since a successful
// exec replaces the process that makes it:
//
//	execveat  memfd_create(MFD_CLOEXEC), execveat(fd, "", AT_EMPTY_PATH)
//	procfd    memfd_create(0), execve("/proc/self/fd/N")
//	python    python3's os.memfd_create and os.execve("/proc/self/fd/N")
//	mfd_exec  memfd_create(MFD_EXEC), which asks for an executable memfd outright
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pythonAttempt is the python attempt: argv[1] is the file to copy.
const pythonAttempt = `
import errno, os, sys
fd = os.memfd_create("probe")
with open(sys.argv[1], "rb") as f:
    data = f.read()
while data:
    data = data[os.write(fd, data):]
try:
    os.execve("/proc/self/fd/%d" % fd, ["memfdprobe", "payload", "python"], dict(os.environ))
except OSError as e:
    print("denied python: %s (%s)" % (errno.errorcode.get(e.errno, str(e.errno)), os.strerror(e.errno)))
`

func main() {
	if len(os.Args) == 3 && os.Args[1] == "payload" {
		fmt.Println("ok", os.Args[2])
		return
	}
	if len(os.Args) == 3 && os.Args[1] == "attempt" {
		attempt(os.Args[2])
		return
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Println("memfdprobe:", err)
		os.Exit(2)
	}
	for _, name := range os.Args[1:] {
		cmd := exec.Command(self, "attempt", name)
		if name == "python" {
			cmd = exec.Command("python3", "-c", pythonAttempt, self)
		}
		out, err := cmd.CombinedOutput()
		line := strings.TrimSpace(string(out))
		if !strings.HasPrefix(line, "ok "+name) && !strings.HasPrefix(line, "denied "+name+":") {
			// Neither verdict: whatever happened is no errno of the exec's.
			line = fmt.Sprintf("denied %s: no verdict (%v): %q", name, err, line)
		}
		fmt.Println(line)
	}
}

// attempt makes one attempt; it returns only when the exec failed, having said why.
func attempt(name string) {
	denied := func(what string, err error) {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			fmt.Printf("denied %s: %s%s (%s)\n", name, what, unix.ErrnoName(errno), errno.Error())
		} else {
			fmt.Printf("denied %s: %s%v\n", name, what, err)
		}
		os.Exit(1)
	}
	argv := []string{"memfdprobe", "payload", name}
	switch name {
	case "mfd_exec":
		fd, err := unix.MemfdCreate("probe", unix.MFD_EXEC|unix.MFD_CLOEXEC)
		if err != nil {
			denied("", err)
		}
		unix.Close(fd)
		fmt.Println("ok", name)
	case "execveat":
		f := copyOfSelf(unix.MFD_CLOEXEC, denied)
		denied("", execveat(int(f.Fd()), argv))
	case "procfd":
		f := copyOfSelf(0, denied)
		denied("", unix.Exec(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), argv, os.Environ()))
	default:
		fmt.Printf("denied %s: no such attempt\n", name)
		os.Exit(2)
	}
}

// copyOfSelf is a memfd made with flags holding this program.
func copyOfSelf(flags int, denied func(string, error)) *os.File {
	fd, err := unix.MemfdCreate("probe", flags)
	if err != nil {
		denied("memfd_create: ", err)
	}
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		denied("reading itself: ", err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	if _, err := io.Copy(f, self); err != nil {
		denied("copying itself: ", err)
	}
	return f
}

// execveat runs the file fd holds, as fexecve(3) does.
func execveat(fd int, argv []string) error {
	argvp, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return err
	}
	envp, err := syscall.SlicePtrFromStrings(os.Environ())
	if err != nil {
		return err
	}
	empty, err := unix.BytePtrFromString("")
	if err != nil {
		return err
	}
	_, _, errno := unix.Syscall6(unix.SYS_EXECVEAT, uintptr(fd), uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])), unix.AT_EMPTY_PATH, 0)
	return errno
}
