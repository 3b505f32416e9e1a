package sealer

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Client is roostd's side: it keeps one roost-sealer running (starting it again if it
// ends) and sends it starts, each over a socket of its own so that they run concurrently.
type Client struct {
	path string

	mu      sync.Mutex
	control *os.File
	cmd     *exec.Cmd
	exited  chan struct{}
	closed  bool
}

// NewClient starts roost-sealer from path.
func NewClient(path string) (*Client, error) {
	c := &Client{path: path}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.spawn(); err != nil {
		return nil, err
	}
	return c, nil
}

// spawn starts roost-sealer with its end of a new control socket. The caller holds c.mu.
func (c *Client) spawn() error {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("roost-sealer's control socket: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "sealer-control"), os.NewFile(uintptr(pair[1]), "sealer-control")
	defer theirs.Close()
	// What libcontainer logs in roost-sealer comes back as JSON lines, and goes on through
	// this process's logrus, as if libcontainer had logged it here.
	logR, logW, err := os.Pipe()
	if err != nil {
		ours.Close()
		return err
	}
	defer logW.Close()
	cmd := &exec.Cmd{
		Path:       c.path,
		Args:       []string{Name},
		Env:        []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", LogLevelEnv + "=" + logrus.GetLevel().String()},
		ExtraFiles: []*os.File{theirs},
		Stderr:     logW,
	}
	if err := cmd.Start(); err != nil {
		ours.Close()
		logR.Close()
		return fmt.Errorf("starting %s: %w", c.path, err)
	}
	go relayLogs(logR)
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	c.control, c.cmd, c.exited = ours, cmd, exited
	return nil
}

// relayLogs logs each line roost-sealer writes: a logrus entry as that entry, anything else
// (a crash's trace) as a warning.
func relayLogs(r *os.File) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var fields logrus.Fields
		if err := json.Unmarshal(sc.Bytes(), &fields); err != nil {
			logrus.WithField("from", Name).Warn(sc.Text())
			continue
		}
		level, err := logrus.ParseLevel(fmt.Sprint(fields[logrus.FieldKeyLevel]))
		switch {
		case err != nil:
			level = logrus.InfoLevel
		case level < logrus.ErrorLevel:
			// Logged at panic level here, an entry would panic roostd: its own process is
			// where that level ended.
			level = logrus.ErrorLevel
		}
		msg := fmt.Sprint(fields[logrus.FieldKeyMsg])
		for _, k := range []string{logrus.FieldKeyLevel, logrus.FieldKeyMsg, logrus.FieldKeyTime} {
			delete(fields, k)
		}
		logrus.WithFields(fields).Log(level, msg)
	}
}

// conn hands roost-sealer one end of a new socket for one start and returns the other,
// starting roost-sealer again first if it has ended.
func (c *Client) conn() (*os.File, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "sealer-conn"), os.NewFile(uintptr(pair[1]), "sealer-conn")
	defer theirs.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		ours.Close()
		return nil, errors.New("roost-sealer: the client is closed")
	}
	for attempt := 0; ; attempt++ {
		select {
		case <-c.exited:
			c.control.Close()
			if err := c.spawn(); err != nil {
				ours.Close()
				return nil, err
			}
		default:
		}
		err := unix.Sendmsg(int(c.control.Fd()), []byte{0}, unix.UnixRights(int(theirs.Fd())), nil, 0)
		if err == nil {
			return ours, nil
		}
		if attempt > 0 || !(errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET)) {
			ours.Close()
			return nil, fmt.Errorf("handing a start to roost-sealer: %w", err)
		}
		// It ended since the last start: wait for its exit to be seen, then start it again.
		select {
		case <-c.exited:
		case <-time.After(5 * time.Second):
			ours.Close()
			return nil, fmt.Errorf("handing a start to roost-sealer: %w", err)
		}
	}
}

// Run creates and starts a container as req says, its init's descriptors 3, 4, … being
// files, and returns roost-sealer's answer: the init's host pid and start time.
func (c *Client) Run(ctx context.Context, req Request, files []*os.File) (Reply, error) {
	conn, err := c.conn()
	if err != nil {
		return Reply{}, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		// A roost-sealer that never answers must not hold the start for ever.
		tv := unix.NsecToTimeval(max(time.Until(dl), time.Millisecond).Nanoseconds())
		_ = unix.SetsockoptTimeval(int(conn.Fd()), unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	}
	if err := writeMessage(int(conn.Fd()), req, files); err != nil {
		return Reply{}, fmt.Errorf("sending the start to roost-sealer: %w", err)
	}
	var reply Reply
	got, err := readMessage(int(conn.Fd()), &reply)
	closeAll(got)
	if err != nil {
		return Reply{}, fmt.Errorf("roost-sealer gave no answer (did it end?): %w", err)
	}
	if reply.Error != "" {
		return Reply{}, errors.New(reply.Error)
	}
	if reply.PID <= 0 {
		return Reply{}, errors.New("roost-sealer answered without the init's pid")
	}
	if req.MemfdHelper != "" && !reply.MemfdNoExec {
		// The caller releases the container: its session must not run so.
		return Reply{}, errors.New("roost-sealer started the container without setting vm.memfd_noexec in its pid namespace: it is older than roostd; install the roost-sealer built with it")
	}
	return reply, nil
}

// Close ends roost-sealer: closing the control socket makes it finish the starts under way
// and exit. Containers it started live on.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.control.Close()
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
	return nil
}
