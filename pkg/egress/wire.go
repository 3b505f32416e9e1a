package egress

import (
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"

	"roost.dev/roost/pkg/manifest"
)

// Bytes are counted where they cross: a forwarded request on the socket the transport
// dials (request line, headers, chunk framing and bodies up; status line, headers and
// bodies down), a tunnel's CONNECT head and its 200 or the SOCKS5 handshake, and every
// byte a tunnel carries. Budget (resources.egress_max_bytes) is reserved before a write
// and as a read arrives, so no header block can pass it; the session's bandwidth share
// (resources.egress_bytes_per_sec) paces the same bytes, one token bucket each way shared
// by all of the session's connections.

// maxBurst bounds a bucket's depth: at most this many bytes pass at once above the rate.
const maxBurst = 16 << 20

// newLimiter is one direction's bucket for bytesPerSec: a tenth of a second deep (at least
// one copy buffer, so every read fits in one wait), so a session that has been quiet
// cannot take the link in a burst for longer than that.
func newLimiter(bytesPerSec int64) *rate.Limiter {
	burst := min(max(bytesPerSec/10, bufSize), maxBurst)
	return rate.NewLimiter(rate.Limit(bytesPerSec), int(burst))
}

// shareOf is the bandwidth share a session gets each way: what it declared, else the
// default, never above the operator's ceiling.
func (p *Proxy) shareOf(declared int64) int64 {
	bps := declared
	if bps <= 0 {
		bps = manifest.DefaultEgressBytesPerSec
	}
	if p.maxRate > 0 {
		bps = min(bps, p.maxRate)
	}
	return bps
}

// pace waits until n bytes one way fit the session's share; it fails only when the
// session is closed.
func (s *Session) pace(n int, up bool) error {
	l := s.downRate
	if up {
		l = s.upRate
	}
	for n > 0 {
		k := min(n, l.Burst())
		if err := l.WaitN(s.ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// readSize is the most one metered read takes: what one wait of the share admits.
func (s *Session) readSize(p []byte) []byte {
	if b := min(s.upRate.Burst(), s.downRate.Burst()); len(p) > b {
		return p[:b]
	}
	return p
}

// refund gives back n bytes reserved by take that never crossed.
func (s *Session) refund(n int) {
	if n > 0 {
		s.used.Add(-int64(n))
	}
}

// charge reserves up bytes one way and down the other that a handshake moves (a CONNECT
// head and its 200, a SOCKS5 exchange), all or nothing: false when they do not fit what is
// left of the budget.
func (s *Session) charge(up, down int) bool {
	n := up + down
	if k := s.take(n); k < n {
		s.refund(k)
		return false
	}
	return true
}

// countSession adds n bytes one way to the session, and to f when there is one.
func (s *Session) countSession(f *flow, n int, up bool) {
	if f != nil {
		f.count(n, up)
		return
	}
	if n <= 0 {
		return
	}
	if up {
		s.up.Add(int64(n))
	} else {
		s.down.Add(int64(n))
	}
}

// requestHeadSize is a request's line and header block as the server parsed it: what the
// client sent, but for whitespace the parser dropped. (A CONNECT's head reaches no
// destination, but it is bytes the session moved through roostd.)
func requestHeadSize(r *http.Request) int {
	n := len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto) + 2
	if r.Host != "" && r.ProtoAtLeast(1, 1) {
		// The server moved the Host header into r.Host.
		n += len("Host: ") + len(r.Host) + 2
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + 2 + len(v) + 2
		}
	}
	return n + 2
}

// countingReader counts what is read through it (a SOCKS5 handshake).
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// trackedConn is an upstream socket the forward transport dialled: it meters every byte
// against the session's budget and share, counts it for the request using it now (a pooled
// socket serves one forwarded request after another), and takes itself out of the
// session's set when closed.
type trackedConn struct {
	net.Conn
	s    *Session
	cur  atomic.Pointer[flow]
	once sync.Once
}

func (c *trackedConn) use(f *flow) { c.cur.Store(f) }

// Read reserves budget for what arrived before handing it on: past the budget the
// request is cut, whether in the status line, the headers or the body.
func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(c.s.readSize(p))
	if n <= 0 {
		return n, err
	}
	f := c.cur.Load()
	k := c.s.take(n)
	c.s.countSession(f, k, false)
	if k < n {
		if f != nil {
			f.cut(ReasonEgressMaxBytes, f.budgetDetail()+"; the response was cut when it reached the limit")
		}
		return k, errBudget
	}
	if perr := c.s.pace(n, false); perr != nil {
		return n, perr
	}
	return n, err
}

// Write reserves budget and waits for the share before each piece goes out.
func (c *trackedConn) Write(p []byte) (int, error) {
	f := c.cur.Load()
	done := 0
	for len(p) > 0 {
		chunk := c.s.readSize(p)
		k := c.s.take(len(chunk))
		if k > 0 {
			if err := c.s.pace(k, true); err != nil {
				c.s.refund(k)
				return done, err
			}
			n, err := c.Conn.Write(chunk[:k])
			c.s.refund(k - n)
			c.s.countSession(f, n, true)
			done += n
			if err != nil {
				return done, err
			}
		}
		if k < len(chunk) {
			if f != nil {
				f.cut(ReasonEgressMaxBytes, f.budgetDetail()+"; the request was cut when it reached the limit")
			}
			return done, errBudget
		}
		p = p[len(chunk):]
	}
	return done, nil
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.s.untrack(c) })
	return c.Conn.Close()
}

func (c *trackedConn) CloseWrite() error { return closeWrite(c.Conn) }
