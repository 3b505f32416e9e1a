package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// notification is one datagram roostd sent to its service manager.
type notification struct {
	at   time.Time
	msg  string
	seen []session // for READY=1: roostctl ps --all as soon as it arrived
	err  string
}

// notifyListener plays the service manager's end of $NOTIFY_SOCKET: an abstract unix
// datagram socket, as systemd's own can be.
func notifyListener(t *testing.T, d *daemon) (string, <-chan notification) {
	t.Helper()
	name := fmt.Sprintf("@roost-e2e-notify-%d-%d", os.Getpid(), time.Now().UnixNano())
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	out := make(chan notification, 256)
	go func() {
		defer close(out)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			note := notification{at: time.Now(), msg: string(buf[:n])}
			if strings.Contains(note.msg, "READY=1") {
				// What an operator sees the moment systemd says the unit is active.
				cmd := exec.Command(filepath.Join(binDir, "roostctl"), "ps", "--all", "--json")
				cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				if err := cmd.Run(); err != nil {
					note.err = fmt.Sprintf("roostctl ps at READY=1: %v: %s", err, stderr.String())
				} else if err := json.Unmarshal(stdout.Bytes(), &note.seen); err != nil {
					note.err = fmt.Sprintf("roostctl ps at READY=1: %v", err)
				}
			}
			out <- note
		}
	}()
	return name, out
}

// next waits for the next notification.
func nextNote(t *testing.T, c <-chan notification, timeout time.Duration) notification {
	t.Helper()
	select {
	case n, ok := <-c:
		if !ok {
			t.Fatal("the notify socket closed")
		}
		return n
	case <-time.After(timeout):
		t.Fatalf("no notification within %s", timeout)
	}
	return notification{}
}

// Under a service manager (Type=notify): roostd restarted after a kill -9 with sessions
// running says what it is doing (STATUS=), and READY=1 only once every session is recovered
// and the socket serves; it answers the watchdog, says STOPPING=1 on SIGTERM, and nothing
// it starts inherits $NOTIFY_SOCKET, even when the operator and the capsule both ask.
func TestOpsNotifyReadyAfterRecovery(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "roostd.yaml")
	if err := os.WriteFile(cfg, []byte("env:\n  passthrough: [NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID, OPS_E2E_MARK]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t, "--config", cfg)
	waiter := func(name, extra string) string {
		return capsule(t, name, "trap 'exit 0' TERM; while :; do sleep 0.1; done", extra)
	}
	var ids []string
	ids = append(ids, strings.TrimSpace(d.ok("run", "-d", waiter("waiter-a", ""))))
	ids = append(ids, strings.TrimSpace(d.ok("run", "-d", waiter("waiter-b", ""))))
	ids = append(ids, strings.TrimSpace(d.ok("run", "-d", waiter("waiter-sealed", "capabilities:\n  containment: sealed\n  shell:\n    allow: [sleep]\n"))))
	d.kill9()

	name, notes := notifyListener(t, d)
	t.Setenv("NOTIFY_SOCKET", name)
	t.Setenv("WATCHDOG_USEC", "2000000")
	t.Setenv("OPS_E2E_MARK", "passes")
	started := time.Now()
	d.start()

	var statuses []string
	var ready notification
	for ready.msg == "" {
		n := nextNote(t, notes, 30*time.Second)
		for _, line := range strings.Split(n.msg, "\n") {
			switch {
			case line == "READY=1":
				ready = n
			case strings.HasPrefix(line, "STATUS="):
				if ready.msg == "" || n.msg != ready.msg {
					statuses = append(statuses, strings.TrimPrefix(line, "STATUS="))
				}
			}
		}
	}
	if ready.err != "" {
		t.Fatalf("%s\nroostd:\n%s", ready.err, d.log)
	}
	t.Logf("READY=1 %s after start; statuses before it: %q", ready.at.Sub(started), statuses)
	if !slices.Contains(statuses, "recovering 3 sessions") {
		t.Fatalf("no STATUS=recovering 3 sessions before READY=1: %q", statuses)
	}
	if !strings.Contains(ready.msg, "STATUS=serving; 3 running sessions") {
		t.Fatalf("READY=1 came with %q", ready.msg)
	}
	// When READY=1 arrived, every session was already re-attached, and said so.
	byID := map[string]session{}
	for _, s := range ready.seen {
		byID[s.ID] = s
	}
	for _, id := range ids {
		if s := byID[id]; s.State != "running" {
			t.Errorf("session %s at READY=1: %+v", id, s)
		}
	}
	recovered := map[string]bool{}
	for _, ev := range d.events(0) {
		if ev.Type == "session.recovered" && strings.HasPrefix(ev.Detail, "attached") {
			recovered[ev.SessionID] = true
		}
	}
	for _, id := range ids {
		if !recovered[id] {
			t.Errorf("no session.recovered (attached) event for %s", id)
		}
	}

	// The watchdog: pings at half of WATCHDOG_USEC (2 s).
	pings := 0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && pings < 2; {
		if n := nextNote(t, notes, 3*time.Second); n.msg == "WATCHDOG=1" {
			pings++
		}
	}
	if pings < 2 {
		t.Fatalf("%d watchdog pings in 3 s, want 2", pings)
	}

	// A session this roostd starts sees none of the service manager's variables, though
	// env.passthrough and env.allow both name them; another host variable passes.
	asks := "capabilities:\n  env:\n    allow: [NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID, OPS_E2E_MARK]\n"
	res := d.ctl("run", capsule(t, "envdump", "env", asks))
	if res.code != 0 || !strings.Contains(res.stdout, "OPS_E2E_MARK=passes") {
		t.Fatalf("env of a session: %+v", res)
	}
	for _, v := range []string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} {
		if strings.Contains(res.stdout, v+"=") {
			t.Errorf("a session inherited %s:\n%s", v, res.stdout)
		}
	}

	for _, id := range ids {
		d.ok("stop", id)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	stopping := false
	for deadline := time.Now().Add(10 * time.Second); !stopping && time.Now().Before(deadline); {
		n := nextNote(t, notes, 10*time.Second)
		stopping = strings.Contains(n.msg, "STOPPING=1")
	}
	if !stopping {
		t.Fatal("no STOPPING=1 after SIGTERM")
	}
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("roostd after SIGTERM: %v\n%s", err, d.log)
	}
	lines := strings.Split(strings.TrimSpace(d.log.String()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, `msg="roostd stopped"`) || !strings.Contains(last, "exit_code=0") {
		t.Fatalf("roostd's last line: %s", last)
	}
}
