package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/session"
)

func TestLogFlags(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil || o.logLevel != slog.LevelInfo || o.logFormat != "text" {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	o, err = parseFlags([]string{"--log-level", "debug", "--log-format", "json"})
	if err != nil || o.logLevel != slog.LevelDebug || o.logFormat != "json" {
		t.Fatalf("debug json: %+v %v", o, err)
	}
	for _, c := range []struct{ args []string }{
		{[]string{"--log-level", "verbose"}},
		{[]string{"--log-level", "INFO"}},
		{[]string{"--log-format", "xml"}},
	} {
		_, err := parseFlags(c.args)
		if err == nil || !strings.Contains(err.Error(), c.args[0]) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.args[0])
		}
	}
	// A usage error is said once, on stderr, and exits 2.
	if code := run([]string{"--log-format", "xml"}); code != 2 {
		t.Fatalf("run with a bad --log-format: exit %d", code)
	}
}

// jsonLines parses every line of out as one JSON object.
func jsonLines(t *testing.T, out []byte) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not a JSON line: %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	return lines
}

// libcontainer's logrus lines come out of roostd's own handler: same format, same level.
func TestLogrusBridge(t *testing.T) {
	defer func() {
		logrus.SetOutput(os.Stderr)
		logrus.SetFormatter(&logrus.TextFormatter{})
		logrus.SetLevel(logrus.InfoLevel)
		logrus.StandardLogger().ReplaceHooks(logrus.LevelHooks{})
	}()
	var buf bytes.Buffer
	log := newLogger(&buf, slog.LevelInfo, "json")
	logrus.Debug("below the level")
	logrus.WithField("pid", 42).WithError(errors.New("no such process")).Warn("signalling the container")
	logrus.Info("plain")
	log.Info("roostd's own")
	lines := jsonLines(t, buf.Bytes())
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), buf.String())
	}
	w := lines[0]
	if w["level"] != "WARN" || w["msg"] != "signalling the container" || w["component"] != "libcontainer" || w["pid"] != float64(42) || w["error"] != "no such process" {
		t.Fatalf("the warning: %v", w)
	}
	if lines[1]["level"] != "INFO" || lines[1]["msg"] != "plain" || lines[2]["component"] != nil {
		t.Fatalf("%v", lines)
	}

	// Text format and the error level: only errors pass, as key=value.
	buf.Reset()
	newLogger(&buf, slog.LevelError, "text")
	logrus.Warn("dropped")
	logrus.Error("kept")
	if out := buf.String(); strings.Contains(out, "dropped") || !strings.Contains(out, `level=ERROR msg=kept component=libcontainer`) {
		t.Fatalf("text at error: %q", out)
	}
	if logrus.GetLevel() != logrus.ErrorLevel {
		t.Fatalf("logrus level %s", logrus.GetLevel())
	}
}

func repoFile(parts ...string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(append([]string{filepath.Dir(file), "..", ".."}, parts...)...)
}

// The configuration make install puts in /etc/roost is one roostd accepts as it is (all
// comments: the defaults), and each example in it is valid once uncommented.
func TestShippedConfig(t *testing.T) {
	path := repoFile("deploy", "systemd", "roostd.yaml")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, config.Defaults()) {
		t.Fatalf("the shipped configuration is not the defaults: %+v", cfg)
	}
	if err := cfg.CheckSecrets(); err != nil {
		t.Fatal(err)
	}
	// Uncomment the examples: each is a block of '#' lines whose first names a top-level key
	// ("#inference:"), up to the next line without '#'. Their hook module must exist to be
	// accepted.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	module := filepath.Join(t.TempDir(), "policy.wasm")
	os.WriteFile(module, []byte("\x00asm\x01\x00\x00\x00"), 0o644)
	var out []string
	example := false
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "#") {
			example = false
		} else if len(line) > 1 && line[1] >= 'a' && line[1] <= 'z' {
			example = true
		}
		if example {
			line = strings.Replace(line[1:], "/etc/roost/hooks/policy.wasm", module, 1)
		}
		out = append(out, line)
	}
	examples, err := config.Parse([]byte(strings.Join(out, "\n")), "examples")
	if err != nil {
		t.Fatalf("the uncommented examples: %v\n%s", err, strings.Join(out, "\n"))
	}
	if len(examples.Inference.Upstreams) != 1 || len(examples.Hooks) != 1 || len(examples.Env.Passthrough) != 2 || examples.Egress.MaxConnectionsPerSession != 64 || len(examples.Sessions.HostPaths) != 1 {
		t.Fatalf("not every example was read: %+v", examples)
	}
}

func TestServingStatus(t *testing.T) {
	for _, c := range []struct {
		running, paused int
		want            string
	}{
		{0, 0, "serving; 0 running sessions"},
		{1, 0, "serving; 1 running session"},
		{3, 2, "serving; 3 running sessions, 2 paused"},
	} {
		if got := servingStatus(c.running, c.paused); got != c.want {
			t.Errorf("servingStatus(%d, %d) = %q", c.running, c.paused, got)
		}
	}
}

func TestWarmPoolCapsuleFlag(t *testing.T) {
	o, err := parseFlags([]string{"--warm-pool-capsule", "caps/a=2", "--warm-pool-capsule", "/x=y/b=1"})
	if err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	want := []session.WarmCapsule{{Dir: filepath.Join(wd, "caps/a"), Size: 2}, {Dir: "/x=y/b", Size: 1}}
	if !slices.Equal(o.warmCapsules, want) {
		t.Fatalf("parsed %+v, want %+v", o.warmCapsules, want)
	}
	for arg, says := range map[string]string{
		"caps/a":   "want DIR=N",
		"=2":       "want DIR=N",
		"caps/a=0": "want 1 or more",
		"caps/a=x": `"x" is not a number`,
		"caps/a=":  `"" is not a number`,
	} {
		_, err := parseFlags([]string{"--warm-pool-capsule", arg})
		if err == nil || !strings.Contains(err.Error(), "--warm-pool-capsule") || !strings.Contains(err.Error(), says) {
			t.Errorf("--warm-pool-capsule %s: %v, want an error naming the flag and saying %q", arg, err, says)
		}
	}
}

// A configuration error stops roostd at start with one line naming the file, the line and
// the key path, and exit code 1, before roostd touches its state directory.
func TestConfigErrorAtStart(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "roostd.yaml")
	if err := os.WriteFile(file, []byte("sessions:\n  allow_root: []\n  descriptor_per_session: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = stderr
	code := run([]string{"--config", file, "--state-dir", filepath.Join(dir, "state"), "--socket", filepath.Join(dir, "roostd.sock"), "--metrics-addr", "", "--log-format", "json"})
	os.Stderr = saved
	stderr.Close()
	out, _ := os.ReadFile(stderr.Name())
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	var errs []map[string]any
	for _, l := range jsonLines(t, out) {
		if l["level"] == "ERROR" {
			errs = append(errs, l)
		}
	}
	want := "--config: " + file + ":3: sessions.descriptor_per_session: unknown key (expected one of: allow_root, descriptors_per_session, host_paths, ids)"
	if len(errs) != 1 || errs[0]["err"] != want || errs[0]["exit_code"] != float64(1) {
		t.Fatalf("error lines %v, want one saying %q:\n%s", errs, want, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "state")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the state directory was made: %v", err)
	}
}
