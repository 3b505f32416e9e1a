package endpoint

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"roost.dev/roost/pkg/fdbudget"
)

// LimitConnections is the bound an endpoint reports when it refuses a connection, as
// store.LimitEndpointConnections names it.
const LimitConnections = "endpoint_connections"

// gate counts connections held against a cap.
type gate struct {
	held atomic.Int64
	max  int64
}

// acquire takes a place, or says there is none.
func (g *gate) acquire() bool {
	if g == nil {
		return true
	}
	for {
		n := g.held.Load()
		if n >= g.max {
			return false
		}
		if g.held.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (g *gate) release() {
	if g != nil {
		g.held.Add(-1)
	}
}

// Held is how many connections the gate counts now.
func (g *gate) Held() int64 {
	if g == nil {
		return 0
	}
	return g.held.Load()
}

// limitListener hands the HTTP server a connection only while the session holds fewer
// than its cap and roostd's descriptor budget has a slot for it. A connection past either
// is closed the moment it is accepted, before a byte of it is read, and counted.
//
// The slot is checked against the budget's total, not the session's share: the endpoint's
// own cap bounds a session's connections, the share is left for what the session opens
// through them, and a refusal there can be said on the connection that asked.
//
// It closes rather than blocks (as netutil.LimitListener does): a listener that stops
// accepting leaves the flood in the kernel's accept queue, where the client sees its
// connects succeed and hang, the session's own later requests queue behind it, and nothing
// is counted or reported. Closed at once, the caller sees a reset straight away and roostd
// holds no descriptor for it.
type limitListener struct {
	net.Listener
	id      string
	session *gate
	budget  *fdbudget.Budget
	refused *refusals
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if !l.session.acquire() {
			abort(c)
			l.refused.add(false)
			continue
		}
		var slot fdbudget.Slot
		if l.budget != nil {
			var err error
			if slot, err = l.budget.AcquireTotal(l.id, fdbudget.Endpoint); err != nil {
				l.session.release()
				abort(c)
				l.refused.add(true)
				continue
			}
		}
		return &heldConn{Conn: c, l: l, slot: slot}, nil
	}
}

// abort closes a refused connection with a reset: the caller learns at once, and the
// socket leaves no TIME_WAIT behind.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// heldConn gives its places back when the server closes it.
type heldConn struct {
	net.Conn
	l    *limitListener
	slot fdbudget.Slot
	once sync.Once
}

func (c *heldConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.session.release()
		c.slot.Release()
	})
	return err
}

// CloseWrite lets the HTTP server half-close before it closes, as it does on a bare TCP
// connection, so a last reply is not lost to a reset.
func (c *heldConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// refusals counts one session's refused connections and reports them in batches: the
// first at once, then at most one report per interval, so a flood of connections makes a
// handful of events, each saying how many were cut.
type refusals struct {
	report     func(detail string)
	every      time.Duration
	sessionMax int64
	globalMax  int64

	mu              sync.Mutex
	session, global int
	last            time.Time
	timer           *time.Timer
}

func (r *refusals) add(global bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if global {
		r.global++
	} else {
		r.session++
	}
	if r.timer != nil {
		return
	}
	wait := max(r.every-time.Since(r.last), 0)
	r.timer = time.AfterFunc(wait, r.flush)
}

func (r *refusals) flush() {
	r.mu.Lock()
	session, global := r.session, r.global
	r.session, r.global = 0, 0
	r.last = time.Now()
	r.timer = nil
	r.mu.Unlock()
	var parts []string
	if session > 0 {
		parts = append(parts, fmt.Sprintf("%d connection(s) refused: the session's endpoint held its cap of %d (resources.endpoint_max_connections)", session, r.sessionMax))
	}
	if global > 0 {
		parts = append(parts, fmt.Sprintf("%d connection(s) refused: all sessions together held the daemon's global descriptor budget of %d (its open-file limit less a reserve for the operator)", global, r.globalMax))
	}
	if len(parts) > 0 {
		r.report(strings.Join(parts, "; "))
	}
}
