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
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"roost.dev/roost/pkg/manifest"
)

// Tests only ever reach loopback. guardDialer fails the test the moment anything else (or
// a name) is about to be dialled, and dials nothing then.
type guardDialer struct {
	t     testing.TB
	mu    sync.Mutex
	dials []string
	d     net.Dialer
}

func (g *guardDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		g.t.Errorf("the proxy dialled a name, not an address: %q", addr)
		return nil, fmt.Errorf("test guard: %q is not an address", addr)
	}
	g.mu.Lock()
	g.dials = append(g.dials, addr)
	g.mu.Unlock()
	if !ap.Addr().Unmap().IsLoopback() {
		g.t.Errorf("the proxy tried to dial non-loopback %s", addr)
		return nil, errors.New("test guard: non-loopback dial refused")
	}
	return g.d.DialContext(ctx, network, addr)
}

func (g *guardDialer) attempts() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.dials...)
}

// fakeResolver answers from a map; anything else does not resolve. It never asks DNS.
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	calls   map[string]int
}

func (r *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls == nil {
		r.calls = map[string]int{}
	}
	r.calls[host]++
	if a, ok := r.answers[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (r *fakeResolver) count(host string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[host]
}

// recorder keeps every Record.
type recorder struct {
	ch chan Record
}

func newRecorder() *recorder { return &recorder{ch: make(chan Record, 1024)} }

func (r *recorder) Egress(id string, rec Record) {
	if id != "s1" {
		panic("wrong session id " + id)
	}
	select {
	case r.ch <- rec:
	default:
		// A benchmark makes more records than anyone reads; a test never does.
	}
}

func (r *recorder) next(t testing.TB) Record {
	t.Helper()
	select {
	case rec := <-r.ch:
		return rec
	case <-time.After(10 * time.Second):
		t.Fatal("no audit record")
		return Record{}
	}
}

// none checks that no further Record arrives.
func (r *recorder) none(t testing.TB) {
	t.Helper()
	select {
	case rec := <-r.ch:
		t.Fatalf("unexpected extra record %+v", rec)
	case <-time.After(20 * time.Millisecond):
	}
}

type env struct {
	t      testing.TB
	p      *Proxy
	s      *Session
	rec    *recorder
	dialer *guardDialer
	res    *fakeResolver
	addr   string // the proxy's listener
	srv    *http.Server
}

var loopback8 = netip.MustParsePrefix("127.0.0.0/8")

func rules(t testing.TB, entries ...string) []manifest.NetRule {
	t.Helper()
	out := make([]manifest.NetRule, 0, len(entries))
	for _, e := range entries {
		r, err := manifest.ParseNetRule(e)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// newEnv serves a session's proxy on a loopback listener through Split, as the endpoint
// does. The Dialer and Resolver are the test's guards unless cfg sets others.
func newEnv(t testing.TB, cfg Config, allow []string, maxBytes, used int64) *env {
	t.Helper()
	return newEnvLimits(t, cfg, allow, Limits{MaxBytes: maxBytes, UsedBytes: used})
}

// newEnvLimits is newEnv with the session's Limits as given.
func newEnvLimits(t testing.TB, cfg Config, allow []string, lim Limits) *env {
	t.Helper()
	e := &env{t: t, rec: newRecorder(), dialer: &guardDialer{t: t}}
	if cfg.Dialer == nil {
		cfg.Dialer = e.dialer
	}
	if cfg.Resolver == nil {
		e.res = &fakeResolver{}
		cfg.Resolver = e.res
	}
	e.p = New(cfg, e.rec, nil)
	e.s = e.p.Session("s1", rules(t, allow...), lim)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	e.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if IsProxyRequest(r) {
				e.s.ServeHTTP(w, r)
				return
			}
			http.NotFound(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
	}
	go func() { _ = e.srv.Serve(Split(ln, e.s.ServeSOCKS)) }()
	t.Cleanup(func() {
		_ = e.srv.Close()
		e.s.Close()
	})
	return e
}

// client is an HTTP client using the proxy for http and https.
func (e *env) client() *http.Client {
	u := &url.URL{Scheme: "http", Host: e.addr}
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u), DisableKeepAlives: true}, Timeout: 20 * time.Second}
}

// raw sends a request as written and reads the response.
func (e *env) raw(req string) (*http.Response, string) {
	e.t.Helper()
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		e.t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		e.t.Fatalf("reading the answer to %q: %v", req, err)
	}
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// connect opens a CONNECT tunnel and returns the connection after the 200.
func (e *env) connect(authority string) (net.Conn, *bufio.Reader, *http.Response) {
	e.t.Helper()
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		e.t.Fatal(err)
	}
	return c, br, res
}

// socks sends a SOCKS5 greeting (no auth) and request, returning the connection and the
// reply code (0xff when the method was refused).
func (e *env) socks(req []byte) (net.Conn, byte) {
	e.t.Helper()
	return e.socksRaw([]byte{5, 1, 0}, req)
}

func (e *env) socksRaw(greeting, req []byte) (net.Conn, byte) {
	e.t.Helper()
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(greeting); err != nil {
		e.t.Fatal(err)
	}
	var m [2]byte
	if _, err := io.ReadFull(c, m[:]); err != nil {
		e.t.Fatalf("reading the method reply: %v", err)
	}
	if m[1] != 0 {
		return c, m[1]
	}
	if _, err := c.Write(req); err != nil {
		e.t.Fatal(err)
	}
	var rep [10]byte
	if _, err := io.ReadFull(c, rep[:4]); err != nil {
		e.t.Fatalf("reading the reply: %v", err)
	}
	n := 6
	if rep[3] == socksAtypIPv6 {
		n = 18
	}
	rest := make([]byte, n)
	if _, err := io.ReadFull(c, rest); err != nil {
		e.t.Fatalf("reading the reply: %v", err)
	}
	_ = c.SetDeadline(time.Time{})
	return c, rep[1]
}

func socksDomain(host string, port int) []byte {
	b := []byte{5, 1, 0, 3, byte(len(host))}
	b = append(b, host...)
	return append(b, byte(port>>8), byte(port))
}

func socksIP(a netip.Addr, port int) []byte {
	if a.Is4() {
		b := a.As4()
		return append(append([]byte{5, 1, 0, 1}, b[:]...), byte(port>>8), byte(port))
	}
	b := a.As16()
	return append(append([]byte{5, 1, 0, 4}, b[:]...), byte(port>>8), byte(port))
}

// portOf is a test server's port.
func portOf(t testing.TB, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(addr, "http://"), "https://"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// echoServer accepts connections on loopback and echoes until the client half-closes,
// then closes. It returns its port.
func echoServer(t testing.TB, network, addr string) int {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("no %s listener at %s: %v", network, addr, err)
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
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// lineServer answers each connection's first line with itself and closes.
func lineServer(t testing.TB, network, addr string) int {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("no %s listener at %s: %v", network, addr, err)
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
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					_, _ = io.WriteString(c, line)
				}
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// streamServer writes zeros to every connection, from its first byte until it goes away.
func streamServer(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		buf := make([]byte, 64<<10)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := c.Read(make([]byte, 1)); err != nil {
					return
				}
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitFor polls cond for up to 5 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
