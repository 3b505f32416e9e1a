package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// exitCodeTable is the first column of docs/cli.md's "## Exit codes" table: each code it
// lists ("124", "128+N", "the capsule's own code").
func exitCodeTable(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(), "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Exit codes\n")
	if !ok {
		t.Fatal(`docs/cli.md has no "## Exit codes" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	codes := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") || strings.TrimSpace(cells[1]) == "exit code" {
			continue
		}
		codes[strings.Trim(strings.TrimSpace(cells[1]), "`")] = true
	}
	if len(codes) == 0 {
		t.Fatal(`docs/cli.md's "## Exit codes" holds no table`)
	}
	return codes
}

// TestExitCodeTable holds roostctl to docs/cli.md's table of exit codes, one row each: every
// code a row below meets is in the table, and every code of the table is met.
func TestExitCodeTable(t *testing.T) {
	table := exitCodeTable(t)
	d := newDaemon(t)
	sleeper := capsule(t, "sleeper", "sleep 60", "")
	killed := strings.TrimSpace(d.ok("run", "--detach", sleeper))
	stopped := strings.TrimSpace(d.ok("run", "--detach", sleeper))
	d.ok("kill", killed)
	d.ok("stop", "--grace", "1s", stopped)
	nostart := t.TempDir()
	os.WriteFile(filepath.Join(nostart, "capsule.yaml"), []byte("name: nostart\nversion: 0.1.0\nrun:\n  command: [/no/such/program]\n"), 0o644)
	unreachable := func(args ...string) result {
		cmd := exec.Command(filepath.Join(binDir, "roostctl"), args...)
		cmd.Env = append(os.Environ(), "ROOST_SOCKET="+filepath.Join(t.TempDir(), "none.sock"))
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return result{out.String(), errOut.String(), cmd.ProcessState.ExitCode()}
	}
	rows := []struct {
		name   string
		run    func() result
		code   int
		stderr string
	}{
		{"capsule's own code", func() result { return d.ctl("run", capsule(t, "three", "exit 3", "")) }, 3, ""},
		{"capsule's zero", func() result { return d.ctl("run", capsule(t, "zero", "true", "")) }, 0, ""},
		{"deadline reached", func() result { return d.ctl("run", "--deadline", "1s", sleeper) }, 124, "deadline_reached"},
		{"not launched", func() result { return d.ctl("run", nostart) }, 125, "/no/such/program"},
		{"killed: 128+SIGKILL", func() result { return d.ctl("wait", killed) }, 137, ""},
		{"stopped: 128+SIGTERM", func() result { return d.ctl("wait", stopped) }, 143, ""},
		{"any other command: stop of an ended session", func() result { return d.ctl("stop", killed) }, 0, ""},
		{"failed operation", func() result { return d.ctl("wait", "nope") }, 1, `no session "nope"`},
		{"failed operation on a live session", func() result { return d.ctl("pause", "nope") }, 1, "nope"},
		{"unknown command", func() result { return d.ctl("lgs") }, 2, "did you mean"},
		{"unknown flag", func() result { return d.ctl("ps", "--bogus") }, 2, "--bogus"},
		{"run: bad flag value", func() result { return d.ctl("run", "--deadline", "abc", sleeper) }, 125, "--deadline"},
		{"run: zero deadline", func() result { return d.ctl("run", "--deadline", "0s", sleeper) }, 125, "--deadline"},
		{"run: unknown flag", func() result { return d.ctl("run", "--nope", sleeper) }, 125, "--nope"},
		{"run: missing argument", func() result { return d.ctl("run") }, 125, "CAPSULE"},
		{"bad flag value", func() result { return d.ctl("stage", "--deadline", "abc", sleeper) }, 2, "--deadline"},
		{"unknown template key", func() result { return d.ctl("inspect", "-f", "{{.nmae}}", killed) }, 2, `"nmae"`},
		{"sub-second deadline", func() result { return d.ctl("stage", "--deadline", "1500ms", sleeper) }, 2, "--deadline"},
		{"missing argument", func() result { return d.ctl("inspect") }, 2, "SESSION"},
		{"wait: unknown flag", func() result { return d.ctl("wait", "--nope", killed) }, 125, "--nope"},
		{"wait: missing argument", func() result { return d.ctl("wait") }, 125, "SESSION"},
		{"exec: unknown flag", func() result { return d.ctl("exec", "--nope", killed, "--", "true") }, 125, "--nope"},
		{"exec: missing command", func() result { return d.ctl("exec", killed) }, 125, "COMMAND"},
		{"unreachable: ps", func() result { return unreachable("ps") }, 69, "cannot reach roostd"},
		{"unreachable: wait", func() result { return unreachable("wait", "x") }, 69, "cannot reach roostd"},
		{"unreachable: run", func() result { return unreachable("run", sleeper) }, 69, "cannot reach roostd"},
	}
	// 255 is a session roostd lost track of: nothing roostctl does here makes one.
	met := map[string]bool{"255": true}
	for _, row := range rows {
		res := row.run()
		if res.code != row.code || !strings.Contains(res.stderr, row.stderr) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d with %q", row.name, res.code, res.stderr, row.code, row.stderr)
		}
		key := strconv.Itoa(row.code)
		switch {
		case strings.HasPrefix(row.name, "capsule's"):
			key = "the capsule's own code"
		case row.code > 128 && row.code < 128+65:
			key = "128+N"
		}
		if !table[key] {
			t.Errorf("%s: exit %d is not in docs/cli.md's table (as %q)", row.name, row.code, key)
		}
		met[key] = true
	}
	for code := range table {
		if !met[code] {
			t.Errorf("docs/cli.md's table lists exit %q, which no row here meets", code)
		}
	}
}

// TestRoughEdges drives each smoothed edge through roostctl, as the operator who found it.
func TestRoughEdges(t *testing.T) {
	d := newDaemon(t)
	ended := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "brief", "true", "")))
	d.ok("wait", ended)

	// Stop and kill agree: an ended session is where both would take it.
	for _, verb := range []string{"stop", "kill"} {
		res := d.ctl(verb, ended)
		if res.code != 0 || !strings.Contains(res.stdout, ended) {
			t.Errorf("%s of an ended session: %+v", verb, res)
		}
	}
	// A failure names the session once, not once from roostctl and once from roostd.
	res := d.ctl("pause", ended)
	if res.code != 1 || strings.Count(res.stderr, ended) != 1 {
		t.Errorf("pause of an ended session: %+v", res)
	}
	// rm of a live session says how to remove it anyway.
	live := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "sleeper", "sleep 60", "")))
	res = d.ctl("rm", live)
	if res.code != 1 || !strings.Contains(res.stderr, "rm -f") {
		t.Errorf("rm of a live session: %+v", res)
	}
	d.ok("rm", "-f", live)

	// run --json: the record on stdout, nothing else anywhere.
	res = d.ctl("run", "--json", capsule(t, "noisy", "echo out; echo err >&2; exit 3", ""))
	if res.code != 3 || res.stderr != "" || !strings.Contains(res.stdout, `"exit_code": 3`) {
		t.Errorf("run --json: %+v", res)
	}
	res = d.ctl("run", "--json", "--deadline", "1s", capsule(t, "slow", "sleep 30", ""))
	if res.code != 124 || res.stderr != "" {
		t.Errorf("run --json past its deadline: %+v", res)
	}

	// The machine ceiling in words, and "none" to lift it.
	if out := d.ok("spend", "set-limit", "5000"); !strings.Contains(out, "5000 tokens per UTC day (was no limit)") {
		t.Errorf("set-limit 5000: %q", out)
	}
	if out := d.ok("spend", "set-limit", "none"); !strings.Contains(out, "no limit (was 5000 tokens per UTC day)") {
		t.Errorf("set-limit none: %q", out)
	}
	if res := d.ctl("spend", "set-limit", "-1"); res.code != 2 || !strings.Contains(res.stderr, "cannot be negative") {
		t.Errorf("set-limit -1: %+v", res)
	}

	// inspect keeps its columns for a multi-line script.
	multi := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "multi", "echo one\necho two", "")))
	d.ok("wait", multi)
	for _, line := range strings.Split(strings.TrimRight(d.ok("inspect", multi), "\n"), "\n") {
		if !strings.Contains(line, ":") {
			t.Errorf("inspect: a line outside its columns: %q", line)
		}
	}
}

// TestRunCtrlCRecordsWhy: a Ctrl-C on run is recorded as the interrupt it was, not as a
// roostctl stop nobody typed.
func TestRunCtrlCRecordsWhy(t *testing.T) {
	d := newDaemon(t)
	cmd := exec.Command(filepath.Join(binDir, "roostctl"), "run", capsule(t, "patient", "echo waiting; sleep 30", ""))
	cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "waiting\n" {
		t.Fatalf("first line %q", line)
	}
	cmd.Process.Signal(os.Interrupt)
	cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		list := d.ps()
		if len(list) == 1 && list[0].State == "exited" {
			if !strings.Contains(list[0].Detail, "interrupted (SIGINT to roostctl run)") || strings.Contains(list[0].Detail, "roostctl stop") {
				t.Fatalf("detail after Ctrl-C: %q", list[0].Detail)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("session after Ctrl-C: %+v", list)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCompletion asks roostctl for completions as bash's script does (cobra's __complete):
// session names and ids come from roostd, capsules from its store and the directory.
func TestCompletion(t *testing.T) {
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "--detach", "--name", "webby", capsule(t, "sleeper", "sleep 60", "")))
	d.ok("push", "examples/worker")
	out := d.ok("__complete", "logs", "")
	if !strings.Contains(out, "webby\tsleeper running") || !strings.Contains(out, id+"\tsleeper running") {
		t.Errorf("completing a SESSION:\n%s", out)
	}
	if out := d.ok("__complete", "inspect", "web"); strings.Contains(out, id) || !strings.Contains(out, "webby") {
		t.Errorf("completing a SESSION from \"web\":\n%s", out)
	}
	out = d.ok("__complete", "run", "examples/h")
	if !strings.Contains(out, "examples/hello\tcapsule") {
		t.Errorf("completing a CAPSULE directory:\n%s", out)
	}
	if out := d.ok("__complete", "run", "work"); !strings.Contains(out, "worker@0.1.0") {
		t.Errorf("completing a pushed CAPSULE:\n%s", out)
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if out := d.ok("completion", shell); !strings.Contains(out, "__complete") {
			t.Errorf("completion %s: no script:\n%.300s", shell, out)
		}
	}
}

// TestTemplates reads sessions of a real daemon through inspect -f and ps --format: the keys
// are inspect --json's, a field a session has not reached yet prints as nothing, and a key
// that is no field fails naming it.
func TestTemplates(t *testing.T) {
	d := newDaemon(t)
	if res := d.ctl("run", "--name", "three", capsule(t, "three", "exit 3", "")); res.code != 3 {
		t.Fatalf("run: exit %d, stderr %q", res.code, res.stderr)
	}
	live := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "sleeper", "sleep 60", "")))
	for args, want := range map[string]string{
		"inspect -f {{.state}}/{{.exit_code}}/{{.capsule.name}} three":       "exited/3/three\n",
		"inspect --format {{.state}}/{{.exit_code}} " + live:                 "running/\n",
		"ps --filter status=exited --format {{.name}}":                       "three\n",
		"ps --filter status=running,state=exited --format {{.capsule.name}}": "sleeper\nthree\n",
	} {
		if got := d.ok(strings.Fields(args)...); got != want {
			t.Errorf("roostctl %s printed %q, want %q", args, got, want)
		}
	}
	for _, args := range [][]string{{"ps", "--format", "{{.nmae}}"}, {"inspect", "-f", "{{.capsule.nmae}}", "three"}} {
		if res := d.ctl(args...); res.code != 2 || !strings.Contains(res.stderr, `"nmae"`) || res.stdout != "" {
			t.Errorf("roostctl %q: exit %d, stdout %q, stderr %q; want exit 2 naming nmae", args, res.code, res.stdout, res.stderr)
		}
	}
	d.ok("kill", live)

	// logs --json: every line of either stream an object, the last one though no newline
	// ended it.
	d.ok("run", "--name", "talker", capsule(t, "talker", `printf 'a\nb\n'; printf c >&2`, ""))
	lines := strings.Split(strings.TrimSuffix(d.ok("logs", "--json", "talker"), "\n"), "\n")
	var got []string
	for _, l := range lines {
		var obj struct{ Stream, Time, Line string }
		if err := json.Unmarshal([]byte(l), &obj); err != nil || obj.Time == "" {
			t.Fatalf("logs --json line %q: %v, or no time", l, err)
		}
		got = append(got, obj.Stream+":"+obj.Line)
	}
	slices.Sort(got)
	if want := []string{"stderr:c", "stdout:a", "stdout:b"}; !slices.Equal(got, want) {
		t.Errorf("logs --json: %q, want %q", got, want)
	}
}
