package containment

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/manifest"
)

// Host is what a probe of this machine found. Every fact is read from the kernel at probe
// time; nothing is inferred from version strings.
type Host struct {
	Kernel string
	// LandlockABI is the Landlock ABI version the kernel offers; 0 when it has none.
	LandlockABI int
	// Cgroups is "v2", "hybrid" or "v1".
	Cgroups string
	// Seccomp says the kernel offers seccomp filters.
	Seccomp bool
	// UserNamespaces is the user.max_user_namespaces limit; 0 when user namespaces are off.
	UserNamespaces int
	Root           bool
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
	if data, err := os.ReadFile("/proc/self/status"); err == nil {
		h.Seccomp = bytes.Contains(data, []byte("\nSeccomp:"))
	}
	if data, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil {
		h.UserNamespaces, _ = strconv.Atoi(strings.TrimSpace(string(data)))
	}
	return h
}

func cgroupLayout() string {
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return "v2"
	}
	if _, err := os.Stat("/sys/fs/cgroup/unified"); err == nil {
		return "hybrid"
	}
	return "v1"
}

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
		Detail: fmt.Sprintf("on the host's view: Landlock ABI %d (host read-only, workdir or scope writable, exec allowlist); cgroup memory, pids and cpu; seccomp; no capabilities; no_new_privs", h.LandlockABI)}
	if scoped != nil {
		scopedCap.Detail = "rehearsing a scoped session failed: " + scoped.Error()
	}
	sealedCap := Capability{Class: manifest.Sealed, Available: sealed == nil,
		Detail: "libcontainer: mount, pid, ipc, uts, net and cgroup namespaces; composed read-only root; cgroup memory, pids and cpu; seccomp; no capabilities; no_new_privs"}
	if sealed != nil {
		sealedCap.Detail = "rehearsing a sealed session failed: " + sealed.Error()
	}
	return Catalog{
		{manifest.Unconfined, true, "plain child process under roost-init; environment, rlimits and deadline applied"},
		{manifest.Advisory, true, "plain child process under roost-init; environment, rlimits and deadline applied, every other grant recorded, not enforced"},
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

// Strongest is the strongest class available.
func (c Catalog) Strongest() manifest.Class {
	best := manifest.ClassNone
	for _, e := range c {
		if e.Available {
			best = max(best, e.Class)
		}
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
	out = append(out, cgroupCheck(h.Cgroups))
	if seccompBuilt {
		out = append(out, Check{Name: "seccomp in roostd", Status: "ok", Detail: "built with libseccomp (the seccomp build tag)"})
	} else {
		out = append(out, Check{Name: "seccomp in roostd", Status: "fail", Detail: "built without seccomp support",
			Hint: "install libseccomp-dev and build with -tags seccomp (make build does)"})
	}
	if data, err := os.ReadFile("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); err == nil {
		v := strings.TrimSpace(string(data))
		out = append(out, Check{Name: "apparmor userns restriction", Status: "info",
			Detail: "kernel.apparmor_restrict_unprivileged_userns = " + v + "; roostd runs as root and creates namespaces without a user namespace, so it is not affected"})
	}
	if h.UserNamespaces > 0 {
		out = append(out, Check{Name: "user namespaces", Status: "ok", Detail: fmt.Sprintf("user.max_user_namespaces = %d", h.UserNamespaces)})
	} else {
		out = append(out, Check{Name: "user namespaces", Status: "info", Detail: "disabled (user.max_user_namespaces = 0)"})
	}
	return out
}

// cgroupControllers are the controllers scoped and sealed sessions are held by.
var cgroupControllers = []string{"memory", "pids", "cpu", "freezer"}

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
		for _, ctrl := range cgroupControllers {
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
	c.Status, c.Detail = "ok", layout+": "+strings.Join(cgroupControllers, ", ")+" available"
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
