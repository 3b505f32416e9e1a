package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Special-purpose addresses open only through PermitCIDRs or an IP-literal rule naming
// that very address; a name resolving to several addresses loses its special ones and is
// dialled at what remains, by address, with one lookup.
func TestSpecialOpenings(t *testing.T) {
	web := webServer(t)
	port := portOf(t, web.URL)
	get := func(e *env, host string) (*http.Response, string) {
		return e.raw(fmt.Sprintf("GET http://%s:%d/hello HTTP/1.1\r\nHost: x\r\n\r\n", host, port))
	}
	t.Run("ip literal rule for the host's own address", func(t *testing.T) {
		// Loopback, unspecified and link-local (the metadata service) are the host's: a
		// capsule's rule naming them opens nothing; only the operator's PermitCIDRs does.
		for _, lit := range []string{"127.0.0.1", "0.0.0.0", "169.254.169.254", "[::1]", "[fd00:ec2::254]", "[::ffff:127.0.0.1]"} {
			e := hostileEnv(t, []string{lit})
			res, body := get(e, lit)
			if res.StatusCode != http.StatusForbidden || res.Header.Get(DeniedHeader) != ReasonSpecialAddress || !strings.Contains(body, "host's own") {
				t.Fatalf("%s: %d %v %s", lit, res.StatusCode, res.Header, body)
			}
			if rec := e.rec.next(t); rec.Decision != Denied || rec.Reason != ReasonSpecialAddress || rec.Addr != "" {
				t.Fatalf("%s: record %+v", lit, rec)
			}
		}
	})
	t.Run("ip literal rule, the address opened by the operator", func(t *testing.T) {
		e := hostileEnv(t, []string{"127.0.0.1"}, netip.MustParsePrefix("127.0.0.1/32"))
		if res, body := get(e, "127.0.0.1"); res.StatusCode != 200 || body != "hello world" {
			t.Fatalf("%d %s", res.StatusCode, body)
		}
		if rec := e.rec.next(t); rec.Decision != Allowed || rec.Rule != "127.0.0.1" {
			t.Fatalf("record %+v", rec)
		}
		// And the mapped spelling is the IPv4 address.
		if res, body := get(e, "[::ffff:127.0.0.1]"); res.StatusCode != 200 {
			t.Fatalf("%d %s", res.StatusCode, body)
		}
		if rec := e.rec.next(t); rec.Host != "127.0.0.1" || rec.Addr != fmt.Sprintf("127.0.0.1:%d", port) {
			t.Fatalf("record %+v", rec)
		}
	})
	t.Run("permit cidrs", func(t *testing.T) {
		e := hostileEnv(t, []string{"lo.test", "mixed.test", "mapped.test", "ten.test"}, netip.MustParsePrefix("127.0.0.0/8"))
		for _, h := range []string{"lo.test", "mapped.test", "mixed.test"} {
			if res, body := get(e, h); res.StatusCode != 200 {
				t.Fatalf("%s: %d %s", h, res.StatusCode, body)
			}
			if rec := e.rec.next(t); rec.Decision != Allowed || rec.Addr != fmt.Sprintf("127.0.0.1:%d", port) {
				t.Fatalf("%s: record %+v", h, rec)
			}
		}
		res, body := get(e, "ten.test")
		e.expectHTTP(t, res, body, vSpecial, ProtoHTTP, "ten.test", port)
		if !strings.Contains(body, "10.0.0.1 is a special-purpose address (private, RFC 1918)") {
			t.Fatalf("detail %s", body)
		}
		if n := e.res.count("mixed.test"); n != 1 {
			t.Fatalf("mixed.test looked up %d times", n)
		}
		for _, d := range e.dialer.attempts() {
			if d != fmt.Sprintf("127.0.0.1:%d", port) {
				t.Fatalf("dialled %s", d)
			}
		}
	})
	t.Run("mapped permit prefix", func(t *testing.T) {
		e := hostileEnv(t, []string{"lo.test"}, netip.MustParsePrefix("::ffff:127.0.0.0/104"))
		if res, body := get(e, "lo.test"); res.StatusCode != 200 {
			t.Fatalf("%d %s", res.StatusCode, body)
		}
	})
	t.Run("wildcard", func(t *testing.T) {
		e := newEnv(t, permitLoopback(), []string{"*.web.test"}, 0, 0)
		if res, body := get(e, "a.web.test"); res.StatusCode != 200 {
			t.Fatalf("%d %s", res.StatusCode, body)
		}
		if rec := e.rec.next(t); rec.Rule != "*.web.test" || rec.Host != "a.web.test" {
			t.Fatalf("record %+v", rec)
		}
		res, body := get(e, "web.test")
		e.expectHTTP(t, res, body, vNotAllowed, ProtoHTTP, "web.test", port)
	})
}

// A resolver that changes its answer between lookups (DNS rebinding) cannot switch a
// connection: the one lookup is checked and its address dialled.
func TestRebinding(t *testing.T) {
	web := webServer(t)
	port := portOf(t, web.URL)
	r := &rebinder{}
	e := newEnv(t, Config{Resolver: r, PermitCIDRs: []netip.Prefix{loopback8}}, []string{"rebind.test"}, 0, 0)
	res, body := e.raw(fmt.Sprintf("GET http://rebind.test:%d/hello HTTP/1.1\r\nHost: x\r\n\r\n", port))
	if res.StatusCode != 200 || body != "hello world" {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	if n := r.n.Load(); n != 1 {
		t.Fatalf("%d lookups", n)
	}
	e.rec.next(t)
	// The second lookup answers the metadata address: refused, undialled.
	res, body = e.raw(fmt.Sprintf("GET http://rebind.test:%d/hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", port))
	e.expectHTTP(t, res, body, vSpecial, ProtoHTTP, "rebind.test", port)
}

type rebinder struct{ n atomic.Int32 }

func (r *rebinder) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if r.n.Add(1) == 1 {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return []netip.Addr{netip.MustParseAddr("169.254.169.254")}, nil
}

func closedPort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return p
}

func TestDialFailed(t *testing.T) {
	port := closedPort(t)
	e := newEnv(t, permitLoopback(), []string{"web.test"}, 0, 0)
	res, body := e.raw(fmt.Sprintf("GET http://web.test:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", port))
	rec := func() Record {
		t.Helper()
		r := e.rec.next(t)
		if r.Decision != Denied || r.Reason != ReasonDialFailed || r.Addr != fmt.Sprintf("127.0.0.1:%d", port) || !strings.Contains(r.Detail, "refused") {
			t.Fatalf("record %+v", r)
		}
		return r
	}
	if res.StatusCode != 502 || res.Header.Get(DeniedHeader) != ReasonDialFailed || !strings.Contains(body, "could not connect to 127.0.0.1") {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	rec()
	_, _, res2 := e.connect(fmt.Sprintf("web.test:%d", port))
	b, _ := io.ReadAll(res2.Body)
	if res2.StatusCode != 502 || res2.Header.Get(DeniedHeader) != ReasonDialFailed {
		t.Fatalf("%d %s", res2.StatusCode, b)
	}
	rec()
	if _, code := e.socks(socksDomain("web.test", port)); code != vDialRefused.socks {
		t.Fatalf("SOCKS5 reply %#x", code)
	}
	rec()
	if tot := e.s.Totals(); tot.Denied != 3 || tot.Connections != 0 || tot.Active != 0 {
		t.Fatalf("totals %+v", tot)
	}
}

// The connection past MaxConnectionsPerSession is refused, whatever the protocol; a slot
// comes back when a tunnel ends.
func TestMaxConnections(t *testing.T) {
	port := echoServer(t, "tcp", "127.0.0.1:0")
	cfg := permitLoopback()
	cfg.MaxConnectionsPerSession = 2
	e := newEnv(t, cfg, []string{"web.test"}, 0, 0)
	dest := fmt.Sprintf("web.test:%d", port)
	c1, _, r1 := e.connect(dest)
	c2, code := e.socks(socksDomain("web.test", port))
	if r1.StatusCode != 200 || code != 0 {
		t.Fatalf("%d %#x", r1.StatusCode, code)
	}
	waitFor(t, "two active", func() bool { return e.s.Totals().Active == 2 })
	_, _, r3 := e.connect(dest)
	b, _ := io.ReadAll(r3.Body)
	e.expectHTTP(t, r3, string(b), vMaxConns, ProtoConnect, "web.test", port)
	if _, code := e.socks(socksDomain("web.test", port)); code != socksNotAllowed {
		t.Fatalf("SOCKS5 reply %#x", code)
	}
	e.expectRecord(t, vMaxConns, ProtoSOCKS, "web.test", port)
	res, body := e.raw(fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: x\r\n\r\n", dest))
	e.expectHTTP(t, res, body, vMaxConns, ProtoHTTP, "web.test", port)
	c1.Close()
	if rec := e.rec.next(t); rec.Decision != Allowed || rec.Proto != ProtoConnect {
		t.Fatalf("record %+v", rec)
	}
	waitFor(t, "one active", func() bool { return e.s.Totals().Active == 1 })
	if _, _, r := e.connect(dest); r.StatusCode != 200 {
		t.Fatal(r.Status)
	}
	c2.Close()
}

// A long download is cut where the budget ends: the client gets no more than the budget
// across everything the session carries, the record says why, and what follows is refused.
func TestBudgetCutsForward(t *testing.T) {
	web := webServer(t)
	port := portOf(t, web.URL)
	const budget = 1 << 20
	e := newEnv(t, permitLoopback(), []string{"web.test"}, budget, 0)
	c := e.client()
	res, err := c.Get(fmt.Sprintf("http://web.test:%d/stream", port))
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err == nil {
		t.Fatal("an endless download ended cleanly")
	}
	if n > budget || n < budget/2 {
		t.Fatalf("client read %d bytes of a %d budget", n, budget)
	}
	rec := e.rec.next(t)
	if rec.Decision != Allowed || rec.Reason != ReasonEgressMaxBytes || rec.BytesUp+rec.BytesDown != budget {
		t.Fatalf("record %+v", rec)
	}
	tot := e.s.Totals()
	if tot.Used != budget || tot.BytesUp+tot.BytesDown != budget {
		t.Fatalf("totals %+v", tot)
	}
	r2, body := e.raw(fmt.Sprintf("GET http://web.test:%d/hello HTTP/1.1\r\nHost: x\r\n\r\n", port))
	e.expectHTTP(t, r2, body, vBudget, ProtoHTTP, "web.test", port)
	_, _, r3 := e.connect(fmt.Sprintf("web.test:%d", port))
	b, _ := io.ReadAll(r3.Body)
	e.expectHTTP(t, r3, string(b), vBudget, ProtoConnect, "web.test", port)
	if _, code := e.socks(socksDomain("web.test", port)); code != socksNotAllowed {
		t.Fatalf("SOCKS5 reply %#x", code)
	}
	e.expectRecord(t, vBudget, ProtoSOCKS, "web.test", port)
}

func TestBudgetCutsTunnels(t *testing.T) {
	port := streamServer(t)
	const budget = 3 << 20
	// Half the budget was spent before a restart.
	e := newEnv(t, permitLoopback(), []string{"web.test"}, budget, budget/2)
	dest := fmt.Sprintf("web.test:%d", port)
	c1, br, res := e.connect(dest)
	c2, code := e.socks(socksDomain("web.test", port))
	// The handshakes count: the CONNECT head and its 200, the SOCKS5 exchange.
	handUp := int64(len(fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)) + 3 + len(socksDomain("web.test", port)))
	handDown := int64(len(connectEstablished) + 2 + 10)
	if res.StatusCode != 200 || code != 0 {
		t.Fatalf("%d %#x", res.StatusCode, code)
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	for i, r := range []io.Reader{br, c2} {
		wg.Add(1)
		_, _ = []net.Conn{c1, c2}[i].Write([]byte("g"))
		go func() {
			defer wg.Done()
			n, _ := io.Copy(io.Discard, r)
			total.Add(n)
		}()
	}
	wg.Wait()
	c1.Close()
	c2.Close()
	// A byte went up each tunnel, unless the first tunnel's download spent the budget before
	// the second's byte was carried (then it was refused, and that tunnel streamed nothing);
	// the rest of the budget came down, to the byte.
	for range 2 {
		if rec := e.rec.next(t); rec.Reason != ReasonEgressMaxBytes || rec.Decision != Allowed {
			t.Fatalf("record %+v", rec)
		}
	}
	// Both tunnels have ended (their records are out): the totals are final.
	tot := e.s.Totals()
	up := tot.BytesUp - handUp
	if up != 1 && up != 2 {
		t.Fatalf("totals %+v: %d bytes up besides the handshakes, want 1 or 2", tot, up)
	}
	left := budget/2 - up - handUp - handDown
	if got := total.Load(); got != left {
		t.Fatalf("clients read %d bytes; the budget left %d", got, left)
	}
	if tot.Used != budget || tot.BytesDown != left+handDown {
		t.Fatalf("totals %+v", tot)
	}
}

func TestBudgetSeededSpent(t *testing.T) {
	e := newEnv(t, permitLoopback(), []string{"web.test"}, 1000, 1000)
	res, body := e.raw("GET http://web.test:80/ HTTP/1.1\r\nHost: x\r\n\r\n")
	e.expectHTTP(t, res, body, vBudget, ProtoHTTP, "web.test", 80)
}

// An upload is counted too and cut at the budget.
func TestBudgetCutsUpload(t *testing.T) {
	web := webServer(t)
	port := portOf(t, web.URL)
	e := newEnv(t, permitLoopback(), []string{"web.test"}, 1000, 0)
	res, body := e.raw(fmt.Sprintf("POST http://web.test:%d/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n%s", port, strings.Repeat("u", 5000)))
	if res.StatusCode != 403 || res.Header.Get(DeniedHeader) != ReasonEgressMaxBytes {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	rec := e.rec.next(t)
	if rec.Reason != ReasonEgressMaxBytes || rec.BytesUp > 1000 {
		t.Fatalf("record %+v", rec)
	}
}

// Close ends open tunnels and requests at once, and refuses what comes after.
func TestCloseEndsTunnels(t *testing.T) {
	port := echoServer(t, "tcp", "127.0.0.1:0")
	web := webServer(t)
	e := newEnv(t, permitLoopback(), []string{"web.test"}, 0, 0)
	c1, br, res := e.connect(fmt.Sprintf("web.test:%d", port))
	c2, code := e.socks(socksDomain("web.test", port))
	if res.StatusCode != 200 || code != 0 {
		t.Fatalf("%d %#x", res.StatusCode, code)
	}
	// A forwarded request in the middle of an endless body.
	fres, err := e.client().Get(fmt.Sprintf("http://web.test:%d/stream", portOf(t, web.URL)))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "three active", func() bool { return e.s.Totals().Active == 3 })
	e.s.Close()
	done := make(chan error, 3)
	go func() { _, err := io.Copy(io.Discard, br); done <- err }()
	go func() { _, err := io.Copy(io.Discard, c2); done <- err }()
	go func() { _, err := io.Copy(io.Discard, fres.Body); done <- err }()
	for range 3 {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Close left a tunnel open")
		}
	}
	for range 3 {
		if rec := e.rec.next(t); rec.Decision != Allowed {
			t.Fatalf("record %+v", rec)
		}
	}
	waitFor(t, "none active", func() bool { return e.s.Totals().Active == 0 })
	_, _, r := e.connect(fmt.Sprintf("web.test:%d", port))
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != 503 || r.Header.Get(DeniedHeader) != ReasonSessionClosed {
		t.Fatalf("after Close: %d %s", r.StatusCode, b)
	}
	e.rec.next(t)
	c1.Close()
}

// A client that connects and says nothing delays no one's accept, and is closed when its
// first-byte time is up; Close stops Accept and closes what is still pending.
func TestSplit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var socksSeen atomic.Int32
	l := split(ln, func(c net.Conn) {
		defer c.Close()
		b := make([]byte, 3)
		if _, err := io.ReadFull(c, b); err == nil && string(b) == "\x05\x01\x00" {
			socksSeen.Add(1)
		}
	}, 1500*time.Millisecond)
	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	start := time.Now()
	talker, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer talker.Close()
	io.WriteString(talker, "GET / HTTP/1.1\r\n")
	select {
	case c := <-accepted:
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "GET / HTTP/1.1\r\n" {
			t.Fatalf("accepted connection reads %q %v", line, err)
		}
		if time.Since(start) > 750*time.Millisecond {
			t.Fatalf("accept waited %v behind a silent client", time.Since(start))
		}
		c.Close()
	case <-time.After(2 * time.Second):
		t.Fatal("no accept while a silent client was pending")
	}
	s, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte{5, 1, 0})
	waitFor(t, "socks handed over", func() bool { return socksSeen.Load() == 1 })
	s.Close()
	// The silent one is closed at its peek timeout.
	_ = silent.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("silent client: %v", err)
	}
	// A new silent one is closed by Close, which also ends Accept.
	silent2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent2.Close()
	waitFor(t, "pending", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return len(l.pending) == 1 })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-accepted:
		if ok {
			t.Fatal("accepted after Close")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Accept not unblocked by Close")
	}
	_ = silent2.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := silent2.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("pending client after Close: %v", err)
	}
}
