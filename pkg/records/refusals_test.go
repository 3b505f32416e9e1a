package records

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// roostd reads each whole line of the refusals once, across restarts, and counts what it
// reported; a line still being written waits for the next read.
func TestNewRefusalsReadsEachLineOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, RefusalsFile)
	line := func(r ExecRefusal) []byte {
		data, _ := json.Marshal(r)
		return append(data, '\n')
	}
	data := append(line(ExecRefusal{Path: "/usr/bin/id", Program: "/usr/bin/dash", Reason: RefusedNotAllowed, Count: 3}),
		line(ExecRefusal{Path: "/usr/bin/cc", Program: "/usr/bin/make", Reason: RefusedNotAllowed, Count: 1})...)
	partial := []byte(`{"path":"/usr/bin/ld","co`)
	if err := os.WriteFile(path, append(data, partial...), 0o600); err != nil {
		t.Fatal(err)
	}
	lines, st, mark, err := NewRefusals(dir)
	if err != nil || len(lines) != 2 || st.Count != 0 {
		t.Fatalf("%+v %+v %v", lines, st, err)
	}
	for _, l := range lines {
		st.Note(l)
	}
	if err := mark(st); err != nil {
		t.Fatal(err)
	}
	if lines, _, mark, err := NewRefusals(dir); err != nil || len(lines) != 0 || mark != nil {
		t.Fatalf("read again: %+v %v", lines, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte(`unt":2}` + "\n"))
	f.Write(line(ExecRefusal{More: 7}))
	f.Close()
	lines, st, mark, err = NewRefusals(dir)
	if err != nil || len(lines) != 2 || lines[0].Path != "/usr/bin/ld" || lines[0].Count != 2 || lines[1].More != 7 {
		t.Fatalf("%+v %v", lines, err)
	}
	for _, l := range lines {
		st.Note(l)
	}
	if err := mark(st); err != nil {
		t.Fatal(err)
	}
	got, err := ReadRefusalState(dir)
	if err != nil || got.Count != 13 || len(got.Recent) != 3 || got.Recent[2] != "/usr/bin/ld" {
		t.Fatalf("state %+v %v", got, err)
	}
}

// A sealed root's missing system program is a refusal only where the host has it.
func TestKeepAbsent(t *testing.T) {
	for _, c := range []struct {
		r    ExecRefusal
		keep bool
	}{
		{ExecRefusal{Path: "/usr/bin/id", Reason: RefusedNotAllowed}, true},
		{ExecRefusal{Path: "/usr/bin/sh", Absent: true}, true},
		{ExecRefusal{Path: "/usr/bin/no-such-program-anywhere", Absent: true}, false},
		{ExecRefusal{Path: "/etc/passwd", Absent: true}, false},
		{ExecRefusal{Path: "/usr/bin", Absent: true}, false},
		{ExecRefusal{Path: "sh", Absent: true}, false},
	} {
		if got := KeepAbsent(c.r); got != c.keep {
			t.Errorf("%+v: kept %v", c.r, got)
		}
	}
}
