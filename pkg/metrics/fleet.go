package metrics

import (
	"context"
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
// Txns timed (roost_fleet_etcd_seconds).
type FleetStore struct {
	fleet.Store
	txn prometheus.Histogram
}

// WatchFleet registers the fleet's collectors: status is the node's own view (its part of
// the day, the day's ceiling, its grants by outcome), read at each scrape. It returns st
// wrapped, to hand to the node.
func (m *Metrics) WatchFleet(st fleet.Store, status func() fleet.Status) *FleetStore {
	fs := &FleetStore{Store: st, txn: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "roost_fleet_etcd_seconds",
		Help:    "Latency of this node's transactions on the fleet store (etcd), failed ones included.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})}
	m.registry.MustRegister(fs.txn, &fleetCollector{status: status,
		tokens:      prometheus.NewDesc("roost_fleet_tokens", "This fleet node's part of today's fleet ceiling, by state: held (its blocks' tokens), used (charged and reserved of them), free (held less used), pool (what the day's pool had left at its last read; -1 before one), ceiling (the day's fleet ceiling at its last read; -1 before one).", []string{"state"}, nil),
		grants:      prometheus.NewDesc("roost_fleet_block_grants_total", "Blocks of the fleet's daily pool this node asked the fleet store for, by result: granted, contended (the pool changed under it), ambiguous (no reply; settled by reading the block).", []string{"result"}, nil),
		unreachable: prometheus.NewDesc("roost_fleet_unreachable", "1 when this fleet node could not reach the fleet store at its last look: it spends what it holds, then refuses.", nil, nil),
		pending:     prometheus.NewDesc("roost_fleet_pending_writes", "Writes to the fleet store whose outcome this node has yet to find out.", nil, nil),
	})
	return fs
}

type fleetCollector struct {
	status                               func() fleet.Status
	tokens, grants, unreachable, pending *prometheus.Desc
}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tokens
	ch <- c.grants
	ch <- c.unreachable
	ch <- c.pending
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	values := map[string]int64{"held": st.Held, "used": st.Used, "free": max(st.Held-st.Used, 0), "pool": st.Pool, "ceiling": st.Ceiling}
	for _, s := range FleetStates {
		ch <- prometheus.MustNewConstMetric(c.tokens, prometheus.GaugeValue, float64(values[s]), s)
	}
	for r, n := range map[string]int64{GrantGranted: st.Grants.Granted, GrantContended: st.Grants.Contended, GrantAmbiguous: st.Grants.Ambiguous} {
		ch <- prometheus.MustNewConstMetric(c.grants, prometheus.CounterValue, float64(n), r)
	}
	var down float64
	if st.Unreachable {
		down = 1
	}
	ch <- prometheus.MustNewConstMetric(c.unreachable, prometheus.GaugeValue, down)
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(st.Pending))
}

// Txn times the transaction.
func (s *FleetStore) Txn(ctx context.Context, cmps []fleet.Cmp, then []fleet.Op) (bool, error) {
	start := time.Now()
	applied, err := s.Store.Txn(ctx, cmps, then)
	s.txn.Observe(time.Since(start).Seconds())
	return applied, err
}

// Placement results roost_fleet_placements_total counts, as pkg/fleet/placement's Stager
// reports them.
var PlacementResults = []string{"here", "forwarded", "refused", "retried", "unplaced"}

// WatchPlacements registers roost_fleet_placements_total and returns what a Stager calls
// with each result: here (placed on this node), forwarded (on another), refused (no node
// could take it, or the one chosen refused), retried (a node refused it for want of room
// and the next was tried), unplaced (etcd did not answer; staged here as a local call).
func (m *Metrics) WatchPlacements() func(result string) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roost_fleet_placements_total",
		Help: "Sessions this node placed over the fleet, by result: here, forwarded (to another node), refused, retried (a node refused for want of room; the next was tried), unplaced (the fleet's etcd did not answer; staged here).",
	}, []string{"result"})
	for _, r := range PlacementResults {
		c.WithLabelValues(r)
	}
	m.registry.MustRegister(c)
	return func(result string) { c.WithLabelValues(result).Inc() }
}

// WatchForwarded registers roost_fleet_forwarded_calls_total and returns what a Router
// calls with the code each forwarded call ended with.
func (m *Metrics) WatchForwarded() func(code string) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roost_fleet_forwarded_calls_total",
		Help: "Calls about sessions on other nodes that this node forwarded to them, by the gRPC code they ended with (Unavailable, from the router, when the owner did not answer).",
	}, []string{"code"})
	m.registry.MustRegister(c)
	return func(code string) { c.WithLabelValues(code).Inc() }
}
