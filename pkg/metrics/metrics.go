// Package metrics exposes roostd to Prometheus. Labels are bounded sets (states, classes,
// outcomes); no session id is ever a label.
package metrics

import (
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"roost.dev/roost/pkg/fdbudget"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
)

// Metrics holds roostd's collectors and hears session starts and recoveries.
type Metrics struct {
	registry  *prometheus.Registry
	starts    *prometheus.CounterVec
	startTime *prometheus.HistogramVec
	recovered *prometheus.CounterVec
	spawns    *prometheus.CounterVec
	spawnTime *prometheus.HistogramVec
	tokens    *prometheus.CounterVec
	// tokensOld is tokens under its former name, roost_tokens_spent_total (the unit belongs
	// before _total): deprecated, kept for one release so dashboards can move.
	tokensOld *prometheus.CounterVec
	overruns  *prometheus.CounterVec
	refusals  *prometheus.CounterVec
	limits    *prometheus.CounterVec
	ends      *prometheus.CounterVec
	// execRefused counts the execs sessions' allowlists refused, by class: the paths are the
	// sessions' choice, and in their traces.
	execRefused *prometheus.CounterVec
	pruned      prometheus.Counter
	compacted   prometheus.Counter
	// egressConns and egressBytes count sessions' egress proxies' work; no host label: the
	// destinations are the sessions' choice, and in the trace.
	egressConns *prometheus.CounterVec
	egressBytes *prometheus.CounterVec
	// hookRuns and hookTime count and time operator hooks' runs (pkg/hooks), by hook name:
	// the operator's config bounds that set.
	hookRuns *prometheus.CounterVec
	hookTime *prometheus.HistogramVec
	// rangeSweeps and rangeSweepTime count and time the sweeps of freed id ranges.
	rangeSweeps    *prometheus.CounterVec
	rangeSweepTime prometheus.Histogram
}

// Budget reports the ledger's state at each scrape.
type Budget interface {
	// Remaining is what the machine may still admit today; ok is false without a ceiling.
	Remaining() (tokens int64, ok bool)
	OpenReservations() int
}

// New registers the Go and process collectors, roost's counters, and a gauge of sessions
// per state read through count at every scrape, so it can never drift from the registry.
func New(states []string, count func() map[string]int) *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		starts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_session_starts_total",
			Help: "Session launches, by containment class and result (started, failed).",
		}, []string{"class", "result"}),
		startTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "roost_session_start_seconds",
			Help:    "Time from a launch request to the session's program running.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"class"}),
		recovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_recovered_sessions_total",
			Help: "Live sessions found at daemon start, by outcome (attached, exited, lost).",
		}, []string{"outcome"}),
		spawns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_spawn_admissions_total",
			Help: "Spawn requests from sessions, by result: granted, refused_<reason> (spawn_allow, depth, children, envelope, containment), invalid, failed.",
		}, []string{"result"}),
		spawnTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "roost_spawn_seconds",
			Help:    "Time from a spawn request to its refusal or to the child's program running, by decision (granted, refused).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"decision"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_spent_tokens_total",
			Help: "Tokens charged to sessions, by capsule and model: a gateway call's model when it is the capsule's declared inference.model or one its upstream's models list names, else \"other\"; empty for calls capsules settle themselves.",
		}, []string{"capsule", "model"}),
		tokensOld: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_tokens_spent_total",
			Help: "Deprecated: renamed roost_spent_tokens_total, which it equals; to be removed.",
		}, []string{"capsule", "model"}),
		overruns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_spend_overruns_total",
			Help: "Settlements that charged more than their call was admitted for (the reported usage is charged), by capsule.",
		}, []string{"capsule"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_spend_refusals_total",
			Help: "Admissions refused at a ceiling, by limit (session, ancestor, machine).",
		}, []string{"limit"}),
		limits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_limit_hits_total",
			Help: "Times a session met one of its bounds, by limit (endpoint_connections, log_bytes, workdir_bytes, workdir_inodes, children_total, disk_full, …): a refusal or a cut.",
		}, []string{"limit"}),
		ends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_sessions_ended_total",
			Help: "Session ends, once each as the registry records them, by containment class and status: the exit status (ok, error, crashed, terminated, deadline_reached, start_failed, lost), or oom for a crash by the kernel's OOM killer.",
		}, []string{"class", "status"}),
		execRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_exec_refused_total",
			Help: "Execs a session's exec allowlist refused (shell.allow, Landlock; a noexec mount; a system program absent from a sealed root), by containment class.",
		}, []string{"class"}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roost_sessions_pruned_total",
			Help: "Ended sessions removed by retention (roostd --retain-ended, --retain-for) and roostctl prune.",
		}),
		compacted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roost_events_compacted_total",
			Help: "Events removed from the registry's log with the sessions retention removed.",
		}),
		egressConns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_egress_connections_total",
			Help: "Connections and forwarded requests of sessions' egress proxies, by decision (allowed, denied).",
		}, []string{"decision"}),
		egressBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_egress_bytes_total",
			Help: "Payload bytes sessions' egress proxies carried, by direction (up: to the destination, down: from it).",
		}, []string{"direction"}),
		hookRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_hook_runs_total",
			Help: "Runs of roostd's configured hooks, by hook and result: stage hooks allowed, vetoed, trap, timeout, out_of_memory, failed; session_end hooks ok, failed, trap, timeout, out_of_memory, and dropped (not run: its queue was full or roostd stopped).",
		}, []string{"hook", "result"}),
		rangeSweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roost_id_range_sweeps_total",
			Help: "Sweeps of freed id ranges (their processes, SysV IPC objects and files in /tmp, /var/tmp, /dev/shm, /dev/mqueue), by result (ok, failed).",
		}, []string{"result"}),
		rangeSweepTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "roost_id_range_sweep_seconds",
			Help:    "Time one sweep of freed id ranges took.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		hookTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "roost_hook_seconds",
			Help:    "Time a hook's run took, from starting its runner to its end (dropped inputs are not timed).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 21),
		}, []string{"hook"}),
	}
	m.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.starts, m.startTime, m.recovered, m.spawns, m.spawnTime, m.tokens, m.tokensOld, m.overruns, m.refusals, m.limits, m.ends, m.execRefused, m.pruned, m.compacted,
		m.egressConns, m.egressBytes, m.hookRuns, m.hookTime, m.rangeSweeps, m.rangeSweepTime,
		&stateCollector{states: states, count: count, desc: prometheus.NewDesc(
			"roost_sessions", "Sessions in the registry, by state.", []string{"state"}, nil)},
	)
	// Every known series from the start, at zero, so that an alert on an increase sees the
	// first one.
	for _, l := range store.Limits {
		m.limits.WithLabelValues(l)
	}
	for _, c := range manifest.Classes {
		for _, st := range store.EndStatuses {
			m.ends.WithLabelValues(c.String(), st)
		}
	}
	return m
}

// WatchBudget reports the ledger's remaining budget and open reservations at each scrape.
func (m *Metrics) WatchBudget(b Budget) {
	m.registry.MustRegister(&budgetCollector{budget: b,
		remaining: prometheus.NewDesc("roost_budget_remaining_tokens", "Tokens the machine may still admit today (only with a machine ceiling).", []string{"scope"}, nil),
		open:      prometheus.NewDesc("roost_spend_reservations_open", "Reservations admitted and not yet settled or charged.", nil, nil),
	})
}

// WatchWarmPool reports how many sealed sandboxes made ahead wait for a session (roostd
// --warm-pool) at each scrape.
func (m *Metrics) WatchWarmPool(ready func() int) {
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "roost_warm_sandboxes",
		Help: "Sealed sandboxes made ahead of their sessions and waiting for one (roostd --warm-pool).",
	}, func() float64 { return float64(ready()) }))
}

// WatchDescriptors reports roostd's descriptor budget at each scrape: the slots held by use
// (endpoint, upstream, gateway, follower) and the budget's bounds (open_file_limit,
// reserve, total, share).
func (m *Metrics) WatchDescriptors(stats func() fdbudget.Stats) {
	m.registry.MustRegister(&descriptorCollector{stats: stats,
		held:   prometheus.NewDesc("roost_descriptors", "Descriptors roostd holds on sessions' behalf, by use: endpoint (connections to sessions' endpoints), upstream (egress sockets: tunnels, SOCKS, forwarded requests, idle pooled), gateway (model calls), follower (log readers' files).", []string{"use"}, nil),
		bounds: prometheus.NewDesc("roost_descriptors_budget", "roostd's descriptor budget, by bound: open_file_limit (RLIMIT_NOFILE), reserve (kept for the operator), total (what sessions may hold together), share (what one session may hold besides its endpoint connections).", []string{"bound"}, nil),
	})
}

type descriptorCollector struct {
	stats        func() fdbudget.Stats
	held, bounds *prometheus.Desc
}

func (c *descriptorCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.held; ch <- c.bounds }

func (c *descriptorCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	for _, u := range fdbudget.Uses() {
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(st.ByUse[u.String()]), u.String())
	}
	for bound, v := range map[string]float64{"open_file_limit": float64(st.Limit), "reserve": float64(st.Reserve), "total": float64(st.Total), "share": float64(st.Share)} {
		ch <- prometheus.MustNewConstMetric(c.bounds, prometheus.GaugeValue, v, bound)
	}
}

// IDRangeStates are the states roost_id_ranges reports.
var IDRangeStates = []string{"free", "held", "freed", "quarantined"}

// WatchIDRanges reports the id pool's ranges by state at each scrape: free (clean or never
// used), held, freed (let go, waiting for their sweep) and quarantined (their sweep failed;
// roostctl doctor lists them).
func (m *Metrics) WatchIDRanges(count func() map[string]int) {
	m.registry.MustRegister(&stateCollector{states: IDRangeStates, count: count, desc: prometheus.NewDesc(
		"roost_id_ranges", "Host id ranges of roostd's block (sessions.ids), by state: free, held, freed (waiting for their sweep), quarantined (their sweep failed).", []string{"state"}, nil)})
}

// RangeSwept counts a sweep of freed id ranges and times it.
func (m *Metrics) RangeSwept(ok bool, took time.Duration) {
	result := "ok"
	if !ok {
		result = "failed"
	}
	m.rangeSweeps.WithLabelValues(result).Inc()
	m.rangeSweepTime.Observe(took.Seconds())
}

// Charged counts tokens charged to a session, and a settlement above its reservation. The
// model label is the one the gateway admitted the call with, already bounded.
func (m *Metrics) Charged(s ledger.Settlement) {
	m.tokens.WithLabelValues(s.Capsule, s.Model).Add(float64(s.Charged))
	m.tokensOld.WithLabelValues(s.Capsule, s.Model).Add(float64(s.Charged))
	if s.Reason == ledger.ReasonSettled && s.Charged > s.Reserved {
		m.overruns.WithLabelValues(s.Capsule).Inc()
	}
}

// SessionsPruned counts ended sessions retention or prune removed.
func (m *Metrics) SessionsPruned(n int) { m.pruned.Add(float64(n)) }

// EventsCompacted counts events compacted away from the registry's log.
func (m *Metrics) EventsCompacted(n int) { m.compacted.Add(float64(n)) }

// Egress counts one connection or request of a session's egress proxy and what it carried.
func (m *Metrics) Egress(decision string, bytesUp, bytesDown int64) {
	m.egressConns.WithLabelValues(decision).Inc()
	m.egressBytes.WithLabelValues("up").Add(float64(bytesUp))
	m.egressBytes.WithLabelValues("down").Add(float64(bytesDown))
}

// HookRan counts one run of a hook with its result and times it; a "dropped" input, which
// never ran, is counted and not timed. *Metrics is pkg/hooks' Observer.
func (m *Metrics) HookRan(hook, result string, took time.Duration) {
	m.hookRuns.WithLabelValues(hook, result).Inc()
	if result != "dropped" {
		m.hookTime.WithLabelValues(hook).Observe(took.Seconds())
	}
}

// LimitHit counts a session meeting one of its bounds.
func (m *Metrics) LimitHit(limit string) { m.limits.WithLabelValues(limit).Inc() }

// SessionEnded counts one session end, by its record's class and end status.
func (m *Metrics) SessionEnded(class, status string) { m.ends.WithLabelValues(class, status).Inc() }

// ExecRefused counts n execs a session of class had refused by its exec allowlist.
func (m *Metrics) ExecRefused(class string, n int64) {
	m.execRefused.WithLabelValues(class).Add(float64(n))
}

// Refused counts an admission refused at a ceiling.
func (m *Metrics) Refused(r *ledger.Refusal) {
	m.refusals.WithLabelValues(r.Kind()).Inc()
}

type budgetCollector struct {
	budget          Budget
	remaining, open *prometheus.Desc
}

func (c *budgetCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.remaining; ch <- c.open }

func (c *budgetCollector) Collect(ch chan<- prometheus.Metric) {
	if tokens, ok := c.budget.Remaining(); ok {
		ch <- prometheus.MustNewConstMetric(c.remaining, prometheus.GaugeValue, float64(tokens), "machine")
	}
	ch <- prometheus.MustNewConstMetric(c.open, prometheus.GaugeValue, float64(c.budget.OpenReservations()))
}

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

// SessionStarted counts a launch that got its program running.
func (m *Metrics) SessionStarted(class manifest.Class, took time.Duration) {
	m.starts.WithLabelValues(class.String(), "started").Inc()
	m.startTime.WithLabelValues(class.String()).Observe(took.Seconds())
}

// SessionStartFailed counts a launch whose program did not start.
func (m *Metrics) SessionStartFailed(class manifest.Class) {
	m.starts.WithLabelValues(class.String(), "failed").Inc()
}

// SessionRecovered counts one live session reconciled at start.
func (m *Metrics) SessionRecovered(outcome string) {
	m.recovered.WithLabelValues(outcome).Inc()
}

// SpawnDecided counts one spawn request and, unless it failed or was malformed, times it.
func (m *Metrics) SpawnDecided(result string, took time.Duration) {
	m.spawns.WithLabelValues(result).Inc()
	switch {
	case result == "granted":
		m.spawnTime.WithLabelValues("granted").Observe(took.Seconds())
	case strings.HasPrefix(result, "refused_"):
		m.spawnTime.WithLabelValues("refused").Observe(took.Seconds())
	}
}

type stateCollector struct {
	states []string
	count  func() map[string]int
	desc   *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.count()
	for _, s := range c.states {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[s]), s)
	}
}
