package containment_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
)

// Every exec the allowlist refuses is recorded by roost-init in the records directory
// (exec_refused.jsonl), observed through a seccomp listener on execve and execveat: what
// was named, the program that tried, how often. Landlock still decides.

// refusalsFile is roost-init's record of refused execs, as roostd reads it.
const refusalsFile = "exec_refused.jsonl"

// refusalLine is one line of refusalsFile, as a reader outside roost sees it.
type refusalLine struct {
	Path     string `json:"path"`
	Resolved string `json:"resolved"`
	Argv0    string `json:"argv0"`
	Program  string `json:"program"`
	PID      int    `json:"pid"`
	Reason   string `json:"reason"`
	Absent   bool   `json:"absent"`
	Count    int64  `json:"count"`
	More     int64  `json:"more"`
}

// readRefusals is every line of the session's refusalsFile; none when there is no file.
func readRefusals(t *testing.T, records string) ([]refusalLine, int64) {
	t.Helper()
	f, err := os.Open(filepath.Join(records, refusalsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	var out []refusalLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l refusalLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("a line of %s is not JSON: %v: %s", refusalsFile, err, sc.Text())
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out, st.Size()
}

// refusedCount sums the counts of the lines naming path (as the program named it).
func refusedCount(lines []refusalLine, path string) int64 {
	var n int64
	for _, l := range lines {
		if l.Path == path {
			n += l.Count
		}
	}
	return n
}

// shellProgram is what the sessions' /bin/sh is: the program that tries the execs.
func shellProgram(t *testing.T) string {
	t.Helper()
	p, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// expectRefusalOf fails unless lines record path refused for program, want times in all.
func expectRefusalOf(t *testing.T, class manifest.Class, lines []refusalLine, path, program string, want int64) {
	t.Helper()
	if got := refusedCount(lines, path); got != want {
		t.Fatalf("%s refused %d times in the records, want %d: %+v", path, got, want, lines)
	}
	for _, l := range lines {
		if l.Path != path {
			continue
		}
		if l.Program != program {
			t.Errorf("the refusal of %s names the program %q, want %q", path, l.Program, program)
		}
		if l.Argv0 == "" || l.PID <= 0 {
			t.Errorf("the refusal of %s lacks argv[0] or the pid: %+v", path, l)
		}
		// A sealed root cut down to the allowlist's closure has no /usr/bin/id at all.
		absent := class == manifest.Sealed && l.Absent && l.Reason == "absent from the view"
		if l.Reason != "not on the allowlist" && !absent {
			t.Errorf("the refusal of %s gives the reason %q", path, l.Reason)
		}
	}
}

func TestExecRefusalRecorded(t *testing.T) {
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			_, out, records, se := execAllowRunFor(t, class, "shell: {allow: [cat]}", execAllowCapsule(t, nil),
				[]string{"/bin/sh", "-c", "/usr/bin/id; exit 0"}, nil, 0)
			if se != nil {
				t.Fatalf("refused: %v", se)
			}
			if strings.Contains(out, "uid=") {
				t.Fatalf("id ran:\n%s", out)
			}
			lines, _ := readRefusals(t, records)
			expectRefusalOf(t, class, lines, "/usr/bin/id", shellProgram(t), 1)
			if l := lines[0]; class == manifest.Scoped && l.Resolved != "/usr/bin/id" {
				t.Errorf("resolved %q, want /usr/bin/id", l.Resolved)
			}
		})
	}
}

// A program trying the same thing again and again is one line with its count (or a few, a
// second apart), never a line per attempt.
func TestExecRefusalRepeatsCoalesce(t *testing.T) {
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			_, _, records, se := execAllowRunFor(t, class, "shell: {allow: []}", execAllowCapsule(t, nil),
				[]string{"/bin/sh", "-c", "i=0; while [ $i -lt 100 ]; do /usr/bin/id 2>/dev/null; i=$((i+1)); done; exit 0"}, nil, 0)
			if se != nil {
				t.Fatalf("refused: %v", se)
			}
			lines, _ := readRefusals(t, records)
			expectRefusalOf(t, class, lines, "/usr/bin/id", shellProgram(t), 100)
			if len(lines) > 3 {
				t.Errorf("%d lines for one refusal repeated: %+v", len(lines), lines)
			}
		})
	}
}

// A shell's PATH search tries each directory in turn: the names that do not exist there are
// no refusal; the one the allowlist refuses is.
func TestExecRefusalPathSearchMissesAreNotRefusals(t *testing.T) {
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			_, _, records, se := execAllowRunFor(t, class, "shell: {allow: []}", execAllowCapsule(t, nil),
				[]string{"/bin/sh", "-c", "id; exit 0"}, func(s *containment.Spec) {
					setPath(s, "/nonexistent/bin:/usr/local/sbin/nonexistent:/usr/bin")
				}, 0)
			if se != nil {
				t.Fatalf("refused: %v", se)
			}
			lines, _ := readRefusals(t, records)
			expectRefusalOf(t, class, lines, "/usr/bin/id", shellProgram(t), 1)
			for _, l := range lines {
				if l.Path == "/usr/bin/id" {
					continue
				}
				// A sealed session reports a missing system program as a candidate, for
				// roostd to keep only when the host has it.
				if class == manifest.Sealed && l.Absent && strings.HasPrefix(l.Path, "/usr/") {
					if _, err := os.Stat(l.Path); err == nil {
						t.Errorf("%s is on the host, yet recorded as absent", l.Path)
					}
					continue
				}
				t.Errorf("a name the PATH search did not find is recorded as refused: %+v", l)
			}
		})
	}
}

// What the allowlist lets run is not recorded; the refused exec beside it is.
func TestExecRefusalAllowedExecsUnrecorded(t *testing.T) {
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			info, out, records, se := execAllowRunFor(t, class, "shell: {allow: [id]}", execAllowCapsule(t, nil),
				[]string{"/bin/sh", "-c", "/usr/bin/id >/dev/null && /usr/bin/id -u && /usr/bin/cat /dev/null; exit 0"}, nil, 0)
			if se != nil {
				t.Fatalf("refused: %v", se)
			}
			if info.Code != 0 {
				t.Fatalf("exit %+v:\n%s", info, out)
			}
			lines, _ := readRefusals(t, records)
			expectRefusalOf(t, class, lines, "/usr/bin/cat", shellProgram(t), 1)
			for _, l := range lines {
				if l.Path != "/usr/bin/cat" {
					t.Errorf("recorded, though the allowlist holds it or it is the program: %+v", l)
				}
			}
		})
	}
}

// A hostile loop through 100,000 distinct names of a refused program (symlinks in its
// workdir, so the attempts are real refusals and not missing files) leaves a bounded file:
// at most the cap of distinct lines, then one marker counting the rest.
func TestHostileExecRefusalsCapped(t *testing.T) {
	const n = 100000
	script := `import os
n = ` + "100000" + `
for i in range(n):
    os.symlink("/usr/bin/id", "l%d" % i)
for i in range(n):
    try:
        os.execv("l%d" % i, ["id"])
    except OSError:
        pass
print("looped")
`
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			info, out, records, se := execAllowRunFor(t, class, "shell: {allow: [python3]}", execAllowCapsule(t, nil),
				[]string{"/usr/bin/python3", "-c", script}, nil, 3*time.Minute)
			if se != nil {
				t.Fatalf("refused: %v", se)
			}
			if info.Code != 0 || !strings.Contains(out, "looped") {
				t.Fatalf("exit %+v:\n%s", info, out)
			}
			lines, size := readRefusals(t, records)
			var counted, more int64
			markers := 0
			for _, l := range lines {
				counted += l.Count
				if l.More > 0 {
					markers++
					more += l.More
				}
			}
			t.Logf("%d lines, %d bytes; %d counted line by line, %d more", len(lines), size, counted, more)
			if len(lines) > 1001 {
				t.Errorf("%d lines: past the cap of 1000 distinct and one marker", len(lines))
			}
			if size > 1<<20 {
				t.Errorf("the file holds %d bytes: past 1 MiB", size)
			}
			if markers != 1 {
				t.Errorf("%d markers of refusals past the cap, want one", markers)
			}
			if counted+more != n {
				t.Errorf("%d refusals counted (%d + %d more), want %d", counted+more, counted, more, n)
			}
		})
	}
}
