package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// logLines parses roostd's output as JSON lines, one object each; any other line fails.
func logLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("roostd wrote a line that is not JSON: %q: %v", sc.Text(), err)
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := m[k]; !ok {
				t.Fatalf("a line without %q: %q", k, sc.Text())
			}
		}
		lines = append(lines, m)
	}
	return lines
}

// find returns the lines with msg about session id.
func find(lines []map[string]any, msg, id string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["msg"] == msg && l["session"] == id {
			out = append(out, l)
		}
	}
	return out
}

// roostd --log-format json: every line it writes, libcontainer's included, is one JSON
// object, and a session's life (staged, launched, ended) is there with its session, capsule
// and class; the configuration make install ships is accepted as it is.
func TestOpsJSONLogs(t *testing.T) {
	shipped := filepath.Join(repoRoot(), "deploy", "systemd", "roostd.yaml")
	d := newDaemon(t, "--log-format", "json", "--log-level", "debug", "--config", shipped)
	res := d.ctl("run", "examples/hello")
	if res.code != 0 {
		t.Fatalf("run examples/hello: %+v", res)
	}
	hello := d.ps()[0].ID
	sealed := strings.TrimSpace(d.ok("run", "-d", capsule(t, "sealed-three", "exit 3", "capabilities:\n  containment: sealed\n")))
	if res := d.ctl("wait", sealed); res.code != 3 {
		t.Fatalf("wait: %+v", res)
	}
	nostart := t.TempDir()
	os.WriteFile(filepath.Join(nostart, "capsule.yaml"), []byte("name: nostart\nversion: 0.1.0\nrun:\n  command: [no-such-program]\n"), 0o644)
	if res := d.ctl("run", nostart); res.code != 125 {
		t.Fatalf("run of a program that is not there: %+v", res)
	}
	list := d.ps()
	failed := list[len(list)-1].ID
	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("roostd after SIGTERM: %v", err)
	}
	lines := logLines(t, d.log.String())

	for _, c := range []struct {
		id, capsule, class, status string
		code                       float64
	}{
		{hello, "hello@0.1.0", "advisory", "ok", 0},
		{sealed, "sealed-three@0.1.0", "sealed", "error", 3},
	} {
		for _, msg := range []string{"session staged", "session launched", "session ended"} {
			got := find(lines, msg, c.id)
			if len(got) != 1 {
				t.Fatalf("%d %q lines for %s, want 1:\n%s", len(got), msg, c.id, d.log)
			}
			l := got[0]
			if l["level"] != "INFO" || l["capsule"] != c.capsule || l["class"] != c.class {
				t.Errorf("%s: %v", msg, l)
			}
			switch msg {
			case "session launched":
				if took, _ := l["took"].(string); took == "" {
					t.Errorf("launched without took: %v", l)
				}
			case "session ended":
				if l["status"] != c.status || l["exit_code"] != c.code || l["detail"] == "" {
					t.Errorf("ended: %v", l)
				}
			}
		}
	}
	if got := find(lines, "session launched", failed); len(got) != 0 {
		t.Errorf("a session that never started was logged launched: %v", got)
	}
	if got := find(lines, "session ended", failed); len(got) != 1 || got[0]["status"] != "start_failed" || got[0]["capsule"] != "nostart@0.1.0" ||
		got[0]["exit_code"] != nil || !strings.Contains(got[0]["detail"].(string), "no-such-program") {
		t.Errorf("the end of a session that never started: %v", got)
	}
	// libcontainer's own lines (logrus) come through the same handler, marked.
	libcontainer := 0
	for _, l := range lines {
		if l["component"] == "libcontainer" {
			libcontainer++
		}
	}
	if libcontainer == 0 {
		t.Error("no line of libcontainer's at debug level")
	}
	last := lines[len(lines)-1]
	if last["msg"] != "roostd stopped" || last["exit_code"] != float64(0) {
		t.Fatalf("the last line: %v", last)
	}
}

// A fatal error is said once, as the last line, in the chosen format; a usage error once,
// before any logger, with exit code 2.
func TestOpsFatalErrorOnce(t *testing.T) {
	out, err := exec.Command(filepath.Join(binDir, "roostd"), "--log-format", "json", "--state-dir", stateDir(t), "--socket", filepath.Join(t.TempDir(), "s"),
		"--metrics-addr", "", "--config", "/nonexistent/roostd.yaml").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("roostd with a missing config: %v\n%s", err, out)
	}
	lines := logLines(t, string(out))
	if n := strings.Count(string(out), "/nonexistent/roostd.yaml"); n != 1 {
		t.Fatalf("the error is said %d times:\n%s", n, out)
	}
	last := lines[len(lines)-1]
	if last["level"] != "ERROR" || last["msg"] != "roostd stopped" || !strings.Contains(last["err"].(string), "--config: open /nonexistent/roostd.yaml") || last["exit_code"] != float64(1) {
		t.Fatalf("the last line: %v", last)
	}

	out, err = exec.Command(filepath.Join(binDir, "roostd"), "--log-level", "loud").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || string(out) != "roostd: --log-level \"loud\": expected one of debug, info, warn, error\n" {
		t.Fatalf("a bad --log-level: %v %q", err, out)
	}
}
