package delegate

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
)

// What a session's proxy carried is checkpointed outside its trace (records.EgressFile):
// the trace stops at its cap, and a count rebuilt from it alone would let a session past
// resources.egress_max_bytes after every restart. A restart takes the larger of the
// checkpoint and the trace for each count: the checkpoint is written at intervals, so the
// trace may be ahead of it; the trace is capped, so the checkpoint may be ahead of it.

// checkpointVersion is the layout of the checkpoint.
const checkpointVersion = 1

// maxCheckpointBytes bounds what is read of a checkpoint: its counters are bounded
// (maxRefusalKeys, maxOverflowKeys, maxRefusalDetail), so anything longer is not one.
const maxCheckpointBytes = 1 << 20

type checkpoint struct {
	Version     int       `json:"version"`
	At          time.Time `json:"at"`
	Connections int64     `json:"connections"`
	Denied      int64     `json:"denied"`
	BytesUp     int64     `json:"bytes_up"`
	BytesDown   int64     `json:"bytes_down"`
	// Used is what counted against resources.egress_max_bytes.
	Used    int64               `json:"used"`
	Refused []checkpointRefusal `json:"refused,omitempty"`
}

// checkpointRefusal is a refusal counter, and how many of its refusals the trace holds.
type checkpointRefusal struct {
	store.EgressRefusal
	Traced int64 `json:"traced"`
}

// sameCounts says whether c and o hold the same totals.
func (c checkpoint) sameCounts(o checkpoint) bool {
	return c.Connections == o.Connections && c.Denied == o.Denied && c.BytesUp == o.BytesUp && c.BytesDown == o.BytesDown &&
		c.Used == o.Used && len(c.Refused) == len(o.Refused)
}

// snapshot is the session's checkpoint now.
func (e *liveEgress) snapshot() checkpoint {
	t := e.proxy.Totals()
	all := e.before.Add(store.EgressTotals{Connections: t.Connections, Denied: t.Denied, BytesUp: t.BytesUp, BytesDown: t.BytesDown})
	e.mu.Lock()
	refused := e.refusals.entries()
	e.mu.Unlock()
	return checkpoint{Version: checkpointVersion, At: time.Now().UTC(), Connections: all.Connections, Denied: all.Denied,
		BytesUp: all.BytesUp, BytesDown: all.BytesDown, Used: t.Used, Refused: refused}
}

// writeCheckpoint replaces the checkpoint in dir atomically: a crash leaves the old one
// or the new one, never part of either.
func writeCheckpoint(dir string, c checkpoint) error {
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, records.EgressFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	// The rename is durable once the directory is.
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// readCheckpoint reads the checkpoint in dir; fs.ErrNotExist when there is none, another
// error when it is not one (corrupt, truncated, too long, counts out of range).
func readCheckpoint(dir string) (checkpoint, error) {
	var c checkpoint
	path := filepath.Join(dir, records.EgressFile)
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return c, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCheckpointBytes+1))
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	if err := parseCheckpoint(data, &c); err != nil {
		return checkpoint{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// parseCheckpoint decodes and checks a checkpoint.
func parseCheckpoint(data []byte, c *checkpoint) error {
	if len(data) > maxCheckpointBytes {
		return fmt.Errorf("longer than %d bytes", maxCheckpointBytes)
	}
	if err := json.Unmarshal(data, c); err != nil {
		return err
	}
	if c.Version != checkpointVersion {
		return fmt.Errorf("version %d, want %d", c.Version, checkpointVersion)
	}
	if c.Connections < 0 || c.Denied < 0 || c.BytesUp < 0 || c.BytesDown < 0 || c.Used < 0 {
		return errors.New("a negative count")
	}
	if len(c.Refused) > maxRefusalKeys+maxOverflowKeys {
		return fmt.Errorf("%d refusal counters, past the %d kept", len(c.Refused), maxRefusalKeys+maxOverflowKeys)
	}
	for _, r := range c.Refused {
		if r.Count < 0 || r.Traced < 0 || r.Traced > r.Count {
			return fmt.Errorf("refusal counter %s:%d %s: count %d, traced %d", r.Host, r.Port, r.Reason, r.Count, r.Traced)
		}
	}
	return nil
}

// Carried is what a session's proxies carried under earlier daemons, read back from its
// checkpoint and its trace (ReadCarried), and how much of the trace's egress parts is used.
type Carried struct {
	// Totals is what was carried (Used what counted against resources.egress_max_bytes).
	Totals store.EgressTotals
	// TracedAllowed and TracedRefused are the bytes of allowed and refusal records the
	// trace holds; the Capped flags say it took its last of them.
	TracedAllowed, TracedRefused int64
	AllowedCapped, RefusedCapped bool

	refusals *refusals
}

// used is what counted against resources.egress_max_bytes: never less than the payload
// the totals hold.
func (c Carried) used() int64 {
	return max(c.Totals.Used, c.Totals.BytesUp+c.Totals.BytesDown)
}

// traceRecord is what ReadCarried reads of a trace line: an egress record or a refusal
// counter's.
type traceRecord struct {
	records.EgressTrace
	Count int64     `json:"count"`
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
}

// ReadCarried reads back what a session's proxies carried: from its checkpoint and its
// trace, each count the larger of the two. A checkpoint that cannot be read (corrupt,
// truncated) is warned about and the trace alone is used.
func ReadCarried(recordsDir string, log *slog.Logger) Carried {
	c := Carried{refusals: newRefusals()}
	fromTrace := newRefusals()
	if f, err := os.Open(filepath.Join(recordsDir, records.TraceFile)); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			line := sc.Bytes()
			var r traceRecord
			if json.Unmarshal(line, &r) != nil {
				continue
			}
			n := int64(len(line)) + 1
			switch r.EventType {
			case records.TraceEgress:
				c.TracedAllowed += n
				if r.Decision == egress.Allowed {
					c.Totals.Connections++
				} else {
					c.Totals.Denied++
				}
				c.Totals.BytesUp += r.BytesUp
				c.Totals.BytesDown += r.BytesDown
			case records.TraceEgressCapped:
				c.TracedAllowed += n
				c.AllowedCapped = true
			case records.TraceEgressRefused:
				c.TracedRefused += n
				if r.Count > 0 {
					c.Totals.Denied += r.Count
					prev := fromTrace.keys[refusalKey{host: r.Host, port: r.Port, reason: r.Reason}]
					sum := r.Count
					if prev != nil {
						sum += prev.Count
					}
					fromTrace.merge(store.EgressRefusal{Proto: r.Proto, Host: r.Host, Port: r.Port, Reason: r.Reason, Count: sum,
						First: r.First, Last: r.Last, Detail: r.Detail}, sum)
				}
			case records.TraceEgressRefusedCapped:
				c.TracedRefused += n
				c.RefusedCapped = true
			}
		}
		f.Close()
	}
	cp, err := readCheckpoint(recordsDir)
	switch {
	case err == nil:
		c.Totals.Connections = max(c.Totals.Connections, cp.Connections)
		c.Totals.Denied = max(c.Totals.Denied, cp.Denied)
		c.Totals.BytesUp = max(c.Totals.BytesUp, cp.BytesUp)
		c.Totals.BytesDown = max(c.Totals.BytesDown, cp.BytesDown)
		c.Totals.Used = cp.Used
		for _, r := range cp.Refused {
			c.refusals.merge(r.EgressRefusal, r.Traced)
		}
	case !errors.Is(err, fs.ErrNotExist):
		log.Warn("the session's egress checkpoint cannot be read; what it carried is taken from its trace alone", "dir", recordsDir, "err", err)
	}
	for _, r := range fromTrace.sorted() {
		c.refusals.merge(r.EgressRefusal, r.traced)
	}
	c.Totals.Used = c.used()
	c.Totals.Denied = max(c.Totals.Denied, c.refusals.total())
	c.Totals.Refused = c.refusals.top(store.MaxEgressRefusals)
	return c
}
