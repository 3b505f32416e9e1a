package hostaddr

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"roost.dev/roost/internal/testnetns"
)

// Notifications the set cannot take in time overflow the kernel's socket buffer (ENOBUFS)
// and are lost; the set then lists the addresses afresh, and ends holding what the
// interfaces hold. The set's reader is held up (its lock taken) while 600 addresses come,
// more than the update channel and a minimal socket buffer hold together.
func TestOverflowRelists(t *testing.T) {
	n := testnetns.New(t)
	link := n.Veth(t, "rh0")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := watch(ctx, n.Handle, nil, 1) // the kernel's minimum
	if err != nil {
		t.Fatal(err)
	}
	const count = 600
	addr := func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("10.78.%d.%d", i/250, 1+i%250)) }
	s.mu.Lock()
	for i := range count {
		n.AddAddr(t, link, addr(i).String()+"/32")
	}
	s.mu.Unlock()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		held := 0
		for i := range count {
			if s.Contains(addr(i)) {
				held++
			}
		}
		if held == count {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the set holds %d of the %d addresses after %d relists", held, count, s.relists.Load())
		}
	}
	if s.relists.Load() == 0 {
		t.Fatal("the notifications never overflowed: the test did not test the relist")
	}
}
