package containment

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/seccomp"
	"roost.dev/roost/pkg/manifest"
)

// Host is what a probe of this machine found. Every fact is read from the kernel at probe
// time; nothing is inferred from version strings.
type Host struct {
	Kernel string
	// LandlockABI is the Landlock ABI version the kernel offers; 0 when it has none.
	LandlockABI int
	// Cgroups is "v2", "hybrid" or "v1" (cgroups.Mode).
	Cgroups string
	// CgroupDriver and CgroupParent are who makes sessions' cgroups and where they go,
	// CgroupParentWhy why: Probe reports the default (cgroupfs, cgroups.DefaultParent);
	// cgroups.Sessions.Report what roostd was configured with.
	CgroupDriver, CgroupParent, CgroupParentWhy string
	// CgroupParentHint, when set, is what the operator should change for the parent to
	// keep working (cgroups.Sessions.Report).
	CgroupParentHint string
	// SystemdDriver says whether the systemd cgroup driver can work here (systemd is PID 1),
	// SystemdDriverWhy why or why not (cgroups.SystemdAvailable).
	SystemdDriver    bool
	SystemdDriverWhy string
	// Seccomp says the kernel offers seccomp filters.
	Seccomp bool
	// SeccompUserNotif says a seccomp filter may hand a call to a listener
	// (SECCOMP_RET_USER_NOTIF): what records the execs sessions' allowlists refuse.
	SeccompUserNotif bool
	// UserNamespaces is the user.max_user_namespaces limit; 0 when user namespaces are off.
	UserNamespaces int
	// UnprivilegedUserNSClone is Debian's kernel.unprivileged_userns_clone, "" when the
	// kernel has no such knob. It binds unprivileged callers only, never roostd as root.
	UnprivilegedUserNSClone string
	// AppArmorRestrictUserNS is kernel.apparmor_restrict_unprivileged_userns (Ubuntu 23.10
	// and later), "" when the kernel has no such knob. Like the above it binds unprivileged
	// callers only.
	AppArmorRestrictUserNS string
	// AppArmor says the AppArmor LSM is enabled; its userns restriction needs it.
	AppArmor bool
	Root     bool
	// MemfdNoExecWhy is why vm.memfd_noexec cannot keep memfds from executing in scoped
	// and sealed sessions, "" when it can (see MemfdNoExecWhy).
	MemfdNoExecWhy string
}

// Probe reads the host's facts.
func Probe() Host {
	h := Host{Root: os.Geteuid() == 0}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		h.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	if abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION); errno == 0 {
		h.LandlockABI = int(abi)
	}
	h.Cgroups = cgroupLayout()
	h.CgroupDriver = cgroups.DriverCgroupfs
	h.CgroupParent, h.CgroupParentWhy = cgroups.DefaultParent()
	h.SystemdDriver, h.SystemdDriverWhy = cgroups.SystemdAvailable()
	if data, err := os.ReadFile("/proc/self/status"); err == nil {
		h.Seccomp = bytes.Contains(data, []byte("\nSeccomp:"))
	}
	action := uint32(unix.SECCOMP_RET_USER_NOTIF)
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&action)))
	h.SeccompUserNotif = errno == 0
	h.UserNamespaces, _ = strconv.Atoi(readKnob("/proc/sys/user/max_user_namespaces"))
	h.UnprivilegedUserNSClone = readKnob("/proc/sys/kernel/unprivileged_userns_clone")
	h.AppArmorRestrictUserNS = readKnob("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
	h.AppArmor = readKnob("/sys/module/apparmor/parameters/enabled") == "Y"
	h.MemfdNoExecWhy = MemfdNoExecWhy()
	return h
}

// readKnob is a sysctl's or module parameter's value; "" when the kernel has none.
func readKnob(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

func cgroupLayout() string { return cgroups.Mode() }

// Capability says whether one class can be delivered here, and what holds a session of it
// or why it cannot be had.
type Capability struct {
	Class     manifest.Class
	Available bool
	Detail    string
}

// Catalog is what this build can deliver on this host, one entry per class, weakest first.
type Catalog []Capability

// NewCatalog judges each class against the host. scoped and sealed are the outcomes of
// rehearsing a session of each (see Rehearse): nil when it ran.
func NewCatalog(h Host, scoped, sealed error) Catalog {
	scopedCap := Capability{Class: manifest.Scoped, Available: scoped == nil,
		Detail: fmt.Sprintf("on the host's view, as an unprivileged uid of the session's own: Landlock ABI %d (reads only the system trees and its own, writes only its workdir or scope and TMPDIR, exec allowlist); net, pid and ipc namespaces (a /proc of its own); cgroup memory, pids and cpu; seccomp; no capabilities; no_new_privs", h.LandlockABI)}
	if scoped != nil {
		scopedCap.Detail = "rehearsing a scoped session failed: " + scoped.Error()
	}
	sealedCap := Capability{Class: manifest.Sealed, Available: sealed == nil,
		Detail: "libcontainer: a user namespace (root inside is an unprivileged host uid range of the session's own), mount, pid, ipc, uts, net and cgroup namespaces; composed read-only root; cgroup memory, pids and cpu; seccomp; no capabilities; no_new_privs"}
	if sealed != nil {
		sealedCap.Detail = "rehearsing a sealed session failed: " + sealed.Error()
	}
	return Catalog{
		{manifest.Unconfined, true, "plain child process under roost-init, as an unprivileged uid of the session's own (host root only for capsules sessions.allow_root names); environment, rlimits and deadline applied"},
		{manifest.Advisory, true, "plain child process under roost-init, as an unprivileged uid of the session's own (host root only for capsules sessions.allow_root names); environment, rlimits and deadline applied, every other grant recorded, not enforced"},
		scopedCap,
		sealedCap,
	}
}

// Lookup returns the entry for class.
func (c Catalog) Lookup(class manifest.Class) Capability {
	for _, e := range c {
		if e.Class == class {
			return e
		}
	}
	return Capability{Class: class, Detail: "unknown class"}
}

// Delivers are the classes available, weakest first: what doctor reports "yes" for, and
// what a fleet node tells the node directory it delivers.
func (c Catalog) Delivers() []manifest.Class {
	var out []manifest.Class
	for _, e := range c {
		if e.Available {
			out = append(out, e.Class)
		}
	}
	return out
}

// Strongest is the strongest class available.
func (c Catalog) Strongest() manifest.Class {
	best := manifest.ClassNone
	for _, cl := range c.Delivers() {
		best = max(best, cl)
	}
	return best
}

// Check is one probed fact with a verdict and, for a problem, what to do about it.
type Check struct {
	Name   string
	Status string // ok | warn | fail | info
	Detail string
	Hint   string
}

// Checks turns the probe into findings an operator can act on.
func (h Host) Checks() []Check {
	var out []Check
	out = append(out, Check{Name: "kernel", Status: "info", Detail: h.Kernel})
	if h.Root {
		out = append(out, Check{Name: "privileges", Status: "ok", Detail: "roostd runs as root"})
	} else {
		out = append(out, Check{Name: "privileges", Status: "warn", Detail: "roostd does not run as root",
			Hint: "run roostd as root (see deploy/systemd/roostd.service); namespaces and cgroups need it"})
	}
	if h.LandlockABI > 0 {
		out = append(out, Check{Name: "landlock", Status: "ok", Detail: fmt.Sprintf("ABI %d", h.LandlockABI)})
	} else {
		out = append(out, Check{Name: "landlock", Status: "warn", Detail: "not offered by the kernel",
			Hint: "boot a kernel with CONFIG_SECURITY_LANDLOCK=y and landlock in the lsm= list"})
	}
	if h.Seccomp {
		out = append(out, Check{Name: "seccomp", Status: "ok", Detail: "available"})
	} else {
		out = append(out, Check{Name: "seccomp", Status: "warn", Detail: "not offered by the kernel", Hint: "boot a kernel with CONFIG_SECCOMP_FILTER=y"})
	}
	out = append(out, h.execRefusalsCheck(), cgroupCheck(h.Cgroups), h.cgroupParentCheck(), h.systemdDriverCheck(), h.memfdCheck())
	if seccomp.Built {
		out = append(out, Check{Name: "seccomp in roostd", Status: "ok", Detail: "built with libseccomp (the seccomp build tag)"})
	} else {
		out = append(out, Check{Name: "seccomp in roostd", Status: "fail", Detail: "built without seccomp support",
			Hint: "install libseccomp-dev and build with -tags seccomp (make build does)"})
	}
	// User namespaces are not a check here: doctor reports them with the mapping roostd
	// actually tried (MapUserNS) and the ids it owns (IDConflicts).
	return out
}

// landlockAuditABI is the Landlock ABI (Linux 6.15) from which the kernel can log Landlock's
// denials itself, through the audit subsystem.
const landlockAuditABI = 7

// execRefusalsCheck says what records the execs a session's exec allowlist refuses.
func (h Host) execRefusalsCheck() Check {
	c := Check{Name: "exec refusals", Status: "ok"}
	audit := "the kernel offers it"
	if h.LandlockABI < landlockAuditABI {
		audit = "the kernel has none"
	}
	audit = fmt.Sprintf("; Landlock audit (ABI %d, Linux 6.15): %s — it would report through the host's audit subsystem, which roost does not turn on", landlockAuditABI, audit)
	switch {
	case h.LandlockABI == 0:
		c.Status, c.Detail = "warn", "not recorded: without Landlock no session has an exec allowlist"
		return c
	case !h.SeccompUserNotif:
		c.Status, c.Detail = "warn", "not recorded: the kernel offers no seccomp user notification (SECCOMP_RET_USER_NOTIF); Landlock refuses them unseen"+audit
		c.Hint = "boot a kernel with CONFIG_SECCOMP_FILTER=y (5.5 or later)"
		return c
	}
	c.Detail = "seccomp user notification on execve/execveat in each session, observed only — Landlock decides; " +
		"scoped and sealed sessions' own processes (not commands roostctl exec starts), in each session's trace.jsonl, its events and roost_exec_refused_total" + audit
	return c
}

func cgroupCheck(layout string) Check {
	c := Check{Name: "cgroups"}
	var missing []string
	if layout == "v2" {
		data, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
		for _, ctrl := range []string{"memory", "pids", "cpu"} {
			if err != nil || !strings.Contains(string(data), ctrl) {
				missing = append(missing, ctrl)
			}
		}
	} else {
		for _, ctrl := range cgroups.Controllers() {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctrl)); err != nil {
				missing = append(missing, ctrl)
			}
		}
	}
	if len(missing) > 0 {
		c.Status, c.Detail = "fail", fmt.Sprintf("%s: the %s controller(s) are not available", layout, strings.Join(missing, ", "))
		c.Hint = "mount the cgroup controllers (or boot with them enabled); scoped and sealed sessions need memory, pids and cpu limits"
		return c
	}
	c.Status, c.Detail = "ok", layout+": "+strings.Join(cgroups.Controllers(), ", ")+" available"
	return c
}

// SetCgroupPlacement sets what h says of the sessions' cgroups: what roostd uses rather than
// the default a probe finds (cgroups.Sessions.Report calls it).
func (h *Host) SetCgroupPlacement(p cgroups.Placement) {
	h.CgroupDriver, h.CgroupParent, h.CgroupParentWhy, h.CgroupParentHint = p.Driver, p.Parent, p.Why, p.Hint
}

// cgroupParentCheck says where sessions' cgroups go, and why.
func (h Host) cgroupParentCheck() Check {
	c := Check{Name: "cgroup parent", Status: "info"}
	if h.CgroupParent == "" {
		c.Detail = "unknown"
		return c
	}
	c.Detail = fmt.Sprintf("%s (%s driver): %s", h.CgroupParent, h.CgroupDriver, h.CgroupParentWhy)
	if h.CgroupParentHint != "" {
		c.Status, c.Hint = "warn", h.CgroupParentHint
	}
	return c
}

// memfdCheck says which mechanism keeps memfds from executing in a scoped or sealed session
// without filesystem.workdir_exec: a memfd is on no mount Landlock or noexec reaches, so a
// copy of any program in one would run past the exec allowlist.
func (h Host) memfdCheck() Check {
	if h.MemfdNoExecWhy == "" {
		return Check{Name: "memfd exec", Status: "ok",
			Detail: "vm.memfd_noexec=2 in each session's pid namespace (kernel 6.3+): no memfd executes in a scoped or sealed session without filesystem.workdir_exec"}
	}
	c := Check{Name: "memfd exec", Status: "warn",
		Detail: h.MemfdNoExecWhy + ": seccomp refuses memfd_create(MFD_EXEC) and execveat(AT_EMPTY_PATH) in scoped and sealed sessions without filesystem.workdir_exec, but a memfd run by its /proc/self/fd path still executes, past the exec allowlist",
		Hint:   "boot a kernel of 6.3 or later"}
	if !strings.HasPrefix(h.MemfdNoExecWhy, "this kernel has no") {
		c.Hint = "run roostd as host root with /proc/sys writable (not in a container that mounts it read-only, nor in a user namespace)"
	}
	return c
}

// systemdDriverCheck says whether --cgroup-driver systemd can work here.
func (h Host) systemdDriverCheck() Check {
	c := Check{Name: "systemd cgroup driver", Status: "info", Detail: "available: " + h.SystemdDriverWhy}
	if !h.SystemdDriver {
		c.Detail = "not available: " + h.SystemdDriverWhy + "; --cgroup-driver cgroupfs (the default) is"
	}
	return c
}

// CheckStateDir measures what a durable registry write costs in dir: one small write and
// fsync, the floor under every committed session change.
func CheckStateDir(dir string) Check {
	c := Check{Name: "state dir fsync"}
	f, err := os.CreateTemp(dir, ".doctor-*")
	if err != nil {
		c.Status, c.Detail, c.Hint = "fail", err.Error(), "make the state directory writable by roostd"
		return c
	}
	defer os.Remove(f.Name())
	defer f.Close()
	const rounds = 5
	var total time.Duration
	for range rounds {
		start := time.Now()
		if _, err := f.Write(make([]byte, 512)); err != nil {
			c.Status, c.Detail = "fail", err.Error()
			return c
		}
		if err := f.Sync(); err != nil {
			c.Status, c.Detail = "fail", err.Error()
			return c
		}
		total += time.Since(start)
	}
	avg := total / rounds
	c.Detail = fmt.Sprintf("%s: %v per write+fsync", filepath.Clean(dir), avg.Round(time.Microsecond))
	c.Status = "ok"
	if avg > 20*time.Millisecond {
		c.Status = "warn"
		c.Hint = "session changes commit at the speed of fsync; put the state directory on faster storage"
	}
	return c
}

// MapUserNS creates a user namespace that maps root to ids, uids and gids alike, as a
// sealed session's is mapped, and runs /usr/bin/true in it. It is the real question
// (will the kernel let roostd give a session ids of its own?), asked the way libcontainer
// asks it, so no kernel version, sysctl or LSM needs to be second-guessed. The error says
// what refused the mapping and what to change.
func MapUserNS(ctx context.Context, ids IDs) error {
	last := uint64(ids.First) + uint64(ids.Size) - 1
	what := fmt.Sprintf("mapping root to host ids %d–%d in a new user namespace", ids.First, last)
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(ids.First), Size: int(ids.Size)}}
	cmd := exec.CommandContext(ctx, "/usr/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: m, GidMappings: m}
	err := cmd.Run()
	if err == nil {
		return nil
	}
	var errno syscall.Errno
	errors.As(err, &errno)
	switch {
	case errno == syscall.EINVAL && last >= 1<<32-1:
		return fmt.Errorf("%s: the kernel refused the map (%v): the range ends past the last usable id, %d; lower sessions.ids.first (or sessions.ids.slots) in roostd's config", what, errno, uint64(1<<32-2))
	case errno == syscall.EINVAL:
		return fmt.Errorf("%s: the kernel refused the map (%v); move sessions.ids.first in roostd's config", what, errno)
	case (errno == syscall.EPERM || errno == syscall.EACCES) && os.Geteuid() != 0:
		return fmt.Errorf("%s: %v: roostd does not run as root; run it as root (deploy/systemd/roostd.service)", what, errno)
	case errno == syscall.EPERM || errno == syscall.EACCES:
		return fmt.Errorf("%s: %v: something confining roostd forbids user namespaces (systemd's RestrictNamespaces= or SystemCallFilter= on its service, a seccomp filter, or an AppArmor or SELinux profile without userns); lift it for roostd", what, errno)
	case errno == syscall.ENOSPC:
		return fmt.Errorf("%s: %v: user.max_user_namespaces is 0 or every one it allows is in use; raise it (sysctl -w user.max_user_namespaces=N)", what, errno)
	case errno == syscall.ENOENT:
		return fmt.Errorf("%s: %w; install /usr/bin/true (coreutils), which the check and sessions' rehearsals run", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// IDFiles are where a host lists the ids its accounts hold and the subordinate ranges it
// delegates to users (rootless podman and the like map their containers' ids onto those).
type IDFiles struct {
	Passwd, Group, SubUID, SubGID string
}

// HostIDFiles are this host's.
func HostIDFiles() IDFiles {
	return IDFiles{Passwd: "/etc/passwd", Group: "/etc/group", SubUID: "/etc/subuid", SubGID: "/etc/subgid"}
}

// IDConflicts lists every account, group and subordinate range in files that holds ids of
// block. A session runs as ids of block and a sealed one's root is one of them, so whoever
// else holds them could reach a session's processes and files, and a session theirs. A
// file that does not exist holds nothing; one that cannot be read is reported, since it
// might hold anything.
func IDConflicts(block IDs, files IDFiles) []string {
	if block.Size == 0 {
		return nil
	}
	r := idSpan{uint64(block.First), uint64(block.First) + uint64(block.Size) - 1}
	var out []string
	scan := func(path string, each func(fields []string) []string) {
		if path == "" {
			return
		}
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			return
		}
		if err == nil {
			defer f.Close()
			var found []string
			if found, err = scanIDFile(f, each); err == nil {
				out = append(out, found...)
				return
			}
		}
		out = append(out, fmt.Sprintf("%s: %v; cannot tell whether it holds session ids, make it readable by roostd", path, err))
	}
	scan(files.Passwd, func(f []string) []string {
		// name:password:uid:gid:...
		if len(f) < 4 {
			return nil
		}
		var hits []string
		if id, ok := parseID(f[2]); ok && r.holds(id) {
			hits = append(hits, fmt.Sprintf("user %s has uid %d (%s)", f[0], id, files.Passwd))
		}
		if id, ok := parseID(f[3]); ok && r.holds(id) {
			hits = append(hits, fmt.Sprintf("user %s has primary gid %d (%s)", f[0], id, files.Passwd))
		}
		return hits
	})
	scan(files.Group, func(f []string) []string {
		// name:password:gid:members
		if len(f) < 3 {
			return nil
		}
		if id, ok := parseID(f[2]); ok && r.holds(id) {
			return []string{fmt.Sprintf("group %s has gid %d (%s)", f[0], id, files.Group)}
		}
		return nil
	})
	sub := func(path, kind string) func([]string) []string {
		return func(f []string) []string {
			// user:first:count, the user by name or by uid
			if len(f) < 3 {
				return nil
			}
			start, ok1 := parseID(f[1])
			count, ok2 := strconv.ParseUint(f[2], 10, 32)
			if !ok1 || ok2 != nil || count == 0 {
				return nil
			}
			d := idSpan{start, start + count - 1}
			if o, ok := d.overlap(r); ok {
				return []string{fmt.Sprintf("user %s is delegated subordinate %ss %d–%d (%s), of which %d–%d are session ids", f[0], kind, d.first, d.last, path, o.first, o.last)}
			}
			return nil
		}
	}
	scan(files.SubUID, sub(files.SubUID, "uid"))
	scan(files.SubGID, sub(files.SubGID, "gid"))
	return out
}

// scanIDFile feeds each entry of a colon-separated id database to each and gathers what it
// returns. Comments, blank lines and NIS compat entries (+ and -) name no ids.
func scanIDFile(r io.Reader, each func(fields []string) []string) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	// A group with many members makes a long line.
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '+' || line[0] == '-' {
			continue
		}
		out = append(out, each(strings.Split(line, ":"))...)
	}
	return out, sc.Err()
}

func parseID(s string) (uint64, bool) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
	return n, err == nil
}

// idSpan is the ids first through last, both included.
type idSpan struct{ first, last uint64 }

func (s idSpan) holds(id uint64) bool { return s.first <= id && id <= s.last }

func (s idSpan) overlap(o idSpan) (idSpan, bool) {
	x := idSpan{max(s.first, o.first), min(s.last, o.last)}
	return x, x.first <= x.last
}
