package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"

	"roost.dev/roost/pkg/fdbudget"
)

// errBudget ends a copy whose session ran out of egress bytes.
var errBudget = errors.New("egress byte budget spent (resources.egress_max_bytes)")

// dial connects to the decided addresses in order, never to a name. It returns the last
// address tried with the error when all fail. The connection holds a slot of roostd's
// descriptor budget until it is closed; with none to be had the error is a
// *fdbudget.Refused and nothing is dialled.
func (s *Session) dial(ctx context.Context, d decision) (net.Conn, string, error) {
	slot, err := s.slot()
	if err != nil {
		return nil, "", err
	}
	c, last, err := s.dialAddrs(ctx, d)
	if err != nil {
		slot.Release()
		return nil, last, err
	}
	if !slot.Valid() {
		return c, last, nil
	}
	return &slotConn{Conn: c, slot: slot}, last, nil
}

// slot takes an upstream descriptor slot for the session. Refused, it first gives back
// the session's idle pooled connections, whose slots are its own, and tries once more.
func (s *Session) slot() (fdbudget.Slot, error) {
	if s.p.fds == nil {
		return fdbudget.Slot{}, nil
	}
	slot, err := s.p.fds.Acquire(s.id, fdbudget.Upstream)
	if err != nil {
		s.transport.CloseIdleConnections()
		slot, err = s.p.fds.Acquire(s.id, fdbudget.Upstream)
	}
	return slot, err
}

// refusedSlot is the denial for a dial the descriptor budget refused; nil when err is not
// such a refusal.
func refusedSlot(t target, err error) *denial {
	var r *fdbudget.Refused
	if !errors.As(err, &r) {
		return nil
	}
	return &denial{ReasonConnections, fmt.Sprintf("egress to %s refused: %v", hostPort(t.host, t.port), r), socksFailure}
}

// slotConn gives its descriptor slot back when closed.
type slotConn struct {
	net.Conn
	slot fdbudget.Slot
	once sync.Once
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.slot.Release)
	return err
}

func (c *slotConn) CloseWrite() error { return closeWrite(c.Conn) }

// dialAddrs dials d's addresses in order.
func (s *Session) dialAddrs(ctx context.Context, d decision) (net.Conn, string, error) {
	var errs []error
	last := ""
	for _, ap := range d.addrs {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		last = ap.String()
		c, err := s.p.dialer.DialContext(ctx, "tcp", last)
		if err == nil {
			return c, last, nil
		}
		errs = append(errs, err)
	}
	return nil, last, fmt.Errorf("egress: dialling %s: %w", last, errors.Join(errs...))
}

// dialDetail says a dial failed.
func dialDetail(t target, addr string, err error) string {
	return fmt.Sprintf("egress to %s failed: could not connect to %s: %v", hostPort(t.host, t.port), addr, errors.Unwrap(err))
}

// socksDialReply is the SOCKS5 reply for a failed dial.
func socksDialReply(err error) byte {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return socksRefused
	case errors.Is(err, syscall.ENETUNREACH):
		return socksNetUnreachable
	case errors.Is(err, syscall.EHOSTUNREACH), errors.As(err, &ne) && ne.Timeout():
		return socksHostUnreachable
	default:
		return socksFailure
	}
}

// copyCounted copies src to dst, reserving budget for every read and waiting for the
// session's share before writing it. It returns nil at src's EOF, errBudget when the
// budget ran out (having written exactly what was left of it), or the error that ended
// it.
func (f *flow) copyCounted(dst io.Writer, src io.Reader, up bool) error {
	buf := f.s.readSize(make([]byte, bufSize))
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			k := f.s.take(n)
			if k > 0 {
				if err := f.s.pace(k, up); err != nil {
					return err
				}
				w, werr := dst.Write(buf[:k])
				f.count(w, up)
				if werr != nil {
					return werr
				}
			}
			if k < n {
				return errBudget
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// closeWrite half-closes c when it can.
func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// tunnel carries bytes both ways between the client (read through clientR, which holds
// anything already buffered from it) and upstream until both directions end: a side that
// ends cleanly is passed on as a half-close; an error, a cut or Close ends both. It
// closes both connections and finishes the flow.
func (f *flow) tunnel(client net.Conn, clientR io.Reader, upstream net.Conn) {
	s := f.s
	defer f.finish()
	if !s.track(client) {
		_ = upstream.Close()
		return
	}
	defer s.untrack(client)
	if !s.track(upstream) {
		_ = client.Close()
		return
	}
	defer s.untrack(upstream)
	closeBoth := sync.OnceFunc(func() {
		_ = client.Close()
		_ = upstream.Close()
	})
	defer closeBoth()
	var wg sync.WaitGroup
	pipe := func(dst net.Conn, src io.Reader, up bool) {
		defer wg.Done()
		err := f.copyCounted(dst, src, up)
		switch {
		case err == nil:
			// A clean end one way is a half-close the other side should see; where the
			// connection cannot say it, ending both is the nearest thing.
			if closeWrite(dst) != nil {
				closeBoth()
			}
		case errors.Is(err, errBudget):
			f.cut(ReasonEgressMaxBytes, f.budgetDetail()+"; the connection was cut when it reached the limit")
			closeBoth()
		default:
			closeBoth()
		}
	}
	wg.Add(2)
	go pipe(upstream, clientR, true)
	go pipe(client, upstream, false)
	wg.Wait()
}
