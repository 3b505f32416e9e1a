// Package containment holds a session's program: it probes what the host can deliver,
// decides each session's class, reports how every grant is enforced, and starts and
// re-attaches the program under roost-init, the small supervisor that outlives roostd and
// records how the program ended.
package containment

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"roost.dev/roost/pkg/manifest"
)

// Files roost-init and roostd keep in a session's records directory.
const (
	StdoutFile = "stdout.log"
	StderrFile = "stderr.log"
	// InitFile records the supervisor's and the program's process identities once the
	// program runs. A restarted roostd finds a live session through it.
	InitFile = "init.json"
	// ExitFile records how the program ended; written by roost-init, which outlives roostd.
	ExitFile = "exit.json"
)

// Spec is everything needed to start one session's program.
type Spec struct {
	SessionID string
	Class     manifest.Class
	// Argv is the command line; Argv[0] is an absolute path or a name looked up on the PATH
	// of Env.
	Argv []string
	Env  []string
	// Dir is the program's working directory.
	Dir        string
	RecordsDir string
	Rlimits    []Rlimit
}

// Rlimit is one resource limit applied to the program before it starts.
type Rlimit struct {
	// Name is the manifest key it comes from, e.g. "resources.max_open_files".
	Name     string
	Resource int
	Value    uint64
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

// ExitInfo is how a program ended, as roost-init recorded it.
type ExitInfo struct {
	PID int `json:"pid,omitempty"`
	// Code is the exit code when the program exited; Signal the signal number when a signal
	// ended it (Code is then 128+Signal).
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
	// StartError is set when the program never started (e.g. its command was not found).
	StartError string    `json:"start_error,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	EndedAt    time.Time `json:"ended_at"`
}

// ErrNoExitRecord means roost-init left no exit.json: it died without recording an end.
var ErrNoExitRecord = errors.New("no exit record")

// ReadExit reads a session's exit.json.
func ReadExit(recordsDir string) (ExitInfo, error) {
	var info ExitInfo
	err := readJSON(filepath.Join(recordsDir, ExitFile), &info)
	if errors.Is(err, fs.ErrNotExist) {
		return info, ErrNoExitRecord
	}
	return info, err
}

// ReadInit reads a session's init.json.
func ReadInit(recordsDir string) (ProcessRef, error) {
	var ref ProcessRef
	return ref, readJSON(filepath.Join(recordsDir, InitFile), &ref)
}

func readJSON(path string, v any) error {
	f, err := os.OpenFile(path, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// writeJSONDurably writes v to path so that a crash leaves either the old file or the whole
// new one: a temporary file, fsync, rename, fsync of the directory.
func writeJSONDurably(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|noFollow, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(data, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}
