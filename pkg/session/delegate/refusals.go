package delegate

import (
	"cmp"
	"slices"

	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
)

// A session's refused connections are folded into counters, one per (host, port, reason):
// a session choosing its destinations could otherwise write one trace record per refusal
// and so fill the trace's cap before its allowed connections are recorded.

const (
	// maxRefusalKeys bounds the (host, port, reason) keys one session's counters hold;
	// refusals of further hosts go to the overflow key of their reason.
	maxRefusalKeys = 256
	// maxOverflowKeys bounds the overflow keys (one per reason: the proxy's reasons are
	// few); past it everything left goes to one key.
	maxOverflowKeys = 32
	// maxRefusalDetail bounds the sample sentence a key keeps.
	maxRefusalDetail = 512
	// overflowReason is the last key's reason, once even the overflow keys are full.
	overflowReason = "other"
)

type refusalKey struct {
	host   string
	port   int
	reason string
}

// refusalCount is one key's counter; traced is how many of its refusals the trace's
// egress_refused records already account for.
type refusalCount struct {
	store.EgressRefusal
	traced int64
}

// refusals is one session's counters. Its owner serialises calls.
type refusals struct {
	keys      map[refusalKey]*refusalCount
	overflows int
}

func newRefusals() *refusals { return &refusals{keys: map[refusalKey]*refusalCount{}} }

// slot finds k's counter, or makes one (the overflow key's when k is past the bound); new
// says it was made.
func (rs *refusals) slot(k refusalKey) (c *refusalCount, made bool) {
	if c := rs.keys[k]; c != nil {
		return c, false
	}
	if len(rs.keys)-rs.overflows >= maxRefusalKeys {
		k = refusalKey{host: records.EgressOverflowHost, reason: k.reason}
		if rs.overflows >= maxOverflowKeys {
			k.reason = overflowReason
		}
		if c := rs.keys[k]; c != nil {
			return c, false
		}
		rs.overflows++
	}
	c = &refusalCount{EgressRefusal: store.EgressRefusal{Host: k.host, Port: k.port, Reason: k.reason}}
	rs.keys[k] = c
	return c, true
}

// note counts one refusal; first says it is its key's first.
func (rs *refusals) note(r egress.Record) (first bool) {
	c, made := rs.slot(refusalKey{host: r.Host, port: r.Port, reason: r.Reason})
	t := r.Time.UTC()
	if c.Count == 0 {
		c.First, c.Proto = t, r.Proto
		c.Detail = truncate(r.Detail, maxRefusalDetail)
	}
	if t.After(c.Last) {
		c.Last = t
	}
	c.Count++
	return made
}

// merge folds in a counter read back at recovery: the larger of each count, as the
// checkpoint and the trace may each be ahead of the other.
func (rs *refusals) merge(e store.EgressRefusal, traced int64) {
	if e.Count < 0 || traced < 0 {
		return
	}
	c, _ := rs.slot(refusalKey{host: e.Host, port: e.Port, reason: e.Reason})
	if c.First.IsZero() || (!e.First.IsZero() && e.First.Before(c.First)) {
		c.First = e.First.UTC()
	}
	if e.Last.After(c.Last) {
		c.Last = e.Last.UTC()
	}
	if c.Detail == "" {
		c.Detail, c.Proto = truncate(e.Detail, maxRefusalDetail), e.Proto
	}
	c.Count = max(c.Count, e.Count)
	c.traced = min(max(c.traced, traced), c.Count)
}

// sorted is every counter, the most refused first (then by host, port and reason, so the
// order is stable).
func (rs *refusals) sorted() []*refusalCount {
	out := make([]*refusalCount, 0, len(rs.keys))
	for _, c := range rs.keys {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *refusalCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Host, b.Host), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Reason, b.Reason))
	})
	return out
}

// changed is every counter with refusals no trace record accounts for yet, oldest first.
func (rs *refusals) changed() []*refusalCount {
	var out []*refusalCount
	for _, c := range rs.keys {
		if c.Count > c.traced {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b *refusalCount) int {
		return cmp.Or(a.First.Compare(b.First), cmp.Compare(a.Host, b.Host), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Reason, b.Reason))
	})
	return out
}

// top is the n most refused keys.
func (rs *refusals) top(n int) []store.EgressRefusal {
	if rs == nil || len(rs.keys) == 0 {
		return nil
	}
	all := rs.sorted()
	out := make([]store.EgressRefusal, 0, min(n, len(all)))
	for _, c := range all[:min(n, len(all))] {
		out = append(out, c.EgressRefusal)
	}
	return out
}

// entries is every counter as the checkpoint keeps it.
func (rs *refusals) entries() []checkpointRefusal {
	all := rs.sorted()
	out := make([]checkpointRefusal, 0, len(all))
	for _, c := range all {
		out = append(out, checkpointRefusal{EgressRefusal: c.EgressRefusal, Traced: c.traced})
	}
	return out
}

// total is every refusal counted.
func (rs *refusals) total() int64 {
	var n int64
	for _, c := range rs.keys {
		n += c.Count
	}
	return n
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
