package etcdtest

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Bridge is a TCP proxy on a loopback port of its own in front of one member's listener:
// what the test cuts to make a partition. It forwards each connection it accepts to where its
// member listens now (a restarted member listens on a new port; the bridge's stays), and
// refuses connections while the member is down. Blackholed, it keeps the connections but
// drops what they carry, in one direction or both, as a partition does: nothing arrives, and
// nothing says so.
type Bridge struct {
	ln     net.Listener
	target func() string // the member's address now; "" while it is down

	dropRequests, dropReplies atomic.Bool

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func newBridge(target func() string) (*Bridge, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bridge listener: %w", err)
	}
	b := &Bridge{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	b.wg.Add(1)
	go b.serve()
	return b, nil
}

// Addr is the bridge's host:port.
func (b *Bridge) Addr() string { return b.ln.Addr().String() }

// Blackhole drops everything both ways, on the connections open now and on new ones, until
// Heal.
func (b *Bridge) Blackhole() { b.dropRequests.Store(true); b.dropReplies.Store(true) }

// BlackholeReplies drops only what the member sends back: requests arrive and are served, and
// their callers never hear of it. A write sent then has an outcome its caller cannot know.
func (b *Bridge) BlackholeReplies() { b.dropReplies.Store(true) }

// BlackholeRequests drops only what callers send: nothing reaches the member.
func (b *Bridge) BlackholeRequests() { b.dropRequests.Store(true) }

// Heal passes traffic again. Connections that lost bytes stay broken (their streams are torn);
// their clients notice and connect anew.
func (b *Bridge) Heal() { b.dropRequests.Store(false); b.dropReplies.Store(false) }

// DropConnections closes every connection open now, as a member's restart would.
func (b *Bridge) DropConnections() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for c := range b.conns {
		c.Close()
	}
}

// Close stops accepting, closes every connection and waits for the bridge's goroutines.
func (b *Bridge) Close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.ln.Close()
	b.DropConnections()
	b.wg.Wait()
}

func (b *Bridge) serve() {
	defer b.wg.Done()
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return // closed
		}
		addr := b.target()
		if addr == "" {
			in.Close() // the member is down: as a refused connection would
			continue
		}
		out, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			in.Close()
			continue
		}
		if !b.track(in, out) {
			in.Close()
			out.Close()
			return
		}
		b.wg.Add(2)
		go b.pipe(out, in, &b.dropRequests)
		go b.pipe(in, out, &b.dropReplies)
	}
}

func (b *Bridge) track(cs ...net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	for _, c := range cs {
		b.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst, dropping what it reads while drop is set; when src ends it closes
// both, so the other direction's pipe ends too.
func (b *Bridge) pipe(dst, src net.Conn, drop *atomic.Bool) {
	defer b.wg.Done()
	defer func() {
		b.mu.Lock()
		delete(b.conns, src)
		delete(b.conns, dst)
		b.mu.Unlock()
		src.Close()
		dst.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !drop.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF, or closed by the other direction or DropConnections
		}
	}
}
