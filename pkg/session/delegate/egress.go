package delegate

// How a session reaches the outside. A sealed or scoped session lives in a network namespace
// of its own that holds loopback and its endpoint only; the endpoint carries its egress proxy
// (HTTP forward, CONNECT and SOCKS5), which admits only its network.allow, resolves names in
// roostd and audits each connection in the session's trace. Unconfined and advisory sessions
// share the host's network: no proxy, network.allow is advisory there.

import (
	"bufio"
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
	proxy *egress.Session
	// before is what earlier daemons' proxies carried for the session (read from its trace
	// at recovery).
	before store.EgressTotals
	// traced counts the bytes of egress records in the trace; past traceMax the trace
	// stops taking them (the totals still count), so no session can fill the disk with
	// connection attempts.
	mu       sync.Mutex
	traced   int64
	traceMax int64
	capped   bool
}

// totals is everything the session's proxy carried.
func (e *liveEgress) totals() store.EgressTotals {
	t := e.proxy.Totals()
	return e.before.Add(store.EgressTotals{Connections: t.Connections, Denied: t.Denied, BytesUp: t.BytesUp, BytesDown: t.BytesDown})
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
// carried under earlier daemons, tracedBytes the size of the egress records its trace
// already holds (see Traced). Nil when roostd has no proxy.
func (a *Egress) Open(sessionID string, p *manifest.Policy, before store.EgressTotals, tracedBytes int64) *egress.Session {
	if a.proxy == nil {
		return nil
	}
	e := &liveEgress{before: before, traced: tracedBytes, traceMax: p.Resources.LogMaxBytes.Value}
	e.proxy = a.proxy.Session(sessionID, p.Network.Allow, egress.Limits{
		MaxBytes: p.Resources.EgressMaxBytes.Value, UsedBytes: before.BytesUp + before.BytesDown,
		BytesPerSec: p.Resources.EgressBytesPerSec.Value,
	})
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

// Egress records one connection or request of a session's proxy: in the session's trace
// (until its egress records reach resources.log_max_bytes) and in the metrics.
func (a *Egress) Egress(sessionID string, r egress.Record) {
	if a.obs != nil {
		a.obs.Egress(r.Decision, r.BytesUp, r.BytesDown)
	}
	e := a.lookup(sessionID)
	if e == nil {
		return
	}
	data, err := json.Marshal(records.EgressTrace{EventType: records.TraceEgress, SessionID: sessionID, Timestamp: r.Time.UTC(),
		Proto: r.Proto, Host: r.Host, Port: r.Port, Addr: r.Addr, Decision: r.Decision, Rule: r.Rule, Reason: r.Reason,
		Detail: r.Detail, BytesUp: r.BytesUp, BytesDown: r.BytesDown, DurationMS: r.Duration.Milliseconds()})
	if err != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.capped {
		return
	}
	if e.traced+int64(len(data))+1 > e.traceMax {
		e.capped = true
		note, _ := json.Marshal(records.Trace{EventType: records.TraceEgressCapped, SessionID: sessionID, Timestamp: time.Now().UTC(),
			Detail: "the trace holds no more egress records: they reached resources.log_max_bytes; inspect and the metrics still count every connection"})
		data = note
	}
	e.traced += int64(len(data)) + 1
	if err := records.AppendLine(filepath.Join(a.records(sessionID), records.TraceFile), data, false); err != nil {
		a.log.Warn("writing the trace", "session", sessionID, "err", err)
	}
}

// Traced reads back from a session's trace what its proxies carried, and how many
// bytes of egress records the trace holds.
func Traced(recordsDir string) (store.EgressTotals, int64) {
	var t store.EgressTotals
	var traced int64
	f, err := os.Open(filepath.Join(recordsDir, records.TraceFile))
	if err != nil {
		return t, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var r records.EgressTrace
		if json.Unmarshal(line, &r) != nil || (r.EventType != records.TraceEgress && r.EventType != records.TraceEgressCapped) {
			continue
		}
		traced += int64(len(line)) + 1
		if r.EventType != records.TraceEgress {
			continue
		}
		if r.Decision == egress.Allowed {
			t.Connections++
		} else {
			t.Denied++
		}
		t.BytesUp += r.BytesUp
		t.BytesDown += r.BytesDown
	}
	return t, traced
}

// Close ends the session's proxy (its open connections are cut and recorded) and keeps its
// totals in the record.
func (a *Egress) Close(rec *store.Record) {
	a.mu.Lock()
	e := a.live[rec.ID]
	delete(a.live, rec.ID)
	a.mu.Unlock()
	if e == nil {
		return
	}
	e.proxy.Close()
	if t := e.totals(); t != (store.EgressTotals{}) {
		rec.Egress = &t
	}
}

// Release cuts every proxy without recording anything: the daemon is going, its sessions
// stay, and the next daemon opens their proxies again.
func (a *Egress) Release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.live {
		e.proxy.Close()
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
