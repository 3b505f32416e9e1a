package records

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The program's output, as roost-init keeps it in the records directory. Each stream is
// held to the session's resources.log_max_bytes:
//
//	stdout.log          the head: the stream's first bytes (an eighth of the cap, at most
//	                    1 MiB), so how the program started is never lost
//	stdout.tail.<N>     the newest bytes, in up to four segments of a quarter of the rest;
//	                    N is the stream offset of the segment's first byte. The oldest
//	                    segment goes when a fifth begins.
//	stdout.log.times, stdout.tail.<N>.times
//	                    each file's time index: when its bytes were written (see
//	                    TimesFile); it shares its file's part of the cap
//	stderr.log, stderr.tail.<N>   the same for stderr
//	logs.json           what each stream wrote and what was dropped (LogStats)
//
// A stream that never outgrows its head is stdout.log alone, byte for byte, as records
// from before the cap are. Bytes missing between one file's end and the next file's offset
// were dropped; readers mark the cut there.
const (
	// LogsFile holds LogStats: updated at most every second while the program runs, at
	// once when a stream is first cut, and for the last time before exit.json.
	LogsFile = "logs.json"

	StdoutStream = "stdout"
	StderrStream = "stderr"

	// DefaultLogMaxBytes is resources.log_max_bytes for a spec that names none; it matches
	// the manifest's default.
	DefaultLogMaxBytes = 64 << 20

	maxHeadBytes = 1 << 20
	tailSegments = 4
	tailInfix    = ".tail."
)

// LogStats is what roost-init counted of the program's output.
type LogStats struct {
	// MaxBytes is the cap each stream was held to (resources.log_max_bytes).
	MaxBytes int64       `json:"max_bytes"`
	Stdout   StreamStats `json:"stdout"`
	Stderr   StreamStats `json:"stderr"`
	// Final is set once both streams are drained: the counts no longer change.
	Final bool `json:"final,omitempty"`
	// Cap names MaxBytes's bound when it is not resources.log_max_bytes itself (a detached
	// exec's share of it), for the marker of a cut.
	Cap       string    `json:"cap,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// StreamStats counts one output stream.
type StreamStats struct {
	// WrittenBytes is every byte the program (and whatever shared its output) wrote.
	WrittenBytes int64 `json:"written_bytes"`
	// DroppedBytes is what of it the records no longer hold: cut by the cap, or lost to a
	// failed write (FailedBytes of them).
	DroppedBytes int64 `json:"dropped_bytes"`
	FailedBytes  int64 `json:"failed_bytes,omitempty"`
	// WriteError is the last write that failed (a full disk, say).
	WriteError string `json:"write_error,omitempty"`
	// CutAt is when the first byte was dropped.
	CutAt time.Time `json:"cut_at,omitzero"`
}

// KeptBytes is what the records hold of the stream.
func (s StreamStats) KeptBytes() int64 { return s.WrittenBytes - s.DroppedBytes }

// Stream returns the counts of stdout or stderr; nil for another name.
func (s *LogStats) Stream(name string) *StreamStats {
	switch name {
	case StdoutStream:
		return &s.Stdout
	case StderrStream:
		return &s.Stderr
	}
	return nil
}

// ReadLogStats reads a session's logs.json; fs.ErrNotExist for records from before it.
func ReadLogStats(recordsDir string) (LogStats, error) {
	var st LogStats
	return st, ReadJSON(filepath.Join(recordsDir, LogsFile), &st)
}

// LogFile is one file of an output stream in the records directory.
type LogFile struct {
	Name string
	// Offset is where in the stream the file's first byte was written.
	Offset int64
}

// HeadFile is the name of a stream's first file: stdout.log, stderr.log.
func HeadFile(stream string) string { return stream + ".log" }

// TailFile names a stream's tail segment that begins at offset.
func TailFile(stream string, offset int64) string {
	return stream + tailInfix + strconv.FormatInt(offset, 10)
}

// LogFiles lists a stream's files in the records directory in stream order: the head, then
// the tail segments. Empty when the stream has none yet.
func LogFiles(recordsDir, stream string) ([]LogFile, error) {
	entries, err := os.ReadDir(recordsDir)
	if err != nil {
		return nil, err
	}
	var out []LogFile
	prefix := stream + tailInfix
	for _, e := range entries {
		name := e.Name()
		if name == HeadFile(stream) {
			out = append(out, LogFile{Name: name})
			continue
		}
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		if off, err := strconv.ParseInt(rest, 10, 64); err == nil && off >= 0 && rest == strconv.FormatInt(off, 10) {
			out = append(out, LogFile{Name: name, Offset: off})
		}
	}
	// The head sorts first: it begins the stream, and at offset 0 it precedes a segment
	// that would begin there too (a cap with no head).
	slices.SortStableFunc(out, func(a, b LogFile) int {
		if a.Offset != b.Offset {
			return compare(a.Offset, b.Offset)
		}
		return compare(tailRank(a, stream), tailRank(b, stream))
	})
	return out, nil
}

func tailRank(f LogFile, stream string) int64 {
	if f.Name == HeadFile(stream) {
		return 0
	}
	return 1
}

func compare(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Layout is how a stream's cap divides: the head, and the tail's segments.
type Layout struct {
	Head     int64
	Segment  int64
	Segments int
}

// LayoutFor divides a cap of maxBytes (DefaultLogMaxBytes when 0 or less).
func LayoutFor(maxBytes int64) Layout {
	if maxBytes <= 0 {
		maxBytes = DefaultLogMaxBytes
	}
	l := Layout{Head: min(maxBytes/8, maxHeadBytes), Segments: tailSegments}
	tail := maxBytes - l.Head
	l.Segment = tail / tailSegments
	if l.Segment == 0 {
		l.Segments, l.Segment = 1, tail
	}
	return l
}

// ReadJSON decodes the JSON file at path into v, never through a link.
func ReadJSON(path string, v any) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := json.NewDecoder(f).Decode(v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// ProcessRef identifies a running session's processes across daemon restarts. Start times
// (clock ticks since boot, from /proc/<pid>/stat) guard against a recycled pid.
type ProcessRef struct {
	InitPID   int       `json:"init_pid"`
	InitStart uint64    `json:"init_start"`
	PID       int       `json:"pid"`
	PIDStart  uint64    `json:"pid_start"`
	StartedAt time.Time `json:"started_at"`
}
