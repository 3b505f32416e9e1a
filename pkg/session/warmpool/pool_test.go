package warmpool

import (
	"testing"

	"roost.dev/roost/pkg/containment/sealed"
)

// TestWarmRefillServesEveryShape: when one shape's sandboxes are taken as fast as they are
// made (most sessions fit it), the refill still comes round to the other shapes whenever
// they are empty too; a shape fuller for its size waits for emptier ones.
func TestWarmRefillServesEveryShape(t *testing.T) {
	busy := &shape{WarmShape: sealed.WarmShape{Name: "busy"}, size: 3}
	other := &shape{WarmShape: sealed.WarmShape{Name: "other"}, size: 2}
	p := &Pool{shapes: []*shape{busy, other}}
	made := map[string]int{}
	for range 6 {
		s := p.neediest()
		if s == nil {
			t.Fatal("no shape chosen while both lack sandboxes")
		}
		p.chose(s)
		made[s.Name]++
		if s == other {
			// Nobody takes these: the shape fills.
			other.ready = append(other.ready, &sealed.Sandbox{})
		}
		// busy's sandbox is claimed as soon as it is made: it stays empty.
	}
	if len(other.ready) == 0 || made["busy"] < 4 {
		t.Fatalf("made %v; want other given a sandbox though busy never fills, and busy most turns", made)
	}
	// other's sandbox is claimed; both are empty, busy chosen last: other is next.
	other.ready = nil
	if got := p.neediest(); got != other {
		t.Fatalf("neediest = %s; want the shape made for longest ago", got.Name)
	}
	// Fuller for its size waits: busy at 2 of 3 ready, other at 0 of 2.
	busy.ready = make([]*sealed.Sandbox, 2)
	other.ready = nil
	if got := p.neediest(); got != other {
		t.Fatalf("neediest = %s; want the emptier shape", got.Name)
	}
	busy.ready, other.ready = make([]*sealed.Sandbox, 3), make([]*sealed.Sandbox, 2)
	if got := p.neediest(); got != nil {
		t.Fatalf("neediest = %s with every shape full", got.Name)
	}
}
