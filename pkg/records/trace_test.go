package records

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// longTrace writes a trace of at least size bytes of egress records, then the given lines.
func longTrace(t testing.TB, size int, tail ...string) string {
	t.Helper()
	dir := t.TempDir()
	var b bytes.Buffer
	b.WriteString(`{"event_type":"session_start"}` + "\n")
	for b.Len() < size {
		b.WriteString(`{"event_type":"egress","host":"example.com","port":443,"decision":"allowed","bytes_out":1234}` + "\n")
	}
	for _, l := range tail {
		b.WriteString(l + "\n")
	}
	if err := os.WriteFile(filepath.Join(dir, TraceFile), b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func countEnds(t *testing.T, dir string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, TraceFile))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), `"event_type":"session_end"`)
}

// A session's end is written once: a daemon that ends a session again after a crash finds
// the end already there, even with an exec's end after it and a long trace before; a trace
// without one, however long, gets it.
func TestTraceEndWrittenOnce(t *testing.T) {
	ended := longTrace(t, 4*traceTail, `{"event_type":"session_end"}`, `{"event_type":"exec_end","exec_id":"x"}`)
	if err := AppendTrace(ended, Trace{EventType: "session_end"}); err != nil {
		t.Fatal(err)
	}
	if n := countEnds(t, ended); n != 1 {
		t.Errorf("a trace that had its end holds %d ends", n)
	}
	open := longTrace(t, 4*traceTail)
	if err := AppendTrace(open, Trace{EventType: "session_end"}); err != nil {
		t.Fatal(err)
	}
	if n := countEnds(t, open); n != 1 {
		t.Errorf("a long trace without its end holds %d ends after one was written", n)
	}
}

// What checking for an earlier end costs at the end of a session with a 16 MiB trace.
func BenchmarkTraceEnded(b *testing.B) {
	path := filepath.Join(longTrace(b, 16<<20), TraceFile)
	for b.Loop() {
		if traceEnded(path) {
			b.Fatal("no end was written")
		}
	}
}
