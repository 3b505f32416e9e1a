package records

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// logDir lays out a records directory: files by name, and logs.json from stats when set.
func logDir(t *testing.T, files map[string]string, stats *LogStats) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if stats != nil {
		data, _ := json.Marshal(stats)
		if err := os.WriteFile(filepath.Join(dir, LogsFile), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// drainStream copies what a stream holds now.
func drainStream(t *testing.T, s *logStream) string {
	t.Helper()
	var b strings.Builder
	for _, c := range chunks(t, s) {
		b.Write(c.Data)
	}
	return b.String()
}

// chunks is what a stream sends of what it holds now, each chunk's offset checked: a
// marker's is -1, every other's the offset just past the bytes before it.
func chunks(t *testing.T, s *logStream) []LogChunk {
	t.Helper()
	var out []LogChunk
	next := int64(-1)
	if _, err := s.copy(func(c LogChunk) error {
		if c.Stream != s.name {
			t.Fatalf("sent as %s", c.Stream)
		}
		if c.Offset >= 0 {
			if next >= 0 && c.Offset < next {
				t.Fatalf("chunk at %d after one that ended at %d", c.Offset, next)
			}
			next = c.Offset + int64(len(c.Data))
		} else if !strings.Contains(string(c.Data), "--- roost: ") || !c.Time.IsZero() {
			t.Fatalf("chunk %+v at -1 is not a marker", c)
		}
		out = append(out, LogChunk{Stream: c.Stream, Data: slices.Clone(c.Data), Offset: c.Offset, Time: c.Time})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
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
	stats := &LogStats{MaxBytes: 1000, Stdout: StreamStats{WrittenBytes: 108, DroppedBytes: 95}}
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
	dir := logDir(t, map[string]string{"stdout.log": "h\n"}, &LogStats{MaxBytes: 64})
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

// index encodes a time index: pairs of offset and time (unix milliseconds, for short
// tests).
func index(pairs ...int64) string {
	var b []byte
	for i := 0; i+1 < len(pairs); i += 2 {
		b = binary.LittleEndian.AppendUint64(b, uint64(pairs[i]))
		b = binary.LittleEndian.AppendUint64(b, uint64(pairs[i+1]*int64(time.Millisecond)))
	}
	return string(b)
}

func ms(n int64) time.Time { return time.UnixMilli(n) }

// timedStream is a stream over a records directory, with options.
func timedStream(dir string, timestamps bool, since time.Time, from int64) *logStream {
	s := newLogStream(dir, Stdout)
	s.timestamps, s.from, s.pos = timestamps, from, from
	if !since.IsZero() {
		s.since = since.UnixNano()
	}
	return s
}

type piece struct {
	data string
	off  int64
	at   int64 // unix milliseconds; 0 for none
}

func pieces(cs []LogChunk) []piece {
	var out []piece
	for _, c := range cs {
		p := piece{data: string(c.Data), off: c.Offset}
		if !c.Time.IsZero() {
			p.at = c.Time.UnixMilli()
		}
		out = append(out, p)
	}
	return out
}

// A head and a segment after a cut, both timed: the head's lines at 1000 and 1005 ms, the
// segment's at 2000 and 2100 (a read of two lines, then one).
func timedDir(t *testing.T) string {
	stats := &LogStats{MaxBytes: 1000, Stdout: StreamStats{WrittenBytes: 120, DroppedBytes: 100}}
	return logDir(t, map[string]string{
		"stdout.log":            "one\ntwo\n",
		"stdout.log.times":      index(0, 1000, 4, 1005),
		"stdout.tail.108":       "x\nthree\nfour",
		"stdout.tail.108.times": index(108, 2000, 116, 2100),
	}, stats)
}

// With timestamps each chunk is what one entry times, with its time; offsets say where each
// begins; without them chunks are not split, yet offsets are there.
func TestLogsTimestamps(t *testing.T) {
	dir := timedDir(t)
	marker := "--- roost: 100 bytes of stdout dropped here (resources.log_max_bytes 1000) ---\n"
	got := pieces(chunks(t, timedStream(dir, true, time.Time{}, 0)))
	want := []piece{{"one\n", 0, 1000}, {"two\n", 4, 1005}, {marker, -1, 0}, {"x\nthree\n", 108, 2000}, {"four", 116, 2100}}
	if !slices.Equal(got, want) {
		t.Fatalf("timestamps:\n%+v\nwant\n%+v", got, want)
	}
	got = pieces(chunks(t, timedStream(dir, false, time.Time{}, 0)))
	want = []piece{{"one\ntwo\n", 0, 0}, {marker, -1, 0}, {"x\nthree\nfour", 108, 0}}
	if !slices.Equal(got, want) {
		t.Fatalf("without timestamps:\n%+v\nwant\n%+v", got, want)
	}
	// Records from before times: offsets, no times.
	old := logDir(t, map[string]string{"stdout.log": "a\nb\n"}, nil)
	if got := pieces(chunks(t, timedStream(old, true, time.Time{}, 0))); !slices.Equal(got, []piece{{"a\nb\n", 0, 0}}) {
		t.Fatalf("old records: %+v", got)
	}
}

// since skips what was written before it, a cut with it when the bytes after the cut are
// before it too; the first byte at or after it and everything later is sent.
func TestLogsSince(t *testing.T) {
	dir := timedDir(t)
	marker := "--- roost: 100 bytes of stdout dropped here (resources.log_max_bytes 1000) ---\n"
	for _, c := range []struct {
		since int64
		want  string
	}{
		{0, "one\ntwo\n" + marker + "x\nthree\nfour"},
		{1000, "one\ntwo\n" + marker + "x\nthree\nfour"},
		{1001, "two\n" + marker + "x\nthree\nfour"},
		// The cut's bytes were written after the head's last and before the segment's first:
		// they may be after since, so the marker stays.
		{1500, marker + "x\nthree\nfour"},
		{2000, marker + "x\nthree\nfour"},
		{2001, "four"},
		{3000, ""},
	} {
		var since time.Time
		if c.since != 0 {
			since = ms(c.since)
		}
		for _, ts := range []bool{false, true} {
			if got := drainStream(t, timedStream(dir, ts, since, 0)); got != c.want {
				t.Errorf("since %d (timestamps %v): %q, want %q", c.since, ts, got, c.want)
			}
		}
	}
	// Without an index, a file's modification time is all there is: one last written before
	// since is skipped, any other sent whole.
	old := logDir(t, map[string]string{"stdout.log": "old\n", "stdout.tail.4": "new\n"}, nil)
	os.Chtimes(filepath.Join(old, "stdout.log"), ms(1000), ms(1000))
	os.Chtimes(filepath.Join(old, "stdout.tail.4"), ms(3000), ms(3000))
	if got := drainStream(t, timedStream(old, true, ms(2000), 0)); got != "new\n" {
		t.Fatalf("old records since: %q", got)
	}
}

// Resuming at an offset sends the bytes from there on, and marks only the cuts after it:
// one in the middle of what was missed counts only the bytes after the offset.
func TestLogsResumeOffsets(t *testing.T) {
	dir := timedDir(t)
	marker := func(n int) string {
		return fmt.Sprintf("--- roost: %d bytes of stdout dropped here (resources.log_max_bytes 1000) ---\n", n)
	}
	for _, c := range []struct {
		from int64
		want []piece
	}{
		{2, []piece{{"e\n", 2, 1000}, {"two\n", 4, 1005}, {marker(100), -1, 0}, {"x\nthree\n", 108, 2000}, {"four", 116, 2100}}},
		{8, []piece{{marker(100), -1, 0}, {"x\nthree\n", 108, 2000}, {"four", 116, 2100}}},
		// A follower that had the head and part of what the cap dropped since.
		{50, []piece{{marker(58), -1, 0}, {"x\nthree\n", 108, 2000}, {"four", 116, 2100}}},
		{108, []piece{{"x\nthree\n", 108, 2000}, {"four", 116, 2100}}},
		{110, []piece{{"three\n", 110, 2000}, {"four", 116, 2100}}},
		{120, nil},
	} {
		if got := pieces(chunks(t, timedStream(dir, true, time.Time{}, c.from))); !slices.Equal(got, c.want) {
			t.Errorf("from %d:\n%+v\nwant\n%+v", c.from, got, c.want)
		}
	}
	// Following from an offset: what is appended later comes once, from where it begins.
	s := timedStream(dir, false, time.Time{}, 117)
	if got := pieces(chunks(t, s)); !slices.Equal(got, []piece{{"our", 117, 0}}) {
		t.Fatalf("from 117: %+v", got)
	}
	appendFile(t, filepath.Join(dir, "stdout.tail.108"), "\nfive\n")
	if got := pieces(chunks(t, s)); !slices.Equal(got, []piece{{"\nfive\n", 120, 0}}) {
		t.Fatalf("appended: %+v", got)
	}
}

// tail counts lines back from the end of what is kept, across files.
func TestLogsTailStart(t *testing.T) {
	// "one\ntwo\n" at 0, "x\nthree\nfour" at 108: "x" is the end of a line the cut went
	// through, which begins where the head ends (so the marker is sent with it).
	dir := timedDir(t)
	for _, c := range []struct {
		n    int64
		want int64
	}{{0, 120}, {1, 116}, {2, 110}, {3, 8}, {4, 4}, {5, 0}, {100, 0}} {
		if got, end, err := tailStart(dir, Stdout, c.n); err != nil || got != c.want || end != 120 {
			t.Errorf("tail %d: %d, end %d (%v), want %d, end 120", c.n, got, end, err, c.want)
		}
	}
	// A newline that ends the stream ends its last line.
	dir = logDir(t, map[string]string{"stdout.log": "a\nb\nc\n"}, nil)
	for n, want := range []int64{6, 4, 2, 0, 0} {
		if got, _, _ := tailStart(dir, Stdout, int64(n)); got != want {
			t.Errorf("tail %d of a\nb\nc\n: %d, want %d", n, got, want)
		}
	}
	if got, _, _ := tailStart(t.TempDir(), Stdout, 3); got != 0 {
		t.Errorf("no files: %d", got)
	}
	// More than one read's worth.
	long := strings.Repeat("y", 3*logChunk) + "\n" + strings.Repeat("z", logChunk+5) + "\n"
	dir = logDir(t, map[string]string{"stdout.log": long}, nil)
	if got, _, _ := tailStart(dir, Stdout, 1); got != 3*logChunk+1 {
		t.Errorf("tail 1 of long lines: %d", got)
	}
}

// Through the manager, a real session: lines written apart are timed apart, within the
// session's run; tail, since and offsets select them.
// A tail without --follow is the last lines of what the stream held when asked: a line the
// program writes while they are sent is not among them. Both streams' tails are counted
// first, then sent in turn: a line reaching stderr while stdout's are sent comes too late.
