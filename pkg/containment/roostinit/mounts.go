package roostinit

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// privateMounts changes this process's mount namespace, one roost-init made private for it:
// its pid namespace's procfs over /proc, a tmpfs of its own over /dev/shm, its passwd over
// the host's, its own /etc/resolv.conf, and noexec binds of the trees the session writes.
func privateMounts(m *Mounts) error {
	if m.Proc {
		// A procfs shows the pid namespace of whoever mounts it: the session's, of which
		// roost-init, this process's parent, was born pid 1. hidepid would hide nothing
		// more: every process it shows is the session's.
		if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("a /proc of its own: %w", err)
		}
	}
	if m.Shm > 0 {
		flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
		if !m.ShmExec {
			flags |= unix.MS_NOEXEC
		}
		if err := unix.Mount("shm", "/dev/shm", "tmpfs", flags, fmt.Sprintf("mode=1777,size=%d", m.Shm)); err != nil {
			return fmt.Errorf("a private /dev/shm: %w", err)
		}
	}
	if m.Passwd != "" {
		if err := bindReadOnly(m.Passwd, "/etc/passwd"); err != nil {
			return fmt.Errorf("the session's /etc/passwd: %w", err)
		}
	}
	for _, dir := range m.NoExec {
		if err := remountNoExec(dir); err != nil {
			return fmt.Errorf("%s noexec: %w", dir, err)
		}
	}
	if m.ResolvConf != "" {
		if err := bindReadOnly(m.ResolvConf, "/etc/resolv.conf"); err != nil {
			return fmt.Errorf("the session's /etc/resolv.conf: %w", err)
		}
	}
	return nil
}

// bindReadOnly binds file src over dst (over what dst links to: mount follows it),
// read-only, noexec, nosuid and nodev, keeping the flags of the mount dst lies on.
func bindReadOnly(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dst, &st); err != nil {
		return err
	}
	flags := uintptr(unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV) | mountFlags(st.Flags)
	return unix.Mount("", dst, "", flags, "")
}

// remountNoExec binds dir over itself and remounts the bind noexec, keeping the flags the
// mount it lies on has (a bind remount must restate them, or it fails on a read-only one).
func remountNoExec(dir string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	flags := uintptr(unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV) | mountFlags(st.Flags)
	return unix.Mount("", dir, "", flags, "")
}

// mountFlags turns statfs's ST_* flags into the MS_* flags a remount must keep.
func mountFlags(st int64) uintptr {
	var out uintptr
	for _, f := range []struct {
		st int64
		ms uintptr
	}{
		{unix.ST_RDONLY, unix.MS_RDONLY},
		{unix.ST_NOATIME, unix.MS_NOATIME},
		{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
		{unix.ST_RELATIME, unix.MS_RELATIME},
		{unix.ST_SYNCHRONOUS, unix.MS_SYNCHRONOUS},
	} {
		if st&f.st != 0 {
			out |= f.ms
		}
	}
	return out
}
