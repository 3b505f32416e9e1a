package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/proxy"

	"roost.dev/roost/pkg/fdbudget"
)

const benchBytes = 100 << 20

// blobServer serves /blob: benchBytes bytes from memory.
func blobServer(b *testing.B) *httptest.Server {
	chunk := make([]byte, 1<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(benchBytes))
		for range benchBytes / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	b.Cleanup(srv.Close)
	return srv
}

// connectDial opens a CONNECT tunnel through the proxy at proxyAddr.
func connectDial(proxyAddr string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", proxyAddr)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr)
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil || res.StatusCode != 200 || br.Buffered() != 0 {
			c.Close()
			return nil, fmt.Errorf("CONNECT %s: %v %v", addr, res, err)
		}
		return c, nil
	}
}

// BenchmarkEgress downloads 100 MiB from a loopback server directly and through the
// proxy as a forwarded request, a CONNECT tunnel and a SOCKS5 connection. The session's
// bandwidth share is lifted past what loopback moves: this measures the proxy, not the
// share (BenchmarkSharesTwoSessions measures that).
func BenchmarkEgress(b *testing.B) {
	srv := blobServer(b)
	port := portOf(b, srv.URL)
	e := newEnvLimits(b, benchConfig(), []string{"web.test"}, Limits{BytesPerSec: 1 << 40})
	socks, err := proxy.SOCKS5("tcp", e.addr, nil, proxy.Direct)
	if err != nil {
		b.Fatal(err)
	}
	proxied := fmt.Sprintf("http://web.test:%d/blob", port)
	cases := []struct {
		name string
		tr   *http.Transport
		url  string
	}{
		{"direct", &http.Transport{}, srv.URL + "/blob"},
		{"forward", &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: e.addr})}, proxied},
		{"connect", &http.Transport{DialContext: connectDial(e.addr)}, proxied},
		{"socks", &http.Transport{DialContext: socks.(proxy.ContextDialer).DialContext}, proxied},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			tc.tr.DisableCompression = true
			c := &http.Client{Transport: tc.tr}
			defer tc.tr.CloseIdleConnections()
			b.SetBytes(benchBytes)
			for b.Loop() {
				res, err := c.Get(tc.url)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if err != nil || n != benchBytes {
					b.Fatalf("%d bytes, %v", n, err)
				}
			}
		})
	}
}

// BenchmarkEgressConnectSetup measures opening a tunnel: connect to the proxy, CONNECT
// (or the SOCKS5 exchange), decision, dial, until the client may send; a plain loopback
// connect for reference. It reports p50 and p99 in microseconds.
func BenchmarkEgressConnectSetup(b *testing.B) {
	port := echoServer(b, "tcp", "127.0.0.1:0")
	e := newEnv(b, benchConfig(), []string{"web.test"}, 0, 0)
	dest := fmt.Sprintf("web.test:%d", port)
	socks, err := proxy.SOCKS5("tcp", e.addr, nil, proxy.Direct)
	if err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name string
		dial func() (net.Conn, error)
	}{
		{"direct", func() (net.Conn, error) { return net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)) }},
		{"connect", func() (net.Conn, error) { return connectDial(e.addr)(context.Background(), "tcp", dest) }},
		{"socks", func() (net.Conn, error) { return socks.Dial("tcp", dest) }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			var took []time.Duration
			for b.Loop() {
				start := time.Now()
				c, err := tc.dial()
				if err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
				c.Close()
			}
			slices.Sort(took)
			q := func(p float64) float64 {
				return float64(took[min(len(took)-1, int(p*float64(len(took))))].Nanoseconds()) / 1e3
			}
			b.ReportMetric(q(0.50), "p50-µs")
			b.ReportMetric(q(0.99), "p99-µs")
		})
	}
}

// benchConfig is the proxy as roostd runs it: every upstream socket takes a slot of a
// descriptor budget.
func benchConfig() Config {
	cfg := permitLoopback()
	cfg.Descriptors = fdbudget.New(1<<20, 0)
	return cfg
}
