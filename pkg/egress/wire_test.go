package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"roost.dev/roost/pkg/manifest"
)

// padSize is the header block each way in the wire tests: what issue 28 moved past a
// 4,000-byte budget 50 times over when only bodies counted.
const padSize = 30_000

// headerServer answers /big with padSize bytes of response header and no body, counting
// the requests that reached it.
func headerServer(t testing.TB) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("X-Big", strings.Repeat("d", padSize))
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

// keepAliveClient uses the proxy for plain http, reusing its connection to the proxy.
func (e *env) keepAliveClient() *http.Client {
	u := &url.URL{Scheme: "http", Host: e.addr}
	tr := &http.Transport{Proxy: http.ProxyURL(u)}
	e.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func padded(t *testing.T, rawURL string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Pad", strings.Repeat("u", padSize))
	return req
}

// Request lines and headers count toward egress_max_bytes, up and down: 50 keep-alive
// requests with 30 kB of header each way on a 4,000-byte budget reach the destination not
// once, and the session's count stays within its budget.
func TestWireHeadersForward(t *testing.T) {
	srv, hits := headerServer(t)
	port := portOf(t, srv.URL)
	target := fmt.Sprintf("http://web.test:%d/big", port)

	t.Run("request headers past the budget", func(t *testing.T) {
		hits.Store(0)
		const budget = 4000
		e := newEnv(t, permitLoopback(), []string{"web.test"}, budget, 0)
		c := e.keepAliveClient()
		for i := range 50 {
			res, err := c.Do(padded(t, target))
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusForbidden || res.Header.Get(DeniedHeader) != ReasonEgressMaxBytes {
				t.Fatalf("request %d: %d %s=%q", i, res.StatusCode, DeniedHeader, res.Header.Get(DeniedHeader))
			}
		}
		if n := hits.Load(); n != 0 {
			t.Fatalf("%d requests reached the destination past a %d-byte budget", n, budget)
		}
		if tot := e.s.Totals(); tot.Used > budget || tot.BytesUp+tot.BytesDown > budget {
			t.Fatalf("totals %+v past a %d-byte budget", tot, budget)
		}
	})

	t.Run("response headers past what is left", func(t *testing.T) {
		hits.Store(0)
		// The request's header block fits; the response's does not.
		const budget = padSize + 10_000
		e := newEnv(t, permitLoopback(), []string{"web.test"}, budget, 0)
		res, err := e.keepAliveClient().Do(padded(t, target))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusForbidden || res.Header.Get(DeniedHeader) != ReasonEgressMaxBytes || res.Header.Get("X-Big") != "" {
			t.Fatalf("%d %s=%q X-Big %d bytes: %s", res.StatusCode, DeniedHeader, res.Header.Get(DeniedHeader), len(res.Header.Get("X-Big")), b)
		}
		if !strings.Contains(string(b), "egress_max_bytes") {
			t.Fatalf("denial %s", b)
		}
		if n := hits.Load(); n != 1 {
			t.Fatalf("%d requests reached the destination", n)
		}
		rec := e.rec.next(t)
		if rec.Reason != ReasonEgressMaxBytes || rec.BytesUp < padSize || rec.BytesUp+rec.BytesDown != budget {
			t.Fatalf("record %+v", rec)
		}
		if tot := e.s.Totals(); tot.Used != budget {
			t.Fatalf("totals %+v", tot)
		}
	})

	t.Run("control: within the budget, headers pass and count", func(t *testing.T) {
		hits.Store(0)
		const budget = 1 << 20
		e := newEnv(t, permitLoopback(), []string{"web.test"}, budget, 0)
		res, err := e.keepAliveClient().Do(padded(t, target))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusNoContent || len(res.Header.Get("X-Big")) != padSize {
			t.Fatalf("%d, X-Big %d bytes", res.StatusCode, len(res.Header.Get("X-Big")))
		}
		rec := e.rec.next(t)
		if rec.Decision != Allowed || rec.Reason != "" || rec.BytesUp < padSize || rec.BytesDown < padSize {
			t.Fatalf("record %+v: headers not counted", rec)
		}
		if tot := e.s.Totals(); tot.Used != rec.BytesUp+rec.BytesDown || tot.BytesUp != rec.BytesUp || tot.BytesDown != rec.BytesDown {
			t.Fatalf("totals %+v, record %+v", tot, rec)
		}
	})
}

// connectHead is a CONNECT with a padSize header, as sent.
func connectHead(authority string) string {
	return fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\nX-Pad: %s\r\n\r\n", authority, authority, strings.Repeat("u", padSize))
}

const connectReply = "HTTP/1.1 200 Connection established\r\n\r\n"

// A CONNECT's request line and headers, and its 200, count.
func TestWireHeadersConnect(t *testing.T) {
	port := echoServer(t, "tcp", "127.0.0.1:0")
	dest := fmt.Sprintf("web.test:%d", port)
	open := func(e *env) (net.Conn, *bufio.Reader, *http.Response) {
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, connectHead(dest)); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		return c, br, res
	}

	t.Run("header block past the budget", func(t *testing.T) {
		e := newEnv(t, permitLoopback(), []string{"web.test"}, 4000, 0)
		_, _, res := open(e)
		if res.StatusCode == http.StatusOK {
			t.Fatalf("a CONNECT with a %d-byte head was established on a 4000-byte budget", len(connectHead(dest)))
		}
		b, _ := io.ReadAll(res.Body)
		e.expectHTTP(t, res, string(b), vBudget, ProtoConnect, "web.test", port)
		if d := e.dialer.attempts(); len(d) != 0 {
			t.Fatalf("dialled %v for a refused CONNECT", d)
		}
		if tot := e.s.Totals(); tot.Used != 0 {
			t.Fatalf("a refused CONNECT spent %+v", tot)
		}
	})

	t.Run("control: the head and the 200 are counted", func(t *testing.T) {
		e := newEnv(t, permitLoopback(), []string{"web.test"}, 1<<20, 0)
		c, br, res := open(e)
		if res.StatusCode != 200 {
			t.Fatal(res.Status)
		}
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if b, err := br.ReadByte(); err != nil || b != 'x' {
			t.Fatalf("%q %v", b, err)
		}
		c.Close()
		rec := e.rec.next(t)
		wantUp, wantDown := int64(len(connectHead(dest))+1), int64(len(connectReply)+1)
		if rec.Decision != Allowed || rec.BytesUp != wantUp || rec.BytesDown != wantDown {
			t.Fatalf("record %+v; want %d up, %d down", rec, wantUp, wantDown)
		}
		if tot := e.s.Totals(); tot.Used != wantUp+wantDown {
			t.Fatalf("totals %+v", tot)
		}
	})
}

// A SOCKS5 greeting, request and replies count.
func TestWireHeadersSOCKS(t *testing.T) {
	port := echoServer(t, "tcp", "127.0.0.1:0")
	req := socksDomain("web.test", port)
	// greeting 3 and request up; method reply 2 and reply 10 down.
	handUp, handDown := int64(3+len(req)), int64(2+10)

	t.Run("handshake past the budget", func(t *testing.T) {
		e := newEnv(t, permitLoopback(), []string{"web.test"}, handUp+handDown-1, 0)
		if _, code := e.socks(req); code != socksNotAllowed {
			t.Fatalf("SOCKS5 reply %#x", code)
		}
		e.expectRecord(t, vBudget, ProtoSOCKS, "web.test", port)
		if d := e.dialer.attempts(); len(d) != 0 {
			t.Fatalf("dialled %v for a refused SOCKS5 request", d)
		}
	})

	t.Run("control: the handshake is counted", func(t *testing.T) {
		e := newEnv(t, permitLoopback(), []string{"web.test"}, handUp+handDown+2, 0)
		c, code := e.socks(req)
		if code != 0 {
			t.Fatalf("SOCKS5 reply %#x", code)
		}
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		var b [1]byte
		if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != 'x' {
			t.Fatalf("%q %v", b, err)
		}
		c.Close()
		rec := e.rec.next(t)
		if rec.Decision != Allowed || rec.BytesUp != handUp+1 || rec.BytesDown != handDown+1 {
			t.Fatalf("record %+v; want %d up, %d down", rec, handUp+1, handDown+1)
		}
		if tot := e.s.Totals(); tot.Used != handUp+handDown+2 {
			t.Fatalf("totals %+v", tot)
		}
	})
}

// sinkServer reads every connection to its end, adding what it read to got.
func sinkServer(t testing.TB, got *atomic.Int64) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				got.Add(n)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// A session's share (resources.egress_bytes_per_sec) bounds what it moves each way, over
// all its connections together, whatever the protocol; a share declared above the
// operator's ceiling gets the ceiling. The bound is a rate, so this test times: it
// checks only the floor the bucket guarantees (a tenth of a second of burst, then the
// rate), never an upper bound.
func TestShareBoundsRate(t *testing.T) {
	const share = 4 << 20
	const n = 4 << 20
	// The bucket starts full: a tenth of a second of the rate passes at once.
	floor := time.Duration(n-share/10) * time.Second / share * 8 / 10
	stream := streamServer(t)
	web := webServer(t)
	var sunk atomic.Int64
	sink := sinkServer(t, &sunk)
	upload := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, k)
	}))
	t.Cleanup(upload.Close)

	shaped := func(t *testing.T, cfg Config, declared int64) *env {
		return newEnvLimits(t, cfg, []string{"web.test"}, Limits{BytesPerSec: declared})
	}
	down := func(t *testing.T, r io.Reader, want int64) {
		t.Helper()
		if got, err := io.CopyN(io.Discard, r, want); err != nil || got != want {
			t.Fatalf("read %d of %d: %v", got, want, err)
		}
	}
	connect := func(t *testing.T, e *env, port int) (net.Conn, *bufio.Reader) {
		c, br, res := e.connect(fmt.Sprintf("web.test:%d", port))
		if res.StatusCode != 200 {
			t.Fatal(res.Status)
		}
		return c, br
	}
	cases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"connect down", func(t *testing.T, e *env) {
			c, br := connect(t, e, stream)
			_, _ = c.Write([]byte("g"))
			down(t, br, n)
		}},
		{"two tunnels share one bucket", func(t *testing.T, e *env) {
			errs := make(chan error, 2)
			for range 2 {
				c, br := connect(t, e, stream)
				_, _ = c.Write([]byte("g"))
				go func() {
					_, err := io.CopyN(io.Discard, br, n/2)
					errs <- err
				}()
			}
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"socks down", func(t *testing.T, e *env) {
			c, code := e.socks(socksDomain("web.test", stream))
			if code != 0 {
				t.Fatalf("SOCKS5 reply %#x", code)
			}
			_, _ = c.Write([]byte("g"))
			down(t, c, n)
		}},
		{"forward down", func(t *testing.T, e *env) {
			res, err := e.client().Get(fmt.Sprintf("http://web.test:%d/stream", portOf(t, web.URL)))
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			down(t, res.Body, n)
		}},
		{"connect up", func(t *testing.T, e *env) {
			before := sunk.Load()
			c, _ := connect(t, e, sink)
			if _, err := c.Write(make([]byte, n)); err != nil {
				t.Fatal(err)
			}
			_ = c.(*net.TCPConn).CloseWrite()
			deadline := time.Now().Add(30 * time.Second)
			for sunk.Load()-before < n {
				if time.Now().After(deadline) {
					t.Fatalf("the destination got %d of %d bytes", sunk.Load()-before, n)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}},
		{"forward up", func(t *testing.T, e *env) {
			res, err := e.client().Post(fmt.Sprintf("http://web.test:%d/", portOf(t, upload.URL)), "application/octet-stream", strings.NewReader(strings.Repeat("u", n)))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if string(b) != fmt.Sprint(n) {
				t.Fatalf("the destination got %q of %d bytes", b, n)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, v := range []struct {
				name     string
				cfg      Config
				declared int64
			}{
				{"declared", permitLoopback(), share},
				// A session cannot raise its share past the operator's ceiling.
				{"above the ceiling", func() Config { c := permitLoopback(); c.MaxBytesPerSecPerSession = share; return c }(), 1 << 40},
			} {
				e := shaped(t, v.cfg, v.declared)
				start := time.Now()
				tc.run(t, e)
				if took := time.Since(start); took < floor {
					t.Errorf("%s: %d bytes in %v at a share of %d bytes/s: at least %v", v.name, n, took, share, floor)
				}
			}
		})
	}
}

// The share a session gets: what it declared, else the default, never above the ceiling.
func TestShareOf(t *testing.T) {
	open := New(Config{}, nil, nil)
	capped := New(Config{MaxBytesPerSecPerSession: 1 << 20}, nil, nil)
	for _, c := range []struct {
		p        *Proxy
		declared int64
		want     int64
	}{
		{open, 0, manifest.DefaultEgressBytesPerSec},
		{open, 5, 5},
		{open, 1 << 40, 1 << 40},
		{capped, 0, 1 << 20},
		{capped, 1 << 10, 1 << 10},
		{capped, 1 << 30, 1 << 20},
	} {
		if got := c.p.shareOf(c.declared); got != c.want {
			t.Errorf("shareOf(%d) = %d, want %d", c.declared, got, c.want)
		}
	}
}
