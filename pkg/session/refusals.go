package session

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"

	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
)

// ExecRefusalObserver hears the execs sessions' allowlists refused, for metrics: n of them
// in a session of class.
type ExecRefusalObserver interface {
	ExecRefused(class string, n int64)
}

const (
	// maxRefusalEvents bounds the events one session's refused execs become; past it they
	// are still counted (inspect, the metric) and traced.
	maxRefusalEvents = 100
	// maxRefusalTrace bounds what the trace holds of one session's refused execs, as the
	// egress records are bounded: roost-init's file is bounded already, this holds the
	// trace to it whatever the file holds.
	maxRefusalTrace = records.MaxRefusalBytes
)

// execRefusals reports the execs roost-init recorded as refused since the last call: each
// line a trace record, an event (the first maxRefusalEvents) and counted in the metric and
// in what inspect shows. A system program a sealed root lacks counts only if the host has
// it (records.KeepAbsent). It runs on the session's periodic tick and once more at its end,
// after roost-init has written its last lines.
func (j *journal) execRefusals(id, recordsDir, class string) {
	j.refusalsMu.Lock()
	defer j.refusalsMu.Unlock()
	lines, st, mark, err := records.NewRefusals(recordsDir)
	if err != nil {
		j.log.Warn("reading the refused execs", "session", id, "err", err)
		return
	}
	if mark == nil {
		return
	}
	var trace bytes.Buffer
	var notes []string
	var n int64
	for _, r := range lines {
		if !records.KeepAbsent(r) {
			continue
		}
		n += r.Refusals()
		st.Note(r)
		detail := refusalDetail(r)
		t := records.Trace{EventType: records.TraceExecRefused, SessionID: id, Timestamp: r.Time.UTC(), Path: r.Path, Resolved: r.Resolved,
			Argv0: r.Argv0, Program: r.Program, Reason: r.Reason, Count: r.Refusals()}
		if r.More > 0 || r.Interpreter != "" {
			t.Detail = detail
		}
		if data, err := json.Marshal(t); err == nil && !st.Capped {
			if st.TracedBytes+int64(len(data))+1 > maxRefusalTrace {
				st.Capped = true
				data, _ = json.Marshal(records.Trace{EventType: records.TraceExecRefusedCapped, SessionID: id, Timestamp: r.Time.UTC(),
					Detail: "the trace holds no more refused execs: they reached " + strconv.Itoa(maxRefusalTrace) + " bytes; inspect and the metrics still count every one"})
			}
			st.TracedBytes += int64(len(data)) + 1
			trace.Write(data)
			trace.WriteByte('\n')
		}
		switch {
		case st.Events < maxRefusalEvents:
			notes = append(notes, detail)
			st.Events++
		case st.Events == maxRefusalEvents:
			notes = append(notes, fmt.Sprintf("more execs refused than %d events tell: trace.jsonl records them, inspect counts them", maxRefusalEvents))
			st.Events++
		}
	}
	if trace.Len() > 0 {
		data := bytes.TrimSuffix(trace.Bytes(), []byte("\n"))
		if err := records.AppendLine(filepath.Join(recordsDir, records.TraceFile), data, false); err != nil {
			j.log.Warn("writing the trace", "session", id, "err", err)
		}
	}
	if len(notes) > 0 {
		err := j.reg.update(func(tx *store.Tx) error {
			rec, err := tx.Get(id)
			if err != nil {
				return err
			}
			for _, d := range notes {
				if err := tx.Note(rec, store.EventExecRefused, d); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			// Removed meanwhile: the trace and the count keep what there is.
			j.log.Warn("recording refused execs", "session", id, "err", err)
		}
	}
	if n > 0 {
		attrs := []any{"session", id, "class", class, "count", n}
		if len(st.Recent) > 0 {
			attrs = append(attrs, "last", st.Recent[len(st.Recent)-1])
		}
		j.log.Info("execs refused", attrs...)
		if j.refused != nil {
			j.refused.ExecRefused(class, n)
		}
	}
	if err := mark(st); err != nil {
		j.log.Warn("noting the refused execs reported", "session", id, "err", err)
	}
}

// refusalDetail is a refused exec as its event says it: the file, what tried it, why, and
// how often.
func refusalDetail(r records.ExecRefusal) string {
	if r.More > 0 {
		return fmt.Sprintf("%d more execs refused past what the records keep of them (%d distinct, %d bytes)", r.More, records.MaxRefusalKeys, records.MaxRefusalBytes)
	}
	d := r.Path
	if r.Resolved != "" && r.Resolved != r.Path {
		d += " (" + r.Resolved + ")"
	}
	d += " by " + r.Program
	if r.Argv0 != "" {
		d += fmt.Sprintf(" as %q", r.Argv0)
	}
	d += ": " + r.Reason
	if r.Interpreter != "" {
		d += " (its #! interpreter " + r.Interpreter + ")"
	}
	if r.Count > 1 {
		d += fmt.Sprintf(", %d times", r.Count)
	}
	return d
}

// ExecRefusals is what inspect shows of the execs a session's allowlist refused: how many,
// and the newest paths. Nil when none was reported.
func ExecRefusals(r *store.Record) *records.RefusalState {
	if r.RecordsDir == "" {
		return nil
	}
	st, err := records.ReadRefusalState(r.RecordsDir)
	if err != nil || st.Count == 0 {
		return nil
	}
	return &st
}
