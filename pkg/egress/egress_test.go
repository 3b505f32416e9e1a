package egress

import (
	"bufio"
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/proxy"
)

// webServer is a loopback HTTP server: /hello, /echo (the request's body and the headers
// it arrived with), /big?n (n bytes), /stream (zeros until the client goes).
func webServer(t testing.TB) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hello":
			_, _ = io.WriteString(w, "hello world")
		case "/echo":
			for k, v := range r.Header {
				w.Header()["X-Got-"+k] = v
			}
			w.Header().Set("X-Got-Host", r.Host)
			w.Header().Set("X-Got-Uri", r.RequestURI)
			// HTTP/1 handlers read the whole body before answering.
			b, _ := io.ReadAll(r.Body)
			_, _ = w.Write(b)
		case "/stream":
			buf := make([]byte, 64<<10)
			for {
				if _, err := w.Write(buf); err != nil {
					return
				}
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func permitLoopback() Config {
	return Config{Hosts: map[string]netip.Addr{
		"web.test":    netip.MustParseAddr("127.0.0.1"),
		"a.web.test":  netip.MustParseAddr("127.0.0.1"),
		"example.com": netip.MustParseAddr("127.0.0.1"),
	}, PermitCIDRs: []netip.Prefix{loopback8, netip.MustParsePrefix("::1/128")}}
}

func TestForwardAllowed(t *testing.T) {
	web := webServer(t)
	port := portOf(t, web.URL)
	e := newEnv(t, permitLoopback(), []string{"web.test"}, 0, 0)
	res, err := e.client().Get(fmt.Sprintf("http://WEB.test.:%d/hello", port))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(body) != "hello world" {
		t.Fatalf("got %d %q", res.StatusCode, body)
	}
	rec := e.rec.next(t)
	want := Record{Proto: ProtoHTTP, Host: "web.test", Port: port, Addr: fmt.Sprintf("127.0.0.1:%d", port), Decision: Allowed, Rule: "web.test"}
	// Wire bytes: the request line and headers up, the status line, headers and body down.
	minUp, minDown := int64(len("GET /hello HTTP/1.1\r\nHost: web.test:NNNNN\r\n\r\n")-5), int64(len("HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world"))
	if rec.Proto != want.Proto || rec.Host != want.Host || rec.Port != want.Port || rec.Addr != want.Addr || rec.Decision != want.Decision ||
		rec.Rule != want.Rule || rec.BytesDown < minDown || rec.BytesUp < minUp || rec.Reason != "" || rec.Duration <= 0 || rec.Time.IsZero() {
		t.Fatalf("record %+v; want %+v with at least %d up, %d down", rec, want, minUp, minDown)
	}
	e.rec.none(t)
	tot := e.s.Totals()
	if tot.Connections != 1 || tot.Denied != 0 || tot.BytesDown != rec.BytesDown || tot.BytesUp != rec.BytesUp || tot.Used != rec.BytesUp+rec.BytesDown || tot.Active != 0 {
		t.Fatalf("totals %+v", tot)
	}
}

// The destination sees its own Host, the path, the client's headers and body, and none of
// what was for the proxy: Proxy-*, Connection-named and other hop-by-hop headers. The
// daemon's own HTTP_PROXY is never chained through.
func TestForwardHeadersAndBody(t *testing.T) {
	t.Setenv("HTTP_PROXY", "http://127.0.0.1:1")
	t.Setenv("http_proxy", "http://127.0.0.1:1")
	web := webServer(t)
	port := portOf(t, web.URL)
	e := newEnv(t, permitLoopback(), []string{"web.test"}, 0, 0)
	payload := strings.Repeat("x", 100000)
	req := fmt.Sprintf("POST http://web.test:%d/echo?q=1 HTTP/1.1\r\nHost: evil.test\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\nProxy-Connection: keep-alive\r\nProxy-Foo: 1\r\nConnection: X-Secret\r\nX-Secret: 1\r\nX-Keep: yes\r\nContent-Length: %d\r\n\r\n%s", port, len(payload), payload)
	res, body := e.raw(req)
	if res.StatusCode != 200 || body != payload {
		t.Fatalf("got %d, %d bytes", res.StatusCode, len(body))
	}
	h := res.Header
	if got := h.Get("X-Got-Host"); got != fmt.Sprintf("web.test:%d", port) {
		t.Errorf("destination saw Host %q", got)
	}
	if got := h.Get("X-Got-Uri"); got != "/echo?q=1" {
		t.Errorf("destination saw URI %q", got)
	}
	for _, k := range []string{"X-Got-Proxy-Authorization", "X-Got-Proxy-Connection", "X-Got-Proxy-Foo", "X-Got-X-Secret", "X-Got-X-Forwarded-For"} {
		if v := h.Get(k); v != "" {
			t.Errorf("destination saw %s: %q", strings.TrimPrefix(k, "X-Got-"), v)
		}
	}
	if h.Get("X-Got-X-Keep") != "yes" {
		t.Error("an end-to-end header was dropped")
	}
	rec := e.rec.next(t)
	// The body and the headers each way; the dropped hop-by-hop headers never crossed.
	if rec.BytesUp <= int64(len(payload)) || rec.BytesUp >= int64(len(req)) || rec.BytesDown <= int64(len(payload)) || rec.Decision != Allowed {
		t.Fatalf("record %+v; the request as sent was %d bytes", rec, len(req))
	}
}

func TestConnectTLS(t *testing.T) {
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "secure "+r.Host)
	}))
	defer tlsSrv.Close()
	port := portOf(t, tlsSrv.URL)
	e := newEnv(t, permitLoopback(), []string{"example.com"}, 0, 0)
	tr := tlsSrv.Client().Transport.(*http.Transport).Clone()
	tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: e.addr})
	tr.DisableKeepAlives = true
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	res, err := c.Get(fmt.Sprintf("https://example.com:%d/", port))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(body) != fmt.Sprintf("secure example.com:%d", port) {
		t.Fatalf("body %q", body)
	}
	tr.CloseIdleConnections()
	rec := e.rec.next(t)
	if rec.Proto != ProtoConnect || rec.Host != "example.com" || rec.Port != port || rec.Decision != Allowed || rec.Rule != "example.com" ||
		rec.BytesUp == 0 || rec.BytesDown == 0 || rec.Addr != fmt.Sprintf("127.0.0.1:%d", port) {
		t.Fatalf("record %+v", rec)
	}
}

// Bytes a client sends right behind its CONNECT header, in the same segment, reach the
// destination.
func TestConnectLeftoverBytes(t *testing.T) {
	port := echoServer(t, "tcp", "127.0.0.1:0")
	e := newEnv(t, permitLoopback(), []string{"web.test"}, 0, 0)
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	head := fmt.Sprintf("CONNECT web.test:%d HTTP/1.1\r\nHost: web.test:%d\r\n\r\n", port, port)
	fmt.Fprint(c, head+"PING early bytes\n")
	want := "HTTP/1.1 200 Connection established\r\n\r\nPING early bytes\n"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
		t.Fatalf("got %q, %v", got, err)
	}
	c.(*net.TCPConn).CloseWrite()
	if rest, _ := io.ReadAll(c); len(rest) != 0 {
		t.Fatalf("extra %q", rest)
	}
	rec := e.rec.next(t)
	if rec.BytesUp != int64(len(head+"PING early bytes\n")) || rec.BytesDown != int64(len(want)) {
		t.Fatalf("record %+v", rec)
	}
}

// A half-close passes through: the client ends its side, still reads the destination's
// answer to the end, and the tunnel ends once both sides have.
func TestConnectHalfClose(t *testing.T) {
	port := echoServer(t, "tcp", "127.0.0.1:0")
	e := newEnv(t, permitLoopback(), []string{"web.test"}, 0, 0)
	c, br, res := e.connect(fmt.Sprintf("web.test:%d", port))
	if res.StatusCode != 200 {
		t.Fatal(res.Status)
	}
	msg := bytes.Repeat([]byte("0123456789"), 50000)
	go func() {
		_, _ = c.Write(msg)
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(br)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	rec := e.rec.next(t)
	head := fmt.Sprintf("CONNECT web.test:%d HTTP/1.1\r\nHost: web.test:%d\r\n\r\n", port, port)
	if rec.BytesUp != int64(len(head)+len(msg)) || rec.BytesDown != int64(len(connectEstablished)+len(msg)) {
		t.Fatalf("record %+v", rec)
	}
	waitFor(t, "no active", func() bool { return e.s.Totals().Active == 0 })
}

// SOCKS5 through golang.org/x/net/proxy: a name (resolved by the proxy), an IPv4
// address, an IPv6 address.
func TestSOCKS(t *testing.T) {
	port4 := lineServer(t, "tcp4", "127.0.0.1:0")
	e := newEnv(t, permitLoopback(), []string{"web.test", "127.0.0.1", "[::1]"}, 0, 0)
	d, err := proxy.SOCKS5("tcp", e.addr, nil, proxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	// x/net/proxy offers one method (3 bytes) and sends the request; it reads the method
	// reply (2) and the reply (10).
	try := func(dest, wantHost string, wantPort int, addrLen int) {
		t.Helper()
		c, err := d.(proxy.ContextDialer).DialContext(context.Background(), "tcp", dest)
		if err != nil {
			t.Fatalf("%s: %v", dest, err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprint(c, "hi "+dest+"\n")
		got, _ := io.ReadAll(c)
		c.Close()
		if string(got) != "hi "+dest+"\n" {
			t.Fatalf("%s: echoed %q", dest, got)
		}
		rec := e.rec.next(t)
		if rec.Proto != ProtoSOCKS || rec.Host != wantHost || rec.Port != wantPort || rec.Decision != Allowed ||
			rec.BytesUp != int64(3+4+addrLen+2+len("hi "+dest+"\n")) || rec.BytesDown != int64(2+10+len("hi "+dest+"\n")) {
			t.Fatalf("%s: record %+v", dest, rec)
		}
	}
	try(fmt.Sprintf("web.test:%d", port4), "web.test", port4, 1+len("web.test"))
	try(fmt.Sprintf("127.0.0.1:%d", port4), "127.0.0.1", port4, 4)
	port6 := lineServer(t, "tcp6", "[::1]:0")
	try(fmt.Sprintf("[::1]:%d", port6), "::1", port6, 16)
}

// The real client: curl as a forward proxy's client (-x, http and https through
// CONNECT) and as a SOCKS5 client resolving through the proxy (--socks5-hostname).
func TestCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl")
	}
	web := webServer(t)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "secure")
	}))
	defer tlsSrv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, permitLoopback(), []string{"web.test", "example.com"}, 0, 0)
	run := func(args ...string) (string, error) {
		cmd := exec.Command(curl, append([]string{"-q", "-sS", "--max-time", "10"}, args...)...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	webURL := fmt.Sprintf("http://web.test:%d/hello", portOf(t, web.URL))
	if out, err := run("-x", "http://"+e.addr, webURL); err != nil || out != "hello world" {
		t.Fatalf("curl -x: %q %v", out, err)
	}
	if r := e.rec.next(t); r.Proto != ProtoHTTP || r.Decision != Allowed || r.BytesDown <= 11 || r.BytesUp == 0 {
		t.Fatalf("record %+v", r)
	}
	if out, err := run("--cacert", ca, "-x", "http://"+e.addr, fmt.Sprintf("https://example.com:%d/", portOf(t, tlsSrv.URL))); err != nil || out != "secure" {
		t.Fatalf("curl -x https: %q %v", out, err)
	}
	if r := e.rec.next(t); r.Proto != ProtoConnect || r.Decision != Allowed {
		t.Fatalf("record %+v", r)
	}
	if out, err := run("--socks5-hostname", e.addr, webURL); err != nil || out != "hello world" {
		t.Fatalf("curl --socks5-hostname: %q %v", out, err)
	}
	if r := e.rec.next(t); r.Proto != ProtoSOCKS || r.Host != "web.test" || r.Decision != Allowed {
		t.Fatalf("record %+v", r)
	}
	out, err := run("-o", "/dev/null", "-D", "-", "-x", "http://"+e.addr, "http://evil.test/")
	if err != nil || !strings.Contains(out, " 403") || !strings.Contains(strings.ToLower(out), "x-roost-denied: not_allowed") {
		t.Fatalf("curl denied: %q %v", out, err)
	}
	if r := e.rec.next(t); r.Reason != ReasonNotAllowed {
		t.Fatalf("record %+v", r)
	}
	if out, err := run("--socks5-hostname", e.addr, "http://evil.test/"); err == nil {
		t.Fatalf("curl through SOCKS to evil.test succeeded: %q", out)
	}
	if r := e.rec.next(t); r.Proto != ProtoSOCKS || r.Reason != ReasonNotAllowed {
		t.Fatalf("record %+v", r)
	}
	e.rec.none(t)
}

// A forwarded WebSocket-style upgrade is carried and counted both ways.
func TestForwardUpgrade(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const switched = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n"
	headUp := make(chan int, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		n, _ := c.Read(buf)
		headUp <- n
		if !bytes.Contains(buf[:n], []byte("Upgrade: test")) {
			return
		}
		_, _ = io.WriteString(c, switched)
		_, _ = io.Copy(c, c)
	}()
	e := newEnv(t, permitLoopback(), []string{"web.test"}, 0, 0)
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET http://web.test:%d/ws HTTP/1.1\r\nHost: web.test\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n", portOf(t, ln.Addr().String()))
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != 101 {
		t.Fatalf("%v %v", res, err)
	}
	fmt.Fprint(c, "ping")
	got := make([]byte, 4)
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "ping" {
		t.Fatalf("%q %v", got, err)
	}
	c.Close()
	rec := e.rec.next(t)
	// The request head as the destination read it, the 101 and the four bytes each way.
	if n := int64(<-headUp); rec.BytesUp != n+4 || rec.BytesDown != int64(len(switched))+4 || rec.Decision != Allowed {
		t.Fatalf("record %+v; the destination read a %d-byte head", rec, n)
	}
}
