package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// A key that is no field of the record is an error naming it; a field the record leaves
// unset (a capsule, an exit code before the end) prints as nothing, not as an error.
func TestTemplateMissingKey(t *testing.T) {
	s := &roostv1.Session{Id: "ses_0190000000017000aaaabbbbcccc", State: "running"}
	for format, want := range map[string]string{
		"{{.state}}":                       "running\n",
		"{{.capsule.name}}|{{.exit_code}}": "|\n",
		"{{short .id}}":                    "aaaabbbbcccc\n",
	} {
		tmpl, err := sessionTemplate(format)
		if err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		var out bytes.Buffer
		if err := executeTemplate(&out, tmpl, []*roostv1.Session{s}, shortIDs([]*roostv1.Session{s})); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		if out.String() != want {
			t.Errorf("%s printed %q, want %q", format, out.String(), want)
		}
	}
	for _, format := range []string{"{{.nmae}}", "{{.capsule.nmae}}"} {
		tmpl, err := sessionTemplate(format)
		if err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		var out bytes.Buffer
		err = executeTemplate(&out, tmpl, []*roostv1.Session{s}, nil)
		if err == nil || !isUsage(err) || !strings.Contains(err.Error(), `"nmae"`) {
			t.Errorf("%s: error %v, want a usage error naming nmae", format, err)
		}
		if out.Len() != 0 {
			t.Errorf("%s printed %q before its error", format, out.String())
		}
	}
}

func TestFilterStatusIsState(t *testing.T) {
	f, err := parsePSFilters([]string{"status=exited", "state=running"})
	if err != nil {
		t.Fatal(err)
	}
	for state, want := range map[string]bool{"exited": true, "running": true, "staged": false} {
		if got := f.match(&roostv1.Session{State: state}); got != want {
			t.Errorf("status=exited,state=running matches %s: %v, want %v", state, got, want)
		}
	}
	if _, err := parsePSFilters([]string{"status=done"}); err == nil || !isUsage(err) || !strings.Contains(err.Error(), "status=done") {
		t.Errorf("status=done: %v, want a usage error naming it", err)
	}
}

// The own mistakes of run, wait and exec, which exit with a program's code, exit 125, never
// a code the program could have exited with; every other command's are 2. None of these
// reaches a daemon.
func TestUsageExitCodes(t *testing.T) {
	t.Setenv("ROOST_SOCKET", t.TempDir()+"/none.sock")
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"run", "--nope", "x"}, exitNoLaunch},
		{[]string{"run"}, exitNoLaunch},
		{[]string{"run", "--deadline", "0s", "x"}, exitNoLaunch},
		{[]string{"ps", "--nope"}, exitUsage},
		{[]string{"ps", "--format", "{{.nmae"}, exitUsage},
		{[]string{"inspect", "-f", "{{.state"}, exitUsage},
		{[]string{"inspect", "--json", "-f", "{{.state}}", "x"}, exitUsage},
		{[]string{"stage", "--nope", "x"}, exitUsage},
		{[]string{"wait"}, exitNoLaunch},
		{[]string{"wait", "--nope", "x"}, exitNoLaunch},
		{[]string{"exec", "x"}, exitNoLaunch},
		{[]string{"exec", "--nope", "x", "--", "ls"}, exitNoLaunch},
		{[]string{"exec", "-e", "NOEQUALS", "x", "--", "ls"}, exitNoLaunch},
		{[]string{"inspect"}, exitUsage},
		{[]string{"stop", "--grace", "-1s", "x"}, exitUsage},
		{[]string{"wait", "x"}, exitUnavailable},
		{[]string{"exec", "x", "--", "ls"}, exitUnavailable},
		{[]string{"--version"}, exitOK},
		{[]string{"files", "bogus"}, exitUsage},
		{[]string{"certs", "nope"}, exitUsage},
		{[]string{"files"}, exitOK},
		{[]string{"ps"}, exitUnavailable},
	} {
		if got := Execute(c.args); got != c.want {
			t.Errorf("roostctl %s: exit %d, want %d", strings.Join(c.args, " "), got, c.want)
		}
	}
}

// logs --json: one object per line of either stream, a line split across chunks whole, with
// the time of its first byte; a line the stream ends without a newline comes at the end.
func TestLogsJSONLines(t *testing.T) {
	var out bytes.Buffer
	p := &logPrinter{jsonOut: &out}
	at := func(sec int64) *timestamppb.Timestamp { return timestamppb.New(time.Unix(sec, 0).UTC()) }
	for _, r := range []*roostv1.LogsResponse{
		{Stream: "stdout", Data: []byte("one\ntw"), Time: at(1)},
		{Stream: "stderr", Data: []byte("err\xff\n"), Time: at(2)},
		{Stream: "stdout", Data: []byte("o\nthree"), Time: at(3)},
	} {
		if err := p.print(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.flushJSON(); err != nil {
		t.Fatal(err)
	}
	want := `{"stream":"stdout","time":"1970-01-01T00:00:01Z","line":"one"}
{"stream":"stderr","time":"1970-01-01T00:00:02Z","line":"err` + "\uFFFD" + `"}
{"stream":"stdout","time":"1970-01-01T00:00:01Z","line":"two"}
{"stream":"stdout","time":"1970-01-01T00:00:03Z","line":"three"}
`
	if out.String() != want {
		t.Errorf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
}

// A program that ended with 1 or 2 keeps its code through run, however it ended; only run's
// own errors become 125.
func TestRunCodeKeepsTheProgramsCode(t *testing.T) {
	one := int32(1)
	a := &app{}
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"terminated with 1", sessionExit(&roostv1.Session{Id: "ses_x", ExitStatus: "terminated", ExitCode: &one}), 1},
		{"error with 1", sessionExit(&roostv1.Session{Id: "ses_x", ExitStatus: "error", ExitCode: &one}), 1},
		{"run failed", errors.New("stream broke"), exitNoLaunch},
		{"usage", usageError{errors.New("--nope")}, exitNoLaunch},
		{"unreachable", status.Error(codes.Unavailable, "gone"), exitUnavailable},
	} {
		code, _ := a.classify(c.err)
		if got := runCode(c.err, code); got != c.want {
			t.Errorf("%s: run exits %d, want %d", c.name, got, c.want)
		}
	}
}
