package containment

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment/roostinit"
)

// ExecOptions is one more command to run in a running session (roostctl exec).
type ExecOptions struct {
	// Argv is the command; Argv[0] is looked up on the session's PATH, in its view.
	Argv []string
	// Env is NAME=VALUE set over the session's own environment.
	Env []string
	// Dir is the working directory in the session's view: its workdir when empty, a
	// relative one beneath it.
	Dir string
	// Stdin keeps the command's stdin open for Execution.Stdin; without it stdin is empty.
	Stdin bool
	// TTY runs the command on a new terminal of its own, its controlling terminal, of
	// Rows x Cols when both are set.
	TTY        bool
	Rows, Cols uint16
}

// Execution is a command roostctl exec started in a session.
type Execution struct {
	// Pid is the command's process id on the host.
	Pid int
	// Stdin is the command's stdin with ExecOptions.Stdin and no terminal, else nil.
	Stdin io.WriteCloser
	// Stdout and Stderr are its output without a terminal.
	Stdout, Stderr io.ReadCloser
	// Terminal is the terminal's master end with ExecOptions.TTY: input and output both.
	Terminal *os.File

	wait   func() (*os.ProcessState, error)
	signal func(syscall.Signal) error
	once   sync.Once
	info   ExitInfo
	err    error
}

// Wait waits for the command to end and says how it did. It may be called more than once.
func (e *Execution) Wait() (ExitInfo, error) {
	e.once.Do(func() {
		st, err := e.wait()
		e.info.EndedAt = time.Now().UTC()
		if st == nil {
			e.err = err
			return
		}
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.info.Signal = int(ws.Signal())
			e.info.Code = 128 + e.info.Signal
		} else {
			e.info.Code = st.ExitCode()
		}
	})
	return e.info, e.err
}

// Started makes e the command started as pid, which wait reaps and signal signals: a runtime
// that starts it by other means than ProcessRuntime's (libcontainer) calls it.
func (e *Execution) Started(pid int, wait func() (*os.ProcessState, error), signal func(syscall.Signal) error) {
	e.Pid, e.wait, e.signal = pid, wait, signal
}

// Kill ends the command (SIGKILL): its client has gone, or its session has ended.
func (e *Execution) Kill() error { return e.signal(syscall.SIGKILL) }

// Signal sends sig to the command (roostctl exec kill).
func (e *Execution) Signal(sig syscall.Signal) error { return e.signal(sig) }

// Resize sets the terminal's size; without a terminal it does nothing.
func (e *Execution) Resize(rows, cols uint16) error {
	if e.Terminal == nil || rows == 0 || cols == 0 {
		return nil
	}
	return unix.IoctlSetWinsize(int(e.Terminal.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}

// Close lets go of roostd's ends of the command's input and output.
func (e *Execution) Close() {
	for _, c := range []io.Closer{e.Stdin, e.Stdout, e.Stderr} {
		if c != nil {
			c.Close()
		}
	}
	if e.Terminal != nil {
		e.Terminal.Close()
	}
}

// execTimeout bounds how long roost-exec may take to start the command.
const execTimeout = 30 * time.Second

// Exec runs one more command in the unconfined or advisory session proc runs, spec being
// the session's own start: as its uid, in its cgroup, with its rlimits and no_new_privs.
func (r *ProcessRuntime) Exec(ctx context.Context, spec Spec, proc Process, opts ExecOptions) (*Execution, error) {
	user, err := spec.User()
	if err != nil {
		return nil, err
	}
	p, ok := proc.(*PlainProcess)
	if !ok {
		return nil, fmt.Errorf("session %s: not a process of this runtime", spec.SessionID)
	}
	return r.ExecJoined(ctx, spec, p, plainExecSpec(spec, user), opts, false)
}

// ExecJoined starts roost-exec as roostd's child with es, the session's program's own
// ExecSpec, made the command's; with namespaces, in the mount, network, IPC and pid
// namespaces of the session's program (its /proc among its mounts).
func (r *ProcessRuntime) ExecJoined(ctx context.Context, spec Spec, p *PlainProcess, es roostinit.ExecSpec, opts ExecOptions, namespaces bool) (_ *Execution, retErr error) {
	es, join, err := Joined(spec, es, opts, spec.Dir)
	if err != nil {
		return nil, err
	}
	hs, err := NewHandshake()
	if err != nil {
		return nil, err
	}
	defer hs.Close()
	extra := hs.ChildFiles()
	var pidNS *os.File
	if namespaces {
		ns, err := programNamespaces(p.ref, "mnt", "net", "ipc", "pid")
		if err != nil {
			return nil, fmt.Errorf("session %s: %w", spec.SessionID, err)
		}
		defer func() {
			for _, f := range ns {
				f.Close()
			}
		}()
		// Descriptors 5, 6 and 7: the program's own namespaces, not whatever a path names
		// by the time roost-exec opens it. The pid namespace is roost-exec's from birth.
		join.MountNS = fmt.Sprintf("/proc/self/fd/%d", 3+len(extra))
		es.NetNS = fmt.Sprintf("/proc/self/fd/%d", 4+len(extra))
		join.IPCNS = fmt.Sprintf("/proc/self/fd/%d", 5+len(extra))
		es.NewNetNS = false
		extra = append(extra, ns[:3]...)
		pidNS = ns[3]
	}
	// The program's cgroup, in every hierarchy, before the command exists.
	var into *os.File
	if p.Cgroup != nil {
		for name, dir := range p.Cgroup.GetPaths() {
			if _, err := os.Stat(dir); err != nil {
				continue
			}
			es.Cgroups = append(es.Cgroups, filepath.Join(dir, "cgroup.procs"))
			if name == "" && into == nil {
				into, _ = os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
			}
		}
	}
	if into != nil {
		defer into.Close()
	}

	var e Execution
	var child []*os.File
	defer func() {
		for _, f := range child {
			f.Close()
		}
		if retErr != nil {
			e.Close()
		}
	}()
	var stdin, stdout, stderr *os.File
	if opts.TTY {
		stdin, stdout, stderr, err = e.terminal(opts)
		child = append(child, stdin)
	} else {
		stdin, stdout, stderr, err = e.Pipes(opts.Stdin)
		child = append(child, stdin, stdout, stderr)
	}
	if err != nil {
		return nil, err
	}
	command := func(into *os.File) *exec.Cmd {
		cmd := &exec.Cmd{
			Path:       r.Init,
			Args:       []string{ExecName},
			Dir:        "/",
			Env:        []string{},
			Stdin:      stdin,
			Stdout:     stdout,
			Stderr:     stderr,
			ExtraFiles: extra,
			// A session of its own: nothing aimed at roostd's group reaches it, and with a
			// terminal, that terminal is its controlling one.
			SysProcAttr: &syscall.SysProcAttr{Setsid: true, Setctty: opts.TTY, Ctty: 0},
		}
		if into != nil {
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(into.Fd())
		}
		return cmd
	}
	cmd, err := startIn(pidNS, func() (*exec.Cmd, error) {
		cmd := command(into)
		err := cmd.Start()
		if err != nil && into != nil {
			// No CLONE_INTO_CGROUP (before 5.7): roost-exec joins through cgroup.procs first
			// thing.
			cmd = command(nil)
			err = cmd.Start()
		}
		return cmd, err
	})
	if err != nil {
		return nil, fmt.Errorf("starting roost-exec: %w", err)
	}
	hs.Started()
	e.Pid = cmd.Process.Pid
	e.wait = func() (*os.ProcessState, error) {
		err := cmd.Wait()
		return cmd.ProcessState, err
	}
	// Its own process group: whatever the command starts ends with it.
	e.signal = func(sig syscall.Signal) error { return syscall.Kill(-cmd.Process.Pid, sig) }
	if err := hs.Hand(ctx, roostinit.JoinSpec(es, join)); err != nil {
		_ = e.signal(syscall.SIGKILL)
		_, _ = e.Wait()
		return nil, err
	}
	return &e, nil
}

// startIn runs start, which starts a process, on an OS thread of its own that has joined the
// pid namespace pidns first (nil: here, in roostd's): setns(CLONE_NEWPID) leaves its caller
// where it is and places only the children it forks afterwards, so the process is born in
// the namespace as the session's own processes are, with a pid and a /proc entry in the
// session's view. The thread is never unlocked: back in the Go runtime's hands it would fork
// other goroutines' children into the session. It ends with its goroutine.
func startIn(pidns *os.File, start func() (*exec.Cmd, error)) (*exec.Cmd, error) {
	if pidns == nil {
		return start()
	}
	type started struct {
		cmd *exec.Cmd
		err error
	}
	ch := make(chan started, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(pidns.Fd()), unix.CLONE_NEWPID); err != nil {
			ch <- started{err: fmt.Errorf("joining the session's pid namespace: %w", err)}
			return
		}
		cmd, err := start()
		ch <- started{cmd, err}
	}()
	s := <-ch
	return s.cmd, s.err
}

// Joined makes es, the session program's ExecSpec, the command's: its argv, the
// session's environment with the extra variables over it, no report pipe and no mounts of
// its own (it joins the program's). work is the session's workdir in its view.
func Joined(spec Spec, es roostinit.ExecSpec, opts ExecOptions, work string) (roostinit.ExecSpec, roostinit.Join, error) {
	if len(opts.Argv) == 0 || opts.Argv[0] == "" {
		return es, roostinit.Join{}, errors.New("no command to run")
	}
	if len(spec.Argv) == 0 {
		return es, roostinit.Join{}, fmt.Errorf("session %s has no program", spec.SessionID)
	}
	env, err := overEnv(es.Env, opts.Env)
	if err != nil {
		return es, roostinit.Join{}, err
	}
	dir := opts.Dir
	switch {
	case dir == "":
		dir = work
	case !path.IsAbs(dir):
		dir = path.Join(work, dir)
	}
	es.Argv, es.Env, es.Dir = opts.Argv, env, path.Clean(dir)
	es.Report, es.Mounts = false, nil
	return es, roostinit.Join{Program: spec.Argv[0], Dir: es.Dir}, nil
}

// overEnv is env with each NAME=VALUE of extra replacing NAME's value, or added.
func overEnv(env, extra []string) ([]string, error) {
	out := append([]string(nil), env...)
	for _, kv := range extra {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" || strings.ContainsRune(kv, 0) {
			return nil, fmt.Errorf("environment %q: want NAME=VALUE", kv)
		}
		replaced := false
		for i, old := range out {
			if strings.HasPrefix(old, name+"=") {
				out[i], replaced = kv, true
			}
		}
		if !replaced {
			out = append(out, kv)
		}
	}
	return out, nil
}

// programNamespaces opens the namespaces of the session's program, and checks they are its:
// its pid still names the process the registry recorded.
func programNamespaces(ref ProcessRef, kinds ...string) ([]*os.File, error) {
	if ref.PID == 0 {
		return nil, fmt.Errorf("its program has ended: %w", ErrGone)
	}
	var out []*os.File
	for _, kind := range kinds {
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", ref.PID, kind))
		if err != nil {
			for _, f := range out {
				f.Close()
			}
			return nil, fmt.Errorf("its program's %s namespace: %w", kind, err)
		}
		out = append(out, f)
	}
	if st, err := StartTime(ref.PID); err != nil || (ref.PIDStart != 0 && st != ref.PIDStart) {
		for _, f := range out {
			f.Close()
		}
		return nil, fmt.Errorf("its program has ended: %w", ErrGone)
	}
	return out, nil
}

// Pipes makes the command's stdin (nil: empty, /dev/null), stdout and stderr, keeping
// roostd's ends in e and returning the command's.
func (e *Execution) Pipes(stdin bool) (in, out, errOut *os.File, err error) {
	if stdin {
		if in, e.Stdin, err = os.Pipe(); err != nil {
			return nil, nil, nil, err
		}
	} else if in, err = os.Open(os.DevNull); err != nil {
		return nil, nil, nil, err
	}
	if e.Stdout, out, err = os.Pipe(); err != nil {
		in.Close()
		return nil, nil, nil, err
	}
	if e.Stderr, errOut, err = os.Pipe(); err != nil {
		in.Close()
		out.Close()
		return nil, nil, nil, err
	}
	return in, out, errOut, nil
}

// terminal opens a new pseudo-terminal on the host for a command that runs in the host's
// devpts (a session without a root of its own), keeping its master end in e.
func (e *Execution) terminal(opts ExecOptions) (in, out, errOut *os.File, err error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("a terminal: %w", err)
	}
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, nil, nil, fmt.Errorf("unlocking the terminal: %w", err)
	}
	// The peer through the master itself, not by a path in /dev/pts anyone could swap.
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, master.Fd(), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		master.Close()
		return nil, nil, nil, fmt.Errorf("the terminal's peer: %w", errno)
	}
	slave := os.NewFile(fd, "pty")
	e.Terminal = master
	if err := e.Resize(opts.Rows, opts.Cols); err != nil {
		slave.Close()
		return nil, nil, nil, err
	}
	return slave, slave, slave, nil
}

// Handshake is roost-exec's spec pipe (its descriptor 3) and error pipe (4): it reads the
// spec, and says on the error pipe why it could not start the command; a successful exec
// closes the error pipe.
type Handshake struct {
	specR, specW *os.File
	errR, errW   *os.File
}

// NewHandshake makes the pipes.
func NewHandshake() (*Handshake, error) {
	h := &Handshake{}
	var err error
	if h.specR, h.specW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if h.errR, h.errW, err = os.Pipe(); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// ChildFiles are roost-exec's descriptors 3 and 4.
func (h *Handshake) ChildFiles() []*os.File { return []*os.File{h.specR, h.errW} }

// Started drops roostd's copies of roost-exec's ends.
func (h *Handshake) Started() {
	h.specR.Close()
	h.errW.Close()
}

// Hand writes the spec and waits for roost-exec to exec the command or say why it could
// not: a *StartError then.
func (h *Handshake) Hand(ctx context.Context, spec any) error {
	data, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	_, werr := h.specW.Write(data)
	h.specW.Close()
	type result struct {
		msg []byte
		err error
	}
	ch := make(chan result, 1)
	go func() {
		msg, err := io.ReadAll(io.LimitReader(h.errR, 64<<10))
		ch <- result{msg, err}
	}()
	timer := time.NewTimer(execTimeout)
	defer timer.Stop()
	var res result
	select {
	case res = <-ch:
	case <-timer.C:
		return fmt.Errorf("roost-exec did not start the command within %s", execTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	if msg := strings.TrimSpace(string(res.msg)); msg != "" {
		return &StartError{Msg: msg}
	}
	if werr != nil {
		return fmt.Errorf("handing the spec to roost-exec: %w", werr)
	}
	return res.err
}

// Close closes everything still open; closing twice is harmless.
func (h *Handshake) Close() {
	for _, f := range []*os.File{h.specR, h.specW, h.errR, h.errW} {
		f.Close()
	}
}
