package roostinit

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseReport(t *testing.T) {
	good := []struct{ in, want string }{
		{`{"status":"crashed","detail":"wasm trap: wasm ` + "`unreachable`" + ` instruction executed"}` + "\n",
			`{"status":"crashed","detail":"wasm trap: wasm ` + "`unreachable`" + ` instruction executed"}`},
		{" {\n \"status\" : \"deadline_reached\" }\n\n", `{"status":"deadline_reached"}`},
		{`{}`, `{}`},
	}
	for _, c := range good {
		got, err := ParseReport([]byte(c.in))
		if err != nil || string(got) != c.want {
			t.Errorf("ParseReport(%q) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	bad := []string{
		"", "garbage", `"a string"`, `[{"status":"crashed"}]`, `null`, `42`,
		`{"status":"crashed"}{"status":"crashed"}`, `{"status":"crashed"`,
		`{"detail":"` + strings.Repeat("x", MaxOutcomeSize) + `"}`,
	}
	for _, in := range bad {
		if got, err := ParseReport([]byte(in)); err == nil {
			t.Errorf("ParseReport(%.40q) = %s, want an error", in, got)
		}
	}
}

func TestExitInfoOutcome(t *testing.T) {
	info := ExitInfo{Report: json.RawMessage(`{"status":"fuel_exhausted","detail":"wasm trap: all fuel consumed by WebAssembly","backtrace":"0: f","extra":1}`)}
	o, ok := info.Outcome()
	if !ok || o != (Outcome{Status: OutcomeFuelExhausted, Detail: "wasm trap: all fuel consumed by WebAssembly", Backtrace: "0: f"}) {
		t.Fatalf("Outcome() = %+v, %v", o, ok)
	}
	data, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	var back ExitInfo
	if err := json.Unmarshal(data, &back); err != nil || !bytes.Equal(back.Report, info.Report) {
		t.Fatalf("round trip: %s (%v)", back.Report, err)
	}
	if _, ok := (ExitInfo{}).Outcome(); ok {
		t.Fatal("an ExitInfo without a report has an Outcome")
	}
	if data, _ := json.Marshal(ExitInfo{}); bytes.Contains(data, []byte("report")) {
		t.Fatalf("an ExitInfo without a report marshals one: %s", data)
	}
}

func TestOutcomeEnv(t *testing.T) {
	env := []string{"PATH=/bin", OutcomeFDEnv + "=7", "ROOST_REPORT_FDX=1", OutcomeFDEnv + "=9"}
	if got, want := outcomeEnv(env, false), []string{"PATH=/bin", "ROOST_REPORT_FDX=1"}; !slices.Equal(got, want) {
		t.Errorf("without a report: %q, want %q", got, want)
	}
	if got, want := outcomeEnv(env, true), []string{"PATH=/bin", "ROOST_REPORT_FDX=1", OutcomeFDEnv + "=3"}; !slices.Equal(got, want) {
		t.Errorf("with a report: %q, want %q", got, want)
	}
	if OutcomeFD != execSpecFD {
		t.Fatal("the report pipe must take the spec pipe's number, free once roost-exec has read the spec")
	}
}

// readOutcome writes data on a fresh report pipe's child end from another goroutine (as the
// program would), closes it unless keepOpen, and returns what finish keeps, with roost-init's
// notes on stderr.
func readOutcome(t *testing.T, data []byte, keepOpen bool, grace time.Duration) (json.RawMessage, string) {
	t.Helper()
	o, err := newOutcomeReader()
	if err != nil {
		t.Fatal(err)
	}
	// The program's copy of the write end: roost-exec's, dup'ed from the child end.
	child, err := dupFile(o.childEnd())
	if err != nil {
		t.Fatal(err)
	}
	o.started()
	wrote := make(chan error, 1)
	go func() {
		_, err := child.Write(data)
		if !keepOpen {
			child.Close()
		}
		wrote <- err
	}()
	var rep json.RawMessage
	notes := captureStderr(t, func() { rep = o.finish(grace) })
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the program's write: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the program is blocked writing its report")
	}
	if keepOpen {
		child.Close()
	}
	return rep, notes
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), "child"), nil
}

// captureStderr runs f with os.Stderr sent to a pipe and returns what it wrote there.
func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	f()
	os.Stderr = saved
	w.Close()
	out, _ := io.ReadAll(r)
	r.Close()
	return string(out)
}

func TestOutcomeReaderKeepsOneObject(t *testing.T) {
	rep, notes := readOutcome(t, []byte(`{"status":"crashed", "detail":"wasm trap: x"}`+"\n"), false, time.Second)
	if string(rep) != `{"status":"crashed","detail":"wasm trap: x"}` || notes != "" {
		t.Fatalf("report %s, notes %q", rep, notes)
	}
}

func TestOutcomeReaderNothingWritten(t *testing.T) {
	rep, notes := readOutcome(t, nil, false, time.Second)
	if rep != nil || notes != "" {
		t.Fatalf("report %s, notes %q", rep, notes)
	}
}

func TestOutcomeReaderDropsGarbage(t *testing.T) {
	rep, notes := readOutcome(t, []byte("not json at all\n"), false, time.Second)
	if rep != nil || !strings.Contains(notes, "not one JSON object") || !strings.Contains(notes, "dropped") {
		t.Fatalf("report %s, notes %q", rep, notes)
	}
}

func TestOutcomeReaderDropsTooLong(t *testing.T) {
	// Far more than the pipe holds: the program must not block on it.
	big := []byte(`{"detail":"` + strings.Repeat("x", 1<<20) + `"}`)
	rep, notes := readOutcome(t, big, false, 5*time.Second)
	if rep != nil || !strings.Contains(notes, "longer than 16384 bytes") {
		t.Fatalf("report %.80s, notes %q", rep, notes)
	}
}

// A write end held past the program's end (by something roost-init does not reap) costs at
// most the grace; what was written by then is still kept.
func TestOutcomeReaderHeldOpen(t *testing.T) {
	start := time.Now()
	rep, notes := readOutcome(t, []byte(`{"status":"crashed"}`), true, 200*time.Millisecond)
	if time.Since(start) > 5*time.Second {
		t.Fatalf("finish waited %s", time.Since(start))
	}
	if string(rep) != `{"status":"crashed"}` || !strings.Contains(notes, "reading the program's report") {
		t.Fatalf("report %s, notes %q", rep, notes)
	}
}

func TestOutcomeReaderNil(t *testing.T) {
	var o *outcomeReader
	if o.childEnd() != nil {
		t.Fatal("a nil reader has a child end")
	}
	o.started()
	o.discard()
	if o.finish(time.Second) != nil {
		t.Fatal("a nil reader has a report")
	}
}
