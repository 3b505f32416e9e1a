package fdbudget

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

func TestNumbers(t *testing.T) {
	for _, c := range []struct {
		nofile              uint64
		reserve             uint64
		total, share, given int64
	}{
		{1024, 256, 768, 48, 0},
		{20000, 2500, 17500, 1093, 0},
		{400, 200, 200, 32, 0},
		{40, 20, 20, 20, 0},
		{1024, 256, 768, 100, 100},
		{1024, 256, 768, 768, 5000},
	} {
		b := New(c.nofile, c.given)
		st := b.Stats()
		if st.Limit != c.nofile || st.Reserve != c.reserve || st.Total != c.total || st.Share != c.share {
			t.Errorf("New(%d, %d): %+v; want reserve %d total %d share %d", c.nofile, c.given, st, c.reserve, c.total, c.share)
		}
	}
}

// The total is the open-file limit less a reserve of an eighth, at least 256, at most half.
func TestTotal(t *testing.T) {
	for nofile, want := range map[uint64]int64{
		100:     50,
		300:     150,
		512:     256,
		1024:    768,
		20000:   17500,
		1 << 20: 917504,
	} {
		if got := New(nofile, 0).Total(); got != want {
			t.Errorf("New(%d).Total() = %d, want %d", nofile, got, want)
		}
	}
}

func TestShareAndTotal(t *testing.T) {
	b := New(1024, 10) // total 768, share 10
	var held []Slot
	for i := range 10 {
		s, err := b.Acquire("ses_a", Upstream)
		if err != nil {
			t.Fatalf("slot %d of a share of 10: %v", i, err)
		}
		held = append(held, s)
	}
	_, err := b.Acquire("ses_a", Gateway)
	var r *Refused
	if !errors.As(err, &r) || r.Scope != ScopeShare || r.Max != 10 || r.Owner != "ses_a" || r.Use != Gateway || !errdefs.IsResourceExhausted(err) {
		t.Fatalf("the 11th slot of a share of 10: %#v", err)
	}
	// Positive control: another owner is not refused for the first one's share.
	other, err := b.Acquire("ses_b", Upstream)
	if err != nil {
		t.Fatalf("another session's first slot: %v", err)
	}
	other.Release()
	if st := b.Stats(); st.Held != 10 || st.ByUse["upstream"] != 10 || st.ByUse["gateway"] != 0 || st.Owners != 1 || st.AtShare != 1 {
		t.Errorf("stats: %+v", st)
	}
	held[0].Release()
	s, err := b.Acquire("ses_a", Gateway)
	if err != nil {
		t.Fatalf("a slot after one was given back: %v", err)
	}
	held[0] = s

	// The total: endpoint connections, counted against it only, fill what is left.
	for range 768 - 10 {
		if _, err := b.AcquireTotal("ses_c", Endpoint); err != nil {
			t.Fatal(err)
		}
	}
	_, err = b.AcquireTotal("ses_c", Endpoint)
	if !errors.As(err, &r) || r.Scope != ScopeTotal || r.Max != 768 {
		t.Fatalf("past the total: %#v", err)
	}
	_, err = b.Acquire("ses_d", Upstream)
	if !errors.As(err, &r) || r.Scope != ScopeTotal || r.Owner != "ses_d" {
		t.Fatalf("a session's first slot past the total: %#v", err)
	}
	if st := b.Stats(); st.Held != 768 {
		t.Errorf("held past the total: %+v", st)
	}

	// Followers are the operator's: out of the reserve, within their own share only.
	for i := range 10 {
		if _, err := b.Acquire(Followers, Follower); err != nil {
			t.Fatalf("follower slot %d with the sessions' total held: %v", i, err)
		}
	}
	_, err = b.Acquire(Followers, Follower)
	if !errors.As(err, &r) || r.Scope != ScopeShare || r.Owner != Followers || !strings.Contains(err.Error(), "readers of sessions' logs") {
		t.Fatalf("the 11th follower slot of a share of 10: %v", err)
	}
	if st := b.Stats(); st.Held != 768 || st.ByUse["follower"] != 10 {
		t.Errorf("followers' slots counted in the sessions' total: %+v", st)
	}
}

// Slots go back: after many owners take and give back slots from many goroutines, nothing
// is held and no owner is remembered.
func TestNoLeak(t *testing.T) {
	b := New(1<<16, 64)
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			owner := "ses_" + string(rune('a'+g%8))
			for i := range 2000 {
				s, err := b.Acquire(owner, Use(i%int(nUses)))
				if err != nil {
					continue // 4 goroutines share an owner's 64
				}
				s.Release()
			}
		})
	}
	wg.Wait()
	st := b.Stats()
	if st.Held != 0 || st.Owners != 0 || len(b.owners) != 0 {
		t.Fatalf("after every slot was given back: %+v, %d owners remembered", st, len(b.owners))
	}
	for use, n := range st.ByUse {
		if n != 0 {
			t.Errorf("%s: %d held", use, n)
		}
	}
	Slot{}.Release() // the zero Slot gives back nothing
	if b.Stats().Held != 0 {
		t.Fatal("releasing the zero Slot changed the count")
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	bud := New(1<<20, 0)
	b.Run("session", func(b *testing.B) {
		for b.Loop() {
			s, err := bud.Acquire("ses_bench", Upstream)
			if err != nil {
				b.Fatal(err)
			}
			s.Release()
		}
	})
	b.Run("total", func(b *testing.B) {
		for b.Loop() {
			s, err := bud.AcquireTotal("ses_bench", Endpoint)
			if err != nil {
				b.Fatal(err)
			}
			s.Release()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s, err := bud.Acquire("ses_bench", Upstream)
				if err != nil {
					b.Fatal(err)
				}
				s.Release()
			}
		})
	})
}
