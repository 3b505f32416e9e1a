package hostaddr_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"roost.dev/roost/internal/testnetns"
	"roost.dev/roost/pkg/hostaddr"
)

// waitFor polls cond for up to 10 s: a notification is asynchronous.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// The set holds what the namespace's interfaces hold at start, follows additions and
// removals, and keeps an address two interfaces hold until both let go.
func TestWatchFollows(t *testing.T) {
	n := testnetns.New(t)
	d0 := n.Veth(t, "rh0", "10.77.0.1/24", "fd77::1/64")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := hostaddr.Watch(ctx, n.Handle, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.77.0.1", "fd77::1", "127.0.0.1", "::ffff:10.77.0.1"} {
		if !s.Contains(netip.MustParseAddr(a)) {
			t.Errorf("at start: %s is missing from %v", a, s.Addrs())
		}
	}
	for _, a := range []string{"10.77.0.2", "10.78.0.1", "fd77::2"} {
		if s.Contains(netip.MustParseAddr(a)) {
			t.Errorf("at start: %s is in the set, and no interface holds it: %v", a, s.Addrs())
		}
	}

	added := netip.MustParseAddr("10.78.0.9")
	n.AddAddr(t, d0, "10.78.0.9/32")
	waitFor(t, "an added address", func() bool { return s.Contains(added) })

	d1 := n.Veth(t, "rh1", "10.78.0.9/32")
	n.DelAddr(t, d0, "10.78.0.9/32")
	// The removal from rh0 is seen once a later change is: rh1 still holds the address.
	n.AddAddr(t, d1, "10.79.0.1/32")
	waitFor(t, "a later address", func() bool { return s.Contains(netip.MustParseAddr("10.79.0.1")) })
	if !s.Contains(added) {
		t.Fatalf("%s left the set while rh1 still holds it: %v", added, s.Addrs())
	}
	n.DelAddr(t, d1, "10.78.0.9/32")
	waitFor(t, "a removed address to leave", func() bool { return !s.Contains(added) })

	if err := n.Link.LinkDel(d1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a deleted interface's address to leave", func() bool { return !s.Contains(netip.MustParseAddr("10.79.0.1")) })
	if got := s.Addrs(); !slices.Contains(got, netip.MustParseAddr("10.77.0.1")) {
		t.Fatalf("the set lost rh0's address: %v", got)
	}

	cancel()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not stop with its context")
	}
}

// BenchmarkContains is what the check costs an egress decision: one lookup in a set of
// 64 addresses, from 8 goroutines at once as sessions' proxies ask.
func BenchmarkContains(b *testing.B) {
	n := testnetns.New(b)
	link := n.Veth(b, "rh0")
	for i := range 64 {
		n.AddAddr(b, link, fmt.Sprintf("10.77.%d.%d/32", i/250, 1+i%250))
	}
	s, err := hostaddr.Watch(b.Context(), n.Handle, nil)
	if err != nil {
		b.Fatal(err)
	}
	probe := netip.MustParseAddr("10.99.0.1")
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if s.Contains(probe) {
				b.Fatal("found")
			}
		}
	})
}
