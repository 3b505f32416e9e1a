package server

import (
	"strings"
	"testing"

	"roost.dev/roost/pkg/fdbudget"
)

// Doctor's descriptors check says the budget and what each use holds: ok while there is
// room, warn at 80% of the total, fail when it is all held, with what to do.
func TestDoctorDescriptors(t *testing.T) {
	b := fdbudget.New(1024, 0)
	c := checkDescriptors(b.Stats())
	if c.Name != "descriptors" || c.Status != "ok" || c.Hint != "" ||
		!strings.Contains(c.Detail, "768 descriptors for sessions (open-file limit 1024 less a reserve of 256 for the operator), at most 48 per session; 0 held") {
		t.Fatalf("an empty budget: %+v", c)
	}
	var held []fdbudget.Slot
	take := func(n int) {
		for range n {
			s, err := b.AcquireTotal("ses_a", fdbudget.Endpoint)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, s)
		}
	}
	take(615) // 80% of 768 is 614.4
	if c := checkDescriptors(b.Stats()); c.Status != "warn" || !strings.Contains(c.Detail, "615 held (endpoint 615, upstream 0, gateway 0, follower 0, exec 0)") || !strings.Contains(c.Hint, "LimitNOFILE") {
		t.Fatalf("at 80%%: %+v", c)
	}
	take(768 - 615)
	if c := checkDescriptors(b.Stats()); c.Status != "fail" || !strings.Contains(c.Hint, "X-Roost-Denied: connections") {
		t.Fatalf("all held: %+v", c)
	}
	for _, s := range held {
		s.Release()
	}
}
