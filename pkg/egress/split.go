package egress

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Split wraps a listener so one port serves both HTTP (the endpoint's API, forward proxy
// and CONNECT) and SOCKS5: a connection whose first byte is 0x05 (a SOCKS5 greeting; no
// HTTP request begins so) goes to socks, in a goroutine of its own; any other is returned
// by Accept with that byte still to be read.
//
// The first byte is awaited off the Accept path, a goroutine per connection, for at most
// PeekTimeout: a client that connects and says nothing delays no one else's accept, and
// is closed when its time is up. Close stops Accept and closes the connections still
// awaiting their first byte or their Accept.
func Split(ln net.Listener, socks func(net.Conn)) net.Listener {
	return split(ln, socks, PeekTimeout)
}

func split(ln net.Listener, socks func(net.Conn), timeout time.Duration) *splitListener {
	l := &splitListener{
		Listener: ln,
		socks:    socks,
		timeout:  timeout,
		conns:    make(chan net.Conn),
		errs:     make(chan error),
		done:     make(chan struct{}),
		stopped:  make(chan struct{}),
		pending:  make(map[net.Conn]struct{}),
	}
	go l.loop()
	return l
}

type splitListener struct {
	net.Listener
	socks   func(net.Conn)
	timeout time.Duration

	conns chan net.Conn
	errs  chan error
	// done is closed by Close; stopped when the inner listener failed for good, with err.
	done, stopped chan struct{}
	err           error
	closeOnce     sync.Once

	mu      sync.Mutex
	pending map[net.Conn]struct{}
}

// loop accepts from the inner listener and starts each connection's peek. A temporary
// error is handed to Accept (whose caller backs off); any other ends the loop and every
// later Accept returns it.
func (l *splitListener) loop() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			var ne interface{ Temporary() bool }
			if errors.As(err, &ne) && ne.Temporary() {
				select {
				case l.errs <- err:
					continue
				case <-l.done:
					return
				}
			}
			l.err = err
			close(l.stopped)
			return
		}
		if !l.hold(c) {
			_ = c.Close()
			return
		}
		go l.peek(c)
	}
}

// hold records a connection awaiting its first byte; false once the listener is closed.
func (l *splitListener) hold(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending == nil {
		return false
	}
	l.pending[c] = struct{}{}
	return true
}

// release takes a connection off the pending set; false when Close has (and closed it).
func (l *splitListener) release(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.pending[c]; !ok {
		return false
	}
	delete(l.pending, c)
	return true
}

func (l *splitListener) peek(c net.Conn) {
	var b [1]byte
	_ = c.SetReadDeadline(time.Now().Add(l.timeout))
	_, err := io.ReadFull(c, b[:])
	_ = c.SetReadDeadline(time.Time{})
	if !l.release(c) {
		return
	}
	if err != nil {
		_ = c.Close()
		return
	}
	pc := &peekedConn{Conn: c, first: b[0], pending: true}
	if b[0] == socksVersion {
		l.socks(pc)
		return
	}
	select {
	case l.conns <- pc:
	case <-l.done:
		_ = c.Close()
	}
}

// Accept returns the next connection that is not SOCKS5.
func (l *splitListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	case <-l.stopped:
		return nil, l.err
	}
}

// Close closes the inner listener and the connections not yet handed on.
func (l *splitListener) Close() error {
	err := net.ErrClosed
	l.closeOnce.Do(func() {
		close(l.done)
		err = l.Listener.Close()
		l.mu.Lock()
		pending := l.pending
		l.pending = nil
		l.mu.Unlock()
		for c := range pending {
			_ = c.Close()
		}
	})
	return err
}

// peekedConn gives back the byte Split read before reading on.
type peekedConn struct {
	net.Conn
	mu      sync.Mutex
	first   byte
	pending bool
}

func (c *peekedConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.pending && len(p) > 0 {
		p[0] = c.first
		c.pending = false
		c.mu.Unlock()
		return 1, nil
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}

// CloseWrite half-closes when the connection underneath can, so a tunnel passes on the
// end of one direction and the HTTP server's last reply is not lost to a reset.
func (c *peekedConn) CloseWrite() error { return closeWrite(c.Conn) }
