package egress

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// hostileEnv maps names to special-purpose addresses: every one of them must be refused
// without a dial (the guard fails the test on any non-loopback dial).
func hostileEnv(t *testing.T, allow []string, permit ...netip.Prefix) *env {
	a := netip.MustParseAddr
	cfg := Config{
		Hosts: map[string]netip.Addr{
			"web.test":         a("127.0.0.1"),
			"meta.test":        a("169.254.169.254"),
			"ten.test":         a("10.0.0.1"),
			"lo.test":          a("127.0.0.1"),
			"v6lo.test":        a("::1"),
			"mapped.test":      a("::ffff:127.0.0.1"),
			"mapped-meta.test": a("::ffff:169.254.169.254"),
			"nat64.test":       a("64:ff9b::a9fe:a9fe"),
			"ula.test":         a("fd00:ec2::254"),
			"ll6.test":         a("fe80::1"),
			"bcast.test":       a("255.255.255.255"),
			"zero.test":        a("0.0.0.0"),
			"unspec6.test":     a("::"),
			"cgnat.test":       a("100.64.0.1"),
			"doc.test":         a("192.0.2.2"),
			"private.test":     a("192.168.1.1"),
			"mcast.test":       a("224.0.0.1"),
			"reserved.test":    a("240.0.0.1"),
		},
		PermitCIDRs: permit,
	}
	e := newEnv(t, cfg, allow, 0, 0)
	e.res.answers = map[string][]netip.Addr{
		"multi.test":  {a("10.0.0.1"), a("169.254.169.254"), a("::ffff:172.16.0.1")},
		"mixed.test":  {a("10.0.0.1"), a("127.0.0.1"), a("127.0.0.1")},
		"empty.test":  {},
		"public.test": {a("192.0.2.7")},
	}
	return e
}

type verdict struct {
	reason string
	status int
	socks  byte
}

var (
	vNotAllowed  = verdict{ReasonNotAllowed, 403, socksNotAllowed}
	vPort        = verdict{ReasonPortNotAllowed, 403, socksNotAllowed}
	vScheme      = verdict{ReasonSchemeNotAllowed, 403, socksNotAllowed}
	vSpecial     = verdict{ReasonSpecialAddress, 403, socksNotAllowed}
	vUnresolv    = verdict{ReasonUnresolvable, 502, socksHostUnreachable}
	vBad         = verdict{ReasonBadRequest, 400, socksFailure}
	vMaxConns    = verdict{ReasonMaxConnections, 403, socksNotAllowed}
	vBudget      = verdict{ReasonEgressMaxBytes, 403, socksNotAllowed}
	vDialRefused = verdict{ReasonDialFailed, 502, socksRefused}
)

// bracket spells a host for a URL or CONNECT.
func bracket(h string) string {
	if strings.Contains(h, ":") {
		return "[" + h + "]"
	}
	return h
}

// expectHTTP checks a refused HTTP answer and its one Record.
func (e *env) expectHTTP(t *testing.T, res *http.Response, body string, v verdict, proto, host string, port int) {
	t.Helper()
	if res.StatusCode != v.status || res.Header.Get(DeniedHeader) != v.reason {
		t.Fatalf("got %d %s=%q (%s); want %d %q", res.StatusCode, DeniedHeader, res.Header.Get(DeniedHeader), body, v.status, v.reason)
	}
	var j struct {
		Error  string `json:"error"`
		Host   string `json:"host"`
		Port   int    `json:"port"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal([]byte(body), &j); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if j.Reason != v.reason || j.Host != host || j.Port != port || j.Error == "" {
		t.Fatalf("body %+v; want host %q port %d reason %q", j, host, port, v.reason)
	}
	if host != "" && !strings.Contains(j.Error, net.JoinHostPort(host, fmt.Sprint(port))) {
		t.Errorf("detail %q does not name %s:%d", j.Error, host, port)
	}
	e.expectRecord(t, v, proto, host, port)
}

func (e *env) expectRecord(t *testing.T, v verdict, proto, host string, port int) Record {
	t.Helper()
	rec := e.rec.next(t)
	if rec.Decision != Denied || rec.Reason != v.reason || rec.Proto != proto || rec.Host != host || rec.Port != port || rec.Detail == "" || rec.BytesUp != 0 || rec.BytesDown != 0 {
		t.Fatalf("record %+v; want denied %s %s %s:%d", rec, v.reason, proto, host, port)
	}
	if v.reason != ReasonDialFailed && rec.Addr != "" {
		t.Fatalf("a refused record names a dialled address: %+v", rec)
	}
	e.rec.none(t)
	return rec
}

// TestDenials runs each hostile destination through all three protocols. Nothing here
// may be dialled.
func TestDenials(t *testing.T) {
	allow := []string{
		"web.test:1", "https://sch.test", "http://plain.test", "*.wild.test", "meta.test", "ten.test", "lo.test", "v6lo.test",
		"mapped.test", "mapped-meta.test", "nat64.test", "ula.test", "ll6.test", "bcast.test", "zero.test", "unspec6.test",
		"cgnat.test", "doc.test", "private.test", "mcast.test", "reserved.test", "multi.test", "nx.test", "empty.test",
		"*.web.test",
	}
	cases := []struct {
		host      string
		port      int
		http      verdict
		tunnel    verdict // CONNECT and SOCKS5
		wantHost  string  // as normalised; "" for a bad request
		socksSkip bool    // the name cannot be carried as a SOCKS5 name
	}{
		{host: "evil.test", port: 80, http: vNotAllowed, tunnel: vNotAllowed},
		{host: "EVIL.test.", port: 80, http: vNotAllowed, tunnel: vNotAllowed, wantHost: "evil.test"},
		// A wildcard never admits its apex.
		{host: "wild.test", port: 443, http: vNotAllowed, tunnel: vNotAllowed},
		{host: "web.test", port: 80, http: vPort, tunnel: vPort},
		// https://sch.test: no plain-http forwarding; a tunnel only to 443.
		{host: "sch.test", port: 443, http: vScheme, tunnel: verdict{}},
		{host: "sch.test", port: 8443, http: vScheme, tunnel: vPort},
		// http://plain.test: forwarding and tunnels on 80 only.
		{host: "plain.test", port: 443, http: vPort, tunnel: vPort},
		// Names resolving to special-purpose addresses.
		{host: "meta.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "ten.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "lo.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "v6lo.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "mapped.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "mapped-meta.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "nat64.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "ula.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "ll6.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "bcast.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "zero.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "unspec6.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "cgnat.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "doc.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "private.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "mcast.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "reserved.test", port: 80, http: vSpecial, tunnel: vSpecial},
		{host: "multi.test", port: 80, http: vSpecial, tunnel: vSpecial},
		// Addresses no rule names.
		{host: "10.1.2.3", port: 80, http: vNotAllowed, tunnel: vNotAllowed},
		{host: "169.254.169.254", port: 80, http: vNotAllowed, tunnel: vNotAllowed},
		{host: "127.0.0.1", port: 80, http: vNotAllowed, tunnel: vNotAllowed},
		{host: "::ffff:169.254.169.254", port: 80, http: vNotAllowed, tunnel: vNotAllowed, wantHost: "169.254.169.254"},
		{host: "::ffff:7f00:1", port: 80, http: vNotAllowed, tunnel: vNotAllowed, wantHost: "127.0.0.1"},
		{host: "fd00:ec2::254", port: 80, http: vNotAllowed, tunnel: vNotAllowed},
		{host: "93.184.216.34", port: 443, http: vNotAllowed, tunnel: vNotAllowed},
		// Names that do not resolve.
		{host: "nx.test", port: 80, http: vUnresolv, tunnel: vUnresolv},
		{host: "empty.test", port: 80, http: vUnresolv, tunnel: vUnresolv},
		// Numeric tricks and malformed names: refused unread, whatever the rules.
		{host: "0x7f.1", port: 80, http: vBad, tunnel: vBad},
		{host: "2130706433", port: 80, http: vBad, tunnel: vBad},
		{host: "127.1", port: 80, http: vBad, tunnel: vBad},
		{host: "0177.0.0.1", port: 80, http: vBad, tunnel: vBad},
		{host: "0x7f000001", port: 80, http: vBad, tunnel: vBad},
		{host: "127.0.0.1.", port: 80, http: vNotAllowed, tunnel: vNotAllowed, wantHost: "127.0.0.1"},
		{host: "1.2.3.4.5", port: 80, http: vBad, tunnel: vBad},
		{host: "a.web.test.0x1", port: 80, http: vBad, tunnel: vBad},
		{host: "under_score.web.test", port: 80, http: vBad, tunnel: vBad},
		{host: "-dash.web.test", port: 80, http: vBad, tunnel: vBad},
		{host: "a..web.test", port: 80, http: vBad, tunnel: vBad},
		{host: "fe80::1%25eth0", port: 80, http: vBad, tunnel: vBad, socksSkip: true},
	}
	e := hostileEnv(t, allow)
	for _, tc := range cases {
		want := tc.wantHost
		if want == "" {
			if a, err := netip.ParseAddr(tc.host); err == nil {
				want = a.Unmap().String()
			} else {
				want = tc.host
			}
		}
		t.Run(tc.host+fmt.Sprint(":", tc.port), func(t *testing.T) {
			h := want
			if tc.http.reason == ReasonBadRequest {
				h = ""
			}
			hp := fmt.Sprintf("%s:%d", bracket(tc.host), tc.port)
			res, body := e.raw(fmt.Sprintf("GET http://%s/x HTTP/1.1\r\nHost: %s\r\n\r\n", hp, hp))
			e.expectHTTP(t, res, body, tc.http, ProtoHTTP, h, map[bool]int{true: 0, false: tc.port}[h == ""])
			if tc.tunnel.reason != "" {
				h = want
				if tc.tunnel.reason == ReasonBadRequest {
					h = ""
				}
				_, _, res := e.connect(hp)
				b, _ := io.ReadAll(res.Body)
				e.expectHTTP(t, res, string(b), tc.tunnel, ProtoConnect, h, map[bool]int{true: 0, false: tc.port}[h == ""])
				if !tc.socksSkip {
					var req []byte
					if a, err := netip.ParseAddr(tc.host); err == nil {
						req = socksIP(a, tc.port)
					} else {
						req = socksDomain(tc.host, tc.port)
					}
					_, code := e.socks(req)
					if code != tc.tunnel.socks {
						t.Fatalf("SOCKS5 reply %#x; want %#x", code, tc.tunnel.socks)
					}
					e.expectRecord(t, tc.tunnel, ProtoSOCKS, h, map[bool]int{true: 0, false: tc.port}[h == ""])
				}
			}
		})
	}
	if d := e.dialer.attempts(); len(d) != 0 {
		t.Fatalf("dials attempted: %v", d)
	}
}

// Refused authorities and URLs that never reach a decision.
func TestBadRequests(t *testing.T) {
	e := hostileEnv(t, []string{"web.test", "*.web.test"})
	for _, req := range []string{
		"CONNECT web.test HTTP/1.1\r\nHost: web.test\r\n\r\n",                    // no port
		"CONNECT web.test:0 HTTP/1.1\r\nHost: web.test\r\n\r\n",                  // port 0
		"CONNECT web.test:65536 HTTP/1.1\r\nHost: web.test\r\n\r\n",              // port too big
		"CONNECT web.test:+80 HTTP/1.1\r\nHost: web.test\r\n\r\n",                // sign
		"CONNECT user:pw@web.test:443 HTTP/1.1\r\nHost: web.test:443\r\n\r\n",    // userinfo
		"CONNECT ::1:443 HTTP/1.1\r\nHost: web.test:443\r\n\r\n",                 // IPv6 without brackets
		"CONNECT [web.test]:443 HTTP/1.1\r\nHost: web.test:443\r\n\r\n",          // a name in brackets
		"CONNECT [127.0.0.1]:443 HTTP/1.1\r\nHost: web.test:443\r\n\r\n",         // IPv4 in brackets
		"CONNECT :443 HTTP/1.1\r\nHost: web.test:443\r\n\r\n",                    // empty host
		"GET https://web.test/ HTTP/1.1\r\nHost: web.test\r\n\r\n",               // https must CONNECT
		"GET ftp://web.test/ HTTP/1.1\r\nHost: web.test\r\n\r\n",                 // not http
		"GET http://user:pw@web.test/ HTTP/1.1\r\nHost: web.test\r\n\r\n",        // userinfo
		"GET http://web.test:0/ HTTP/1.1\r\nHost: web.test\r\n\r\n",              // port 0
		"GET http://web.test:99999/ HTTP/1.1\r\nHost: web.test\r\n\r\n",          // port too big
		"GET http://[::ffff:127.0.0.1%25lo]/ HTTP/1.1\r\nHost: web.test\r\n\r\n", // zone
	} {
		res, body := e.raw(req)
		if res.StatusCode != 400 {
			t.Errorf("%q: %d %s", req, res.StatusCode, body)
			continue
		}
		if res.Header.Get(DeniedHeader) == ReasonBadRequest {
			if rec := e.rec.next(t); rec.Reason != ReasonBadRequest || rec.Decision != Denied {
				t.Errorf("%q: record %+v", req, rec)
			}
		}
		// Go's server refuses some of these before the proxy sees them (no record then).
	}
	e.rec.none(t)
	if d := e.dialer.attempts(); len(d) != 0 {
		t.Fatalf("dials attempted: %v", d)
	}
	res, body := e.raw("GET https://web.test/ HTTP/1.1\r\nHost: web.test\r\n\r\n")
	if !strings.Contains(body, "CONNECT") || res.Header.Get(DeniedHeader) != ReasonBadRequest {
		t.Errorf("https refusal does not point to CONNECT: %s", body)
	}
	e.rec.next(t)
}

func TestSOCKSProtocolErrors(t *testing.T) {
	e := hostileEnv(t, []string{"web.test"})
	cases := []struct {
		name     string
		greeting []byte
		req      []byte
		code     byte
	}{
		{"bind", nil, []byte{5, 2, 0, 3, 8, 'w', 'e', 'b', '.', 't', 'e', 's', 't', 0, 80}, socksCmdUnsupported},
		{"udp associate", nil, []byte{5, 3, 0, 1, 0, 0, 0, 0, 0, 0}, socksCmdUnsupported},
		{"unknown command", nil, []byte{5, 9, 0, 1, 1, 2, 3, 4, 0, 80}, socksCmdUnsupported},
		{"address type 5", nil, []byte{5, 1, 0, 5, 1, 2, 3, 4, 0, 80}, socksAddrTypUnsupported},
		{"reserved byte", nil, []byte{5, 1, 1, 3, 8, 'w', 'e', 'b', '.', 't', 'e', 's', 't', 0, 80}, socksFailure},
		{"port 0", nil, []byte{5, 1, 0, 3, 8, 'w', 'e', 'b', '.', 't', 'e', 's', 't', 0, 0}, socksFailure},
		{"empty name", nil, []byte{5, 1, 0, 3, 0, 0, 80}, socksFailure},
		{"name in brackets", nil, socksDomain("[::1]", 80), socksFailure},
		{"no-auth not offered", []byte{5, 1, 2}, nil, socksMethodNoAcceptable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.greeting
			if g == nil {
				g = []byte{5, 2, 2, 0}
			}
			_, code := e.socksRaw(g, tc.req)
			if code != tc.code {
				t.Fatalf("reply %#x; want %#x", code, tc.code)
			}
			if rec := e.rec.next(t); rec.Reason != ReasonBadRequest || rec.Proto != ProtoSOCKS || rec.Decision != Denied {
				t.Fatalf("record %+v", rec)
			}
			e.rec.none(t)
		})
	}
	// A name in the domain field that is an address is that address.
	_, code := e.socks(socksDomain("::ffff:127.0.0.1", 80))
	if code != socksNotAllowed {
		t.Fatalf("reply %#x", code)
	}
	if rec := e.rec.next(t); rec.Host != "127.0.0.1" || rec.Reason != ReasonNotAllowed {
		t.Fatalf("record %+v", rec)
	}
	if d := e.dialer.attempts(); len(d) != 0 {
		t.Fatalf("dials attempted: %v", d)
	}
}
