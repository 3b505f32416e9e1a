package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// listener is a service manager's end: a unix datagram socket that collects what arrives.
type listener struct {
	t    *testing.T
	name string
	conn *net.UnixConn
}

func listen(t *testing.T, name string) *listener {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &listener{t: t, name: name, conn: conn}
}

// next returns the next datagram, or fails after timeout.
func (l *listener) next(timeout time.Duration) string {
	l.t.Helper()
	buf := make([]byte, 4096)
	l.conn.SetReadDeadline(time.Now().Add(timeout))
	n, err := l.conn.Read(buf)
	if err != nil {
		l.t.Fatalf("no datagram: %v", err)
	}
	return string(buf[:n])
}

// drain discards what arrives within d.
func (l *listener) drain(d time.Duration) {
	buf := make([]byte, 4096)
	l.conn.SetReadDeadline(time.Now().Add(d))
	for {
		if _, err := l.conn.Read(buf); err != nil {
			return
		}
	}
}

// none asserts nothing arrives for d.
func (l *listener) none(d time.Duration) {
	l.t.Helper()
	buf := make([]byte, 4096)
	l.conn.SetReadDeadline(time.Now().Add(d))
	if n, err := l.conn.Read(buf); err == nil {
		l.t.Fatalf("unexpected datagram %q", buf[:n])
	}
}

func TestSendPath(t *testing.T) {
	l := listen(t, filepath.Join(t.TempDir(), "notify"))
	n, err := New(l.name)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := n.Send(Status("recovering 3 sessions")); err != nil {
		t.Fatal(err)
	}
	if got := l.next(time.Second); got != "STATUS=recovering 3 sessions" {
		t.Fatalf("got %q", got)
	}
	// Several assignments travel in one datagram, one per line.
	if err := n.Send(Ready, Status("serving; 3 running sessions")); err != nil {
		t.Fatal(err)
	}
	if got := l.next(time.Second); got != "READY=1\nSTATUS=serving; 3 running sessions" {
		t.Fatalf("got %q", got)
	}
	// A status cannot smuggle in another assignment.
	n.Send(Status("one\nREADY=1"))
	if got := l.next(time.Second); got != "STATUS=one READY=1" {
		t.Fatalf("got %q", got)
	}
}

func TestSendAbstract(t *testing.T) {
	name := fmt.Sprintf("@roost-notify-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	l := listen(t, name)
	n, err := New(name)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := n.Send(Stopping); err != nil {
		t.Fatal(err)
	}
	if got := l.next(time.Second); got != "STOPPING=1" {
		t.Fatalf("got %q", got)
	}
	// Nothing was made on the filesystem for it.
	if _, err := os.Stat(name); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an abstract name became a file: %v", err)
	}
}

// A manager re-executed binds its socket anew; the next send reaches the new one.
func TestSendRedials(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	l := listen(t, path)
	n, _ := New(path)
	defer n.Close()
	n.Send(Status("one"))
	l.next(time.Second)
	l.conn.Close()
	os.Remove(path)
	l2 := listen(t, path)
	if err := n.Send(Status("two")); err != nil {
		t.Fatal(err)
	}
	if got := l2.next(time.Second); got != "STATUS=two" {
		t.Fatalf("got %q", got)
	}
}

func TestSendNobodyListening(t *testing.T) {
	n, _ := New(filepath.Join(t.TempDir(), "absent"))
	if err := n.Send(Ready); err == nil || !strings.Contains(err.Error(), "notifying the service manager") {
		t.Fatalf("send to no socket: %v", err)
	}
}

func TestNilNotifier(t *testing.T) {
	n, err := New("")
	if n != nil || err != nil {
		t.Fatalf("New(\"\") = %v, %v", n, err)
	}
	if err := n.Send(Ready); err != nil {
		t.Fatal(err)
	}
	n.RunWatchdog(context.Background(), time.Second, nil, nil) // returns at once
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestNewRefuses(t *testing.T) {
	for _, bad := range []string{"relative/sock", "@", "vsock:2:1234"} {
		if _, err := New(bad); err == nil {
			t.Errorf("New(%q) accepted", bad)
		}
	}
}

func TestFromEnvUnsets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	l := listen(t, path)
	t.Setenv(SocketEnv, path)
	n, err := FromEnv(true)
	if err != nil || n == nil {
		t.Fatalf("FromEnv: %v %v", n, err)
	}
	defer n.Close()
	if _, set := os.LookupEnv(SocketEnv); set {
		t.Fatal("NOTIFY_SOCKET still set")
	}
	n.Send(Ready)
	if got := l.next(time.Second); got != Ready {
		t.Fatalf("got %q", got)
	}
	// Without unset it stays.
	t.Setenv(SocketEnv, path)
	FromEnv(false)
	if os.Getenv(SocketEnv) != path {
		t.Fatal("NOTIFY_SOCKET removed")
	}
}

func TestWatchdogInterval(t *testing.T) {
	self := os.Getpid()
	cases := []struct {
		usec, pid string
		want      time.Duration
		bad       bool
	}{
		{"", "", 0, false},
		{"30000000", "", 30 * time.Second, false},
		{"30000000", fmt.Sprint(self), 30 * time.Second, false},
		{"30000000", fmt.Sprint(self + 1), 0, false},
		{"0", "", 0, true},
		{"-5", "", 0, true},
		{"soon", "", 0, true},
		{"30000000", "me", 0, true},
		{"99999999999999999999", "", 0, true},
	}
	for _, c := range cases {
		got, err := watchdogInterval(c.usec, c.pid, self)
		if got != c.want || (err != nil) != c.bad {
			t.Errorf("watchdogInterval(%q, %q) = %v, %v", c.usec, c.pid, got, err)
		}
	}
	t.Setenv(WatchdogUSecEnv, "2000000")
	t.Setenv(WatchdogPIDEnv, fmt.Sprint(self))
	if d, err := WatchdogInterval(true); d != 2*time.Second || err != nil {
		t.Fatalf("WatchdogInterval: %v %v", d, err)
	}
	for _, v := range []string{WatchdogUSecEnv, WatchdogPIDEnv} {
		if _, set := os.LookupEnv(v); set {
			t.Errorf("%s still set", v)
		}
	}
}

// syncBuffer is a log destination the watchdog goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The watchdog pings at half the timeout while the daemon is healthy, stops pinging while it
// is not (or while its check hangs), and starts again once it recovers.
func TestWatchdog(t *testing.T) {
	l := listen(t, filepath.Join(t.TempDir(), "notify"))
	n, _ := New(l.name)
	defer n.Close()
	var mode atomic.Int32 // 0 healthy, 1 failing, 2 hanging
	healthy := func(ctx context.Context) error {
		switch mode.Load() {
		case 1:
			return errors.New("the registry answers nothing")
		case 2:
			<-ctx.Done()
			// A check that ignores its context entirely must not stall the loop either.
			time.Sleep(300 * time.Millisecond)
			return ctx.Err()
		}
		return nil
	}
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	const timeout = 600 * time.Millisecond
	start := time.Now()
	go func() {
		n.RunWatchdog(ctx, timeout, healthy, slog.New(slog.NewTextHandler(logs, nil)))
		close(done)
	}()
	// The first ping comes at once, the next about timeout/2 later.
	if got := l.next(time.Second); got != Watchdog {
		t.Fatalf("got %q", got)
	}
	if got := l.next(time.Second); got != Watchdog {
		t.Fatalf("got %q", got)
	}
	// Not before half the timeout; well before the timeout, however loaded the machine.
	if since := time.Since(start); since < timeout/2-50*time.Millisecond || since > 2*timeout {
		t.Fatalf("second ping after %s, want about %s", since, timeout/2)
	}

	mode.Store(1)
	l.drain(timeout / 2) // a check may have passed just before
	l.none(2 * timeout)
	if !strings.Contains(logs.String(), "the registry answers nothing") {
		t.Fatalf("no log of the failed check:\n%s", logs)
	}
	mode.Store(0)
	if got := l.next(2 * timeout); got != Watchdog {
		t.Fatalf("after recovery: %q", got)
	}

	mode.Store(2)
	l.drain(timeout / 2)
	l.none(2 * timeout)
	mode.Store(0)
	if got := l.next(2 * timeout); got != Watchdog {
		t.Fatalf("after a hung check: %q", got)
	}
	if !strings.Contains(logs.String(), "healthy again") {
		t.Fatalf("no log of the recovery:\n%s", logs)
	}

	cancel()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("RunWatchdog did not return when its context ended")
	}
}
