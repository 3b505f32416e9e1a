package containment

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/opencontainers/cgroups"
	cgroupsmanager "github.com/opencontainers/cgroups/manager"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/manifest"
)

// ScopedRuntime runs scoped sessions: the program stays on the host's own view, with no
// namespace, held by what a process can be held with there. roost-exec, before it execs the
// program, joins the session's cgroup (memory, pids, cpu), sets no_new_privs, applies
// Landlock (the host readable, only the workdir or its scope writable, the exec
// allowlist), drops every capability and loads the same seccomp filter a sealed session
// gets. For hosts (or containers) where namespaces cannot be had.
type ScopedRuntime struct {
	plain *ProcessRuntime
	// tmp holds each session's private temporary directory (TMPDIR).
	tmp string
}

// NewScopedRuntime starts sessions under the roost-init binary at init and keeps their
// temporary directories under stateDir.
func NewScopedRuntime(stateDir, init string) (*ScopedRuntime, error) {
	r := &ScopedRuntime{plain: NewProcessRuntime(init), tmp: filepath.Join(stateDir, "tmp")}
	return r, os.MkdirAll(r.tmp, 0o700)
}

// TmpDir is the scoped session's private temporary directory, which TMPDIR names.
func (r *ScopedRuntime) TmpDir(sessionID string) string { return filepath.Join(r.tmp, sessionID) }

type scopedProcess struct {
	*plainProcess
	cgroup cgroups.Manager
}

var (
	_ Process = (*scopedProcess)(nil)
	_ Freezer = (*scopedProcess)(nil)
	_ Meter   = (*scopedProcess)(nil)
)

func scopedCgroup(sessionID string, p *manifest.Policy) (cgroups.Manager, error) {
	r := p.Resources
	mem := r.CgroupMemoryBytes.Value
	return cgroupsmanager.New(&cgroups.Cgroup{
		Path: filepath.Join(sealedCgroupParent, sessionID),
		Resources: &cgroups.Resources{
			Memory:      mem,
			MemorySwap:  mem,
			PidsLimit:   ptrInt64(r.CgroupPidsMax.Value),
			CpuQuota:    r.CgroupCPUPercent.Value * cpuPeriod / 100,
			CpuPeriod:   cpuPeriod,
			SkipDevices: true,
		},
	})
}

func ptrInt64(v int64) *int64 { return &v }

// Start creates the session's cgroup and temporary directory and starts the program.
func (r *ScopedRuntime) Start(ctx context.Context, spec Spec) (_ Process, retErr error) {
	if spec.Policy == nil {
		return nil, errors.New("scoped start without a policy")
	}
	defer func() {
		if retErr != nil {
			_ = r.Release(spec.SessionID)
		}
	}()
	if _, err := prepareWorkSources(spec.Dir, spec.Policy.Filesystem.Scope, nil); err != nil {
		return nil, &StartError{Msg: "workdir: " + err.Error()}
	}
	if err := os.MkdirAll(r.TmpDir(spec.SessionID), 0o700); err != nil {
		return nil, err
	}
	cg, err := scopedCgroup(spec.SessionID, spec.Policy)
	if err != nil {
		return nil, err
	}
	if err := cg.Apply(-1); err != nil {
		return nil, fmt.Errorf("creating the session's cgroup: %w", err)
	}
	if err := cg.Set(mustResources(cg)); err != nil {
		return nil, fmt.Errorf("setting the session's cgroup limits: %w", err)
	}
	var procs []string
	for _, dir := range cg.GetPaths() {
		// Controllers the manager left alone (devices, with SkipDevices) have no directory.
		if _, err := os.Stat(dir); err == nil {
			procs = append(procs, filepath.Join(dir, "cgroup.procs"))
		}
	}
	bpf, err := scopedSeccomp(spec.Policy)
	if err != nil {
		return nil, err
	}
	writable := spec.Dir
	if scope := spec.Policy.Filesystem.Scope; scope != "" {
		writable = filepath.Join(spec.Dir, scope)
	}
	// The host's /tmp is shared and not writable here: the session gets its own.
	env := append(slices.Clone(spec.Env), "TMPDIR="+r.TmpDir(spec.SessionID))
	exec := roostinit.ExecSpec{
		Argv: spec.Argv, Env: env, Dir: spec.Dir, Rlimits: spec.Rlimits,
		Cgroups:          procs,
		NoNewPrivileges:  true,
		DropCapabilities: true,
		Seccomp:          bpf,
		Landlock: &roostinit.Landlock{
			Exec: spec.Policy.Shell.Allow,
			FS: &roostinit.LandlockFS{
				Read:       []string{"/"},
				Write:      []string{writable, r.TmpDir(spec.SessionID)},
				WriteFiles: []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random", "/dev/urandom"},
			},
		},
	}
	p, err := r.plain.start(ctx, spec, exec)
	if err != nil {
		return nil, err
	}
	return &scopedProcess{plainProcess: p, cgroup: cg}, nil
}

func mustResources(cg cgroups.Manager) *cgroups.Resources {
	c, err := cg.GetCgroups()
	if err != nil || c.Resources == nil {
		return &cgroups.Resources{SkipDevices: true}
	}
	return c.Resources
}

// scopedSeccomp is the sealed profile for the session's policy, compiled.
func scopedSeccomp(p *manifest.Policy) ([]byte, error) {
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}
	profile, err := seccompProfile(spec, p.Network.UnixSockets)
	if err != nil {
		return nil, err
	}
	return compileSeccomp(profile)
}

// Attach re-attaches to a scoped session a previous daemon started.
func (r *ScopedRuntime) Attach(sessionID, recordsDir string, ref *ProcessRef) (Process, error) {
	p, err := r.plain.Attach(sessionID, recordsDir, ref)
	if err != nil {
		return nil, err
	}
	cg, err := cgroupsmanager.New(&cgroups.Cgroup{Path: filepath.Join(sealedCgroupParent, sessionID), Resources: &cgroups.Resources{SkipDevices: true}})
	if err != nil {
		return nil, err
	}
	return &scopedProcess{plainProcess: p.(*plainProcess), cgroup: cg}, nil
}

// Release removes the session's cgroup (ending anything left in it) and temporary directory.
func (r *ScopedRuntime) Release(sessionID string) error {
	return errors.Join(removeCgroups(sessionID), os.RemoveAll(r.TmpDir(sessionID)))
}

// Held lists sessions that still have a temporary directory.
func (r *ScopedRuntime) Held() ([]string, error) { return dirNames(r.tmp) }

func (p *scopedProcess) Pause() error  { return p.cgroup.Freeze(cgroups.Frozen) }
func (p *scopedProcess) Resume() error { return p.cgroup.Freeze(cgroups.Thawed) }

func (p *scopedProcess) Usage() (Usage, error) {
	st, err := p.cgroup.GetStats()
	if err != nil {
		return Usage{}, err
	}
	return Usage{
		MemoryBytes:     int64(st.MemoryStats.Usage.Usage),
		MemoryPeakBytes: int64(st.MemoryStats.Usage.MaxUsage),
		CPUSeconds:      float64(st.CpuStats.CpuUsage.TotalUsage) / 1e9,
		Pids:            int64(st.PidsStats.Current),
	}, nil
}

func (p *scopedProcess) Exit() (ExitInfo, error) {
	info, err := p.plainProcess.Exit()
	if err == nil && info.StartError == "" && (info.Code != 0 || info.Signal != 0) {
		if n, cerr := p.cgroup.OOMKillCount(); cerr == nil && n > 0 {
			info.OOMKilled = true
		}
	}
	return info, err
}

func (p *scopedProcess) Signal(sig syscall.Signal) error { return p.plainProcess.Signal(sig) }
