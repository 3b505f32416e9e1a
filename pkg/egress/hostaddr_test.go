package egress

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"roost.dev/roost/internal/testnetns"
	"roost.dev/roost/pkg/hostaddr"
)

// hostNet is a network namespace standing for roostd's host: an interface holding
// 10.77.0.1 and fd77::1 (as eth0 or a veth holds the host's address) and a service bound
// to every address there, as a host's 0.0.0.0 services are. The proxy dials from inside
// it, and the namespace has no route out.
type hostNet struct {
	ns    *testnetns.NS
	link  netlink.Link // the interface, for adding addresses
	addrs *hostaddr.Set
	port  int
}

const hostServiceBody = "the host's own service\n"

func newHostNet(t *testing.T) *hostNet {
	t.Helper()
	n := testnetns.New(t)
	link := n.Veth(t, "rh0", "10.77.0.1/24", "fd77::1/64")
	ln := n.Listen(t, "tcp", ":0") // 0.0.0.0 and ::, as a host service binds
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, hostServiceBody)
		}))
	}()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	set, err := hostaddr.Watch(ctx, n.Handle, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &hostNet{ns: n, link: link, addrs: set, port: ln.Addr().(*net.TCPAddr).Port}
}

// env serves a session whose proxy lives in the host namespace; hostAddrs nil leaves the
// proxy as it was before it knew the host's addresses.
func (h *hostNet) env(t *testing.T, allow []string, hostAddrs HostAddrs, permit ...netip.Prefix) *env {
	t.Helper()
	cfg := Config{
		PermitCIDRs: permit,
		HostAddrs:   hostAddrs,
		Dialer:      &testnetns.Dialer{NS: h.ns, T: t, Allowed: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/16"), netip.MustParsePrefix("fd77::/16")}},
	}
	return newEnv(t, cfg, allow, 0, 0)
}

func (h *hostNet) get(e *env, host string) (*http.Response, string) {
	return e.raw(fmt.Sprintf("GET http://%s:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", host, h.port))
}

// An IP-literal rule naming an address of roostd's host (not loopback: an interface's)
// is refused, over every protocol, unless the operator's permit_cidrs names it.
func TestHostAddressRefused(t *testing.T) {
	h := newHostNet(t)

	t.Run("control: without the host's addresses the rule reaches the host's service", func(t *testing.T) {
		e := h.env(t, []string{"10.77.0.1"}, nil)
		if res, body := h.get(e, "10.77.0.1"); res.StatusCode != 200 || body != hostServiceBody {
			t.Fatalf("%d %q", res.StatusCode, body)
		}
	})

	for lit, rule := range map[string]string{"10.77.0.1": "10.77.0.1", "[fd77::1]": "[fd77::1]", "[::ffff:10.77.0.1]": "10.77.0.1"} {
		t.Run("refused "+lit, func(t *testing.T) {
			e := h.env(t, []string{rule}, h.addrs)
			res, body := h.get(e, lit)
			if res.StatusCode != http.StatusForbidden || res.Header.Get(DeniedHeader) != ReasonSpecialAddress {
				t.Fatalf("forward to %s: %d %s=%q %s", lit, res.StatusCode, DeniedHeader, res.Header.Get(DeniedHeader), body)
			}
			if !strings.Contains(body, "an address of roostd's host") || !strings.Contains(body, "egress.permit_cidrs") {
				t.Fatalf("the refusal does not say the address is the host's and how to open it: %s", body)
			}
			if rec := e.rec.next(t); rec.Decision != Denied || rec.Reason != ReasonSpecialAddress || rec.Addr != "" {
				t.Fatalf("record %+v", rec)
			}
			_, _, cres := e.connect(fmt.Sprintf("%s:%d", lit, h.port))
			if cres.StatusCode != http.StatusForbidden || cres.Header.Get(DeniedHeader) != ReasonSpecialAddress {
				t.Fatalf("CONNECT to %s: %d %v", lit, cres.StatusCode, cres.Header)
			}
			e.rec.next(t)
			a := netip.MustParseAddr(strings.Trim(lit, "[]"))
			if _, code := e.socks(socksIP(a, h.port)); code != socksNotAllowed {
				t.Fatalf("SOCKS to %s: reply %#x, want %#x", lit, code, socksNotAllowed)
			}
			e.rec.next(t)
		})
	}

	t.Run("permit_cidrs opens it", func(t *testing.T) {
		e := h.env(t, []string{"10.77.0.1"}, h.addrs, netip.MustParsePrefix("10.77.0.1/32"))
		if res, body := h.get(e, "10.77.0.1"); res.StatusCode != 200 || body != hostServiceBody {
			t.Fatalf("%d %q", res.StatusCode, body)
		}
		if rec := e.rec.next(t); rec.Decision != Allowed || rec.Addr != fmt.Sprintf("10.77.0.1:%d", h.port) {
			t.Fatalf("record %+v", rec)
		}
	})

	t.Run("an address added after start", func(t *testing.T) {
		e := h.env(t, []string{"10.77.9.9"}, h.addrs)
		// Not the host's yet: nothing holds it, and the dial finds no one there.
		if res, body := h.get(e, "10.77.9.9"); res.Header.Get(DeniedHeader) != ReasonDialFailed {
			t.Fatalf("10.77.9.9 before any interface held it: %d %v %s", res.StatusCode, res.Header, body)
		}
		e.rec.next(t)
		h.ns.AddAddr(t, h.link, "10.77.9.9/32")
		waitFor(t, "the set to follow the new address", func() bool { return h.addrs.Contains(netip.MustParseAddr("10.77.9.9")) })
		res, body := h.get(e, "10.77.9.9")
		if res.StatusCode != http.StatusForbidden || res.Header.Get(DeniedHeader) != ReasonSpecialAddress {
			t.Fatalf("an address added after start: %d %v %s", res.StatusCode, res.Header, body)
		}
		e.rec.next(t)
		// Control: the host's service answers there now.
		open := h.env(t, []string{"10.77.9.9"}, nil)
		if res, body := h.get(open, "10.77.9.9"); res.StatusCode != 200 || body != hostServiceBody {
			t.Fatalf("control, without the set: %d %q", res.StatusCode, body)
		}
	})
}
