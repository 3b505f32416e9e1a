package delegate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"time"

	"roost.dev/roost/pkg/gateway"
	"roost.dev/roost/pkg/records"
)

// callTraces bounds what sessions' traces hold of their metered gateway calls: a quarter of
// resources.log_max_bytes each (16 MiB by default, some 50,000 calls), as the egress records
// are bounded. Past it one inference_call_capped note is written and no more calls; the
// ledger still counts every token (roostctl spend, inspect), so a session making a million
// calls grows its trace by the cap and no further.
// (A session's count stays in memory for the daemon's life: a few words a session.)
type callTraces struct {
	mu       sync.Mutex
	sessions map[string]*callTrace
}

type callTrace struct {
	traced int64
	capped bool
}

// callTraceBudget is the part of resources.log_max_bytes the call records may take.
func callTraceBudget(logMax int64) int64 { return logMax / 4 }

// traceCall appends one call's record to the session's trace, within its budget. The
// record is one small write, unsynced, as an egress record is.
func (b *Backend) traceCall(id, dir string, logMax int64, c gateway.CallRecord) {
	if dir == "" {
		return
	}
	path := filepath.Join(dir, records.TraceFile)
	data, err := json.Marshal(records.CallTrace{EventType: records.TraceInferenceCall, SessionID: id, Timestamp: c.At,
		Upstream: c.Upstream, Route: c.Route, Model: c.Model, Status: c.Status, InputTokens: c.InputTokens, OutputTokens: c.OutputTokens,
		CacheReadTokens: c.CacheReadTokens, CacheWriteTokens: c.CacheWriteTokens, Reserved: c.Reserved, Charged: c.Charged,
		LatencyMS: c.Latency.Milliseconds(), Streamed: c.Streamed, LoweredFrom: c.LoweredFrom, LoweredTo: c.LoweredTo, InputCounted: c.InputCounted})
	if err != nil {
		return
	}
	most := callTraceBudget(logMax)
	b.calls.mu.Lock()
	t := b.calls.sessions[id]
	if t == nil {
		// First call under this daemon: what earlier ones traced counts.
		t = tracedCalls(path)
		b.calls.sessions[id] = t
	}
	if t.capped {
		b.calls.mu.Unlock()
		return
	}
	if t.traced+int64(len(data))+1 > most-noteRoom {
		t.capped = true
		data, _ = json.Marshal(records.Trace{EventType: records.TraceInferenceCallCapped, SessionID: id, Timestamp: time.Now().UTC(),
			Detail: "the trace holds no more inference calls: they reached their part (a quarter) of resources.log_max_bytes; the ledger (roostctl spend) still counts every token"})
	}
	t.traced += int64(len(data)) + 1
	b.calls.mu.Unlock()
	if err := records.AppendLine(path, data, false); err != nil {
		b.cfg.Logger.Warn("writing the trace", "session", id, "err", err)
	}
}

// tracedCalls reads back what a session's trace holds of its calls.
func tracedCalls(path string) *callTrace {
	t := &callTrace{}
	f, err := os.Open(path)
	if err != nil {
		return t
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.Contains(line, []byte(`"event_type":"`+records.TraceInferenceCall+`"`)):
			t.traced += int64(len(line)) + 1
		case bytes.Contains(line, []byte(`"event_type":"`+records.TraceInferenceCallCapped+`"`)):
			t.traced += int64(len(line)) + 1
			t.capped = true
		}
	}
	return t
}
