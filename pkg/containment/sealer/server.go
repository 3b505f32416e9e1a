package sealer

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/exeseal"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment/roostinit"
)

// ControlFD is the descriptor roost-sealer is started with: its end of roostd's control
// socket, over which each start arrives as a socket of its own.
const ControlFD = 3

// LogLevelEnv carries roostd's logrus level to roost-sealer, which logs JSON lines at it on
// its standard error for roostd to relay.
const LogLevelEnv = "_ROOST_SEALER_LOG_LEVEL"

// SetupLogging has libcontainer's logs in roost-sealer go to standard error as JSON lines,
// at the level roostd asked for.
func SetupLogging() {
	logrus.SetOutput(os.Stderr)
	logrus.SetFormatter(&logrus.JSONFormatter{})
	if level, err := logrus.ParseLevel(os.Getenv(LogLevelEnv)); err == nil {
		logrus.SetLevel(level)
	}
}

// sealedEnv marks a roost-sealer already running from its sealed copy.
const sealedEnv = "_ROOST_SEALER_SEALED"

// Serve is roost-sealer's main loop: it takes start requests on the control socket until
// roostd closes it (roostd has ended), then returns once the starts under way have
// answered. Containers already started are not its to stop: their inits outlive it, as they
// outlive roostd.
func Serve(control int) error {
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for {
		conn, err := acceptConn(control)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("control socket: %w", err)
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			defer conn.Close()
			serveOne(int(conn.Fd()))
		}()
	}
}

// acceptConn receives the next start's socket: one byte carrying one descriptor.
func acceptConn(control int) (*os.File, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(control, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		files, err := parseRights(oob[:oobn])
		if err != nil {
			return nil, err
		}
		if n == 0 && len(files) == 0 {
			return nil, io.EOF
		}
		if len(files) != 1 {
			closeAll(files)
			continue
		}
		return files[0], nil
	}
}

// serveOne creates and starts one container and answers with its init's pid.
func serveOne(conn int) {
	var req Request
	files, err := readMessage(conn, &req)
	if err != nil {
		_ = writeMessage(conn, Reply{Error: "roost-sealer: reading the request: " + err.Error()}, nil)
		return
	}
	reply, proc := start(req, files)
	closeAll(files)
	_ = writeMessage(conn, reply, nil)
	if proc != nil {
		// The init is this process's child: reap it when it ends. roostd watches it by
		// pid and start time, as it watches a container a previous daemon started.
		go func() { _, _ = proc.Wait() }()
	}
}

func start(req Request, files []*os.File) (Reply, *libcontainer.Process) {
	if req.Config == nil || req.ID == "" || req.Root == "" || len(req.Args) == 0 {
		return Reply{Error: "roost-sealer: the request lacks a container id, root, configuration or command"}, nil
	}
	c, err := libcontainer.Create(req.Root, req.ID, req.Config)
	if err != nil {
		return Reply{Error: "creating the container: " + err.Error()}, nil
	}
	proc := &libcontainer.Process{
		Args:       req.Args,
		Env:        req.Env,
		Cwd:        req.Cwd,
		ExtraFiles: files,
		Init:       true,
	}
	pid, err := Run(c, proc, req.MemfdHelper)
	if err != nil {
		if pid == 0 {
			return Reply{Error: err.Error()}, nil
		}
		return Reply{Error: err.Error()}, proc
	}
	reply := Reply{PID: pid, MemfdNoExec: req.MemfdHelper != ""}
	// From the container in memory: no state file read.
	if st, err := c.State(); err == nil {
		reply.InitStart = st.InitProcessStartTime
	}
	return reply, proc
}

// Run starts the container's init proc and lets it run its program, as c.Run does; with
// memfdHelper (roost-init's host path) it sets vm.memfd_noexec=2 in the container's pid
// namespace between the two, while the init waits to exec, so that nothing of the
// session's runs there before. It returns the init's pid, and 0 when there is no init to
// reap; on an error the init has been killed.
func Run(c *libcontainer.Container, proc *libcontainer.Process, memfdHelper string) (int, error) {
	if err := c.Start(proc); err != nil {
		return 0, fmt.Errorf("starting the container: %w", err)
	}
	pid, err := proc.Pid()
	if err != nil {
		return 0, fmt.Errorf("starting the container: %w", err)
	}
	if memfdHelper != "" {
		if err := roostinit.SetMemfdNoExecIn(memfdHelper, pid); err != nil {
			_ = proc.Signal(syscall.SIGKILL)
			return pid, fmt.Errorf("vm.memfd_noexec in the container's pid namespace: %w", err)
		}
	}
	if err := c.Exec(); err != nil {
		_ = proc.Signal(syscall.SIGKILL)
		return pid, fmt.Errorf("starting the container: %w", err)
	}
	return pid, nil
}

// RunFromSealedCopy re-executes the running binary from a sealed memfd copy of itself,
// once, so that libcontainer, finding /proc/self/exe already sealed, has no binary to clone
// for each container's init (and a container can never reach the file on disk). It returns
// only when the copy cannot be made or run: then libcontainer clones per start, as it does
// for any caller.
func RunFromSealedCopy() {
	if os.Getenv(sealedEnv) != "" || exeseal.IsSelfExeCloned() {
		return
	}
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return
	}
	defer self.Close()
	st, err := self.Stat()
	if err != nil {
		return
	}
	sealed, err := exeseal.CloneBinary(self, st.Size(), Name, os.TempDir())
	if err != nil {
		return
	}
	defer sealed.Close()
	env := append(os.Environ(), sealedEnv+"=1")
	// The control socket (3) stays where it is: exec keeps descriptors not marked
	// close-on-exec, and Go marks every one it opens.
	_ = syscall.Exec(fmt.Sprintf("/proc/self/fd/%d", sealed.Fd()), os.Args, env)
}
