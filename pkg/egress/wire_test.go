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
