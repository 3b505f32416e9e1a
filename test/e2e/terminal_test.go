package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// onPTY runs roostctl with its stdout and stderr on a new pseudo-terminal and returns all
// the terminal was given (ONLCR makes each \n a \r\n there, as on an operator's).
func (d *daemon) onPTY(args ...string) []byte {
	d.t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		d.t.Fatalf("a pseudo-terminal: %v", err)
	}
	defer master.Close()
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		d.t.Fatal(err)
	}
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, master.Fd(), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		d.t.Fatalf("the pseudo-terminal's peer: %v", errno)
	}
	peer := os.NewFile(fd, "pty")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "roostctl"), args...)
	cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	cmd.Stdout, cmd.Stderr = peer, peer
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	// Only roostctl holds the peer now: once it exits, reading the master ends (EIO).
	peer.Close()
	var out bytes.Buffer
	_, err = io.Copy(&out, master)
	if err != nil && !errors.Is(err, syscall.EIO) {
		d.t.Fatalf("reading the terminal: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		d.t.Fatalf("roostctl %s on a terminal: %v\n%q", strings.Join(args, " "), err, out.Bytes())
	}
	return out.Bytes()
}

// What a session prints cannot drive the operator's terminal: OSC 52 (which sets the
// clipboard), a window title and a screen clear reach a terminal as text, from logs, run
// and exec alike. --raw, and any stdout that is no terminal, pass the very bytes.
func TestSessionOutputOnATerminalIsText(t *testing.T) {
	d := newDaemon(t)
	const printed = "\x1b]52;c;aGVsbG8=\x07\x1b]0;title\x07\x1b[2J" + "héllo, 世界 \u009b\x9b\n"
	script := `printf '\033]52;c;aGVsbG8=\007\033]0;title\007\033[2J'; printf 'h\303\251llo, \344\270\226\347\225\214 \302\233\233\n'`
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "osc", script+"; while [ ! -e stop ]; do sleep 0.05; done", "")))
	waitFor(t, "the session's output", func() bool { return strings.Contains(d.ok("logs", id), "\n") })

	// The positive control: to a pipe, the bytes are the session's, unchanged.
	if got := d.ok("logs", id); got != printed {
		t.Fatalf("logs to a pipe: %q, want %q", got, printed)
	}
	escaped := `\x1b]52;c;aGVsbG8=\x07\x1b]0;title\x07\x1b[2J` + `héllo, 世界 \u009b\x9b` + "\r\n"
	check := func(what string, got []byte) {
		t.Helper()
		if bytes.ContainsAny(got, "\x1b\x07") || bytes.Contains(got, []byte("\u009b")) || bytes.Contains(got, []byte(" \x9b")) {
			t.Errorf("%s on a terminal: a raw control reached it: %q", what, got)
		}
		if !bytes.Contains(got, []byte(`\x1b]52;`)) || !bytes.Contains(got, []byte(escaped)) {
			t.Errorf("%s on a terminal: %q, want %q in it", what, got, escaped)
		}
	}
	check("logs", d.onPTY("logs", id))
	// --raw hands the terminal the very escapes: the check above would catch them.
	if got := d.onPTY("logs", "--raw", id); !bytes.Contains(got, []byte("\x1b]52;c;aGVsbG8=\x07\x1b]0;title\x07\x1b[2J")) {
		t.Errorf("logs --raw on a terminal: %q", got)
	}

	out := d.onPTY("exec", id, "--", "printf", `\033]52;c;aGVsbG8=\007\033]0;title\007\033[2J`+`h\303\251llo, \344\270\226\347\225\214 \302\233\233\n`)
	check("exec", out)
	if got := d.onPTY("exec", "--raw", id, "--", "printf", `\033[2J`); !bytes.Contains(got, []byte("\x1b[2J")) {
		t.Errorf("exec --raw on a terminal: %q", got)
	}
	if got := d.ok("exec", id, "--", "printf", `\033[2J\233`); got != "\x1b[2J\x9b" {
		t.Errorf("exec to a pipe: %q", got)
	}
	os.WriteFile(filepath.Join(d.inspect(id).Workdir, "stop"), nil, 0o644)
	d.ok("wait", id)

	check("run", d.onPTY("run", capsule(t, "osc", script, "")))
	if got := d.onPTY("run", "--raw", capsule(t, "osc", script, "")); !bytes.Contains(got, []byte("\x1b]52;c;aGVsbG8=\x07")) {
		t.Errorf("run --raw on a terminal: %q", got)
	}
	if res := d.ctl("run", capsule(t, "osc", script, "")); res.code != 0 || res.stdout != printed {
		t.Errorf("run to a pipe: %+v, want %q", res, printed)
	}
}
