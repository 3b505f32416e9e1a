package records

// Execs the exec allowlist refused: roost-init observes every execve and execveat of a scoped
// or sealed session's own processes (a seccomp listener; Landlock decides) and writes those it
// judges refused to RefusalsFile, one JSON line each; roostd turns them into trace records,
// events and a counter.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

const (
	// RefusalsFile holds ExecRefusal lines. roost-init coalesces repeats (the same path and
	// program is one line a second at most, with its count) and bounds the file
	// (MaxRefusalKeys distinct, MaxRefusalBytes in all): past either, what is refused is
	// only counted, in one marker line (More) written last.
	RefusalsFile = "exec_refused.jsonl"
	// RefusalsReportedFile is roostd's note of how far it has read RefusalsFile and what it
	// found (RefusalState): each line is reported once, across restarts too.
	RefusalsReportedFile = "exec_refused.reported"

	// MaxRefusalKeys bounds the distinct (path, program) pairs RefusalsFile names.
	MaxRefusalKeys = 1000
	// MaxRefusalBytes bounds RefusalsFile's lines, the marker apart.
	MaxRefusalBytes = 1 << 20
	// MaxRefusalField bounds each name a line carries (what the session chose to name).
	MaxRefusalField = 512
)

// Why an exec was refused, as ExecRefusal.Reason says it.
const (
	RefusedNotAllowed = "not on the allowlist"
	RefusedNoexec     = "noexec mount"
	RefusedAbsent     = "absent from the view"
)

// ExecRefusal is one line of RefusalsFile: an exec refused Count times since the previous
// line for the same path and program, or (More) the marker of those past the file's bounds.
type ExecRefusal struct {
	// Time is when the last of them was tried.
	Time time.Time `json:"time"`
	// Path is the file as the program named it (execve's path; execveat's, relative to its
	// directory descriptor); Resolved is where it led in the session's view.
	Path     string `json:"path,omitempty"`
	Resolved string `json:"resolved,omitempty"`
	Argv0    string `json:"argv0,omitempty"`
	// Program is the executable that tried (its /proc/<pid>/exe, else its comm); PID its
	// pid in the session's pid namespace (the first that tried, for a coalesced line).
	Program string `json:"program,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Interpreter, when set, is the #! interpreter of Path the allowlist refuses (the
	// script itself may be on it).
	Interpreter string `json:"interpreter,omitempty"`
	// Absent marks a system program (under /usr, /bin, /sbin or /lib*) missing from a
	// sealed root: a refusal only if the host has it, which roostd checks (KeepAbsent).
	Absent bool  `json:"absent,omitempty"`
	Count  int64 `json:"count,omitempty"`
	// More counts the refusals past the file's bounds, on its one marker line.
	More int64 `json:"more,omitempty"`
}

// Refusals is how many execs the line stands for.
func (r ExecRefusal) Refusals() int64 { return r.Count + r.More }

// KeepAbsent says whether a refusal marked Absent is one: the sealed root lacks what the
// host has as an executable file, because its view holds the allowlist's closure only. A
// name the host lacks too was a miss of a PATH search, no refusal.
func KeepAbsent(r ExecRefusal) bool {
	if !r.Absent {
		return true
	}
	if !filepath.IsAbs(r.Path) {
		return false
	}
	info, err := os.Stat(r.Path)
	return err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0
}

// RecentRefusals is how many of the newest refused paths RefusalState keeps.
const RecentRefusals = 5

// RefusalState is what roostd has read of a session's RefusalsFile (RefusalsReportedFile).
type RefusalState struct {
	// Offset is where the next unread line begins.
	Offset int64 `json:"offset"`
	// Count is every refusal reported (the absent ones the host lacks are none).
	Count int64 `json:"count"`
	// Recent are the newest distinct paths refused, newest last.
	Recent []string `json:"recent,omitempty"`
	// Events is how many of them were noted as events; TracedBytes what the trace holds of
	// them. Both are bounded (roostd's session journal), the count and the metric are not.
	Events      int   `json:"events,omitempty"`
	TracedBytes int64 `json:"traced_bytes,omitempty"`
	// Capped says the trace holds no more refusal records.
	Capped bool `json:"capped,omitempty"`
}

// Note adds one reported line to the state's count and recent paths.
func (s *RefusalState) Note(r ExecRefusal) {
	s.Count += r.Refusals()
	if r.Path == "" {
		return
	}
	for i, p := range s.Recent {
		if p == r.Path {
			s.Recent = append(s.Recent[:i], s.Recent[i+1:]...)
			break
		}
	}
	s.Recent = append(s.Recent, r.Path)
	if len(s.Recent) > RecentRefusals {
		s.Recent = s.Recent[len(s.Recent)-RecentRefusals:]
	}
}

// ReadRefusalState reads what roostd has reported of a session's refused execs: the zero
// state when it has reported none.
func ReadRefusalState(recordsDir string) (RefusalState, error) {
	var st RefusalState
	err := ReadJSON(filepath.Join(recordsDir, RefusalsReportedFile), &st)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	return st, err
}

// maxRefusalRead bounds what one NewRefusals reads: the file's bounds, and room for the
// marker and the longest line.
const maxRefusalRead = MaxRefusalBytes + 64<<10

// NewRefusals returns the lines of RefusalsFile past what state says was read, the state
// read, and mark, which saves the state given (the caller's, updated for the lines it
// reported): call it once they are reported, so that a crash in between reports them again
// rather than never. Only whole lines are returned; a line being written is read next time.
// Calls for one directory must not overlap.
func NewRefusals(recordsDir string) (lines []ExecRefusal, state RefusalState, mark func(RefusalState) error, err error) {
	// Most sessions have no refusals: one failed open is all they cost each tick.
	f, err := os.Open(filepath.Join(recordsDir, RefusalsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, state, nil, nil
	}
	if err != nil {
		return nil, state, nil, err
	}
	defer f.Close()
	if state, err = ReadRefusalState(recordsDir); err != nil {
		return nil, state, nil, err
	}
	buf := make([]byte, maxRefusalRead)
	n, err := f.ReadAt(buf, state.Offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, state, nil, err
	}
	data := buf[:n]
	end := bytes.LastIndexByte(data, '\n')
	if end < 0 {
		return nil, state, nil, nil
	}
	data = data[:end+1]
	for line := range strings.Lines(string(data)) {
		var r ExecRefusal
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			// roost-init writes each line whole; skip one that is not, rather than stall.
			continue
		}
		lines = append(lines, r)
	}
	offset := state.Offset + int64(len(data))
	path := filepath.Join(recordsDir, RefusalsReportedFile)
	return lines, state, func(st RefusalState) error {
		st.Offset = offset
		data, err := json.Marshal(st)
		if err != nil {
			return err
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			return fmt.Errorf("%s: %w", tmp, err)
		}
		return os.Rename(tmp, path)
	}, nil
}
