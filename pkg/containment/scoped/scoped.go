package scoped

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	ocgroups "github.com/opencontainers/cgroups"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/containment/seccomp"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/resolver"
)

// Runtime runs scoped sessions: the program keeps the host's view of files, held by
// what a process can be held with there, in a network namespace of its own (the session's
// pinned one, where its endpoint and resolver listen, /etc/resolv.conf naming the resolver;
// else a new one, loopback only) and pid and IPC
// namespaces of its own, roost-init their pid 1, with a /proc of its own. roost-exec, before
// it execs the program, joins the session's cgroup (memory, pids, cpu) and network
// namespace, sets no_new_privs, applies Landlock (the host readable, only the workdir or its
// scope writable, the exec allowlist), drops every capability and loads the same seccomp
// filter a sealed session gets. For hosts (or containers) where a sealed root cannot be had.
type Runtime struct {
	plain *containment.ProcessRuntime
	// tmp holds each session's private temporary directory (TMPDIR).
	tmp string
	// resolvConf is the file bound over every session's /etc/resolv.conf.
	resolvConf string
	// rehearsal is the id range rehearsals run as: one no session is ever given.
	rehearsal containment.IDs
	// memfdSysctl says roost-exec sets vm.memfd_noexec in the session's pid namespace
	// (kernel 6.3 and later), where the policy needs it; without it the seccomp filter
	// holds what it can.
	memfdSysctl bool
}

// NewRuntime starts sessions under the roost-init binary at init and keeps their
// temporary directories under stateDir. containment.WithCgroups says where their cgroups
// go.
func NewRuntime(stateDir, init string, rehearsal containment.IDs, opts ...containment.Option) (*Runtime, error) {
	r := &Runtime{plain: containment.NewProcessRuntime(init, opts...), tmp: TmpRoot(stateDir), rehearsal: rehearsal,
		resolvConf: filepath.Join(stateDir, "resolv.conf"), memfdSysctl: containment.ApplyOptions(opts).MemfdSysctl()}
	// Others may pass through to a TMPDIR they own, never list the sessions'.
	if err := os.MkdirAll(r.tmp, 0o711); err != nil {
		return nil, err
	}
	if err := os.WriteFile(r.resolvConf, []byte(resolver.ResolvConf), 0o644); err != nil {
		return nil, fmt.Errorf("the sessions' resolv.conf: %w", err)
	}
	return r, os.Chmod(r.tmp, 0o711)
}

// TmpRoot is where, beneath stateDir, the runtime keeps its sessions' TMPDIRs: a session
// tree like the workdirs, which roostd seals (dirs.Seal) as it seals them.
func TmpRoot(stateDir string) string { return filepath.Join(stateDir, "tmp") }

// TmpDir is the scoped session's private temporary directory, which TMPDIR names.
func (r *Runtime) TmpDir(sessionID string) string { return filepath.Join(r.tmp, sessionID) }

// Cgroups is where the runtime puts its sessions' cgroups.
func (r *Runtime) Cgroups() *cgroups.Sessions { return r.plain.Cgroups() }

// scopedProcess is a PlainProcess whose cgroup holds limits, and is always there.
type scopedProcess struct {
	*containment.PlainProcess
}

var _ containment.Runtime = (*Runtime)(nil)

var (
	_ containment.Process = (*scopedProcess)(nil)
	_ containment.Freezer = (*scopedProcess)(nil)
	_ containment.Meter   = (*scopedProcess)(nil)
)

// scopedResources are a scoped session's cgroup limits: memory with swap 0, pids, cpu.
func scopedResources(p *manifest.Policy) *ocgroups.Resources {
	r := p.Resources
	mem := r.CgroupMemoryBytes.Value
	return &ocgroups.Resources{
		Memory:      mem,
		MemorySwap:  mem,
		PidsLimit:   ptrInt64(r.CgroupPidsMax.Value),
		CpuQuota:    r.CgroupCPUPercent.Value * cgroups.CPUPeriod / 100,
		CpuPeriod:   cgroups.CPUPeriod,
		SkipDevices: true,
	}
}

func ptrInt64(v int64) *int64 { return &v }

// Start creates the session's cgroup and temporary directory and starts the program.
func (r *Runtime) Start(ctx context.Context, spec containment.Spec) (_ containment.Process, retErr error) {
	if spec.Policy == nil {
		return nil, errors.New("scoped start without a policy")
	}
	defer func() {
		if retErr != nil {
			_ = r.Release(spec.SessionID)
		}
	}()
	user, err := spec.User()
	if err != nil {
		return nil, err
	}
	owner, err := spec.Owner()
	if err != nil {
		return nil, err
	}
	if _, err := containment.PrepareWorkSources(spec.Dir, spec.Policy.Filesystem.Scope, nil, owner); err != nil {
		return nil, &containment.StartError{Msg: "workdir: " + err.Error()}
	}
	tmp := r.TmpDir(spec.SessionID)
	if err := os.Mkdir(tmp, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	if user != nil {
		if err := os.Lchown(tmp, int(user.UID), int(user.GID)); err != nil {
			return nil, fmt.Errorf("the session's TMPDIR: %w", err)
		}
	}
	// The cgroup, with its limits, is there before roost-init: roost-init is started into it
	// (and with it roost-exec and the program), and counts against its pids and memory as a
	// sealed session's does.
	cg, err := r.Cgroups().Create(spec.SessionID, scopedResources(spec.Policy))
	if err != nil {
		return nil, err
	}
	exec, err := r.execSpec(spec, user, tmp)
	if err != nil {
		return nil, err
	}
	if exec.Mounts.Passwd, err = r.passwdFile(spec, user); err != nil {
		return nil, fmt.Errorf("the session's passwd: %w", err)
	}
	p, err := r.plain.StartExec(ctx, spec, exec, cg, namespaces)
	if err != nil {
		return nil, err
	}
	return &scopedProcess{PlainProcess: p}, nil
}

// namespaces are the session's own that roost-init is born in, and so everything it starts:
// a pid namespace (roost-init its pid 1, the program its child, none of the host's processes
// in it, and a /proc of its own that roost-exec mounts) and an IPC namespace (no SysV object
// or POSIX message queue of the host's in it). Its mount and network namespaces are
// roost-exec's to make.
const namespaces = syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC

// execSpec is what roost-exec applies before a scoped session's program, and before
// every command roostctl exec runs in one; tmp is the session's TMPDIR.
func (r *Runtime) execSpec(spec containment.Spec, user *roostinit.User, tmp string) (roostinit.ExecSpec, error) {
	bpf, err := scopedSeccomp(spec.Policy, r.memfdSysctl)
	if err != nil {
		return roostinit.ExecSpec{}, err
	}
	// The host's /tmp is shared and not readable here: the session gets its own.
	env := append(slices.Clone(spec.Env), "TMPDIR="+tmp)
	exec := roostinit.ExecSpec{
		Argv: spec.Argv, Env: env, Dir: spec.Dir, Rlimits: spec.Rlimits,
		NoNewPrivileges:  true,
		DropCapabilities: true,
		Seccomp:          bpf,
		User:             user,
		NetNS:            spec.NetNS,
		NewNetNS:         spec.NetNS == "",
		Report:           spec.Runner != "",
		// roost-init, pid 1 of the session's pid namespace, is born as host root: so is
		// roost-exec, its child there, until it becomes the session's uid.
		MemfdNoExec: !spec.Policy.Filesystem.WorkdirExec && r.memfdSysctl,
		// The allowlist's refusals are recorded, a scoped session's view being the host's:
		// a name missing there is missing, no refusal.
		Refusals: &roostinit.Refusals{},
	}
	exec.Landlock, exec.Mounts = scopedExec(spec, tmp)
	// The host's resolv.conf names servers the session's namespace cannot reach; without
	// one, resolvers ask 127.0.0.1, the session's own already.
	if _, err := os.Stat("/etc/resolv.conf"); err == nil {
		exec.Mounts.ResolvConf = r.resolvConf
	}
	return exec, nil
}

// scopedSeccomp is the sealed profile for the session's policy, compiled; memfdSysctl says
// vm.memfd_noexec holds memfds, so the filter need not.
func scopedSeccomp(p *manifest.Policy, memfdSysctl bool) ([]byte, error) {
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}
	profile, err := seccomp.Profile(spec, containment.SeccompOptions(p, memfdSysctl))
	if err != nil {
		return nil, err
	}
	return seccomp.Compile(profile)
}

// Attach re-attaches to a scoped session a previous daemon started.
func (r *Runtime) Attach(sessionID, recordsDir string, ref *containment.ProcessRef) (containment.Process, error) {
	p, err := r.plain.Attach(sessionID, recordsDir, ref)
	if err != nil {
		return nil, err
	}
	plain := p.(*containment.PlainProcess)
	if plain.Cgroup == nil {
		// Found nowhere: a manager of where it would be, so pausing and reading say so.
		if plain.Cgroup, err = r.Cgroups().PlaceOf(sessionID).Manager(nil); err != nil {
			return nil, err
		}
	}
	return &scopedProcess{PlainProcess: plain}, nil
}

// scopedExec is what may execute in a scoped session, and its mounts: its pid namespace's
// /proc, and those that hold what may execute. The trees
// the session writes (its workdir — a scope's surroundings too: an earlier session wrote
// them —, TMPDIR, home and private /dev/shm) never become exec rules and are mounted noexec
// in its own mount namespace, so not even the dynamic loader maps a program from them; the
// children's workdirs are theirs, never the parent's to run. With workdir_exec those trees
// execute whatever is in them, and the rest of the host still only the allowlist.
func scopedExec(spec containment.Spec, tmp string) (*roostinit.Landlock, *roostinit.Mounts) {
	writable := []string{spec.Dir, tmp}
	if spec.Home != "" {
		writable = append(writable, spec.Home)
	}
	l := &roostinit.Landlock{Exec: spec.ExecAllowlist(), ExecTrees: spec.ExecTrees, FS: FS(spec, tmp)}
	m := &roostinit.Mounts{Shm: containment.DevShmBytes, Proc: true}
	if spec.Policy.Filesystem.WorkdirExec {
		l.WritableExec = append(writable, "/dev/shm")
		l.NoExec = slices.Clone(spec.Children)
		m.ShmExec = true
	} else {
		l.NoExec = append(slices.Clone(writable), spec.Children...)
		m.NoExec = writable
	}
	return l, m
}

// FS is what Landlock lets a scoped session's program read and write: the system
// trees, /proc and a few devices; its capsule; its workdir (with a scope, only the scope
// and the read_only subtrees); its TMPDIR; its task text; and where its children work. The
// scope (or the whole workdir) and the TMPDIR are writable.
func FS(spec containment.Spec, tmp string) *roostinit.LandlockFS {
	fsr := &roostinit.LandlockFS{
		Read:       append(containment.SystemTrees(), "/proc", spec.CapsuleDir),
		WriteFiles: containment.DeviceFiles(),
	}
	if v := spec.System; v != nil {
		// Of the system trees, the program reads only its allowlist's closure: the ELF
		// loader, which maps a file without an exec, then finds nothing else to run. The
		// trees stay listable (a program's search of /usr/lib sees names, opens nothing).
		fsr.Read = append([]string{"/etc", "/proc", spec.CapsuleDir}, v.Trees...)
		fsr.List = containment.SystemTrees()
		fsr.ReadFiles = append(fsr.ReadFiles, v.Files...)
	}
	writable := spec.Dir
	if p := spec.Policy; p != nil && p.Filesystem.Scope != "" {
		writable = filepath.Join(spec.Dir, p.Filesystem.Scope)
		for _, ro := range p.Filesystem.ReadOnly {
			fsr.Read = append(fsr.Read, filepath.Join(spec.Dir, ro))
		}
	}
	fsr.Write = []string{writable, tmp, "/dev/shm"}
	if spec.Home != "" {
		fsr.Write = append(fsr.Write, spec.Home)
	}
	if spec.Task != "" {
		fsr.ReadFiles = append(fsr.ReadFiles, spec.Task)
	}
	if spec.Runner != "" {
		// exec opens the file for reading too: the runner needs READ_FILE beside EXECUTE.
		fsr.ReadFiles = append(fsr.ReadFiles, spec.Runner, spec.WasmModule)
	}
	fsr.Read = append(fsr.Read, spec.Children...)
	if spec.Policy != nil {
		fsr.Read = append(fsr.Read, spec.Policy.Filesystem.HostRead...)
	}
	// /etc/resolv.conf is often a link into /run (systemd-resolved): name resolution needs
	// the file it points to, not the rest of /run.
	if target, err := filepath.EvalSymlinks("/etc/resolv.conf"); err == nil && !beneathAny(target, containment.SystemTrees()) {
		fsr.ReadFiles = append(fsr.ReadFiles, target)
	}
	return fsr
}

// beneathAny says whether path is one of dirs or beneath one.
func beneathAny(path string, dirs []string) bool {
	for _, d := range dirs {
		if path == d || strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}

// Release removes the session's cgroup wherever it is (ending anything left in it), its
// temporary directory and its passwd.
func (r *Runtime) Release(sessionID string) error {
	err := os.Remove(r.passwdPath(sessionID))
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	return errors.Join(r.Cgroups().Remove(sessionID), os.RemoveAll(r.TmpDir(sessionID)), err)
}

// passwdPath is where the session's passwd is: beside its TMPDIR, root's, not the session's.
func (r *Runtime) passwdPath(sessionID string) string {
	return filepath.Join(r.tmp, sessionID+".passwd")
}

// passwdFile writes the session's passwd: the host's, with an entry for the session's uid,
// a uid of its own the host's has none for, naming its home and its login shell, so that
// getpwuid finds it (Codex runs commands with the passwd shell; ssh, git and Python's
// getpass.getuser ask it too). roost-exec binds it over /etc/passwd in the session's mount
// namespace. "" for a session as host root, or a uid the host's passwd has.
func (r *Runtime) passwdFile(spec containment.Spec, user *roostinit.User) (string, error) {
	if user == nil {
		return "", nil
	}
	host, err := os.ReadFile("/etc/passwd")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	uid := strconv.FormatUint(uint64(user.UID), 10)
	for _, line := range strings.Split(string(host), "\n") {
		if f := strings.Split(line, ":"); len(f) > 2 && f[2] == uid {
			return "", nil
		}
	}
	home, shell := spec.Home, spec.Shell
	if home == "" {
		home = "/nonexistent"
	}
	if shell == "" {
		shell = "/bin/sh"
	}
	content := string(host)
	if content != "" && !strings.HasSuffix(content, "\n") {
		content += "\n"
	}
	content += fmt.Sprintf("roost:x:%d:%d:roost session %s:%s:%s\n", user.UID, user.GID, spec.SessionID, home, shell)
	file := r.passwdPath(spec.SessionID)
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		return "", err
	}
	return file, nil
}

// Held lists sessions that still have a temporary directory.
func (r *Runtime) Held() ([]string, error) { return containment.DirNames(r.tmp) }

func (p *scopedProcess) Pause() error  { return p.Cgroup.Freeze(ocgroups.Frozen) }
func (p *scopedProcess) Resume() error { return p.Cgroup.Freeze(ocgroups.Thawed) }

func (p *scopedProcess) Exit() (containment.ExitInfo, error) {
	info, err := p.PlainProcess.Exit()
	if err == nil && info.StartError == "" && (info.Code != 0 || info.Signal != 0) {
		if n, cerr := p.Cgroup.OOMKillCount(); cerr == nil && n > 0 {
			info.OOMKilled = true
		}
	}
	return info, err
}

func (p *scopedProcess) Signal(sig syscall.Signal) error { return p.PlainProcess.Signal(sig) }

// Rehearse runs /usr/bin/true as a throwaway scoped session: cgroup, Landlock, seccomp,
// capabilities and no_new_privs, exactly as a session gets them.
func (r *Runtime) Rehearse(ctx context.Context) error {
	if r == nil {
		return containment.ErrNoRuntime
	}
	if abi := containment.Probe().LandlockABI; abi < 1 {
		return errors.New("the kernel offers no Landlock; boot a kernel with CONFIG_SECURITY_LANDLOCK=y and landlock in the lsm= list")
	}
	return containment.Rehearse(ctx, r, manifest.Scoped, r.tmp, r.rehearsal)
}
