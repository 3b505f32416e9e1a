package containment

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	ocgroups "github.com/opencontainers/cgroups"

	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/manifest"
)

// Process is a session's running program as the daemon sees it.
type Process interface {
	// Ref identifies the processes, for the registry and for re-attaching after a restart.
	Ref() ProcessRef
	// Done is closed once the session's supervisor has ended, its exit recorded.
	Done() <-chan struct{}
	// Signal sends sig to the program's whole process group.
	Signal(sig syscall.Signal) error
	// Exit reads how the program ended; call it after Done is closed.
	Exit() (ExitInfo, error)
}

// StartError is a program that could not be started: the session ends start_failed.
type StartError struct{ Msg string }

func (e *StartError) Error() string { return e.Msg }

// reportTimeout bounds how long Start waits for roost-init to say the program runs.
const reportTimeout = 30 * time.Second

// ProcessRuntime runs sessions of the classes that need no kernel sandbox (unconfined,
// advisory) as a plain process tree under roost-init, in a cgroup of the session's own
// without limits (<parent>/<session>; see package cgroups), which roost-init is started into
// before the program exists: a session's processes never share roostd's cgroup.
type ProcessRuntime struct {
	// Init is the binary that plays roost-init and roost-exec.
	Init string
	// cg says where sessions' cgroups go; nil is the default configuration.
	cg *cgroups.Sessions
}

// NewProcessRuntime returns a runtime that starts sessions under the roost-init binary at
// init; "/proc/self/exe" when the running binary plays roost-init itself (see RunHelper).
// WithCgroups says where their cgroups go.
func NewProcessRuntime(init string, opts ...Option) *ProcessRuntime {
	return &ProcessRuntime{Init: init, cg: ApplyOptions(opts).Cgroups}
}

// Cgroups is where the runtime puts its sessions' cgroups.
func (r *ProcessRuntime) Cgroups() *cgroups.Sessions {
	if r.cg != nil {
		return r.cg
	}
	return cgroups.Default()
}

// SelfInit is the init path of a binary that calls RunHelper first thing in main.
const SelfInit = "/proc/self/exe"

// PlainProcess is a session's process tree under roost-init, as ProcessRuntime starts
// it: a scoped session's is one too.
type PlainProcess struct {
	ref        ProcessRef
	recordsDir string
	watch      *ExitWatch
	// cmd is set when this daemon started roost-init: it must reap it.
	cmd *exec.Cmd
	// Cgroup is the session's cgroup; nil when it has none (a session started before
	// plain sessions had one, or on a host that lets roostd make none). A runtime built on
	// this one may give a re-attached session a manager of where it would be.
	Cgroup ocgroups.Manager
}

var (
	_ Process = (*PlainProcess)(nil)
	_ Meter   = (*PlainProcess)(nil)
)

// Start starts spec's program under a new roost-init and returns once it runs. Output goes
// to files in the records directory, through pipes roost-init drains, never through one
// the daemon holds.
func (r *ProcessRuntime) Start(ctx context.Context, spec Spec) (_ Process, retErr error) {
	user, err := spec.User()
	if err != nil {
		return nil, err
	}
	cg, err := r.Cgroups().Create(spec.SessionID, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil && cg != nil {
			_ = r.Cgroups().Remove(spec.SessionID)
		}
	}()
	p, err := r.StartExec(ctx, spec, plainExecSpec(spec, user), cg, 0)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// plainExecSpec is what roost-exec applies before an unconfined or advisory session's
// program, and before every command roostctl exec runs in one.
func plainExecSpec(spec Spec, user *roostinit.User) roostinit.ExecSpec {
	return roostinit.ExecSpec{Argv: spec.Argv, Env: spec.Env, Dir: spec.Dir, Rlimits: spec.Rlimits, User: user, Report: spec.Runner != ""}
}

// StartExec starts roost-init in the session's cgroup cg (nil: none), with execSpec as
// what roost-exec applies before the program: the plain runtime's, or another's built on it.
// namespaces are the CLONE_NEW* flags of the namespaces roost-init is born in, the session's
// own (0: the host's); with CLONE_NEWPID roost-init is their pid 1, and still reports and
// records the host's pids.
func (r *ProcessRuntime) StartExec(ctx context.Context, spec Spec, execSpec roostinit.ExecSpec, cg *cgroups.Session, namespaces uintptr) (*PlainProcess, error) {
	io, err := OpenInitIO(spec.RecordsDir)
	if err != nil {
		return nil, err
	}
	defer io.Close()
	// roost-init's descriptors, in its order: stdin, stdout and stderr are /dev/null (it
	// writes the program's output into the records directory itself), then spec (3),
	// report (4) and the records directory (5).
	command := func(into *os.File) *exec.Cmd {
		cmd := &exec.Cmd{
			Path:       r.Init,
			Args:       []string{InitName, InitTag(spec.SessionID)},
			Dir:        "/",
			Env:        []string{},
			ExtraFiles: io.ChildFiles(),
			// Its own session: a signal or hangup aimed at roostd's group never reaches it,
			// and no parent-death signal is set, so it outlives the daemon.
			SysProcAttr: &syscall.SysProcAttr{Setsid: true, Cloneflags: namespaces},
		}
		if into != nil {
			// Born in the session's cgroup (CLONE_INTO_CGROUP): not for an instant in roostd's.
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(into.Fd())
		}
		return cmd
	}
	into := cg.IntoFD()
	if into != nil {
		defer into.Close()
	}
	cmd := command(into)
	err = cmd.Start()
	if err != nil && into != nil {
		// A kernel without clone3's CLONE_INTO_CGROUP (before 5.7): start it, then move it.
		into = nil
		cmd = command(nil)
		err = cmd.Start()
	}
	io.Started()
	if err != nil {
		return nil, fmt.Errorf("starting roost-init: %w", err)
	}
	// roost-init waits for its spec before it does anything: it, and so everything it starts,
	// is in the session's cgroup in every hierarchy before the program exists.
	if cg != nil {
		if err := cg.Join(cmd.Process.Pid, into != nil); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, err
		}
	}
	if err := io.HandSpec(InitSpec(spec, execSpec)); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("handing the spec to roost-init: %w", err)
	}

	rep, err := io.ReadReport(ctx)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	if rep.Error != "" || rep.Ref == nil {
		_ = cmd.Wait()
		if rep.Error == "" {
			rep.Error = "roost-init ended without starting the program"
		}
		return nil, &StartError{Msg: rep.Error}
	}
	w, err := WatchExit(rep.Ref.InitPID, rep.Ref.InitStart)
	if err != nil && !errors.Is(err, ErrGone) {
		return nil, err
	}
	p := &PlainProcess{ref: *rep.Ref, recordsDir: spec.RecordsDir, cmd: cmd, watch: w}
	if cg != nil {
		p.Cgroup = cg.Manager()
	}
	if w == nil {
		// roost-init already ended: the program was quicker than us.
		p.watch = EndedWatch()
	}
	return p, nil
}

// InitSpec is roost-init's spec: the program's start, and what it keeps of its output.
func InitSpec(spec Spec, exec roostinit.ExecSpec) roostinit.InitSpec {
	return roostinit.InitSpec{Exec: exec, LogMaxBytes: spec.logMaxBytes()}
}

// logMaxBytes is resources.log_max_bytes: the Spec's own, else its policy's, else the
// default.
func (s Spec) logMaxBytes() int64 {
	switch {
	case s.LogMaxBytes > 0:
		return s.LogMaxBytes
	case s.Policy != nil && s.Policy.Resources.LogMaxBytes.Value > 0:
		return s.Policy.Resources.LogMaxBytes.Value
	}
	return manifest.DefaultLogMaxBytes
}

// InitIO is what roost-init is started with: the spec pipe, the report pipe and the
// records directory it gets as descriptors 3, 4 and 5.
type InitIO struct {
	records          *os.File
	specR, specW     *os.File
	reportR, reportW *os.File
}

// OpenInitIO opens the records directory and makes the pipes, for a roost-init to start.
func OpenInitIO(recordsDir string) (_ *InitIO, err error) {
	io := &InitIO{}
	defer func() {
		if err != nil {
			io.Close()
		}
	}()
	if io.records, err = os.OpenFile(recordsDir, os.O_RDONLY|syscall.O_DIRECTORY|noFollow|syscall.O_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("records directory: %w", err)
	}
	if io.specR, io.specW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if io.reportR, io.reportW, err = os.Pipe(); err != nil {
		return nil, err
	}
	return io, nil
}

// ChildFiles are roost-init's descriptors 3, 4 and 5, in order.
func (io *InitIO) ChildFiles() []*os.File { return []*os.File{io.specR, io.reportW, io.records} }

// Started drops the daemon's copies of roost-init's ends, so roost-init's death reads as EOF.
func (io *InitIO) Started() {
	io.specR.Close()
	io.reportW.Close()
}

// HandSpec writes roost-init's spec and closes the pipe.
func (io *InitIO) HandSpec(spec roostinit.InitSpec) error {
	data, err := json.Marshal(spec)
	if err == nil {
		_, err = io.specW.Write(data)
	}
	if cerr := io.specW.Close(); err == nil {
		err = cerr
	}
	return err
}

// Close closes everything still open; closing twice is harmless.
func (io *InitIO) Close() {
	for _, f := range []*os.File{io.records, io.specR, io.specW, io.reportR, io.reportW} {
		if f != nil {
			f.Close()
		}
	}
}

// DirNames lists the names of the directories in dir: the sessions a runtime holds.
func DirNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// ReadReport waits for roost-init to say the program runs, or why it does not.
func (io *InitIO) ReadReport(ctx context.Context) (roostinit.Report, error) {
	return readReport(ctx, io.reportR)
}

func readReport(ctx context.Context, r *os.File) (roostinit.Report, error) {
	type result struct {
		rep roostinit.Report
		err error
	}
	ch := make(chan result, 1)
	go func() {
		line, err := bufio.NewReader(r).ReadBytes('\n')
		if len(line) == 0 && err != nil {
			ch <- result{err: errors.New("roost-init ended before reporting")}
			return
		}
		var rep roostinit.Report
		if err := json.Unmarshal(line, &rep); err != nil {
			ch <- result{err: fmt.Errorf("roost-init report: %w", err)}
			return
		}
		ch <- result{rep: rep}
	}()
	timer := time.NewTimer(reportTimeout)
	defer timer.Stop()
	select {
	case res := <-ch:
		return res.rep, res.err
	case <-timer.C:
		return roostinit.Report{}, fmt.Errorf("roost-init did not report within %s", reportTimeout)
	case <-ctx.Done():
		return roostinit.Report{}, ctx.Err()
	}
}

// InitWait bounds how long Attach waits for a roost-init caught mid-start to write
// init.json.
const InitWait = 10 * time.Second

// Attach re-attaches to a session a previous daemon started. ref is what the registry
// recorded; nil when the daemon died before recording it, and then init.json, written by
// roost-init before it reports, names the processes. ErrGone when the supervisor is no
// longer running.
func (r *ProcessRuntime) Attach(sessionID, recordsDir string, ref *ProcessRef) (Process, error) {
	if ref == nil {
		found, err := awaitInit(sessionID, recordsDir)
		if err != nil {
			return nil, err
		}
		ref = found
	}
	w, err := WatchExit(ref.InitPID, ref.InitStart)
	if err != nil {
		return nil, err
	}
	// Its cgroup wherever it is: where it was noted, the parent now, or /roost.
	return &PlainProcess{ref: *ref, recordsDir: recordsDir, watch: w, Cgroup: r.Cgroups().Manager(sessionID, nil)}, nil
}

// awaitInit reads init.json, giving a roost-init of the session that is still starting the
// time to write it.
func awaitInit(sessionID, recordsDir string) (*ProcessRef, error) {
	for deadline := time.Now().Add(InitWait); ; time.Sleep(20 * time.Millisecond) {
		if ref, err := ReadInit(recordsDir); err == nil {
			return &ref, nil
		}
		pid, running := FindInit(sessionID)
		if !running {
			return nil, ErrGone
		}
		if time.Now().After(deadline) {
			// A supervisor that cannot say what it runs is not one anybody can supervise.
			_ = syscall.Kill(pid, syscall.SIGKILL)
			return nil, fmt.Errorf("roost-init (pid %d) wrote no init.json within %s; killed it", pid, InitWait)
		}
	}
}

// Release removes the session's cgroup wherever it is (where it was noted, under the
// parent, or under /roost), ending anything still in it.
func (r *ProcessRuntime) Release(sessionID string) error { return r.Cgroups().Remove(sessionID) }

// Held lists the sessions whose cgroups are noted (cgroups.Config.StateDir) and not yet
// removed: whatever their class, Release removes them.
func (r *ProcessRuntime) Held() ([]string, error) { return r.Cgroups().Held() }

func (p *PlainProcess) Ref() ProcessRef       { return p.ref }
func (p *PlainProcess) Done() <-chan struct{} { return p.watch.Done() }

func (p *PlainProcess) Signal(sig syscall.Signal) error {
	select {
	case <-p.watch.Done():
		return ErrGone
	default:
	}
	return roostinit.SignalGroup(p.ref.PID, sig)
}

// Usage reads the session's cgroup, its ceilings too.
func (p *PlainProcess) Usage() (Usage, error) {
	u, err := cgroups.ReadUsage(p.Cgroup)
	if err != nil {
		return u, err
	}
	u.MemoryLimitBytes, u.PidsLimit = cgroups.Limits(p.Cgroup)
	return u, nil
}

func (p *PlainProcess) Exit() (ExitInfo, error) {
	<-p.watch.Done()
	if p.cmd != nil {
		_ = p.cmd.Wait()
	}
	return ReadExit(p.recordsDir)
}

// Freezer is a Process whose processes freeze and thaw as one (its cgroup's freezer).
type Freezer interface {
	Pause() error
	Resume() error
}

// Meter is a Process whose consumption can be read (from its cgroup).
type Meter interface {
	Usage() (Usage, error)
}

// Usage is what a session's processes use now, as their cgroup counts it.
type Usage = cgroups.Usage
