package sealed

import (
	"context"
	"fmt"
	"os"
	"syscall"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/roostinit"
)

// Exec runs one more command in the sealed session proc runs, spec being the session's own
// start: libcontainer starts roost-exec in its container (its namespaces, cgroup, uid,
// seccomp filter, capabilities, no_new_privs), and roost-exec applies what the program got
// from it inside the root (rlimits, the Landlock exec allowlist).
func (r *Runtime) Exec(ctx context.Context, spec containment.Spec, proc containment.Process, opts containment.ExecOptions) (_ *containment.Execution, retErr error) {
	p, ok := proc.(*sealedProcess)
	if !ok {
		return nil, fmt.Errorf("session %s: not a process of this runtime", spec.SessionID)
	}
	es, join, err := containment.Joined(spec, sealedExecSpec(spec), opts, Work)
	if err != nil {
		return nil, err
	}
	hs, err := containment.NewHandshake()
	if err != nil {
		return nil, err
	}
	defer hs.Close()
	lp := &libcontainer.Process{
		Args: []string{initPath, containment.ExecName},
		Env:  []string{"PATH=" + containment.DefaultPath},
		// roost-exec enters the command's directory itself, as the command's uid.
		Cwd:        "/",
		ExtraFiles: hs.ChildFiles(),
		Init:       false,
	}
	var e containment.Execution
	var child []*os.File
	var console *os.File
	defer func() {
		for _, f := range child {
			f.Close()
		}
		if console != nil {
			console.Close()
		}
		if retErr != nil {
			e.Close()
		}
	}()
	if opts.TTY {
		// The terminal is the container's own, from its devpts: libcontainer makes it inside
		// and sends its master end back.
		parent, sock, err := socketPair()
		if err != nil {
			return nil, err
		}
		console, child = parent, append(child, sock)
		lp.ConsoleSocket, lp.ConsoleWidth, lp.ConsoleHeight = sock, opts.Cols, opts.Rows
	} else {
		in, out, errOut, err := e.Pipes(opts.Stdin)
		if err != nil {
			return nil, err
		}
		child = append(child, in, out, errOut)
		lp.Stdin, lp.Stdout, lp.Stderr = in, out, errOut
	}
	c, err := p.container.get()
	if err != nil {
		return nil, err
	}
	if err := c.Run(lp); err != nil {
		return nil, fmt.Errorf("starting roost-exec in the session's container: %w", err)
	}
	hs.Started()
	if console != nil {
		if e.Terminal, err = recvFile(console); err != nil {
			_ = lp.Signal(syscall.SIGKILL)
			_, _ = lp.Wait()
			return nil, fmt.Errorf("the command's terminal: %w", err)
		}
	}
	pid, _ := lp.Pid()
	e.Started(pid, lp.Wait, func(sig syscall.Signal) error { return lp.Signal(sig) })
	if err := hs.Hand(ctx, roostinit.JoinSpec(es, join)); err != nil {
		_ = lp.Signal(syscall.SIGKILL)
		_, _ = e.Wait()
		return nil, err
	}
	return &e, nil
}

// socketPair is a connected pair of unix stream sockets, close-on-exec.
func socketPair() (parent, child *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "console-parent"), os.NewFile(uintptr(fds[1]), "console-child"), nil
}

// recvFile receives the one descriptor libcontainer sends on a console socket (its data
// is the file's name).
func recvFile(sock *os.File) (*os.File, error) {
	name := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	conn := int(sock.Fd())
	n, oobn, _, _, err := unix.Recvmsg(conn, name, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return nil, err
		}
		fds = append(fds, got...)
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("expected one descriptor, got %d", len(fds))
	}
	return os.NewFile(uintptr(fds[0]), string(name[:n])), nil
}
