// Package testnetns makes network namespaces for tests: one per call, with loopback up
// and nothing else — no route out — so whatever a test sends there reaches only what the
// test put there. Sockets opened in one stay in it; every other thread of the test stays
// in the host's namespace.
package testnetns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
)

// NS is a network namespace of the test's.
type NS struct {
	Handle netns.NsHandle
	// Link is rtnetlink in the namespace: for the test's interfaces and addresses.
	Link *netlink.Handle
}

// New makes a namespace, closed when the test ends.
func New(t testing.TB) *NS {
	t.Helper()
	testenv.NeedRoot(t, "making a network namespace needs CAP_SYS_ADMIN")
	var ns netns.NsHandle
	err := on(netns.None(), func() error {
		// netns.New moves the thread; on puts it back.
		var err error
		ns, err = netns.New()
		return err
	})
	if err != nil {
		t.Fatalf("making a network namespace: %v", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		t.Fatalf("rtnetlink in the test namespace: %v", err)
	}
	n := &NS{Handle: ns, Link: h}
	t.Cleanup(func() {
		h.Close()
		ns.Close()
	})
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("bringing loopback up in the test namespace: %v", err)
	}
	return n
}

// on runs f on a locked thread, in ns unless ns is None, and returns the thread to the
// namespace it had. A thread that cannot go back is left locked, so it ends with its
// goroutine rather than serve another in the wrong namespace.
func on(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer home.Close()
		if ns.IsOpen() {
			if err := netns.Set(ns); err != nil {
				errc <- err
				return
			}
		}
		ferr := f()
		if err := netns.Set(home); err != nil {
			errc <- fmt.Errorf("returning to the host's namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Veth adds a veth pair, both ends in the namespace, up, the end named name holding addrs
// (CIDR, "10.77.0.1/24"); its peer is name+"p". (A veth, not a dummy: kernels without the
// dummy module have veth, which every container runtime needs.)
func (n *NS) Veth(t testing.TB, name string, addrs ...string) netlink.Link {
	t.Helper()
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := n.Link.LinkAdd(link); err != nil {
		t.Fatalf("adding %s: %v", name, err)
	}
	l, err := n.Link.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		n.AddAddr(t, l, a)
	}
	for _, name := range []string{name, name + "p"} {
		up, err := n.Link.LinkByName(name)
		if err == nil {
			err = n.Link.LinkSetUp(up)
		}
		if err != nil {
			t.Fatalf("bringing %s up: %v", name, err)
		}
	}
	return l
}

// AddAddr puts cidr on link.
func (n *NS) AddAddr(t testing.TB, link netlink.Link, cidr string) {
	t.Helper()
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	// No duplicate address detection: the address is usable at once, as on a host whose
	// interfaces have been up a while.
	a.Flags |= unix.IFA_F_NODAD
	if err := n.Link.AddrAdd(link, a); err != nil {
		t.Fatalf("adding %s: %v", cidr, err)
	}
}

// DelAddr takes cidr off link.
func (n *NS) DelAddr(t testing.TB, link netlink.Link, cidr string) {
	t.Helper()
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Link.AddrDel(link, a); err != nil {
		t.Fatalf("removing %s: %v", cidr, err)
	}
}

// Listen listens on addr in the namespace, closed when the test ends.
func (n *NS) Listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	err := on(n.Handle, func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("listening on %s in the test namespace: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// Dialer dials from inside the namespace, and only to addresses in Allowed: a test's
// guard that nothing else is reached, even there.
type Dialer struct {
	NS      *NS
	Allowed []netip.Prefix
	T       testing.TB
}

// DialContext dials address (an IP and port) from inside the namespace.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		d.T.Errorf("dialled a name, not an address: %q", address)
		return nil, fmt.Errorf("test guard: %q is not an address", address)
	}
	ok := false
	for _, p := range d.Allowed {
		ok = ok || p.Contains(ap.Addr().Unmap())
	}
	if !ok {
		d.T.Errorf("dialled %s, outside the test's addresses %v", address, d.Allowed)
		return nil, fmt.Errorf("test guard: %s refused", address)
	}
	var c net.Conn
	err = on(d.NS.Handle, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, address)
		return err
	})
	return c, err
}
