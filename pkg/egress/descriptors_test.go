package egress

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/pkg/fdbudget"
)

var vConnections = verdict{ReasonConnections, 503, socksFailure}

// serveSession serves s on a loopback listener of its own, as the endpoint would.
func serveSession(t *testing.T, s *Session) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(Split(ln, s.ServeSOCKS)) }()
	t.Cleanup(func() { _ = srv.Close(); s.Close() })
	return ln.Addr().String()
}

// Every upstream socket takes a slot of the session's share: past it a CONNECT and a
// forwarded request get 503 with X-Roost-Denied: connections, SOCKS reply 1, each a denied
// record naming the budget; another session is not refused for it; a slot freed is taken
// again.
func TestDescriptorShare(t *testing.T) {
	port := echoServer(t, "tcp", "127.0.0.1:0")
	cfg := permitLoopback()
	fds := fdbudget.Sized(100, 2)
	cfg.Descriptors = fds
	e := newEnv(t, cfg, []string{"web.test"}, 0, 0)
	dest := fmt.Sprintf("web.test:%d", port)
	c1, _, r1 := e.connect(dest)
	c2, code := e.socks(socksDomain("web.test", port))
	if r1.StatusCode != 200 || code != 0 {
		t.Fatalf("within the share: CONNECT %d, SOCKS %#x", r1.StatusCode, code)
	}
	if n := fds.Held("s1"); n != 2 {
		t.Fatalf("two tunnels hold %d slots of the session's, want 2", n)
	}

	_, _, r3 := e.connect(dest)
	b, _ := io.ReadAll(r3.Body)
	e.expectHTTP(t, r3, string(b), vConnections, ProtoConnect, "web.test", port)
	if _, code := e.socks(socksDomain("web.test", port)); code != socksFailure {
		t.Fatalf("SOCKS5 past the share: reply %#x, want %#x", code, socksFailure)
	}
	rec := e.expectRecord(t, vConnections, ProtoSOCKS, "web.test", port)
	if !strings.Contains(rec.Detail, "share of 2") {
		t.Errorf("the record does not say the share: %q", rec.Detail)
	}
	res, body := e.raw(fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: x\r\n\r\n", dest))
	e.expectHTTP(t, res, body, vConnections, ProtoHTTP, "web.test", port)

	// Another session, on the same budget, is within its own share.
	cfg.Dialer = e.dialer
	other := New(cfg, nil, nil).Session("s2", rules(t, "web.test"), Limits{})
	addr := serveSession(t, other)
	oc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()
	fmt.Fprintf(oc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
	line := make([]byte, 12)
	if _, err := io.ReadFull(oc, line); err != nil || string(line) != "HTTP/1.1 200" {
		t.Fatalf("another session's CONNECT while the first holds its share: %q %v", line, err)
	}

	// A freed slot is taken again.
	c1.Close()
	if rec := e.rec.next(t); rec.Decision != Allowed || rec.Proto != ProtoConnect {
		t.Fatalf("record %+v", rec)
	}
	waitFor(t, "the tunnel's slot back", func() bool { return fds.Held("s1") == 1 })
	if _, _, r := e.connect(dest); r.StatusCode != 200 {
		t.Fatalf("a CONNECT after a tunnel ended: %s", r.Status)
	}
	c2.Close()
}

// Past the daemon's total a session within its share is refused the same way, saying so.
func TestDescriptorTotal(t *testing.T) {
	port := echoServer(t, "tcp", "127.0.0.1:0")
	cfg := permitLoopback()
	fds := fdbudget.Sized(3, 2)
	cfg.Descriptors = fds
	e := newEnv(t, cfg, []string{"web.test"}, 0, 0)
	dest := fmt.Sprintf("web.test:%d", port)
	held, err := fds.AcquireTotal("elsewhere", fdbudget.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	held2, err := fds.AcquireTotal("elsewhere", fdbudget.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, r := e.connect(dest); r.StatusCode != 200 {
		t.Fatalf("the last slot of the total: %s", r.Status)
	}
	if _, code := e.socks(socksDomain("web.test", port)); code != socksFailure {
		t.Fatalf("SOCKS5 past the total: reply %#x, want %#x", code, socksFailure)
	}
	if rec := e.expectRecord(t, vConnections, ProtoSOCKS, "web.test", port); !strings.Contains(rec.Detail, "all sessions together hold roostd's 3 descriptors") {
		t.Errorf("the record does not say the total: %q", rec.Detail)
	}
	_, _, r := e.connect(dest)
	b, _ := io.ReadAll(r.Body)
	e.expectHTTP(t, r, string(b), vConnections, ProtoConnect, "web.test", port)
	held2.Release()
	if _, _, r := e.connect(dest); r.StatusCode != 200 {
		t.Fatalf("a slot freed under the total: %s", r.Status)
	}
}

// Idle pooled connections hold slots, and give them back when the session's next dial
// finds its share held; none is left once the session closes.
func TestDescriptorIdlePool(t *testing.T) {
	up1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "one") }))
	defer up1.Close()
	up2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "two") }))
	defer up2.Close()
	echo := echoServer(t, "tcp", "127.0.0.1:0")
	cfg := permitLoopback()
	fds := fdbudget.Sized(100, 2)
	cfg.Descriptors = fds
	e := newEnv(t, cfg, []string{"web.test"}, 0, 0)
	for _, u := range []string{up1.URL, up2.URL} {
		res, body := e.raw(fmt.Sprintf("GET http://web.test:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", portOf(t, u)))
		if res.StatusCode != 200 {
			t.Fatalf("forward to %s: %d %s", u, res.StatusCode, body)
		}
		e.rec.next(t)
	}
	// Two upstream connections idle in the pool, each holding its slot.
	if n := fds.InUse(fdbudget.Upstream); n != 2 {
		t.Fatalf("two idle pooled connections hold %d upstream slots, want 2", n)
	}
	c, _, r := e.connect(fmt.Sprintf("web.test:%d", echo))
	if r.StatusCode != 200 {
		t.Fatalf("a CONNECT with the share held by idle connections: %s (they should have given it back)", r.Status)
	}
	c.Close()
	e.rec.next(t)
	e.s.Close()
	waitFor(t, "every slot back after Close", func() bool { return fds.Stats().Held == 0 })
}

// No slot leaks: after many tunnels, SOCKS connections and forwarded requests, allowed,
// refused and failed, nothing is held once the session closes, and no more than the idle
// pool while it is open.
func TestDescriptorsNoLeak(t *testing.T) {
	port := echoServer(t, "tcp", "127.0.0.1:0")
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer up.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := dead.Addr().(*net.TCPAddr).Port
	dead.Close() // refused: its dials fail
	cfg := permitLoopback()
	fds := fdbudget.Sized(1000, 0)
	cfg.Descriptors = fds
	e := newEnv(t, cfg, []string{"web.test"}, 0, 0)
	go func() {
		for range e.rec.ch {
		}
	}()
	for i := range 50 {
		c, _, r := e.connect(fmt.Sprintf("web.test:%d", port))
		if r.StatusCode != 200 {
			t.Fatalf("tunnel %d: %s", i, r.Status)
		}
		fmt.Fprint(c, "x")
		_, _ = c.Read(make([]byte, 1))
		c.Close()
		s, code := e.socks(socksDomain("web.test", port))
		if code != 0 {
			t.Fatalf("SOCKS %d: %#x", i, code)
		}
		s.Close()
		if res, _ := e.raw(fmt.Sprintf("GET http://web.test:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", portOf(t, up.URL))); res.StatusCode != 200 {
			t.Fatalf("forward %d: %d", i, res.StatusCode)
		}
		if res, _ := e.raw(fmt.Sprintf("GET http://web.test:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", deadPort)); res.StatusCode != 502 {
			t.Fatalf("forward to a closed port %d: %d", i, res.StatusCode)
		}
		if _, _, r := e.connect(fmt.Sprintf("web.test:%d", deadPort)); r.StatusCode != 502 {
			t.Fatalf("CONNECT to a closed port %d: %s", i, r.Status)
		}
	}
	waitFor(t, "only the idle pool held", func() bool { return fds.InUse(fdbudget.Upstream) <= 1 })
	e.s.Close()
	waitFor(t, "every slot back", func() bool { return fds.Stats().Held == 0 })
}
