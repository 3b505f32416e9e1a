package delegate

// How a session reaches the outside. A sealed or scoped session lives in a network namespace
// of its own that holds loopback and its endpoint only; the endpoint carries its egress proxy
// (HTTP forward, CONNECT and SOCKS5), which admits only its network.allow, resolves names in
// roostd and audits each connection in the session's trace. Unconfined and advisory sessions
// share the host's network: no proxy, network.allow is advisory there.

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/spawn"
)

// liveEgress is a running session's proxy and what the trace holds of it.
type liveEgress struct {
	id    string
	dir   string
	proxy *egress.Session
	// before is what earlier daemons' proxies carried for the session (read back at
	// recovery from its checkpoint and its trace).
	before store.EgressTotals

	mu sync.Mutex
	// The trace takes allowed records up to allowedMax bytes and refusal records up to
	// refusedMax (see traceBudgets); past either it stops taking them, with a note, and
	// the counts go on, so no session can fill the disk with connection attempts, nor
	// evict its allowed connections with refused ones.
	tracedAllowed, allowedMax int64
	tracedRefused, refusedMax int64
	allowedCapped             bool
	refusedCapped             bool
	refusals                  *refusals
	// saved is the checkpoint last written, to write one only when something changed.
	saved checkpoint
	// flushMu serialises flushes (the interval's, the end's, the daemon's release): they
	// share the checkpoint's temporary file.
	flushMu sync.Mutex
}

// traceBudgets splits resources.log_max_bytes between the egress records: three quarters
// for allowed connections, which are one record each and are the audit trail, a quarter
// for refusals, which are folded into per-(host, port, reason) counters and so need few
// records however many refusals there are.
func traceBudgets(logMax int64) (allowed, refused int64) {
	refused = logMax / 4
	return logMax - refused, refused
}

// noteRoom is kept in each part of the trace for the note that it is full, so the note too
// stays within resources.log_max_bytes.
const noteRoom = 512

// totals is everything the session's proxy carried.
func (e *liveEgress) totals() store.EgressTotals {
	t := e.proxy.Totals()
	out := e.before.Add(store.EgressTotals{Connections: t.Connections, Denied: t.Denied, BytesUp: t.BytesUp, BytesDown: t.BytesDown})
	// The proxy's count began at what the session had used before.
	out.Used = t.Used
	e.mu.Lock()
	out.Refused = e.refusals.top(store.MaxEgressRefusals)
	e.mu.Unlock()
	return out
}

// EgressObserver hears every connection or request of a session's proxy, for metrics.
type EgressObserver interface {
	Egress(decision string, bytesUp, bytesDown int64)
}

// Egress is the sessions' egress proxies as roostd holds them: each live session's proxy
// session, and what its trace holds of its connections. It is the proxy's auditor.
type Egress struct {
	proxy   *egress.Proxy
	obs     EgressObserver
	records func(sessionID string) string
	log     *slog.Logger

	mu   sync.Mutex
	live map[string]*liveEgress
}

var _ egress.Auditor = (*Egress)(nil)

// NewEgress makes the proxy cfg describes (none when cfg is nil: then no session reaches
// the outside); records names a session's records directory, where its trace is.
func NewEgress(cfg *egress.Config, obs EgressObserver, records func(sessionID string) string, log *slog.Logger) *Egress {
	a := &Egress{obs: obs, records: records, log: log, live: map[string]*liveEgress{}}
	if cfg != nil {
		a.proxy = egress.New(*cfg, a, log)
	}
	return a
}

// Open gives a session in a network namespace of its own its proxy; before is what it
// carried under earlier daemons (see Carried; the zero Carried for a new session). Nil
// when roostd has no proxy.
func (a *Egress) Open(sessionID string, p *manifest.Policy, before Carried) *egress.Session {
	if a.proxy == nil {
		return nil
	}
	allowedMax, refusedMax := traceBudgets(p.Resources.LogMaxBytes.Value)
	e := &liveEgress{id: sessionID, dir: a.records(sessionID), before: before.Totals,
		tracedAllowed: before.TracedAllowed, allowedMax: allowedMax, allowedCapped: before.AllowedCapped,
		tracedRefused: before.TracedRefused, refusedMax: refusedMax, refusedCapped: before.RefusedCapped,
		refusals: before.refusals}
	if e.refusals == nil {
		e.refusals = newRefusals()
	}
	e.before.Refused = nil
	e.proxy = a.proxy.Session(sessionID, p.Network.Allow, egress.Limits{
		MaxBytes: p.Resources.EgressMaxBytes.Value, UsedBytes: before.used(),
		BytesPerSec: p.Resources.EgressBytesPerSec.Value,
	})
	e.saved = e.snapshot()
	a.mu.Lock()
	a.live[sessionID] = e
	a.mu.Unlock()
	return e.proxy
}

func (a *Egress) lookup(sessionID string) *liveEgress {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.live[sessionID]
}

// Env points the program's HTTP clients, git and curl at its proxy, when it may reach
// anything: HTTP_PROXY and HTTPS_PROXY (forward requests and CONNECT), ALL_PROXY (SOCKS5
// with the name resolved by the proxy), each in both cases, and NO_PROXY for the endpoint.
func Env(p *manifest.Policy, ep spawn.Endpoint, env map[string]string) {
	if len(p.Network.Allow) == 0 || ep == nil || ep.NetNS() == "" {
		return
	}
	addr := strings.TrimPrefix(ep.URL(), "http://")
	httpProxy, socks := "http://"+addr, "socks5h://"+addr
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		env[k] = httpProxy
	}
	env["ALL_PROXY"], env["all_proxy"] = socks, socks
	env["NO_PROXY"], env["no_proxy"] = "127.0.0.1,localhost", "127.0.0.1,localhost"
}

// Egress records one connection or request of a session's proxy: in the metrics, and in
// the session's trace — an allowed one as its own record (until they reach their part of
// resources.log_max_bytes), a refused one in its (host, port, reason) counter, whose first
// refusal is written at once and the rest at intervals (Run) and at the end.
func (a *Egress) Egress(sessionID string, r egress.Record) {
	if a.obs != nil {
		a.obs.Egress(r.Decision, r.BytesUp, r.BytesDown)
	}
	e := a.lookup(sessionID)
	if e == nil {
		return
	}
	if r.Decision != egress.Allowed {
		e.mu.Lock()
		first := e.refusals.note(r)
		var data []byte
		if first {
			data = e.refusalRecords(time.Now().UTC())
		}
		e.mu.Unlock()
		a.appendTrace(e, data)
		return
	}
	data, err := json.Marshal(records.EgressTrace{EventType: records.TraceEgress, SessionID: sessionID, Timestamp: r.Time.UTC(),
		Proto: r.Proto, Host: r.Host, Port: r.Port, Addr: r.Addr, Decision: r.Decision, Rule: r.Rule, Reason: r.Reason,
		Detail: r.Detail, BytesUp: r.BytesUp, BytesDown: r.BytesDown, DurationMS: r.Duration.Milliseconds()})
	if err != nil {
		return
	}
	e.mu.Lock()
	if e.allowedCapped {
		e.mu.Unlock()
		return
	}
	if e.tracedAllowed+int64(len(data))+1 > e.allowedMax-noteRoom {
		e.allowedCapped = true
		note, _ := json.Marshal(records.Trace{EventType: records.TraceEgressCapped, SessionID: sessionID, Timestamp: time.Now().UTC(),
			Detail: "the trace holds no more allowed egress records: they reached their part (three quarters) of resources.log_max_bytes; inspect and the metrics still count every connection"})
		data = note
	}
	e.tracedAllowed += int64(len(data)) + 1
	e.mu.Unlock()
	a.appendTrace(e, data)
}

// refusalRecords renders the refusal counters changed since their last record, within
// the refusals' part of the trace; the caller holds e.mu and appends what it returns.
func (e *liveEgress) refusalRecords(now time.Time) []byte {
	if e.refusedCapped {
		return nil
	}
	var out []byte
	for _, c := range e.refusals.changed() {
		data, err := json.Marshal(records.EgressRefusedTrace{EventType: records.TraceEgressRefused, SessionID: e.id, Timestamp: now,
			Proto: c.Proto, Host: c.Host, Port: c.Port, Reason: c.Reason, Count: c.Count - c.traced, Total: c.Count,
			First: c.First, Last: c.Last, Detail: c.Detail})
		if err != nil {
			continue
		}
		if e.tracedRefused+int64(len(data))+1 > e.refusedMax-noteRoom {
			e.refusedCapped = true
			note, _ := json.Marshal(records.Trace{EventType: records.TraceEgressRefusedCapped, SessionID: e.id, Timestamp: now,
				Detail: "the trace holds no more egress refusal records: they reached their part (a quarter) of resources.log_max_bytes; inspect still counts every refusal by host and reason"})
			e.tracedRefused += int64(len(note)) + 1
			return append(out, append(note, '\n')...)
		}
		e.tracedRefused += int64(len(data)) + 1
		c.traced = c.Count
		out = append(out, append(data, '\n')...)
	}
	return out
}

// appendTrace appends lines (each ending in a newline) to the session's trace in one write.
func (a *Egress) appendTrace(e *liveEgress, lines []byte) {
	if len(lines) == 0 {
		return
	}
	if err := records.AppendLine(filepath.Join(e.dir, records.TraceFile), bytes.TrimSuffix(lines, []byte("\n")), false); err != nil {
		a.log.Warn("writing the trace", "session", e.id, "err", err)
	}
}

// flush writes the session's changed refusal counters to its trace and, when anything
// changed since the last one, its checkpoint.
func (a *Egress) flush(e *liveEgress) {
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	e.mu.Lock()
	data := e.refusalRecords(time.Now().UTC())
	e.mu.Unlock()
	a.appendTrace(e, data)
	cp := e.snapshot()
	e.mu.Lock()
	same := cp.sameCounts(e.saved)
	e.mu.Unlock()
	if same {
		return
	}
	if err := writeCheckpoint(e.dir, cp); err != nil {
		a.log.Warn("checkpointing the session's egress", "session", e.id, "err", err)
		return
	}
	e.mu.Lock()
	e.saved = cp
	e.mu.Unlock()
}

// FlushInterval is how often Run writes the live sessions' refusal counters and checkpoints.
const FlushInterval = 10 * time.Second

// Run writes every live session's changed refusal counters and its checkpoint each
// interval until ctx ends.
func (a *Egress) Run(ctx context.Context, interval time.Duration) {
	if a.proxy == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.Flush()
		}
	}
}

// Flush writes every live session's changed refusal counters and checkpoint now.
func (a *Egress) Flush() {
	for _, e := range a.lives() {
		a.flush(e)
	}
}

// lives is the live sessions' egress now, for work done outside a.mu (a flush writes files).
func (a *Egress) lives() []*liveEgress {
	a.mu.Lock()
	defer a.mu.Unlock()
	live := make([]*liveEgress, 0, len(a.live))
	for _, e := range a.live {
		live = append(live, e)
	}
	return live
}

// Close ends the session's proxy (its open connections are cut), writes its last refusal
// counters and checkpoint, and keeps its totals in the record. A session this daemon held
// no proxy for (it ended while no daemon ran) gets what its checkpoint and trace hold.
func (a *Egress) Close(rec *store.Record) {
	a.mu.Lock()
	e := a.live[rec.ID]
	delete(a.live, rec.ID)
	a.mu.Unlock()
	if e == nil {
		// Only a session that had a proxy has a checkpoint: no other's trace is read.
		if a.proxy == nil || rec.RecordsDir == "" || rec.Egress != nil {
			return
		}
		if _, err := os.Lstat(filepath.Join(rec.RecordsDir, records.EgressFile)); err == nil {
			if t := ReadCarried(rec.RecordsDir, a.log).Totals; !t.IsZero() {
				rec.Egress = &t
			}
		}
		return
	}
	e.proxy.Close()
	a.flush(e)
	if t := e.totals(); !t.IsZero() {
		rec.Egress = &t
	}
}

// Release cuts every proxy and checkpoints what each carried, recording no end: the
// daemon is going, its sessions stay, and the next daemon opens their proxies again.
func (a *Egress) Release() {
	for _, e := range a.lives() {
		e.proxy.Close()
		a.flush(e)
	}
}

// Now is what a live session's proxy has carried so far and how many of its
// connections are open; ok is false when it has no proxy.
func (a *Egress) Now(id string) (t store.EgressTotals, active int, ok bool) {
	e := a.lookup(id)
	if e == nil {
		return t, 0, false
	}
	return e.totals(), e.proxy.Totals().Active, true
}
