package sealed

import (
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"roost.dev/roost/pkg/artifact"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/containment/sealer"
	"roost.dev/roost/pkg/manifest"
)

// Runtime runs sealed sessions: libcontainer builds each one's namespaces, cgroup,
// seccomp filter and composed root from the OCI spec OCISpec describes, and roost-init
// is its PID 1.
//
// Every sealed session shares one composed root (see prepareRoot): it holds only mount
// points, symlinks and generated /etc files, identical for all sessions, and each session
// mounts it read-only in its own mount namespace, so none can change it.
type Runtime struct {
	// containers is libcontainer's state root; roots holds the composed roots (the shared
	// one, and those Bundle makes).
	containers string
	roots      string
	root       string
	// init is the static roost-init binary bind-mounted into every root.
	init     string
	merged   bool
	etcBinds []string
	// rehearsal is the id range rehearsals run as: one no session is ever given.
	rehearsal containment.IDs
	// cg says where sessions' cgroups go; nil is the default configuration.
	cg *cgroups.Sessions
	// sealer starts the containers when set; nil: this process does.
	sealer *sealer.Client
	// memfdSysctl says vm.memfd_noexec is set in the containers' pid namespaces from the
	// host (kernel 6.3 and later), where the policy needs it (see MemfdAnnotation); without
	// it the seccomp filter holds what it can.
	memfdSysctl bool
	// fits keeps Fits's verdicts by policy.
	fitsMu sync.Mutex
	fits   map[string]error
	// held keeps, by session id, the container a start or attach gave a session, for
	// Release to destroy without reading its libcontainer state again, or, if it was never
	// read and its init has ended, at all.
	heldMu sync.Mutex
	held   map[string]*lazyContainer
}

// NewRuntime keeps its state under stateDir and mounts init, a static roost-init
// binary, into each root. Rehearsals run as the ids of rehearsal. WithCgroups says where
// sessions' cgroups go.
func NewRuntime(stateDir, init string, rehearsal containment.IDs, opts ...containment.Option) (*Runtime, error) {
	o := containment.ApplyOptions(opts)
	if err := staticInit(init); err != nil {
		return nil, err
	}
	r := &Runtime{
		containers:  filepath.Join(stateDir, "containers"),
		roots:       filepath.Join(stateDir, "roots"),
		init:        init,
		rehearsal:   rehearsal,
		cg:          o.Cgroups,
		sealer:      o.Sealer,
		memfdSysctl: o.MemfdSysctl(),
		held:        map[string]*lazyContainer{},
	}
	if err := os.MkdirAll(r.containers, 0o700); err != nil {
		return nil, err
	}
	// A session's root is its user namespace's root, an unprivileged uid on the host: it
	// must pass through to the composed root it mounts, and nothing more.
	if err := os.MkdirAll(r.roots, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(r.roots, 0o711); err != nil {
		return nil, err
	}
	r.merged, r.etcBinds = hostShape()
	if err := r.prepareRoot(); err != nil {
		return nil, fmt.Errorf("composing the sealed root: %w", err)
	}
	return r, nil
}

// staticInit refuses a roost-init that needs a dynamic loader: a sealed root holds of the
// host's /usr only the session's view of it, and a sandbox made ahead none until its session
// claims it, so roost-init, which starts first, must need nothing of it.
func staticInit(init string) error {
	f, err := elf.Open(init)
	if err != nil {
		return fmt.Errorf("roost-init %s: %w", init, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("roost-init %s is dynamically linked; a sealed root holds none of the host's libraries for it: build it static (CGO_ENABLED=0, as make build does)", init)
		}
	}
	return nil
}

// prepareRoot makes the shared root for this daemon's sessions. It is named by its content
// and never changed once made: a running session has it mounted (its mount points are
// mounts in that session's namespace), and removing or rewriting it would pull /usr and
// /etc from under a program that outlived the daemon. A root the host's layout changed
// gets a new name; an old one goes once no container uses it.
func (r *Runtime) prepareRoot() error {
	tmp, err := os.MkdirTemp(r.roots, ".compose-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := composeRoot(filepath.Join(tmp, "root"), r.Layout("", "", "")); err != nil {
		return err
	}
	digest, err := artifact.DigestDir(filepath.Join(tmp, "root"))
	if err != nil {
		return err
	}
	r.root = filepath.Join(r.roots, "base-"+strings.TrimPrefix(digest, "sha256:")[:16])
	if _, err := os.Stat(r.root); err == nil {
		return r.collectRoots()
	}
	if err := os.Rename(filepath.Join(tmp, "root"), r.root); err != nil {
		return err
	}
	return r.collectRoots()
}

// collectRoots removes shared roots that are neither this daemon's nor mounted by a
// container that still exists.
func (r *Runtime) collectRoots() error {
	inUse := map[string]bool{r.root: true}
	held, err := r.Held()
	if err != nil {
		return err
	}
	for _, id := range held {
		c, err := libcontainer.Load(r.containers, id)
		if err != nil {
			// Unreadable state: keep every root rather than guess.
			return nil
		}
		inUse[c.Config().Rootfs] = true
	}
	bases, err := filepath.Glob(filepath.Join(r.roots, "base-*"))
	if err != nil {
		return err
	}
	for _, b := range bases {
		if !inUse[b] {
			if err := os.RemoveAll(b); err != nil {
				return err
			}
		}
	}
	return nil
}

// Cgroups is where the runtime puts its sessions' cgroups.
func (r *Runtime) Cgroups() *cgroups.Sessions {
	if r.cg != nil {
		return r.cg
	}
	return cgroups.Default()
}

// Layout is where the session's parts go; Explain shows it with placeholders.
func (r *Runtime) Layout(sessionID, workdir, capsuleDir string) Layout {
	return Layout{
		SessionID:   sessionID,
		CgroupsPath: r.Cgroups().OCIPath(sessionID),
		Rootfs:      r.root,
		Workdir:     workdir,
		CapsuleDir:  capsuleDir,
		Init:        r.init,
		MergedUsr:   r.merged,
		EtcBinds:    r.etcBinds,
		MemfdSysctl: r.memfdSysctl,
	}
}

type sealedProcess struct {
	ref        containment.ProcessRef
	recordsDir string
	watch      *containment.ExitWatch
	runtime    *Runtime
	container  *lazyContainer
	// proc is set when this daemon started the container: it must reap its init.
	proc *libcontainer.Process
}

var (
	_ containment.Runtime = (*Runtime)(nil)
	_ containment.Process = (*sealedProcess)(nil)
)

// Start builds the session's root and container and returns once roost-init reports the
// program running.
func (r *Runtime) Start(ctx context.Context, spec containment.Spec) (_ containment.Process, retErr error) {
	if spec.Policy == nil {
		return nil, errors.New("sealed start without a policy")
	}
	id := spec.SessionID
	layout, err := r.sessionLayout(spec)
	if err != nil {
		return nil, err
	}
	if err := r.ownRoot(id, &layout); err != nil {
		return nil, fmt.Errorf("composing the session's root: %w", err)
	}
	defer func() {
		if retErr != nil {
			_ = r.Release(id)
		}
	}()
	ociSpec, err := r.sessionSpec(spec, layout)
	if err != nil {
		return nil, err
	}
	config, err := r.config(id, ociSpec)
	if err != nil {
		return nil, err
	}
	// roost-init is the namespace's root, an unprivileged uid on the host: it writes the
	// program's output, init.json and exit.json into the records directory, through the
	// descriptor it is handed, as that uid. No path of the session leads there.
	if err := os.Lchown(spec.RecordsDir, int(spec.IDs.First), int(spec.IDs.First)); err != nil {
		return nil, fmt.Errorf("records directory: %w", err)
	}
	io, err := containment.OpenInitIO(spec.RecordsDir)
	if err != nil {
		return nil, err
	}
	defer io.Close()

	// The spec goes into its pipe while the container starts: roost-init finds it waiting
	// rather than waiting for this process to hear the container is up. libcontainer has
	// put the init in the session's cgroup before it runs roost-init, so no gate is lost.
	handed := make(chan error, 1)
	go func() { handed <- io.HandSpec(containment.InitSpec(spec, sealedExecSpec(spec))) }()
	container, proc, err := r.run(ctx, id, config, memfdNoExec(ociSpec), io)
	if err != nil {
		return nil, err
	}
	reap := func() {
		if proc != nil {
			_, _ = proc.Wait()
		}
	}
	if err := <-handed; err != nil {
		container.signal(syscall.SIGKILL)
		reap()
		return nil, fmt.Errorf("handing the spec to roost-init: %w", err)
	}
	rep, err := io.ReadReport(ctx)
	if err != nil {
		container.signal(syscall.SIGKILL)
		reap()
		return nil, err
	}
	if rep.Error != "" || rep.Ref == nil {
		reap()
		if rep.Error == "" {
			rep.Error = "roost-init ended without starting the program"
		}
		return nil, &containment.StartError{Msg: rep.Error}
	}
	p, err := r.started(container, proc, spec.RecordsDir, rep.Ref)
	if err != nil {
		container.signal(syscall.SIGKILL)
		reap()
	}
	return p, err
}

// sessionLayout is where the session's parts are, in the shared root.
// ownRoot gives the container id a root composed for it when its layout reads host trees,
// which need mount points the shared root has not (Release removes it).
func (r *Runtime) ownRoot(id string, layout *Layout) error {
	if len(layout.HostRead) == 0 && !viewHasOpt(*layout) {
		return nil
	}
	layout.Rootfs = filepath.Join(r.roots, id)
	return composeRoot(layout.Rootfs, *layout)
}

func (r *Runtime) sessionLayout(spec containment.Spec) (Layout, error) {
	layout := r.Layout(spec.SessionID, spec.Dir, spec.CapsuleDir)
	layout.NetNS, layout.Task, layout.IDs, layout.Home = spec.NetNS, spec.Task, spec.IDs, spec.Home
	layout.Runner, layout.WasmModule, layout.HostRead = spec.Runner, spec.WasmModule, spec.Policy.Filesystem.HostRead
	layout.System = spec.System
	if spec.Shell != "" {
		var err error
		if layout.Passwd, err = r.passwdFile(spec.Shell); err != nil {
			return Layout{}, fmt.Errorf("the session's passwd: %w", err)
		}
	}
	return layout, nil
}

// passwdFile is a passwd whose users' login shell is shell, on the host, for a session's
// root to bind at PasswdPath. One file per content, made once and never changed (a running
// session has it bound) nor removed: sessions share the few shells there are.
func (r *Runtime) passwdFile(shell string) (string, error) {
	content := passwd(shell)
	sum := sha256.Sum256([]byte(content))
	dir := filepath.Join(r.roots, ".passwd")
	file := filepath.Join(dir, hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(file); err == nil {
		return file, nil
	}
	// The session's root passes through to it, as to the composed roots beside it.
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".new-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(content); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return file, os.Rename(tmp.Name(), file)
}

// sessionSpec is the session's OCI spec in layout, its workdir's subtrees checked to lie
// beneath the workdir with no symlink on the way (see PrepareWorkSources).
func (r *Runtime) sessionSpec(spec containment.Spec, layout Layout) (*specs.Spec, error) {
	ro := spec.Policy.Filesystem.ReadOnly
	if len(spec.Policy.Spawn.Allow) > 0 {
		ro = append(slices.Clone(ro), containment.ChildrenRoot)
	}
	owner, err := spec.Owner()
	if err != nil {
		return nil, err
	}
	if layout.Sources, err = containment.PrepareWorkSources(spec.Dir, spec.Policy.Filesystem.Scope, ro, owner); err != nil {
		return nil, &containment.StartError{Msg: "workdir: " + err.Error()}
	}
	return OCISpec(layout, spec.Policy)
}

// started is the session's process once roost-init has reported the program running
// (inner, in the session's pid namespace): proc is the init when this process started it.
func (r *Runtime) started(c *lazyContainer, proc *libcontainer.Process, records string, inner *containment.ProcessRef) (containment.Process, error) {
	ref, err := startedRef(c, proc != nil, inner)
	if err != nil {
		return nil, err
	}
	w, err := containment.WatchExit(ref.InitPID, ref.InitStart)
	if errors.Is(err, containment.ErrGone) {
		w, err = containment.EndedWatch(), nil
	}
	if err != nil {
		return nil, err
	}
	r.hold(c)
	return &sealedProcess{ref: ref, recordsDir: records, watch: w, runtime: r, container: c, proc: proc}, nil
}

// run creates the container and starts roost-init in it with io's descriptors: through
// roost-sealer when the runtime has one, else from this process; with memfd, once
// vm.memfd_noexec is 2 in its pid namespace. proc is the init when this process started it
// (and must reap it); nil when roost-sealer did, which reaps it itself. extra follows the
// session id in roost-init's arguments.
func (r *Runtime) run(ctx context.Context, id string, config *configs.Config, memfd bool, io *containment.InitIO, extra ...string) (_ *lazyContainer, proc *libcontainer.Process, err error) {
	// Noted before libcontainer makes it: a crash before its state is written leaves a
	// cgroup Release still finds.
	cg := r.Cgroups()
	place := cg.PlaceOf(id)
	if err := place.Check(id); err != nil {
		return nil, nil, err
	}
	if err := cg.Note(id, place); err != nil {
		return nil, nil, err
	}
	initArgs, initEnv := append([]string{initPath, containment.InitTag(id)}, extra...), []string{"PATH=" + containment.DefaultPath}
	// The container's init waits to exec roost-init until the sysctl is set: nothing of the
	// session's runs in its pid namespace before.
	helper := ""
	if memfd {
		helper = r.init
	}
	l := &lazyContainer{containers: r.containers, id: id}
	if r.sealer != nil {
		reply, err := r.sealer.Run(ctx, sealer.Request{Root: r.containers, ID: id, Config: config,
			Args: initArgs, Env: initEnv, Cwd: "/", MemfdHelper: helper}, io.ChildFiles())
		io.Started()
		if err != nil {
			return nil, nil, err
		}
		l.initPID, l.initStart = reply.PID, reply.InitStart
		if l.initStart == 0 {
			// A roost-sealer from before the field: the start time is in the state alone.
			c, err := l.get()
			if err != nil {
				return nil, nil, fmt.Errorf("the container roost-sealer started: %w", err)
			}
			st, err := c.State()
			if err != nil {
				return nil, nil, fmt.Errorf("the container roost-sealer started: %w", err)
			}
			l.initStart = st.InitProcessStartTime
		}
		return l, nil, nil
	}
	container, err := libcontainer.Create(r.containers, id, config)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the container: %w", err)
	}
	l.c = container
	proc = &libcontainer.Process{Args: initArgs, Env: initEnv, Cwd: "/", ExtraFiles: io.ChildFiles(), Init: true}
	l.initPID, err = sealer.Run(container, proc, helper)
	io.Started()
	if err != nil {
		if l.initPID != 0 {
			_, _ = proc.Wait()
		}
		return nil, nil, err
	}
	if st, err := container.State(); err == nil {
		l.initStart = st.InitProcessStartTime
	}
	return l, proc, nil
}

// sealedExecSpec is what roost-exec applies inside a sealed root before the session's
// program, and before every command roostctl exec runs there. Inside the root the program
// runs at /work, its command from the sealed view. Landlock holds the exec allowlist: the
// program, shell.allow, and their interpreters. Its refusals are recorded; a system
// program missing from the root may be one too, the root holding what the allowlist needs.
func sealedExecSpec(spec containment.Spec) roostinit.ExecSpec {
	return roostinit.ExecSpec{Argv: spec.Argv, Env: spec.Env, Dir: Work, Rlimits: spec.Rlimits,
		Landlock: sealedLandlock(spec), Report: spec.Runner != "", Refusals: &roostinit.Refusals{Absent: true}}
}

// sealedLandlock is the exec allowlist inside a sealed root. What the session can write
// (/work, /tmp, /dev/shm, its home; /dev and /run hold roost's own mounts) never becomes an
// exec rule, and is mounted noexec; with workdir_exec those trees execute whatever is in
// them, and the rest of the root still only what the allowlist names.
func sealedLandlock(spec containment.Spec) *roostinit.Landlock {
	l := &roostinit.Landlock{Exec: spec.ExecAllowlist(), ExecTrees: spec.ExecTrees, NoExec: []string{Work, "/tmp", "/dev", "/run", Home}}
	if spec.Policy.Filesystem.WorkdirExec {
		l.NoExec = []string{"/dev", "/run"}
		l.WritableExec = []string{Work, "/tmp", "/dev/shm", Home}
	}
	return l
}

// startedRef is the started session's processes on the host. An init this process started
// is its unreaped child, so its pid names it even after it ended; one roost-sealer started
// is reaped as soon as it ends, and only the start time libcontainer recorded for it tells
// it from a process that took its pid since.
func startedRef(c *lazyContainer, ours bool, inner *containment.ProcessRef) (containment.ProcessRef, error) {
	initPID := c.initPID
	if ours {
		return hostRef(initPID, inner)
	}
	want := c.initStart
	if got, err := containment.StartTime(initPID); err != nil || got != want {
		// Already ended and reaped (a quick program): exit.json tells the rest.
		return containment.ProcessRef{InitPID: initPID, InitStart: want, StartedAt: inner.StartedAt}, nil
	}
	ref, err := hostRef(initPID, inner)
	ref.InitStart = want
	return ref, err
}

// hostRef turns the pids roost-init saw in the session's pid namespace into the host's:
// roost-init is the container's init; the program is its child whose innermost pid is the
// one reported.
func hostRef(initPID int, inner *containment.ProcessRef) (containment.ProcessRef, error) {
	ref := containment.ProcessRef{InitPID: initPID, StartedAt: inner.StartedAt}
	var err error
	if ref.InitStart, err = containment.StartTime(initPID); err != nil {
		// roost-init has already ended (a quick program): it is our unreaped child, so its
		// pid cannot have been reused, and the end is in exit.json.
		return ref, nil
	}
	for _, child := range roostinit.ChildrenOf(initPID) {
		if innermostPID(child) == inner.PID {
			if start, err := containment.StartTime(child); err == nil {
				ref.PID, ref.PIDStart = child, start
			}
			// Gone between the two reads: it ended, and exit.json tells the rest.
			return ref, nil
		}
	}
	// Not among roost-init's children: the program has already ended (roost-init reaps at
	// once). PID stays 0; there is nothing left to signal, and exit.json tells the rest.
	return ref, nil
}

// innermostPID is a process's pid in its own (innermost) pid namespace.
func innermostPID(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[len(f)-1])
				return n
			}
		}
	}
	return 0
}

// Attach re-attaches to a sealed session from libcontainer's state.
func (r *Runtime) Attach(sessionID, recordsDir string, ref *containment.ProcessRef) (containment.Process, error) {
	container, err := libcontainer.Load(r.containers, sessionID)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", containment.ErrGone, err)
	}
	state, err := container.State()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", containment.ErrGone, err)
	}
	// A container a dying daemon created but never started waits for ever on its exec fifo:
	// its program never ran, and Release destroys it. But libcontainer calls a container
	// created while its fifo file exists, and a daemon that died after releasing the init
	// through the fifo, before removing the file, leaves one that runs: roost-init's
	// init.json says which.
	status, err := container.Status()
	if err != nil || status == libcontainer.Stopped {
		return nil, fmt.Errorf("%w: the container has stopped", containment.ErrGone)
	}
	if status == libcontainer.Created && !released(recordsDir, state.InitProcessPid) {
		return nil, fmt.Errorf("%w: the container was never started", containment.ErrGone)
	}
	if ref == nil {
		inner, err := awaitInner(recordsDir, state.InitProcessPid, state.InitProcessStartTime)
		if err != nil {
			return nil, err
		}
		found, err := hostRef(state.InitProcessPid, inner)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", containment.ErrGone, err)
		}
		// libcontainer recorded the init's start time when it started it: the one to trust.
		found.InitStart = state.InitProcessStartTime
		ref = &found
	}
	w, err := containment.WatchExit(ref.InitPID, ref.InitStart)
	if err != nil {
		return nil, err
	}
	l := &lazyContainer{containers: r.containers, id: sessionID, initPID: state.InitProcessPid, initStart: state.InitProcessStartTime, c: container}
	r.hold(l)
	return &sealedProcess{ref: *ref, recordsDir: recordsDir, watch: w, runtime: r, container: l}, nil
}

// released says whether a container's init has gone past its exec fifo: it has become
// roost-init (whose name the kernel keeps, cut to 15 bytes), or has even written init.json.
func released(recordsDir string, initPID int) bool {
	if _, err := containment.ReadInit(recordsDir); err == nil {
		return true
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", initPID))
	name := containment.InitName[:min(len(containment.InitName), 15)]
	return err == nil && strings.TrimSpace(string(comm)) == name
}

// awaitInner reads the init.json roost-init writes inside the session (its pids are the
// session's own), giving it a moment while the container's init is still starting.
func awaitInner(recordsDir string, initPID int, initStart uint64) (*containment.ProcessRef, error) {
	for deadline := time.Now().Add(containment.InitWait); ; time.Sleep(20 * time.Millisecond) {
		if ref, err := containment.ReadInit(recordsDir); err == nil {
			return &ref, nil
		}
		if st, err := containment.StartTime(initPID); err != nil || st != initStart || time.Now().After(deadline) {
			return nil, containment.ErrGone
		}
	}
}

// Release removes what the runtime holds for an ended session: the container (its cgroup,
// its libcontainer state) and the composed root. It handles a container whose creation a
// crash cut short (state without state.json, cgroups libcontainer cannot load), and finds
// the cgroup wherever it is: where libcontainer's state says, where it was noted, under
// the parent, under /roost.
func (r *Runtime) Release(sessionID string) error {
	if err := cgroups.CheckSessionID(sessionID); err != nil {
		return err
	}
	var errs []error
	held := r.unhold(sessionID)
	if held != nil && held.loaded() == nil && held.ended() {
		// Never read, and its init is gone: all Destroy would do to a container of its own
		// pid namespace and no hooks is remove its cgroup (below) and its state.
		if err := os.RemoveAll(filepath.Join(r.containers, sessionID)); err != nil {
			errs = append(errs, err)
		}
	} else if c, err := held.orLoad(r.containers, sessionID); err == nil {
		if err := c.Destroy(); err != nil {
			// Still running, or paused: what is released has ended, or ends now.
			err = destroyLive(c)
			if err != nil {
				errs = append(errs, fmt.Errorf("destroying the container: %w", err))
			}
		}
	} else if err := os.RemoveAll(filepath.Join(r.containers, sessionID)); err != nil {
		errs = append(errs, err)
	}
	if err := r.Cgroups().Remove(sessionID); err != nil {
		errs = append(errs, err)
	}
	// A root Bundle composed for the session (the shared root stays).
	if err := os.RemoveAll(filepath.Join(r.roots, sessionID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("removing the composed root: %w", err))
	}
	return errors.Join(errs...)
}

// destroyLive kills a container libcontainer will not destroy while its init lives (paused
// too), waits for the init to go, and destroys it.
func destroyLive(c *libcontainer.Container) error {
	_ = c.Resume()
	_ = c.Signal(syscall.SIGKILL)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, err := c.Status(); err != nil || st == libcontainer.Stopped {
			break
		}
	}
	return c.Destroy()
}

// Held lists the sessions (and sandboxes) this runtime holds a container or a composed
// root for: what Release frees.
func (r *Runtime) Held() ([]string, error) {
	held, err := containment.DirNames(r.containers)
	if err != nil {
		return nil, err
	}
	// A root composed for a session or sandbox (host_read) whose container was never
	// made, the daemon killed in between.
	roots, err := containment.DirNames(r.roots)
	if err != nil {
		return nil, err
	}
	for _, name := range roots {
		if !strings.HasPrefix(name, "base-") && !strings.HasPrefix(name, ".") && !slices.Contains(held, name) {
			held = append(held, name)
		}
	}
	return held, nil
}

func (p *sealedProcess) Ref() containment.ProcessRef { return p.ref }
func (p *sealedProcess) Done() <-chan struct{}       { return p.watch.Done() }

func (p *sealedProcess) Signal(sig syscall.Signal) error {
	select {
	case <-p.watch.Done():
		return containment.ErrGone
	default:
	}
	if p.ref.PID == 0 {
		return containment.ErrGone
	}
	return roostinit.SignalGroup(p.ref.PID, sig)
}

func (p *sealedProcess) Exit() (containment.ExitInfo, error) {
	<-p.watch.Done()
	if p.proc != nil {
		_, _ = p.proc.Wait()
	}
	info, err := containment.ReadExit(p.recordsDir)
	// The OOM killer may have taken the program or one of its children (the program then
	// ends on its own, often 137): either way the session died of memory.
	if err == nil && info.StartError == "" && (info.Code != 0 || info.Signal != 0) && p.oomKilled() {
		info.OOMKilled = true
	}
	return info, err
}

// oomKilled says whether the kernel's OOM killer acted in the session's cgroup.
func (p *sealedProcess) oomKilled() bool {
	c, err := p.container.get()
	if err != nil {
		return false
	}
	stats, err := c.Stats()
	if err != nil || stats.CgroupStats == nil {
		return false
	}
	return stats.CgroupStats.MemoryStats.Stats["oom_kill"] > 0 || oomKillsV1(c) > 0
}

// oomKillsV1 reads memory.oom_control's oom_kill counter on a cgroup v1 host.
func oomKillsV1(c *libcontainer.Container) uint64 {
	state, err := c.State()
	if err != nil {
		return 0
	}
	dir, ok := state.CgroupPaths["memory"]
	if !ok {
		return 0
	}
	data, err := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(rest), 10, 64)
			return n
		}
	}
	return 0
}

// Rehearse runs /usr/bin/true as a throwaway sealed session: namespaces, cgroup, seccomp,
// composed root and roost-init, exactly as a session gets them. What fails here would fail
// a session, so the answer is the host's real ability, not a guess from versions.
func (r *Runtime) Rehearse(ctx context.Context) error {
	if r == nil {
		return containment.ErrNoRuntime
	}
	return containment.Rehearse(ctx, r, manifest.Sealed, r.roots, r.rehearsal)
}

// Describe returns the OCI runtime spec a sealed session with this policy would run under,
// for a session id, workdir and capsule directory given (the mounts of workdir subtrees
// name their paths, where a session mounts descriptors resolved beneath the workdir).
func (r *Runtime) Describe(sessionID, workdir, capsuleDir string, ids containment.IDs, p *manifest.Policy) (*specs.Spec, error) {
	layout := r.Layout(sessionID, workdir, capsuleDir)
	layout.IDs = ids
	return OCISpec(layout, p)
}

// Bundle composes a root for sessionID exactly as Start would and returns the OCI spec
// that runs in it: an OCI bundle another runtime can run, for comparing runtimes on the same
// root (bench/). Release(sessionID) removes it.
func (r *Runtime) Bundle(sessionID, workdir, capsuleDir string, ids containment.IDs, p *manifest.Policy) (*specs.Spec, error) {
	layout := r.Layout(sessionID, workdir, capsuleDir)
	layout.Rootfs = filepath.Join(r.roots, sessionID)
	layout.IDs = ids
	if err := composeRoot(layout.Rootfs, layout); err != nil {
		return nil, err
	}
	return OCISpec(layout, p)
}

var (
	_ containment.Freezer = (*sealedProcess)(nil)
	_ containment.Meter   = (*sealedProcess)(nil)
)

// Pause freezes the session's cgroup.
func (p *sealedProcess) Pause() error {
	c, err := p.container.get()
	if err != nil {
		return err
	}
	return c.Pause()
}

// Resume thaws the session's cgroup.
func (p *sealedProcess) Resume() error {
	c, err := p.container.get()
	if err != nil {
		return err
	}
	return c.Resume()
}

// Usage reads the session's cgroup.
func (p *sealedProcess) Usage() (containment.Usage, error) {
	container, err := p.container.get()
	if err != nil {
		return containment.Usage{}, err
	}
	stats, err := container.Stats()
	if err != nil {
		return containment.Usage{}, err
	}
	if stats.CgroupStats == nil {
		return containment.Usage{}, errors.New("no cgroup statistics")
	}
	c := stats.CgroupStats
	u := containment.Usage{
		MemoryBytes:     int64(c.MemoryStats.Usage.Usage),
		MemoryPeakBytes: int64(c.MemoryStats.Usage.MaxUsage),
		CPUSeconds:      float64(c.CpuStats.CpuUsage.TotalUsage) / 1e9,
		Pids:            int64(c.PidsStats.Current),
	}
	// The same read carried the ceilings: no second pass over the cgroup's files.
	u.MemoryLimitBytes, u.PidsLimit = cgroups.StatsLimits(c)
	return u, nil
}
