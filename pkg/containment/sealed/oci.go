package sealed

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/seccomp"
	"roost.dev/roost/pkg/manifest"
)

// Where things sit inside a sealed root.
const (
	// Work is the session's workdir, where its program starts; Capsule its capsule,
	// read-only.
	Work    = "/work"
	Capsule = "/capsule"
	// initDir holds roost-init and what roost's WASM runner needs, bound from the host.
	initDir  = "/.roost"
	initPath = initDir + "/" + containment.InitName
	// RunnerPath is roost's WASM runner in a sealed root, WasmModule the session's
	// compiled module: both bound read-only from the host when it runs one.
	RunnerPath = initDir + "/roost-wasm"
	WasmModule = initDir + "/module.cwasm"
	// TaskPath is where a sealed session finds the task text its parent gave it.
	TaskPath = "/run/roost/task.md"
	// Home is a sealed session's HOME: root's home, as its passwd says.
	Home = "/root"
	// PasswdPath is the session's passwd, bound over the shared root's: its users' login
	// shell is the session's (see Layout.Passwd).
	PasswdPath = "/etc/passwd"
)

// Layout is where a sealed session's parts live on the host.
type Layout struct {
	SessionID string
	// CgroupsPath is the session's cgroup, as the OCI spec's cgroupsPath says it: a path
	// (cgroupfs) or slice:prefix:name (systemd); "" is cgroups.FallbackParent/<session>.
	CgroupsPath string
	// Rootfs is the directory composed for the session (see composeRoot).
	Rootfs     string
	Workdir    string
	CapsuleDir string
	// Init is roost-init's binary on the host; it is bind-mounted read-only into the root.
	Init string
	// Sources maps a workdir-relative path (the scope, a read_only entry) to the host path
	// mounted for it, checked to resolve beneath the workdir with no symlink on the way
	// (see PrepareWorkSources).
	Sources map[string]string
	// MergedUsr says /bin, /sbin, /lib and /lib64 are symlinks into /usr on this host.
	MergedUsr bool
	// EtcBinds are host /etc entries bound read-only (TLS certificates, alternatives).
	EtcBinds []string
	// NetNS is a pinned network namespace to join instead of making one.
	NetNS string
	// Task is the host path of a task text to mount at TaskPath.
	Task string
	// IDs is the host range the session's user namespace maps 0..Size-1 onto.
	IDs containment.IDs
	// Home is the session's home directory on the host, mounted at Home.
	Home string
	// Passwd is the passwd naming the session's login shell on the host (see
	// Runtime.passwdFile), mounted at PasswdPath; "" keeps the shared root's.
	Passwd string
	// HostRead lists host trees bound read-only at the same paths (filesystem.host_read).
	HostRead []string
	// Runner and WasmModule, for a WASM session, are roost-wasm and the session's compiled
	// module on the host, bound read-only at RunnerPath and WasmModule.
	Runner, WasmModule string
	// System, when set, is the view of the system trees the root has in place of the host's
	// /usr (filesystem.system: allowlist).
	System *containment.SystemView
	// MemfdSysctl says the kernel has vm.memfd_noexec, which Init sets in the container's
	// pid namespace (see MemfdAnnotation); without it the seccomp filter holds what it can.
	MemfdSysctl bool
}

// systemTops are the system trees a sealed root may hold: /usr, and on a host whose /bin,
// /sbin and /lib* are no links into /usr, those; /opt only from a view that holds some of it.
var systemTops = []string{"/usr", "/bin", "/sbin", "/lib", "/lib64", "/opt"}

// inSystemTrees says whether a host path lies in one of systemTops.
func inSystemTrees(p string) bool {
	for _, t := range systemTops {
		if p == t || strings.HasPrefix(p, t+"/") {
			return true
		}
	}
	return false
}

// systemMounts are the root's system trees: the host's (filesystem.system: full), or the
// session's view of them, its allowlist's closure, with the trees it holds whole bound
// from the host onto the view's directories for them.
func systemMounts(l Layout) []specs.Mount {
	ro := []string{"rbind", "ro", "nosuid", "nodev"}
	var out []specs.Mount
	for _, top := range systemTops {
		if top == "/opt" && l.System == nil {
			continue
		}
		if top != "/usr" && top != "/opt" && l.MergedUsr {
			continue
		}
		src := top
		if l.System != nil {
			src = filepath.Join(l.System.Dir, top)
		}
		if _, err := os.Stat(src); err == nil {
			out = append(out, specs.Mount{Destination: top, Type: "bind", Source: src, Options: ro})
		}
	}
	if l.System != nil {
		// The trees the allowlist asked for; the view holds the data trees itself, so a
		// sandbox made ahead attaches one mount for a plain capsule's view.
		for _, t := range l.System.Trees {
			if slices.Contains(l.System.Linked, t) {
				continue
			}
			out = append(out, specs.Mount{Destination: t, Type: "bind", Source: t, Options: ro})
		}
	}
	return out
}

// OCISpec describes a sealed session as an OCI runtime spec: the one description of its
// root, namespaces, cgroup, capabilities and seccomp filter. roost converts it with runc's
// specconv; `roostctl explain --oci` prints it as the config.json another runtime would run.
func OCISpec(l Layout, p *manifest.Policy) (*specs.Spec, error) {
	if l.IDs.Size == 0 || l.IDs.First == 0 {
		return nil, fmt.Errorf("session %s has no uid range for its user namespace", l.SessionID)
	}
	example := specconv.Example()
	// The session's writable trees (its workdir, /tmp, /dev/shm, its home) execute only
	// with workdir_exec; the rest of the root is read-only, and /dev holds no programs.
	noexec := "noexec"
	if p.Filesystem.WorkdirExec {
		noexec = "exec"
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "noexec", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", noexec, "nodev", "mode=1777", fmt.Sprintf("size=%d", containment.DevShmBytes)}},
	}
	mounts = append(mounts, systemMounts(l)...)
	for _, e := range l.EtcBinds {
		mounts = append(mounts, specs.Mount{Destination: e, Type: "bind", Source: e, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	mounts = append(mounts,
		specs.Mount{Destination: Capsule, Type: "bind", Source: l.CapsuleDir, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		specs.Mount{Destination: initPath, Type: "bind", Source: l.Init, Options: []string{"bind", "ro", "nosuid", "nodev"}},
	)
	for _, h := range l.HostRead {
		if l.System != nil && inSystemTrees(h) {
			// The view holds it among its trees (see systemMounts).
			continue
		}
		mounts = append(mounts, specs.Mount{Destination: h, Type: "bind", Source: h, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	if l.Runner != "" {
		mounts = append(mounts,
			specs.Mount{Destination: RunnerPath, Type: "bind", Source: l.Runner, Options: []string{"bind", "ro", "nosuid", "nodev"}},
			specs.Mount{Destination: WasmModule, Type: "bind", Source: l.WasmModule, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	mounts = append(mounts, workMounts(l, p, noexec)...)
	if l.Home != "" {
		mounts = append(mounts, specs.Mount{Destination: Home, Type: "bind", Source: l.Home, Options: []string{"bind", "rw", "nosuid", "nodev", noexec}})
	}
	// /run is a tmpfs so the mount point of the task file can be made in the read-only root;
	// every session has it, with a task or without, so that a sandbox made before its
	// session knows whether it will have one is the same sandbox.
	mounts = append(mounts, specs.Mount{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "noexec", "mode=755", "size=1m"}})
	if l.Passwd != "" {
		mounts = append(mounts, specs.Mount{Destination: PasswdPath, Type: "bind", Source: l.Passwd, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	if l.Task != "" {
		mounts = append(mounts, specs.Mount{Destination: TaskPath, Type: "bind", Source: l.Task, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	mounts = append(mounts, specs.Mount{
		Destination: "/tmp", Type: "tmpfs", Source: "tmpfs",
		Options: []string{"nosuid", "nodev", noexec, "mode=1777", fmt.Sprintf("size=%d", tmpBytes(p))},
	})

	caps := &specs.LinuxCapabilities{}
	spec := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: l.Rootfs, Readonly: true},
		Hostname: "roost",
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			// roost-init is PID 1; it starts the program (see roostinit) in the same
			// directory with the same rlimits, which the spec states so that it tells the
			// program's truth.
			Args:            []string{initPath, containment.InitTag(l.SessionID)},
			Env:             []string{"PATH=" + containment.DefaultPath},
			Cwd:             Work,
			Rlimits:         ociRlimits(p),
			Capabilities:    caps,
			NoNewPrivileges: true,
		},
		Mounts: mounts,
		Linux: &specs.Linux{
			// The user namespace comes first: every other namespace is owned by it, so
			// root inside holds nothing over the host's.
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.UserNamespace},
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace, Path: l.NetNS}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
			},
			UIDMappings:   []specs.LinuxIDMapping{{ContainerID: 0, HostID: l.IDs.First, Size: l.IDs.Size}},
			GIDMappings:   []specs.LinuxIDMapping{{ContainerID: 0, HostID: l.IDs.First, Size: l.IDs.Size}},
			CgroupsPath:   l.cgroupsPath(),
			Resources:     resources(p),
			MaskedPaths:   present(maskedPaths(example.Linux.MaskedPaths)),
			ReadonlyPaths: present(example.Linux.ReadonlyPaths),
		},
	}
	filter, err := seccomp.Profile(spec, containment.SeccompOptions(p, l.MemfdSysctl))
	if err != nil {
		return nil, err
	}
	spec.Linux.Seccomp = filter
	if !p.Filesystem.WorkdirExec && l.MemfdSysctl {
		spec.Annotations = map[string]string{MemfdAnnotation: "2"}
	}
	return spec, nil
}

// MemfdAnnotation, at "2" in a sealed spec, says vm.memfd_noexec is 2 in the container's
// pid namespace, set from the host once the container is made and before its init runs
// anything of the session's (see roostinit.SetMemfdNoExecIn): no memfd executes there.
// Nothing in the container could set it, root there being no host root and holding no
// capability. It is in the spec, rather than a choice where the container starts, so that
// a sandbox made ahead has it exactly when its session would (the fit compares it) and
// explain --oci shows it; another OCI runtime ignores it.
const MemfdAnnotation = "dev.roost.memfd-noexec"

// memfdNoExec says whether the container of spec s must have vm.memfd_noexec set.
func memfdNoExec(s *specs.Spec) bool { return s.Annotations[MemfdAnnotation] == "2" }

func (l Layout) cgroupsPath() string {
	if l.CgroupsPath != "" {
		return l.CgroupsPath
	}
	return path.Join(cgroups.FallbackParent, l.SessionID)
}

// moreMasked are what roost hides in /proc and /sys beyond runc's defaults: moby's
// additions (interrupt counts and power capping, both side channels), and the kernel's
// symbol table and allocator state, which help an exploit find its targets. Some are
// readable only by host root anyway; masked, they are empty whatever a kernel bug allows.
var moreMasked = []string{"/proc/interrupts", "/sys/devices/virtual/powercap", "/proc/kallsyms", "/proc/slabinfo", "/proc/vmallocinfo"}

func maskedPaths(base []string) []string {
	out := slices.Clone(base)
	for _, p := range moreMasked {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// present keeps the /proc and /sys paths this kernel has: a spec naming others states
// masks no runtime can apply.
func present(paths []string) []string {
	return slices.DeleteFunc(slices.Clone(paths), func(p string) bool {
		_, err := os.Lstat(p)
		return err != nil
	})
}

// ociRlimits are the session's rlimits as the OCI spec names them.
func ociRlimits(p *manifest.Policy) []specs.POSIXRlimit {
	var out []specs.POSIXRlimit
	for _, rl := range containment.Rlimits(manifest.Sealed, p) {
		name, ok := rlimitNames[rl.Resource]
		if !ok {
			continue
		}
		hard := rl.Value
		if rl.Resource == unix.RLIMIT_CPU {
			hard++ // as roost-exec sets it: SIGXCPU a second before SIGKILL
		}
		out = append(out, specs.POSIXRlimit{Type: name, Soft: rl.Value, Hard: hard})
	}
	return out
}

var rlimitNames = map[int]string{
	unix.RLIMIT_NOFILE: "RLIMIT_NOFILE",
	unix.RLIMIT_FSIZE:  "RLIMIT_FSIZE",
	unix.RLIMIT_CPU:    "RLIMIT_CPU",
	unix.RLIMIT_NPROC:  "RLIMIT_NPROC",
	unix.RLIMIT_AS:     "RLIMIT_AS",
}

// workMounts mounts the workdir at /work so that the mounts themselves hold the filesystem
// grants: the whole workdir writable, or (with a scope) read-only but for the scope; each
// read_only subtree read-only on top. Without workdir_exec nothing under it executes.
func workMounts(l Layout, p *manifest.Policy, noexec string) []specs.Mount {
	opts := func(rw string) []string { return []string{"bind", rw, "nosuid", "nodev", noexec} }
	work := "rw"
	if p.Filesystem.Scope != "" {
		work = "ro"
	}
	mounts := []specs.Mount{{Destination: Work, Type: "bind", Source: l.Workdir, Options: opts(work)}}
	sub := func(rel, rw string) {
		src, ok := l.Sources[rel]
		if !ok {
			src = filepath.Join(l.Workdir, rel)
		}
		mounts = append(mounts, specs.Mount{Destination: path.Join(Work, rel), Type: "bind", Source: src, Options: opts(rw)})
	}
	if p.Filesystem.Scope != "" {
		sub(p.Filesystem.Scope, "rw")
	}
	for _, ro := range p.Filesystem.ReadOnly {
		sub(ro, "ro")
	}
	// A session that may delegate sees its children's workdirs under /work/.roost, read-only:
	// roost makes and writes there (children's workdirs, completion.json), so the parent
	// must not be able to swap anything in it for a link.
	if len(p.Spawn.Allow) > 0 {
		sub(containment.ChildrenRoot, "ro")
	}
	return mounts
}

// tmpBytes bounds the sealed /tmp: workdir_max_bytes, which the workdir and /tmp share,
// and never more than the cgroup's memory, which tmpfs pages are charged to.
func tmpBytes(p *manifest.Policy) int64 {
	return min(p.Resources.WorkdirMaxBytes.Value, p.Resources.CgroupMemoryBytes.Value)
}

func resources(p *manifest.Policy) *specs.LinuxResources {
	r := p.Resources
	mem := r.CgroupMemoryBytes.Value
	pids := r.CgroupPidsMax.Value
	quota := r.CgroupCPUPercent.Value * cgroups.CPUPeriod / 100
	period := uint64(cgroups.CPUPeriod)
	deny := []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}
	return &specs.LinuxResources{
		Devices: deny,
		// Swap equal to memory: the memory+swap limit is the memory limit, so no swap.
		Memory: &specs.LinuxMemory{Limit: &mem, Swap: &mem},
		Pids:   &specs.LinuxPids{Limit: &pids},
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
	}
}
