package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ctlIn runs roostctl with stdin.
func (d *daemon) ctlIn(stdin string, args ...string) result {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "roostctl"), args...)
	cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	res := result{stdout: out.String(), stderr: errOut.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	case err != nil:
		d.t.Fatalf("roostctl %v: %v", args, err)
	}
	return res
}

// awaitFile waits for a session's program to have written a file.
func awaitFile(t *testing.T, path string) string {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if data, err := os.ReadFile(path); err == nil && len(data) > 0 && strings.HasSuffix(string(data), "\n") {
			return string(data)
		}
	}
	t.Fatalf("the session's program never wrote %s", path)
	return ""
}

// statusField is one field of /proc/<pid>/status text.
func statusField(status, name string) string {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// A command exec'd into a sealed session gets the session's containment: its namespaces
// (hostname, pid 1, /work, no host path), its uid mapping, no capability, its seccomp filter
// and its exec allowlist; its exit code, stdin and a terminal pass through; it is recorded.
func TestExecSealed(t *testing.T) {
	d := newDaemon(t)
	hostDir := t.TempDir()
	hostFile := filepath.Join(hostDir, "host-secret")
	if err := os.WriteFile(hostFile, []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "execsealed",
		"hostname > /work/hostname; cat /proc/self/uid_map > /work/uid_map; cat /proc/self/status > /work/status; sleep 300",
		"capabilities:\n  containment: sealed\n  shell:\n    allow: [sleep, cat, hostname, tty]\n")))
	work := d.inspect(id).Workdir
	programStatus := awaitFile(t, filepath.Join(work, "status"))

	if out := d.ok("exec", id, "--", "hostname"); out != awaitFile(t, filepath.Join(work, "hostname")) {
		t.Errorf("hostname: exec sees %q, the program %q", out, awaitFile(t, filepath.Join(work, "hostname")))
	}
	if out := d.ok("exec", id, "--", "cat", "/proc/self/uid_map"); out != awaitFile(t, filepath.Join(work, "uid_map")) || strings.HasPrefix(strings.TrimSpace(out), "0 0 ") {
		t.Errorf("uid_map: exec sees %q, the program %q", out, awaitFile(t, filepath.Join(work, "uid_map")))
	}
	status := d.ok("exec", id, "--", "cat", "/proc/self/status")
	for field, want := range map[string]string{"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": statusField(programStatus, "CapBnd"), "Seccomp": "2", "NoNewPrivs": "1"} {
		if got := statusField(status, field); got != want {
			t.Errorf("%s: %q, want %q (the program's %q)", field, got, want, statusField(programStatus, field))
		}
	}
	// The session's pid namespace: its PID 1 is its roost-init.
	if out := d.ok("exec", id, "--", "cat", "/proc/1/comm"); out != "roost-init\n" {
		t.Errorf("pid 1 in the exec's pid namespace: %q", out)
	}
	// The session's root: it starts in /work and sees the workdir; no host path.
	if out := d.ok("exec", id, "--", "sh", "-c", "pwd; test -f /work/status && echo work"); out != "/work\nwork\n" {
		t.Errorf("workdir: %q", out)
	}
	// cat runs there (it read uid_map above); the host's file is not in the session's root.
	if res := d.ctl("exec", id, "--", "cat", hostFile); res.code != 1 || res.stdout != "" || res.stderr != "cat: "+hostFile+": No such file or directory\n" {
		t.Errorf("a host file is visible in the session, or cat failed otherwise than ENOENT: %+v", res)
	}
	// -w and -e.
	if out := d.ok("exec", "-w", "/tmp", "-e", "GREETING=hi there", id, "--", "sh", "-c", `echo "$(pwd) $GREETING $ROOST_SESSION_ID"`); out != "/tmp hi there "+id+"\n" {
		t.Errorf("-w and -e: %q", out)
	}
	// A symlinked directory resolves in the session's view, not the host's.
	// (made from the host: what a session can write in its workdir).
	if err := os.Symlink(hostDir, filepath.Join(work, "escape")); err != nil {
		t.Fatal(err)
	}
	// -w /tmp worked above; this one fails for the link's target, absent in the session.
	if res := d.ctl("exec", "-w", "/work/escape", id, "--", "cat", "host-secret"); res.code != 127 || res.stdout != "" || !strings.Contains(res.stderr, "chdir /work/escape: no such file or directory") {
		t.Errorf("-w through a symlink reached the host, or failed otherwise than ENOENT: %+v", res)
	}
	// The exec allowlist holds: id is not in shell.allow, so not even in the session's view
	// of the system trees (filesystem.system: allowlist), and not found.
	res := d.ctl("exec", id, "--", "id")
	if res.code != 127 || !strings.Contains(res.stderr, `command "id" not found`) || res.stdout != "" {
		t.Errorf("a command outside shell.allow: %+v", res)
	}
	// Not even through the allowed shell, which runs (sh -c above did) and finds no id.
	if res := d.ctl("exec", id, "--", "sh", "-c", "id"); res.code != 127 || res.stdout != "" || res.stderr != "sh: 1: id: not found\n" {
		t.Errorf("a command outside shell.allow, through sh: %+v", res)
	}
	// By its path, the same: the file is absent from the root.
	if res := d.ctl("exec", id, "--", "/usr/bin/id"); res.code != 127 || res.stdout != "" {
		t.Errorf("a command outside shell.allow, by its path: %+v", res)
	}
	if res := d.ctl("exec", id, "--", "no-such-command"); res.code != 127 || !strings.Contains(res.stderr, "not found") {
		t.Errorf("a missing command: %+v", res)
	}
	// Exit codes pass through, signals as 128+N.
	if res := d.ctl("exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 7"); res.code != 7 || res.stdout != "out\n" || res.stderr != "err\n" {
		t.Errorf("exit 7: %+v", res)
	}
	if res := d.ctl("exec", id, "--", "sh", "-c", "kill -TERM $$"); res.code != 128+15 {
		t.Errorf("killed by SIGTERM: %+v", res)
	}
	// stdin with -i; without it, stdin is empty.
	if res := d.ctlIn("line one\nline two\n", "exec", "-i", id, "--", "cat"); res.code != 0 || res.stdout != "line one\nline two\n" {
		t.Errorf("-i: %+v", res)
	}
	if res := d.ctlIn("ignored\n", "exec", id, "--", "cat"); res.code != 0 || res.stdout != "" {
		t.Errorf("without -i: %+v", res)
	}
	// -t: the command runs on a terminal from the session's own devpts, even when roostctl
	// has none.
	if res := d.ctl("exec", "-t", id, "--", "tty"); res.code != 0 || !strings.HasPrefix(res.stdout, "/dev/pts/") {
		t.Errorf("-t: %+v", res)
	}

	// Recorded: events and trace.
	var execEvents []event
	for _, ev := range d.events(0) {
		if ev.Type == "session.exec" && ev.SessionID == id {
			execEvents = append(execEvents, ev)
		}
	}
	found := false
	for _, ev := range execEvents {
		if strings.Contains(ev.Detail, "exec_") && strings.Contains(ev.Detail, "sh -c 'echo out; echo err >&2; exit 7'") && strings.Contains(ev.Detail, "exited with code 7") {
			found = true
		}
	}
	if !found {
		t.Errorf("no session.exec event for exit 7 among %+v", execEvents)
	}
	trace, _ := os.ReadFile(filepath.Join(d.inspect(id).RecordsDir, "trace.jsonl"))
	if !strings.Contains(string(trace), `"event_type":"exec_start"`) || !strings.Contains(string(trace), `"event_type":"exec_end"`) || !strings.Contains(string(trace), `"exit_code":7`) {
		t.Errorf("trace has no exec records:\n%s", trace)
	}

	// Paused: refused, naming the state.
	d.ok("pause", id)
	if res := d.ctl("exec", id, "--", "true"); res.code != 1 || !strings.Contains(res.stderr, "paused") {
		t.Errorf("exec into a paused session: %+v", res)
	}
	d.ok("resume", id)
	// A command still running when the session ends ends with it.
	done := make(chan result, 1)
	go func() { done <- d.ctl("exec", id, "--", "sh", "-c", "echo > /work/exec-running; exec sleep 300") }()
	awaitFile(t, filepath.Join(work, "exec-running"))
	d.ok("stop", id)
	select {
	case res := <-done:
		if res.code == 0 {
			t.Errorf("an exec outlived its session: %+v", res)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("an exec outlived its session by 30s")
	}
	res = d.ctl("exec", id, "--", "true")
	if res.code != 1 || !strings.Contains(res.stderr, "is exited") {
		t.Errorf("exec into an ended session: %+v", res)
	}
	if res := d.ctl("exec", "ses_nosuchsession", "--", "true"); res.code != 1 || !strings.Contains(res.stderr, "ses_nosuchsession") {
		t.Errorf("exec into a missing session: %+v", res)
	}
	// exec exits with the command's code, so its own usage errors are 125, as run's.
	if res := d.ctl("exec", id); res.code != 125 {
		t.Errorf("exec without a command: %+v", res)
	}
}

// A command exec'd into a scoped or advisory session shares its program's cgroup and uid,
// and a scoped one its seccomp filter, capabilities, network namespace and allowlist.
func TestExecScopedAdvisory(t *testing.T) {
	d := newDaemon(t)
	for _, class := range []string{"scoped", "advisory"} {
		func() {
			id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "exec"+class,
				"cat /proc/self/cgroup > cgroup; cat /proc/net/dev > netdev; cat /proc/self/status > status; sleep 300",
				"capabilities:\n  containment: "+class+"\n  shell:\n    allow: [sleep, cat, tty]\n")))
			defer d.ctl("kill", id)
			s := d.inspect(id)
			programStatus := awaitFile(t, filepath.Join(s.Workdir, "status"))
			if out := d.ok("exec", id, "--", "cat", "/proc/self/cgroup"); out != awaitFile(t, filepath.Join(s.Workdir, "cgroup")) {
				t.Errorf("%s: cgroup: exec is in %q, the program in %q", class, out, awaitFile(t, filepath.Join(s.Workdir, "cgroup")))
			}
			if out := d.ok("exec", id, "--", "cat", "/proc/net/dev"); out != awaitFile(t, filepath.Join(s.Workdir, "netdev")) {
				t.Errorf("%s: network: exec sees %q, the program %q", class, out, awaitFile(t, filepath.Join(s.Workdir, "netdev")))
			}
			status := d.ok("exec", id, "--", "cat", "/proc/self/status")
			for _, field := range []string{"Uid", "Gid", "Groups", "CapEff", "CapPrm", "CapBnd", "Seccomp", "NoNewPrivs"} {
				if got, want := statusField(status, field), statusField(programStatus, field); got != want {
					t.Errorf("%s: %s: exec %q, the program %q", class, field, got, want)
				}
			}
			if statusField(status, "CapEff") != "0000000000000000" {
				t.Errorf("%s: CapEff: %q", class, statusField(status, "CapEff"))
			}
			if out := d.ok("exec", id, "--", "sh", "-c", "pwd"); out != s.Workdir+"\n" {
				t.Errorf("%s: workdir: %q, want %s", class, out, s.Workdir)
			}
			if res := d.ctl("exec", "-t", id, "--", "tty"); res.code != 0 || !strings.HasPrefix(res.stdout, "/dev/pts/") {
				t.Errorf("%s: -t: %+v", class, res)
			}
			res := d.ctl("exec", id, "--", "id")
			if class == "scoped" && (res.code != 126 || !strings.Contains(res.stderr, "refused by shell.allow")) {
				t.Errorf("%s: a command outside shell.allow: %+v", class, res)
			}
			if res := d.ctl("exec", id, "--", "sh", "-c", "exit 7"); res.code != 7 {
				t.Errorf("%s: exit 7: %+v", class, res)
			}
		}()
	}
}
