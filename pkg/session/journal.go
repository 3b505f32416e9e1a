package session

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"roost.dev/roost/pkg/hooks"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
)

// LimitObserver hears every bound a session meets, for metrics.
type LimitObserver interface {
	LimitHit(limit string)
}

// EndObserver hears every session end once, when the registry commits it, for metrics:
// class is the record's EndClass, status its EndStatus.
type EndObserver interface {
	SessionEnded(class, status string)
}

// journal notes in the registry what happens to a session besides its transitions: the
// bounds it meets, the cuts of its output, the operator's hooks that judged it.
type journal struct {
	reg     registry
	log     *slog.Logger
	limits  LimitObserver       // nil for none
	refused ExecRefusalObserver // nil for none
	ends    EndObserver         // nil for none
	// cutsMu orders the notes of which log cuts were reported (records.NewCuts);
	// refusalsMu those of which refused execs were (records.NewRefusals).
	cutsMu, refusalsMu sync.Mutex
}

// LimitHit records that a session met one of its bounds: an event (limit: detail) and a
// count. The session may have been removed meanwhile; then only the count remains.
func (j *journal) LimitHit(sessionID, limit, detail string) {
	if j.limits != nil {
		j.limits.LimitHit(limit)
	}
	rec, err := j.reg.get(sessionID)
	if err != nil {
		j.log.Info("session limit hit", "session", sessionID, "limit", limit, "detail", detail)
		return
	}
	j.log.Info("session limit hit", "session", rec.ID, "capsule", rec.Capsule.Name+"@"+rec.Capsule.Version, "class", rec.Achieved,
		"limit", limit, "detail", detail)
	if err := j.reg.update(func(tx *store.Tx) error { return tx.Note(rec, store.EventLimit, limit+": "+detail) }); err != nil {
		j.log.Warn("recording a limit", "session", sessionID, "limit", limit, "err", err)
	}
}

// logCuts reports, once per stream, a session's output first cut by
// resources.log_max_bytes (limit log_bytes) and first lost to a failed write (disk_full),
// as roost-init's logs.json counts them. It runs on the session's periodic tick while it
// runs (watchLogs), and once more when its end is recorded; it reads two small files.
func (j *journal) logCuts(id, recordsDir string) {
	j.cutsMu.Lock()
	defer j.cutsMu.Unlock()
	cuts, mark, err := records.NewCuts(recordsDir)
	if err != nil || len(cuts) == 0 {
		return
	}
	for _, c := range cuts {
		limit := store.LimitLogBytes
		if c.Failed {
			limit = store.LimitDiskFull
		}
		j.LimitHit(id, limit, c.Detail)
	}
	if err := mark(); err != nil {
		j.log.Warn("noting a reported log cut", "session", id, "err", err)
	}
}

// readRecords reports what roost-init recorded of the session since the last call: its
// output's cuts and the execs its allowlist refused.
func (j *journal) readRecords(rec *store.Record) {
	j.logCuts(rec.ID, rec.RecordsDir)
	j.execRefusals(rec.ID, rec.RecordsDir, rec.Achieved)
}

// watchLogs reports the session's output cuts and refused execs every interval until done
// closes or ctx ends.
func (j *journal) watchLogs(ctx context.Context, rec *store.Record, interval time.Duration, done <-chan struct{}) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-ticker.C:
			j.readRecords(rec)
		}
	}
}

// hookOutputInEvent bounds what of a hook's stdout an event keeps.
const hookOutputInEvent = 4 << 10

// HookEvent records one hook run as an event: on the session it concerns (a session_end
// hook's), or on none (a stage hook's, which judged a capsule before any session existed).
func (j *journal) HookEvent(hook string, r hooks.Result, subject string) {
	detail := fmt.Sprintf("hook %q on %s: %s in %s", hook, subject, r.Outcome, r.Took.Round(1e6))
	if r.Reason != "" {
		detail += ": " + r.Reason
	}
	if out := strings.TrimSpace(string(r.Stdout)); out != "" && r.Outcome != hooks.OutcomeVetoed {
		if len(out) > hookOutputInEvent {
			out = out[:hookOutputInEvent]
			for !utf8.ValidString(out) {
				out = out[:len(out)-1]
			}
			out += " [cut]"
		}
		detail += "; its output: " + out
	}
	err := j.reg.update(func(tx *store.Tx) error {
		if rec, err := tx.Get(subject); err == nil {
			return tx.Note(rec, EventHookRan, detail)
		}
		return tx.NoteDaemon(EventHookRan, detail)
	})
	if err != nil {
		j.log.Warn("recording a hook's run", "hook", hook, "subject", subject, "err", err)
	}
}

var _ hooks.EventSink = (*Manager)(nil)

// HookEvent records one run of an operator's hook (hooks.EventSink).
func (m *Manager) HookEvent(hook string, r hooks.Result, subject string) {
	m.journal.HookEvent(hook, r, subject)
}
