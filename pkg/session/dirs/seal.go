package dirs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Trees are the session trees beneath the state directory: every directory roost makes
// for what sessions write on the host (workdirs, homes, children's workdirs, records).
// A runtime's own (the scoped runtime's TMPDIRs) are added by whoever builds it.
func Trees(state string) []string {
	return []string{
		filepath.Join(state, WorkDir),
		filepath.Join(state, HomesDir),
		filepath.Join(state, ChildrenDir),
		filepath.Join(state, RecordsDir),
	}
}

// Seal makes each tree a mount that honours no setuid or setgid bit and no device node
// (nosuid,nodev): a bind of the directory over itself, unless it is a mount point already
// (one an operator mounted there), which is remounted in place.
//
// Why: a session's uid owns what it writes, and a sealed session's root is a host uid too.
// Without nosuid, a file a session marks setuid runs as the session's uid for whoever on
// the host executes it (an operator poking at a workdir, a host tool, a build that runs
// what it finds), and a setgid directory hands out the session's group; without nodev, a
// device node left there by anything that could make one opens the device. Inside their
// own mount namespaces sessions already get these flags (roost-init, the sealed root's
// mounts); Seal is for the host's view, which no session's namespace covers.
//
// Each tree is a mount of its own, so nothing may be renamed or linked from one to another
// (EXDEV, even within one filesystem): what moves into a tree (a warm sandbox's records
// directory, which becomes its session's) is kept in that tree beforehand.
//
// It is idempotent: a tree already on a nosuid,nodev mount (a restarted roostd's bind, or
// an operator's mount of the state directory with those options) is left as it is, and a
// mount point is remounted rather than bound again, so repeated calls never stack mounts.
// The other flags of the mount beneath (ro, noexec, atime) are kept. Nothing is unmounted
// at exit: the next roostd finds the binds and reuses them. A missing tree is made (0711,
// as Prepare makes them).
func Seal(trees ...string) error {
	for _, tree := range trees {
		if err := seal(tree); err != nil {
			return fmt.Errorf("sealing %s (nosuid,nodev): %w", tree, err)
		}
	}
	return nil
}

func seal(tree string) error {
	if err := os.MkdirAll(tree, 0o711); err != nil {
		return err
	}
	// /proc/self/mountinfo names mount points with symlinks resolved.
	tree, err := filepath.EvalSymlinks(tree)
	if err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(tree, &st); err != nil {
		return err
	}
	if st.Flags&unix.ST_NOSUID != 0 && st.Flags&unix.ST_NODEV != 0 {
		return nil
	}
	mounted, err := isMountPoint(tree)
	if err != nil {
		return err
	}
	if !mounted {
		// Recursive, so that a mount beneath the tree (none of roost's; an operator's) is
		// still seen there rather than hidden under the bind.
		if err := unix.Mount(tree, tree, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return mountErr("binding it over itself", err)
		}
		// The bind's flags are those of the mount it was taken from.
		if err := unix.Statfs(tree, &st); err != nil {
			_ = unix.Unmount(tree, unix.MNT_DETACH)
			return err
		}
	}
	flags := uintptr(unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV) | keptFlags(st.Flags)
	if err := unix.Mount("", tree, "", flags, ""); err != nil {
		if !mounted {
			// No half-made bind is left for the next roostd to take as sealed.
			_ = unix.Unmount(tree, unix.MNT_DETACH)
		}
		return mountErr("remounting it nosuid,nodev", err)
	}
	return nil
}

// mountErr says what to do when roostd may not mount (no CAP_SYS_ADMIN, as in a container
// it does not own): the operator can mount the trees, or the whole state directory,
// nosuid,nodev, and Seal then has nothing to do.
func mountErr(what string, err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("%s: %w: roostd may not mount here; mount the state directory with nosuid,nodev (an fstab line, or a container volume with those options) and start roostd again: %w", what, err, errdefs.ErrFailedPrecondition)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// keptFlags are the per-mount flags, from statfs's ST_* form, that a bind remount must
// restate as MS_* to keep: it sets exactly the flags it is given, clearing the rest.
func keptFlags(st int64) uintptr {
	// ST_NOSYMFOLLOW (linux/statfs.h), which x/sys/unix does not name.
	const stNoSymFollow = 0x2000
	var out uintptr
	for _, f := range []struct {
		st int64
		ms uintptr
	}{
		{unix.ST_RDONLY, unix.MS_RDONLY},
		{unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME},
		{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
		{unix.ST_RELATIME, unix.MS_RELATIME},
		{stNoSymFollow, unix.MS_NOSYMFOLLOW},
	} {
		if st&f.st != 0 {
			out |= f.ms
		}
	}
	return out
}

// isMountPoint says whether path is the mount point of a mount, by /proc/self/mountinfo
// (a bind of a directory over itself has the device of what it covers: comparing devices
// would not see it). path must be absolute, with symlinks resolved.
func isMountPoint(path string) (bool, error) {
	mounts, err := mountsAt(path)
	return len(mounts) > 0, err
}

// mountsAt lists the mounts whose mount point is path, in the order mounted: the last is the
// one seen there. More than one is a stack.
func mountsAt(path string) ([]*mountinfo.Info, error) {
	path = filepath.Clean(path)
	return mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != path, false
	})
}

// CheckSealed says, for each tree that is not on a nosuid,nodev mount, what it lacks; none
// when all are. A tree that cannot be looked at is reported with why.
func CheckSealed(trees ...string) []string {
	var problems []string
	for _, tree := range trees {
		var st unix.Statfs_t
		if err := unix.Statfs(tree, &st); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", tree, err))
			continue
		}
		var lacks []string
		if st.Flags&unix.ST_NOSUID == 0 {
			lacks = append(lacks, "nosuid (setuid and setgid bits are honoured)")
		}
		if st.Flags&unix.ST_NODEV == 0 {
			lacks = append(lacks, "nodev (device nodes open their devices)")
		}
		if len(lacks) > 0 {
			problems = append(problems, fmt.Sprintf("%s is on a mount without %s", tree, strings.Join(lacks, " or ")))
		}
	}
	return problems
}
