package session

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"roost.dev/roost/pkg/containment/roostinit"
)

// logDir lays out a records directory: files by name, and logs.json from stats when set.
func logDir(t *testing.T, files map[string]string, stats *roostinit.LogStats) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if stats != nil {
		data, _ := json.Marshal(stats)
		if err := os.WriteFile(filepath.Join(dir, roostinit.LogsFile), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// drainStream copies what a stream holds now.
func drainStream(t *testing.T, s *logStream) string {
	t.Helper()
	var b strings.Builder
	if _, err := s.copy(func(stream string, data []byte) error {
		if stream != s.name {
			t.Fatalf("sent as %s", stream)
		}
		b.Write(data)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func appendFile(t *testing.T, path, data string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
}

func TestLogsOldRecords(t *testing.T) {
	dir := logDir(t, map[string]string{"stdout.log": "a\nb\n", "stderr.log": "e"}, nil)
	if got := drainStream(t, newLogStream(dir, Stdout)); got != "a\nb\n" {
		t.Fatalf("stdout %q", got)
	}
	if got := drainStream(t, newLogStream(dir, Stderr)); got != "e" {
		t.Fatalf("stderr %q", got)
	}
	if got := drainStream(t, newLogStream(t.TempDir(), Stdout)); got != "" {
		t.Fatalf("no files: %q", got)
	}
}

func TestLogsHeadCutNewest(t *testing.T) {
	stats := &roostinit.LogStats{MaxBytes: 1000, Stdout: roostinit.StreamStats{WrittenBytes: 108, DroppedBytes: 95}}
	dir := logDir(t, map[string]string{"stdout.log": "head\n", "stdout.tail.100": "xx\nlast\n", "stderr.log": "hea", "stderr.tail.50": "tail\n"}, stats)
	want := "head\n--- roost: 95 bytes of stdout dropped here (resources.log_max_bytes 1000) ---\nxx\nlast\n"
	if got := drainStream(t, newLogStream(dir, Stdout)); got != want {
		t.Fatalf("stdout %q", got)
	}
	// The marker is a line of its own even when the head ends mid-line.
	if got := drainStream(t, newLogStream(dir, Stderr)); got != "hea\n--- roost: 47 bytes of stderr dropped here (resources.log_max_bytes 1000) ---\ntail\n" {
		t.Fatalf("stderr %q", got)
	}
	stats.Stdout.FailedBytes, stats.Stdout.WriteError = 95, "write stdout.tail.5: no space left on device"
	dir = logDir(t, map[string]string{"stdout.log": "head\n", "stdout.tail.100": "x\n"}, stats)
	if got := drainStream(t, newLogStream(dir, Stdout)); !strings.Contains(got, "(resources.log_max_bytes 1000; 95 bytes lost to failed writes: write stdout.tail.5: no space left on device) ---\nx\n") {
		t.Fatalf("stdout %q", got)
	}
}

// A follower keeps up with rotation: it finishes a file once a later one exists, and leaves
// a segment rotated away under it for the newest, marking what it skipped.
func TestLogsFollowRotation(t *testing.T) {
	dir := logDir(t, map[string]string{"stdout.log": "h\n"}, &roostinit.LogStats{MaxBytes: 64})
	s := newLogStream(dir, Stdout)
	defer s.close()
	if got := drainStream(t, s); got != "h\n" {
		t.Fatalf("first %q", got)
	}
	appendFile(t, filepath.Join(dir, "stdout.tail.2"), "ab")
	if got := drainStream(t, s); got != "ab" {
		t.Fatalf("second %q", got)
	}
	appendFile(t, filepath.Join(dir, "stdout.tail.2"), "cd\n")
	appendFile(t, filepath.Join(dir, "stdout.tail.7"), "ef")
	if got := drainStream(t, s); got != "cd\nef" {
		t.Fatalf("third %q", got)
	}
	// The writer runs ahead: tail.7 grows, is rotated away, newer segments follow.
	appendFile(t, filepath.Join(dir, "stdout.tail.7"), "gh")
	appendFile(t, filepath.Join(dir, "stdout.tail.11"), "ij")
	appendFile(t, filepath.Join(dir, "stdout.tail.13"), "kl\n")
	os.Remove(filepath.Join(dir, "stdout.tail.7"))
	want := "\n--- roost: 2 bytes of stdout dropped here (resources.log_max_bytes 64) ---\nijkl\n"
	if got := drainStream(t, s); got != want {
		t.Fatalf("after rotation %q, want %q", got, want)
	}
	if got := drainStream(t, s); got != "" {
		t.Fatalf("caught up, yet %q", got)
	}
}

// A session past its log_max_bytes: logs shows the head, the cut and the newest lines, the
// API counts what was written and dropped, and the cut is reported once however often it is
// checked.
func TestLogsCapThroughTheManager(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, `seq 1 200000; echo done >&2`, "capabilities:\n  resources:\n    log_max_bytes: 65536\n")})
	rec = waitEnd(t, m, rec.ID)
	out, errOut := logs(t, m, rec.ID)
	total := int64(len(seqText(200000)))
	if !strings.HasPrefix(out, "1\n2\n3\n") || !strings.HasSuffix(out, "\n200000\n") || errOut != "done\n" {
		t.Fatalf("stdout %.40q...%q, stderr %q", out, out[max(0, len(out)-20):], errOut)
	}
	if n := strings.Count(out, "--- roost: "); n != 1 || !strings.Contains(out, " bytes of stdout dropped here (resources.log_max_bytes 65536) ---\n") {
		t.Fatalf("%d markers", n)
	}
	p := rec.Proto()
	if p.GetStdout().GetWrittenBytes() != total || p.GetStdout().GetMaxBytes() != 65536 || p.GetStdout().GetDroppedBytes() < total-65536 ||
		p.GetStderr().GetWrittenBytes() != 5 || p.GetStderr().GetDroppedBytes() != 0 {
		t.Fatalf("stats %v %v", p.GetStdout(), p.GetStderr())
	}
	for range 3 {
		m.CheckLogCuts(rec.ID, rec.RecordsDir)
	}
	var details []string
	m.Events(context.Background(), 0, false, func(ev Event) error {
		if ev.Type == EventLimit && ev.SessionID == rec.ID {
			details = append(details, ev.Detail)
		}
		return nil
	})
	if len(details) != 1 || !strings.HasPrefix(details[0], "log_bytes: stdout past resources.log_max_bytes (65536)") {
		t.Fatalf("limit events %q", details)
	}
}

func seqText(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.String()
}
