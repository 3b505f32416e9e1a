package records

// The trace: the session's record of its life, one JSON object per line, appended by roostd
// (its start, delegations, execs, egress, its end) in the records directory.

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// TraceFile is the session's record of its life, one JSON object per line.
const TraceFile = "trace.jsonl"

// Trace is one record of a session's trace.

type Trace struct {
	EventType string    `json:"event_type"`
	SessionID string    `json:"session_id"`
	Timestamp time.Time `json:"timestamp"`
	Capsule   string    `json:"capsule,omitempty"`
	// EffectiveGrants is the explanation recorded at staging: what `roostctl explain
	// --json` prints for the capsule.
	EffectiveGrants json.RawMessage `json:"effective_grants,omitempty"`
	Command         []string        `json:"command,omitempty"`
	// Start is how a session_start began: warm (in a sandbox made ahead) or cold.
	Start      string `json:"start,omitempty"`
	ExitStatus string `json:"exit_status,omitempty"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	Detail     string `json:"detail,omitempty"`
	DurationMS *int64 `json:"duration_ms,omitempty"`
	// Child and ChildID name a delegation's capsule and, once granted, its session;
	// Refusal is why one was refused.
	Child   string `json:"child,omitempty"`
	ChildID string `json:"child_id,omitempty"`
	Refusal string `json:"refusal,omitempty"`
	// The session's token totals, at its end.
	Tokens       *int64 `json:"tokens,omitempty"`
	InputTokens  *int64 `json:"input_tokens,omitempty"`
	OutputTokens *int64 `json:"output_tokens,omitempty"`
	// Egress is what the session's proxy carried, at its end.
	Egress *Egress `json:"egress,omitempty"`
	// ExecID names a command roostctl exec ran in the session (exec_start, exec_end).
	ExecID string `json:"exec_id,omitempty"`
	// An exec the allowlist refused (exec_refused, see ExecRefusal): the file as named and
	// where it led, argv[0], the program that tried, why, and how many times (since the
	// previous record of the same path and program).
	Path     string `json:"path,omitempty"`
	Resolved string `json:"resolved,omitempty"`
	Argv0    string `json:"argv0,omitempty"`
	Program  string `json:"program,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Count    int64  `json:"count,omitempty"`
}

// Refused-exec trace event types: one record per line roost-init wrote (TraceExecRefused),
// and the one that says the trace holds no more of them (TraceExecRefusedCapped).
const (
	TraceExecRefused       = "exec_refused"
	TraceExecRefusedCapped = "exec_refused_capped"
)

// EgressTrace is one egress record in the session's trace.
type EgressTrace struct {
	EventType  string    `json:"event_type"`
	SessionID  string    `json:"session_id"`
	Timestamp  time.Time `json:"timestamp"`
	Proto      string    `json:"proto"`
	Host       string    `json:"host"`
	Port       int       `json:"port"`
	Addr       string    `json:"addr,omitempty"`
	Decision   string    `json:"decision"`
	Rule       string    `json:"rule,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	Detail     string    `json:"detail,omitempty"`
	BytesUp    int64     `json:"bytes_up"`
	BytesDown  int64     `json:"bytes_down"`
	DurationMS int64     `json:"duration_ms"`
}

// EgressRefusedTrace is one egress_refused record: the refusals of one (host, port,
// reason) since its previous record. A session's refusals are folded into such counters
// so that they cannot evict its allowed connections from the trace.
type EgressRefusedTrace struct {
	EventType string    `json:"event_type"`
	SessionID string    `json:"session_id"`
	Timestamp time.Time `json:"timestamp"` // when the record was written
	Proto     string    `json:"proto,omitempty"`
	// Host is the destination as normalised, EgressOverflowHost for the refusals of hosts
	// past the number of keys kept.
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Reason string `json:"reason"`
	// Count is the refusals since the key's previous record, Total all of them so far.
	Count int64 `json:"count"`
	Total int64 `json:"total"`
	// First and Last are the key's first and newest refusal.
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
	// Detail is one refusal's sentence, as a sample.
	Detail string `json:"detail,omitempty"`
}

// EgressOverflowHost stands for every host past the number of refusal keys a session keeps.
const EgressOverflowHost = "*"

// Egress-related trace event types: an allowed connection or request (or, in traces
// written before refusals were folded, a refused one), the note that the trace takes no
// more of them, a (host, port, reason)'s refusals, and the note that it takes no more of
// those.
const (
	TraceEgress              = "egress"
	TraceEgressCapped        = "egress_trace_capped"
	TraceEgressRefused       = "egress_refused"
	TraceEgressRefusedCapped = "egress_refused_capped"
)

// EgressFile is the checkpoint of what a session's egress proxy carried, kept outside the
// capped trace so that resources.egress_max_bytes holds across a restart.
const EgressFile = "egress.json"

// Egress is what a session's egress proxy carried, at its end.
type Egress struct {
	Connections int64 `json:"connections,omitempty"`
	Denied      int64 `json:"denied,omitempty"`
	BytesUp     int64 `json:"bytes_up,omitempty"`
	BytesDown   int64 `json:"bytes_down,omitempty"`
	// Used is what counted against resources.egress_max_bytes.
	Used int64 `json:"used,omitempty"`
}

// AppendTrace appends one record. A session_end already present (written by a
// daemon that died before committing the end) is not written twice.
func AppendTrace(dir string, t Trace) error {
	path := filepath.Join(dir, TraceFile)
	if t.EventType == "session_end" && traceEnded(path) {
		return nil
	}
	data, err := json.Marshal(t)
	if err != nil {
		return err
	}
	// session_end syncs the file, session_start with it: the registry, not the trace,
	// is what survives a host crash mid-session.
	return AppendLine(path, data, t.EventType == "session_end")
}

// AppendLine appends data and a newline to the file at path in one write, so lines written
// at once by several goroutines never interleave.
func AppendLine(path string, data []byte, sync bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(data, '\n')); err != nil {
		f.Close()
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// traceEnded says whether the trace already holds a session_end. It is the last record but
// for the few an exec ending with the session may add, so only the file's tail is read: an
// end must not cost a read of a long session's whole trace.
func traceEnded(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false
	}
	from := max(st.Size()-traceTail, 0)
	buf := make([]byte, st.Size()-from)
	if _, err := f.ReadAt(buf, from); err != nil && !errors.Is(err, io.EOF) {
		return false
	}
	return bytes.Contains(buf, []byte(`"event_type":"session_end"`))
}

// traceTail is how much of a trace's end traceEnded reads.
const traceTail = 256 << 10

// Inference call trace event types: one metered gateway call (CallTrace), and the note
// that the trace takes no more of them.
const (
	TraceInferenceCall       = "inference_call"
	TraceInferenceCallCapped = "inference_call_capped"
)

// CallTrace is one inference_call record: a metered gateway call as it was admitted and
// charged.
type CallTrace struct {
	EventType string    `json:"event_type"`
	SessionID string    `json:"session_id"`
	Timestamp time.Time `json:"timestamp"` // when the call was admitted
	Upstream  string    `json:"upstream"`
	Route     string    `json:"route"`
	Model     string    `json:"model,omitempty"`
	// Status is the upstream's HTTP status; 0 when it did not answer.
	Status           int   `json:"status"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
	CacheReadTokens  int64 `json:"cache_read_tokens,omitempty"`
	CacheWriteTokens int64 `json:"cache_write_tokens,omitempty"`
	Reserved         int64 `json:"reserved"`
	Charged          int64 `json:"charged"`
	LatencyMS        int64 `json:"latency_ms"`
	Streamed         bool  `json:"streamed"`
	// LoweredFrom and LoweredTo are the output cap per answer the call came with and the
	// one the gateway lowered it to, to fit the session's ceilings.
	LoweredFrom int64 `json:"lowered_from,omitempty"`
	LoweredTo   int64 `json:"lowered_to,omitempty"`
	// InputCounted says the call was admitted for its upstream's count of its input, not
	// the gateway's estimate (its ceilings left less than its worst case).
	InputCounted bool `json:"input_counted,omitempty"`
}
