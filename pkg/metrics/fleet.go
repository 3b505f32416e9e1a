package metrics

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"roost.dev/roost/pkg/fleet"
)

// FleetStates are the states roost_fleet_tokens reports: what this node holds of today's
// blocks, what its ledger charged and reserved of them, what is free of them, what the
// day's pool had left and the day's ceiling, each at the node's last look.
var FleetStates = []string{"held", "used", "free", "pool", "ceiling"}

// The results roost_fleet_block_grants_total counts: a block taken, the pool changed
// under the grant (read again), an ambiguous reply (settled by reading the block).
const (
	GrantGranted   = "granted"
	GrantContended = "contended"
	GrantAmbiguous = "ambiguous"
)

// FleetStore is a fleet node's store as roostd gives it to the node: the same store, its
// Txns timed (roost_fleet_etcd_seconds), its grants counted by result
// (roost_fleet_block_grants_total) and the last day's ceiling it read kept for
// roost_fleet_tokens{state="ceiling"}.
type FleetStore struct {
	fleet.Store
	m       *Metrics
	ceiling atomic.Int64
}

// WatchFleet registers the fleet's collectors: status is the node's own view, read at each
// scrape. It returns st wrapped, to hand to the node.
func (m *Metrics) WatchFleet(st fleet.Store, status func() fleet.Status) *FleetStore {
	fs := &FleetStore{Store: st, m: m}
	fs.ceiling.Store(-1)
	m.fleetGrants = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roost_fleet_block_grants_total",
		Help: "Blocks of the fleet's daily pool this node asked the fleet store for, by result: granted, contended (the pool changed under it), ambiguous (no reply; settled by reading the block).",
	}, []string{"result"})
	m.fleetTxn = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "roost_fleet_etcd_seconds",
		Help:    "Latency of this node's transactions on the fleet store (etcd), failed ones included.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})
	for _, r := range []string{GrantGranted, GrantContended, GrantAmbiguous} {
		m.fleetGrants.WithLabelValues(r)
	}
	m.registry.MustRegister(m.fleetGrants, m.fleetTxn, &fleetCollector{status: status, ceiling: &fs.ceiling,
		tokens:      prometheus.NewDesc("roost_fleet_tokens", "This fleet node's part of today's fleet ceiling, by state: held (its blocks' tokens), used (charged and reserved of them), free (held less used), pool (what the day's pool had left at its last read; -1 before one), ceiling (the day's fleet ceiling at its last read; -1 before one).", []string{"state"}, nil),
		unreachable: prometheus.NewDesc("roost_fleet_unreachable", "1 when this fleet node could not reach the fleet store at its last look: it spends what it holds, then refuses.", nil, nil),
		pending:     prometheus.NewDesc("roost_fleet_pending_writes", "Writes to the fleet store whose outcome this node has yet to find out.", nil, nil),
	})
	return fs
}

type fleetCollector struct {
	status                       func() fleet.Status
	ceiling                      *atomic.Int64
	tokens, unreachable, pending *prometheus.Desc
}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tokens
	ch <- c.unreachable
	ch <- c.pending
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	values := map[string]int64{"held": st.Held, "used": st.Used, "free": max(st.Held-st.Used, 0), "pool": st.Pool, "ceiling": c.ceiling.Load()}
	for _, s := range FleetStates {
		ch <- prometheus.MustNewConstMetric(c.tokens, prometheus.GaugeValue, float64(values[s]), s)
	}
	var down float64
	if st.Unreachable {
		down = 1
	}
	ch <- prometheus.MustNewConstMetric(c.unreachable, prometheus.GaugeValue, down)
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(st.Pending))
}

// Get reads through, keeping the value of a day's ceiling key when it reads one.
func (s *FleetStore) Get(ctx context.Context, key string, prefix bool) ([]fleet.KV, int64, error) {
	kvs, rev, err := s.Store.Get(ctx, key, prefix)
	if err == nil && !prefix && strings.Contains(key, "/days/") && strings.HasSuffix(key, "/ceiling") {
		for _, kv := range kvs {
			if n, err := strconv.ParseInt(string(kv.Value), 10, 64); err == nil && kv.Key == key {
				s.ceiling.Store(n)
			}
		}
	}
	return kvs, rev, err
}

// Txn times the transaction and, when it is a grant (it takes a block key that must be
// absent and moves granted), counts its result.
func (s *FleetStore) Txn(ctx context.Context, cmps []fleet.Cmp, then []fleet.Op) (bool, error) {
	start := time.Now()
	applied, err := s.Store.Txn(ctx, cmps, then)
	s.m.fleetTxn.Observe(time.Since(start).Seconds())
	if isGrant(cmps, then) {
		switch {
		case err != nil:
			s.m.fleetGrants.WithLabelValues(GrantAmbiguous).Inc()
		case applied:
			s.m.fleetGrants.WithLabelValues(GrantGranted).Inc()
		default:
			s.m.fleetGrants.WithLabelValues(GrantContended).Inc()
		}
	}
	return applied, err
}

func isGrant(cmps []fleet.Cmp, then []fleet.Op) bool {
	var absentBlock, movesGranted bool
	for _, c := range cmps {
		absentBlock = absentBlock || c.ModRevision == 0 && strings.Contains(c.Key, "/blocks/")
	}
	for _, op := range then {
		movesGranted = movesGranted || strings.HasSuffix(op.Key, "/granted")
	}
	return absentBlock && movesGranted
}
