package endpoint_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/endpoint"
	"roost.dev/roost/pkg/manifest"
)

// A loopback endpoint (a session without a network namespace) carries no proxy: a forward
// request or CONNECT gets 403 no_proxy, never a connection, and needs no credential to be
// told so.
func TestLoopbackEndpointCarriesNoProxy(t *testing.T) {
	f := open(t, newFake(sessionID))
	conn, err := net.Dial("tcp", f.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, req := range []string{
		"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
	} {
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get(egress.DeniedHeader) != "no_proxy" {
			t.Fatalf("%q: %d %v %s", req, resp.StatusCode, resp.Header, body)
		}
		conn.Close()
		if conn, err = net.Dial("tcp", f.addr()); err != nil {
			t.Fatal(err)
		}
	}
}

// In a namespace the endpoint carries the session's proxy on the one listener: HTTP forward
// requests, CONNECT and SOCKS5 from inside reach what the rules admit (roostd's side dials),
// without a credential; the session's other routes still want theirs.
func TestNetNSEndpointCarriesProxy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making and pinning a network namespace needs root")
	}
	// The destination listens in the host's namespace: roostd's, where the proxy dials.
	dest, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer dest.Close()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "destination") })}
	go srv.Serve(dest)
	defer srv.Close()
	port := dest.Addr().(*net.TCPAddr).Port

	var mu sync.Mutex
	var records []egress.Record
	audit := egress.AuditorFunc(func(_ string, r egress.Record) { mu.Lock(); records = append(records, r); mu.Unlock() })
	px := egress.New(egress.Config{Hosts: map[string]netip.Addr{"dest.test": netip.MustParseAddr("127.0.0.1")},
		PermitCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, audit, nil)
	rule, _ := manifest.ParseNetRule(fmt.Sprintf("dest.test:%d", port))
	session := px.Session(sessionID, []manifest.NetRule{rule}, egress.Limits{})
	defer session.Close()

	eps, err := endpoint.New(newKeys(t), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eps.Release(sessionID) })
	ep, err := eps.Open(sessionID, true, 0, 0, newFake(sessionID), session)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()

	exchange := func(what string, first []byte, then func(c net.Conn) (string, error)) string {
		t.Helper()
		var out string
		err := inNetNS(ep.NetNS(), func() error {
			c, err := net.DialTimeout("tcp", endpoint.SealedAddr, 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(first); err != nil {
				return err
			}
			out, err = then(c)
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return out
	}
	readAll := func(c net.Conn) (string, error) { b, err := io.ReadAll(c); return string(b), err }

	forward := exchange("forward", []byte(fmt.Sprintf("GET http://dest.test:%d/ HTTP/1.1\r\nHost: dest.test:%d\r\nConnection: close\r\n\r\n", port, port)), readAll)
	if !strings.HasPrefix(forward, "HTTP/1.1 200") || !strings.HasSuffix(forward, "destination") {
		t.Errorf("forward request: %q", forward)
	}
	tunnel := exchange("CONNECT", []byte(fmt.Sprintf("CONNECT dest.test:%d HTTP/1.1\r\nHost: dest.test:%d\r\n\r\nGET / HTTP/1.1\r\nHost: dest.test\r\nConnection: close\r\n\r\n", port, port)), readAll)
	if !strings.HasPrefix(tunnel, "HTTP/1.1 200") || !strings.HasSuffix(tunnel, "destination") {
		t.Errorf("CONNECT: %q", tunnel)
	}
	// SOCKS5: no authentication; CONNECT to a domain name.
	req := []byte{5, 1, 0, 5, 1, 0, 3, byte(len("dest.test"))}
	req = append(append(req, "dest.test"...), byte(port>>8), byte(port))
	socks := exchange("SOCKS5", req, func(c net.Conn) (string, error) {
		head := make([]byte, 2+10)
		if _, err := io.ReadFull(c, head); err != nil {
			return "", err
		}
		if head[1] != 0 || head[3] != 0 {
			return fmt.Sprintf("socks replies %v", head), nil
		}
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: dest.test\r\nConnection: close\r\n\r\n")
		return readAll(c)
	})
	if !strings.HasSuffix(socks, "destination") {
		t.Errorf("SOCKS5: %q", socks)
	}
	denied := exchange("denied", []byte("CONNECT elsewhere.test:443 HTTP/1.1\r\nHost: elsewhere.test:443\r\nConnection: close\r\n\r\n"), readAll)
	if !strings.HasPrefix(denied, "HTTP/1.1 403") || !strings.Contains(denied, egress.DeniedHeader+": not_allowed") {
		t.Errorf("a destination no rule admits: %q", denied)
	}
	self := exchange("self", []byte("GET /v1/self HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), readAll)
	if !strings.HasPrefix(self, "HTTP/1.1 403") || !strings.Contains(self, "not authorised") {
		t.Errorf("the session's routes without a credential: %q", self)
	}
	session.Close()
	mu.Lock()
	defer mu.Unlock()
	var allowed, refused int
	for _, r := range records {
		switch r.Decision {
		case egress.Allowed:
			allowed++
		case egress.Denied:
			refused++
		}
	}
	if allowed != 3 || refused != 1 {
		t.Errorf("audit: %d allowed, %d denied; want 3 and 1: %+v", allowed, refused, records)
	}
}
