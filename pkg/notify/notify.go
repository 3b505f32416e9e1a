// Package notify speaks the service manager's notification protocol (sd_notify(3)) without
// libsystemd: newline-separated VAR=VALUE assignments, one datagram each, sent to the unix
// datagram socket $NOTIFY_SOCKET names (a path, or an abstract name written with a leading
// '@'). A daemon not started by a service manager has no $NOTIFY_SOCKET, and every call is
// then a no-op.
package notify

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The variables the protocol defines and roostd sends.
const (
	// Ready: start-up is finished and the daemon serves.
	Ready = "READY=1"
	// Stopping: the daemon has begun shutting down.
	Stopping = "STOPPING=1"
	// Watchdog: the daemon is alive and well (see WatchdogSec= in systemd.service(5)).
	Watchdog = "WATCHDOG=1"
)

// The environment the service manager sets.
const (
	SocketEnv       = "NOTIFY_SOCKET"
	WatchdogUSecEnv = "WATCHDOG_USEC"
	WatchdogPIDEnv  = "WATCHDOG_PID"
)

// Status is a STATUS= line: free text a service manager shows (systemctl status).
func Status(text string) string {
	// One line: a newline would start another assignment.
	return "STATUS=" + strings.ReplaceAll(text, "\n", " ")
}

// sendTimeout bounds one send.
const sendTimeout = 5 * time.Second

// Notifier sends notifications to one socket. The nil *Notifier sends nothing, so callers
// need not ask whether a service manager is listening.
type Notifier struct {
	addr *net.UnixAddr
	mu   sync.Mutex
	conn *net.UnixConn
}

// New returns a Notifier for socket: an absolute path, or an abstract socket name with a
// leading '@'. It returns nil for "" (no service manager listens).
func New(socket string) (*Notifier, error) {
	switch {
	case socket == "":
		return nil, nil
	case socket[0] == '@':
		if len(socket) == 1 {
			return nil, fmt.Errorf("%s=%q: an abstract socket needs a name after '@'", SocketEnv, socket)
		}
	case socket[0] != '/':
		// systemd also knows vsock: addresses (for virtual machines); roostd runs on the host.
		return nil, fmt.Errorf("%s=%q: expected an absolute path or an abstract name (@name)", SocketEnv, socket)
	}
	// The net package turns a leading '@' into the abstract namespace's NUL.
	return &Notifier{addr: &net.UnixAddr{Name: socket, Net: "unixgram"}}, nil
}

// FromEnv returns the Notifier $NOTIFY_SOCKET names (nil when it is unset) and, with unset,
// removes the variable from the environment, so that no process this one starts inherits
// it and speaks for this one.
func FromEnv(unset bool) (*Notifier, error) {
	socket := os.Getenv(SocketEnv)
	if unset {
		os.Unsetenv(SocketEnv)
	}
	return New(socket)
}

// Send sends the assignments as one datagram. A nil Notifier sends nothing.
func (n *Notifier) Send(assignments ...string) error {
	if n == nil || len(assignments) == 0 {
		return nil
	}
	msg := []byte(strings.Join(assignments, "\n"))
	n.mu.Lock()
	defer n.mu.Unlock()
	// One connected socket for the daemon's life; dialled again when a send fails, as the
	// manager may have been re-executed and bound its socket anew.
	for attempt := 0; ; attempt++ {
		if n.conn == nil {
			conn, err := net.DialUnix("unixgram", nil, n.addr)
			if err != nil {
				return fmt.Errorf("notifying the service manager at %s: %w", n.addr.Name, err)
			}
			n.conn = conn
		}
		// A manager that reads nothing must not hang the daemon.
		_ = n.conn.SetWriteDeadline(time.Now().Add(sendTimeout))
		written, err := n.conn.Write(msg)
		if err == nil && written != len(msg) {
			err = fmt.Errorf("short write: %d of %d bytes", written, len(msg))
		}
		if err == nil {
			return nil
		}
		n.conn.Close()
		n.conn = nil
		if attempt == 1 {
			return fmt.Errorf("notifying the service manager at %s: %w", n.addr.Name, err)
		}
	}
}

// Close releases the socket; the Notifier may still be used (it dials again).
func (n *Notifier) Close() error {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return nil
	}
	err := n.conn.Close()
	n.conn = nil
	return err
}

// WatchdogInterval reads $WATCHDOG_USEC and $WATCHDOG_PID: the watchdog's timeout, when the
// service manager runs one for this process (0 otherwise: unset, or meant for another pid).
// With unset it removes both variables from the environment.
func WatchdogInterval(unset bool) (time.Duration, error) {
	usec, pid := os.Getenv(WatchdogUSecEnv), os.Getenv(WatchdogPIDEnv)
	if unset {
		os.Unsetenv(WatchdogUSecEnv)
		os.Unsetenv(WatchdogPIDEnv)
	}
	return watchdogInterval(usec, pid, os.Getpid())
}

func watchdogInterval(usec, pid string, self int) (time.Duration, error) {
	if usec == "" {
		return 0, nil
	}
	if pid != "" {
		p, err := strconv.Atoi(pid)
		if err != nil {
			return 0, fmt.Errorf("%s=%q: not a pid", WatchdogPIDEnv, pid)
		}
		if p != self {
			// Meant for another process (this one was started by the one it names).
			return 0, nil
		}
	}
	us, err := strconv.ParseUint(usec, 10, 63)
	if err != nil || us == 0 {
		return 0, fmt.Errorf("%s=%q: expected a positive number of microseconds", WatchdogUSecEnv, usec)
	}
	if us > uint64(1<<63-1)/uint64(time.Microsecond) {
		return 0, fmt.Errorf("%s=%q: too large", WatchdogUSecEnv, usec)
	}
	return time.Duration(us) * time.Microsecond, nil
}

// RunWatchdog sends WATCHDOG=1 every timeout/2 for as long as healthy says the daemon is
// well, until ctx ends. Each check gets at most half a period; a check that fails, or has
// not answered by the next tick, sends nothing, and the service manager acts once timeout
// passes without a ping. A check still running is never started again. log hears each
// change between healthy and not.
func (n *Notifier) RunWatchdog(ctx context.Context, timeout time.Duration, healthy func(context.Context) error, log *slog.Logger) {
	if n == nil || timeout <= 0 {
		return
	}
	period := timeout / 2
	ticker := time.NewTicker(period)
	defer ticker.Stop()
	type verdict struct{ err error }
	var pending chan verdict
	sick := false
	check := func() {
		c := make(chan verdict, 1)
		pending = c
		go func() {
			cctx, cancel := context.WithTimeout(ctx, period/2)
			defer cancel()
			c <- verdict{healthy(cctx)}
		}()
	}
	judge := func(v verdict) {
		pending = nil
		if v.err != nil {
			if !sick {
				log.Error("watchdog: the daemon is not healthy; withholding the service manager's watchdog ping", "err", v.err, "watchdog_timeout", timeout.String())
			}
			sick = true
			return
		}
		if sick {
			log.Info("watchdog: the daemon is healthy again")
		}
		sick = false
		if err := n.Send(Watchdog); err != nil {
			log.Warn("watchdog ping", "err", err)
		}
	}
	check()
	for {
		select {
		case <-ctx.Done():
			return
		case v := <-pending:
			judge(v)
		case <-ticker.C:
			if pending != nil {
				if !sick {
					log.Error("watchdog: the health check has not answered; withholding the service manager's watchdog ping", "watchdog_timeout", timeout.String())
				}
				sick = true
				continue
			}
			check()
		}
	}
}
