package exec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/outcome"
)

// A detached exec (roostctl exec -d) runs on without a client. roostd holds its output's
// pipes and keeps what it writes in the session's records directory, in execs/<id>/: its
// record (RecordFile) and its two streams laid out as the session's own output is, each
// held to CapFor(resources.log_max_bytes). The command is roostd's child, as every exec is:
// it does not outlive the roostd that started it (see MarkLost).
const (
	// Dir holds the detached execs' records in a session's records directory.
	Dir = "execs"
	// RecordFile is one detached exec's Record, in its directory.
	RecordFile = "exec.json"

	// MaxLive is how many detached execs one session may run at once.
	MaxLive = 64
	// MaxEnded is how many ended detached execs a session's records keep; the oldest goes
	// when another ends past it.
	MaxEnded = 64
	// Slots is how many descriptors roostd holds for one detached exec at most: its two
	// output pipes, each stream's file and time index, and its directory.
	Slots = 7

	// minCap is the least each stream of a detached exec keeps.
	minCap = 64 << 10
	// drainGrace bounds the last read of a detached exec's output once it has ended.
	drainGrace = 2 * time.Second
)

// States of a detached exec.
const (
	Running = "running"
	Exited  = "exited"
	// Lost: roostd stopped or died while it ran, so its end was never seen.
	Lost = "lost"
)

// CapFor is what each stream of a detached exec keeps under a session's
// resources.log_max_bytes of logMax: a sixty-fourth of it, at least 64 KiB, never more than
// logMax. The session's 64 live execs together keep at most twice what its own stream does.
func CapFor(logMax int64) int64 {
	if logMax <= 0 {
		logMax = records.DefaultLogMaxBytes
	}
	return min(logMax, max(logMax/64, minCap))
}

// CapName names CapFor's bound in a cut's marker.
const CapName = "a detached exec's sixty-fourth of resources.log_max_bytes:"

// Record is a detached exec as RecordFile keeps it.
type Record struct {
	ID      string   `json:"id"`
	Command []string `json:"command"`
	TTY     bool     `json:"tty,omitempty"`
	PID     int      `json:"pid"`
	// PIDStart is the command's start time (clock ticks since boot), against a recycled pid.
	PIDStart  uint64    `json:"pid_start,omitempty"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// Code is its exit code (128+N for signal N); nil until it has ended, and when lost.
	Code   *int   `json:"code,omitempty"`
	Signal int    `json:"signal,omitempty"`
	Detail string `json:"detail,omitempty"`
	Lost   bool   `json:"lost,omitempty"`
}

// State is running, exited or lost, as the record says: a record without an end is
// running only while the roostd that started it holds it (see MarkLost).
func (r Record) State() string {
	switch {
	case r.Lost:
		return Lost
	case !r.EndedAt.IsZero():
		return Exited
	}
	return Running
}

// Detached is a detached exec this roostd runs.
type Detached struct {
	*Exec
	// Dir is its directory in the session's records.
	Dir string

	mu   sync.Mutex
	rec  Record
	done chan struct{}
	// why, when set, says who ended it, after its detail.
	why string
}

// Done is closed once it has ended and its end is recorded.
func (d *Detached) Done() <-chan struct{} { return d.done }

// Record is its record now.
func (d *Detached) Record() Record {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rec
}

var idPattern = regexp.MustCompile(`^exec_[0-9a-f]{12}$`)

// CheckID refuses what cannot be an exec's id, before it names a path.
func CheckID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("exec id %q: want exec_ and 12 hex digits, as exec -d printed it: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// StartDetached starts the command in t as Start does, bound to its session alone (not to
// ctx, which bounds the start), with an empty stdin, and keeps its output in its directory
// under the records, each stream held to CapFor(logMax). ended runs once its end is
// recorded.
func StartDetached(ctx context.Context, t Target, j Journal, log *slog.Logger, opts containment.ExecOptions, logMax int64, ended func(*Detached)) (*Detached, error) {
	opts.Stdin = false
	x, err := start(ctx, t, j, log, opts, nil)
	if err != nil {
		return nil, err
	}
	d := &Detached{Exec: x, Dir: filepath.Join(t.RecordsDir, Dir, x.ID), done: make(chan struct{})}
	d.rec = Record{ID: x.ID, Command: opts.Argv, TTY: x.Terminal != nil, PID: x.Pid, StartedAt: x.began}
	d.rec.PIDStart, _ = containment.StartTime(x.Pid)
	out, err := d.keep(logMax)
	if err != nil {
		_ = x.Kill()
		x.Wait()
		x.Close()
		return nil, fmt.Errorf("session %s: keeping %s's output: %w", t.Session, x.ID, err)
	}
	go func() {
		code, detail := x.Wait()
		info, _ := x.Execution.Wait()
		out.Finish(drainGrace)
		// Finish closed the output's pipes; what else roostd held of the command goes now.
		x.Close()
		d.mu.Lock()
		if d.why != "" {
			detail += " (" + d.why + ")"
		}
		d.rec.EndedAt, d.rec.Code, d.rec.Detail = time.Now().UTC(), &code, detail
		if info.Signal != 0 {
			d.rec.Signal = info.Signal
		}
		if err := writeRecord(d.Dir, d.rec); err != nil {
			log.Warn("recording a detached exec's end", "session", t.Session, "exec", x.ID, "err", err)
		}
		d.mu.Unlock()
		close(d.done)
		ended(d)
	}()
	return d, nil
}

// keep makes the exec's directory and record and starts keeping its output there.
func (d *Detached) keep(logMax int64) (*roostinit.Output, error) {
	if err := os.MkdirAll(filepath.Dir(d.Dir), 0o700); err != nil {
		return nil, err
	}
	if err := os.Mkdir(d.Dir, 0o700); err != nil {
		return nil, err
	}
	if err := writeRecord(d.Dir, d.rec); err != nil {
		return nil, err
	}
	stdout, stderr := d.Stdout, d.Stderr
	if d.Terminal != nil {
		stdout, stderr = d.Terminal, nil
	}
	so, _ := stdout.(*os.File)
	var se *os.File
	if stderr != nil {
		se, _ = stderr.(*os.File)
	}
	if so == nil || (stderr != nil && se == nil) {
		return nil, errors.New("the command's output is not a pipe roostd can keep")
	}
	return roostinit.KeepOutput(d.Dir, CapFor(logMax), CapName, so, se)
}

// Signal sends sig to the command; a command that has ended is not signalled.
func (d *Detached) Signal(sig syscall.Signal) error {
	select {
	case <-d.done:
		return nil
	default:
	}
	if err := d.Execution.Signal(sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// End kills the command, its record's detail saying why.
func (d *Detached) End(why string) error {
	d.mu.Lock()
	d.why = why
	d.mu.Unlock()
	return d.Signal(syscall.SIGKILL)
}

// writeRecord replaces dir's RecordFile with rec, whole or not at all.
func writeRecord(dir string, rec Record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, RecordFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, RecordFile))
}

// ReadRecord reads the record of the detached exec id in the records directory recordsDir:
// errdefs.ErrNotFound when there is none.
func ReadRecord(recordsDir, session, id string) (Record, error) {
	if err := CheckID(id); err != nil {
		return Record{}, err
	}
	var rec Record
	err := records.ReadJSON(filepath.Join(recordsDir, Dir, id, RecordFile), &rec)
	if errors.Is(err, fs.ErrNotExist) {
		return rec, fmt.Errorf("session %s has no detached exec %s (only those started with exec -d are kept): %w", session, id, errdefs.ErrNotFound)
	}
	return rec, err
}

// ReadRecords reads every detached exec's record in recordsDir, oldest start first. A
// directory without a readable record (one being made, one half removed) is skipped.
func ReadRecords(recordsDir string) ([]Record, error) {
	entries, err := os.ReadDir(filepath.Join(recordsDir, Dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, e := range entries {
		if !e.IsDir() || !idPattern.MatchString(e.Name()) {
			continue
		}
		var rec Record
		if records.ReadJSON(filepath.Join(recordsDir, Dir, e.Name(), RecordFile), &rec) == nil && rec.ID == e.Name() {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b Record) int { return a.StartedAt.Compare(b.StartedAt) })
	return out, nil
}

// MarkLost records that the detached exec rec, which has no end, was lost: no roostd holds
// it (the one that started it stopped or died), so its end will never be seen. What is left
// of its command, if its pid still names it, is killed: nothing reads its output any more.
func MarkLost(recordsDir string, rec Record) Record {
	if rec.PID > 0 && rec.PIDStart != 0 {
		if st, err := containment.StartTime(rec.PID); err == nil && st == rec.PIDStart {
			_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
			_ = syscall.Kill(rec.PID, syscall.SIGKILL)
		}
	}
	rec.Lost = true
	rec.Detail = "lost: roostd stopped while it ran, so its end is not known (what it wrote until then is kept)"
	_ = writeRecord(filepath.Join(recordsDir, Dir, rec.ID), rec)
	return rec
}

// Prune removes the records of the oldest ended detached execs in recordsDir past the
// MaxEnded newest.
func Prune(recordsDir string, recs []Record) {
	var ended []Record
	for _, r := range recs {
		if r.State() != Running {
			ended = append(ended, r)
		}
	}
	for _, r := range ended[:max(len(ended)-MaxEnded, 0)] {
		_ = os.RemoveAll(filepath.Join(recordsDir, Dir, r.ID))
	}
}

// Stats reads what the exec's records count of its output; nil when they count nothing.
func Stats(recordsDir, id string) *records.LogStats {
	st, err := records.ReadLogStats(filepath.Join(recordsDir, Dir, id))
	if err != nil {
		return nil
	}
	return &st
}

// EndDetail is how a detached exec ended, for its ExecExit: a lost one's code is 255.
func EndDetail(rec Record) (int, string) {
	if rec.Code == nil {
		return 255, rec.Detail
	}
	return *rec.Code, rec.Detail
}

// SignalName is the signal that ended rec ("SIGKILL"); empty when none did.
func SignalName(rec Record) string {
	if rec.Signal == 0 {
		return ""
	}
	return outcome.SignalName(syscall.Signal(rec.Signal))
}
