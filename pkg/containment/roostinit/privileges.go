package roostinit

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dropCapabilities empties the bounding, ambient, inheritable, permitted and effective sets
// of this thread. With the bounding and inheritable sets empty, exec gives no capability back,
// even to root.
func dropCapabilities() error {
	last := 40
	if data, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return err
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	return unix.Capset(&hdr, &data[0])
}

// loadSeccomp installs a compiled BPF filter on every thread of this process.
func loadSeccomp(program []byte) error {
	const size = int(unsafe.Sizeof(unix.SockFilter{}))
	if len(program) == 0 || len(program)%size != 0 {
		return errors.New("malformed filter")
	}
	filters := make([]unix.SockFilter, len(program)/size)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&filters[0])), len(program)), program)
	prog := unix.SockFprog{Len: uint16(len(filters)), Filter: &filters[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	if errno != 0 {
		return errno
	}
	return nil
}
