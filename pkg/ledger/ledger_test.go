package ledger

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
)

// clock is a settable clock for the day window and expiry.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func open(t testing.TB, path string, c *clock, ceiling *int64) *Ledger {
	t.Helper()
	cfg := Config{Path: path, MachineCeiling: ceiling, TTL: time.Minute}
	if c != nil {
		cfg.Clock = c.Now
	}
	l, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func ptr(v int64) *int64 { return &v }

func register(t testing.TB, l *Ledger, id, parent string, ceiling int64) {
	t.Helper()
	if err := l.Register(Session{ID: id, Capsule: "cap-" + id, ParentID: parent, Ceiling: ceiling}); err != nil {
		t.Fatal(err)
	}
}

func refusal(t *testing.T, err error, limit string) *Refusal {
	t.Helper()
	var r *Refusal
	if !errors.As(err, &r) || r.Limit != limit || !errdefs.IsResourceExhausted(err) {
		t.Fatalf("got %v, want a refusal at %q", err, limit)
	}
	return r
}

// 64 admitters hold what they are granted, each asking for a range (the most it would use,
// the least it can do with) or for a fixed amount: the grants never sum past the ceiling,
// each is within what was asked, and every refusal was right — not even its least fitted in
// what was left. Nothing is settled, so nothing is charged and no refusal latches.
func TestConcurrentAdmittersNeverOver(t *testing.T) {
	for _, limit := range []string{LimitMachine, LimitSession, LimitAncestor} {
		t.Run(limit, func(t *testing.T) {
			const ceiling = 10_000
			var machine *int64
			sessionCeiling, parentCeiling := int64(0), int64(0)
			switch limit {
			case LimitMachine:
				machine = ptr(ceiling)
			case LimitSession:
				sessionCeiling = ceiling
			case LimitAncestor:
				parentCeiling = ceiling
			}
			l := open(t, filepath.Join(t.TempDir(), File), nil, machine)
			register(t, l, "parent", "", parentCeiling)
			register(t, l, "s", "parent", sessionCeiling)
			var granted atomic.Int64
			var mu sync.Mutex
			var refused []int64
			var wg sync.WaitGroup
			for w := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					for range 20 {
						most := 1 + rng.Int64N(400)
						least := int64(0)
						if w%2 == 0 {
							least = 1 + rng.Int64N(most)
						}
						r, err := l.Admit(Admission{SessionID: "s", Tokens: most, MinTokens: least})
						switch {
						case err == nil:
							if r.Tokens > most || r.Tokens < max(least, 1) || (least == 0 && r.Tokens != most) {
								t.Errorf("asked %d..%d, granted %d", least, most, r.Tokens)
							}
							granted.Add(r.Tokens)
						case errdefs.IsResourceExhausted(err):
							mu.Lock()
							refused = append(refused, max(least, most*int64(1-min(least, 1))))
							mu.Unlock()
						default:
							t.Error(err)
						}
					}
				}()
			}
			wg.Wait()
			if granted.Load() > ceiling {
				t.Fatalf("granted %d tokens under a ceiling of %d", granted.Load(), ceiling)
			}
			if len(refused) == 0 {
				t.Fatal("64×20 requests of up to 400 tokens fit under 10,000")
			}
			// Used only grows while everything is held, so a refusal stays justified.
			for _, n := range refused {
				if granted.Load()+n <= ceiling {
					t.Errorf("refused %d tokens with %d of %d granted", n, granted.Load(), ceiling)
				}
			}
			// The ranges took what was left: the room ends smaller than the least asked.
			if left := ceiling - granted.Load(); left >= 400 {
				t.Errorf("%d tokens left unused though ranges down to one token were asked for", left)
			}
			s, _ := l.Session("s")
			if s.Reserved != granted.Load() {
				t.Errorf("the session holds %d reserved, %d were granted", s.Reserved, granted.Load())
			}
			if s.Latched != nil {
				t.Errorf("a refusal made by open reservations latched: %+v", s.Latched)
			}
		})
	}
}

// 64 clients admit and settle at once: every total comes out exact, and survives a reopen.
func TestConcurrentSettlementsExact(t *testing.T) {
	path := filepath.Join(t.TempDir(), File)
	l := open(t, path, nil, ptr(1<<30))
	register(t, l, "root", "", 0)
	for i := range 8 {
		register(t, l, fmt.Sprint("s", i), "root", 0)
	}
	var input, output atomic.Int64
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprint("s", w%8)
			for i := range 25 {
				r, err := l.Admit(Admission{SessionID: id, RequestID: fmt.Sprint(w, "-", i), Tokens: 100})
				if err != nil {
					t.Error(err)
					return
				}
				in, out := int64(w%10+1), int64(i%7)
				if _, err := l.Settle(id, r.ID, Usage{Input: in, Output: out}); err != nil {
					t.Error(err)
					return
				}
				input.Add(in)
				output.Add(out)
			}
		}()
	}
	wg.Wait()
	want := input.Load() + output.Load()
	check := func(l *Ledger) {
		t.Helper()
		day, err := l.Report("")
		if err != nil {
			t.Fatal(err)
		}
		if day.Charged != want || day.Reserved != 0 || day.OpenReservations != 0 || day.Lifetime != want {
			t.Errorf("day: charged %d reserved %d open %d lifetime %d; want %d charged", day.Charged, day.Reserved, day.OpenReservations, day.Lifetime, want)
		}
		root, _ := l.Session("root")
		if root.SubtreeCharged != want {
			t.Errorf("the root's subtree was charged %d, want %d", root.SubtreeCharged, want)
		}
		var in, out int64
		for i := range 8 {
			s, _ := l.Session(fmt.Sprint("s", i))
			in += s.InputTokens
			out += s.OutputTokens
		}
		if in != input.Load() || out != output.Load() {
			t.Errorf("sessions: %d in %d out; want %d %d", in, out, input.Load(), output.Load())
		}
	}
	check(l)
	l.Close()
	reopened, err := Open(Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer reopened.Close()
	check(reopened)
}

func TestIdempotentAdmitAndSettle(t *testing.T) {
	path := filepath.Join(t.TempDir(), File)
	l := open(t, path, nil, ptr(1000))
	register(t, l, "s", "", 0)
	a, err := l.Admit(Admission{SessionID: "s", RequestID: "call-1", Tokens: 600})
	if err != nil {
		t.Fatal(err)
	}
	again, err := l.Admit(Admission{SessionID: "s", RequestID: "call-1", Tokens: 600})
	if err != nil || again.ID != a.ID {
		t.Fatalf("a repeated admission: %+v %v (first %s)", again, err, a.ID)
	}
	first, err := l.Settle("s", a.ID, Usage{Input: 10, Output: 20})
	if err != nil || first.Charged != 30 {
		t.Fatalf("settle: %+v %v", first, err)
	}
	second, err := l.Settle("s", a.ID, Usage{Input: 500, Output: 500})
	if err != nil || second != first {
		t.Fatalf("a repeated settlement: %+v %v", second, err)
	}
	l.Close()
	l = open(t, path, nil, nil)
	third, err := l.Settle("s", a.ID, Usage{Input: 1, Output: 1})
	if err != nil || third.Charged != 30 {
		t.Fatalf("a settlement repeated after a restart: %+v %v", third, err)
	}
	readmit, err := l.Admit(Admission{SessionID: "s", RequestID: "call-1", Tokens: 600})
	if err != nil || readmit.Settled == nil || readmit.Settled.Charged != 30 {
		t.Fatalf("an admission repeated after its settlement: %+v %v", readmit, err)
	}
	if day, _ := l.Report(""); day.Charged != 30 || day.Reserved != 0 {
		t.Fatalf("charged %d reserved %d", day.Charged, day.Reserved)
	}
	// Another session cannot settle (or learn of) this one's reservation.
	register(t, l, "other", "", 0)
	if _, err := l.Settle("other", a.ID, Usage{}); !errdefs.IsNotFound(err) {
		t.Fatalf("another session's settlement: %v", err)
	}
}

func TestSessionRefusalLatchesMachineDoesNot(t *testing.T) {
	l := open(t, filepath.Join(t.TempDir(), File), nil, ptr(100))
	register(t, l, "capped", "", 50)
	r, err := l.Admit(Admission{SessionID: "capped", Tokens: 40})
	if err != nil {
		t.Fatal(err)
	}
	// Refused while the 40 are held, but not latched: settling them can free the room.
	refusal(t, errOf(l.Admit(Admission{SessionID: "capped", Tokens: 20})), LimitSession)
	if s, _ := l.Session("capped"); s.Latched != nil {
		t.Fatalf("a refusal made by an open reservation latched: %+v", s.Latched)
	}
	if _, err := l.Settle("capped", r.ID, Usage{Input: 1}); err != nil {
		t.Fatal(err)
	}
	r, err = l.Admit(Admission{SessionID: "capped", Tokens: 20})
	if err != nil {
		t.Fatalf("20 of the 49 left: %v", err)
	}
	if _, err := l.Settle("capped", r.ID, Usage{Input: 20}); err != nil {
		t.Fatal(err)
	}
	// 21 charged: 30 more can never fit, so the refusal latches: that call, retried, is
	// refused at once, while a smaller one that fits is still admitted.
	refusal(t, errOf(l.Admit(Admission{SessionID: "capped", Tokens: 30})), LimitSession)
	got := refusal(t, errOf(l.Admit(Admission{SessionID: "capped", Tokens: 30})), LimitSession)
	if got.Used != 21 || got.Requested != 30 || got.Ceiling != 50 || !got.Latched {
		t.Errorf("latched refusal: %+v", got)
	}
	small, err := l.Admit(Admission{SessionID: "capped", Tokens: 5})
	if err != nil {
		t.Fatalf("5 of the 29 left, latched at 30: %v", err)
	}
	if _, err := l.Settle("capped", small.ID, Usage{Input: 5}); err != nil {
		t.Fatal(err)
	}
	if s, _ := l.Session("capped"); s.Latched == nil {
		t.Error("the latch is not in the account")
	}

	register(t, l, "free", "", 0)
	// 26 of the machine's 100 are charged to "capped".
	big, err := l.Admit(Admission{SessionID: "free", Tokens: 70})
	if err != nil {
		t.Fatal(err)
	}
	m := refusal(t, errOf(l.Admit(Admission{SessionID: "free", Tokens: 20})), LimitMachine)
	if m.Used != 96 || m.Ceiling != 100 {
		t.Errorf("machine refusal: %+v", m)
	}
	if _, err := l.Settle("free", big.ID, Usage{Input: 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admit(Admission{SessionID: "free", Tokens: 20}); err != nil {
		t.Fatalf("the machine refusal latched: %v", err)
	}
}

func errOf(_ Reservation, err error) error { return err }

// A child's spend counts against its whole ancestry: the grandparent's ceiling refuses the
// grandchild, named as the ancestor it is.
func TestAncestorCeilings(t *testing.T) {
	l := open(t, filepath.Join(t.TempDir(), File), nil, nil)
	register(t, l, "gp", "", 100)
	register(t, l, "p", "gp", 0)
	register(t, l, "c", "p", 0)
	r, err := l.Admit(Admission{SessionID: "c", Tokens: 70})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Settle("c", r.ID, Usage{Input: 30, Output: 40}); err != nil {
		t.Fatal(err)
	}
	got := refusal(t, errOf(l.Admit(Admission{SessionID: "p", Tokens: 40})), "ancestor gp")
	if got.Used != 70 || got.Ceiling != 100 || got.Kind() != LimitAncestor {
		t.Errorf("ancestor refusal: %+v", got)
	}
	refusal(t, errOf(l.Admit(Admission{SessionID: "gp", Tokens: 40})), LimitSession)
	// The parent and the grandparent latched, not the grandchild: 70 + 30 fits exactly.
	if _, err := l.Admit(Admission{SessionID: "c", Tokens: 30}); err != nil {
		t.Fatalf("the grandchild's admission that fits: %v", err)
	}
	gp, _ := l.Session("gp")
	if gp.Charged != 0 || gp.SubtreeCharged != 70 {
		t.Errorf("grandparent: own %d, subtree %d", gp.Charged, gp.SubtreeCharged)
	}
	if err := l.Register(Session{ID: "orphan", ParentID: "nobody"}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a child of an unknown parent: %v", err)
	}
}

func TestDayRollover(t *testing.T) {
	c := &clock{now: time.Date(2026, 3, 1, 23, 59, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), File)
	l := open(t, path, c, ptr(100))
	register(t, l, "s", "", 0)
	r, _ := l.Admit(Admission{SessionID: "s", Tokens: 90})
	if _, err := l.Settle("s", r.ID, Usage{Input: 90}); err != nil {
		t.Fatal(err)
	}
	refusal(t, errOf(l.Admit(Admission{SessionID: "s", Tokens: 20})), LimitMachine)
	changed := l.Changed()
	c.Add(2 * time.Minute)
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 20}); err != nil {
		t.Fatalf("a new day: %v", err)
	}
	select {
	case <-changed:
	default:
		t.Error("a new day woke nobody waiting for budget")
	}
	day1, _ := l.Report("2026-03-01")
	day2, _ := l.Report("")
	if day1.Charged != 90 || day1.Reserved != 0 || !day1.ResetsAt.Equal(time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("day 1: %+v", day1)
	}
	if day2.Date != "2026-03-02" || day2.Charged != 0 || day2.Reserved != 20 || day2.Lifetime != 90 {
		t.Errorf("day 2: %+v", day2)
	}
	if len(day1.Capsules) != 1 || day1.Capsules[0].Capsule != "cap-s" || day1.Capsules[0].Charged != 90 {
		t.Errorf("day 1 capsules: %+v", day1.Capsules)
	}
	if _, err := l.Report("March 1st"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a bad day: %v", err)
	}
	// The window and the lifetime total survive a restart on the same day.
	l.Close()
	l = open(t, path, c, nil)
	if d, _ := l.Report(""); d.Reserved != 20 || d.Lifetime != 90 || d.MachineCeiling != 100 {
		t.Errorf("after a restart: %+v", d)
	}
}

func TestExpiryAndEndChargeInFull(t *testing.T) {
	c := &clock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	l := open(t, filepath.Join(t.TempDir(), File), c, nil)
	register(t, l, "s", "", 0)
	old, _ := l.Admit(Admission{SessionID: "s", Tokens: 50})
	c.Add(30 * time.Second)
	young, _ := l.Admit(Admission{SessionID: "s", Tokens: 7})
	c.Add(31 * time.Second)
	if err := l.Expire(); err != nil {
		t.Fatal(err)
	}
	s, _ := l.Session("s")
	if s.Charged != 50 || s.Reserved != 7 {
		t.Fatalf("after expiry: charged %d reserved %d", s.Charged, s.Reserved)
	}
	// The capsule's late settlement finds the charge already made.
	late, err := l.Settle("s", old.ID, Usage{Input: 1})
	if err != nil || late.Reason != ReasonExpired || late.Charged != 50 {
		t.Fatalf("a late settlement: %+v %v", late, err)
	}
	end, err := l.End("s")
	if err != nil || end.Charged != 57 || end.Reserved != 0 || !end.Ended {
		t.Fatalf("end: %+v %v", end, err)
	}
	if got, _ := l.Settle("s", young.ID, Usage{}); got.Reason != ReasonSessionEnded {
		t.Errorf("the open reservation at the end: %+v", got)
	}
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 1}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("an admission after the end: %v", err)
	}
}

func TestBadInput(t *testing.T) {
	l := open(t, filepath.Join(t.TempDir(), File), nil, nil)
	register(t, l, "s", "", 0)
	for _, n := range []int64{0, -1, MaxTokens + 1} {
		if _, err := l.Admit(Admission{SessionID: "s", Tokens: n}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("admit %d: %v", n, err)
		}
	}
	r, _ := l.Admit(Admission{SessionID: "s", Tokens: 5})
	if _, err := l.Settle("s", r.ID, Usage{Input: -1}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a negative usage: %v", err)
	}
	if _, err := l.Admit(Admission{SessionID: "ghost", Tokens: 5}); !errdefs.IsNotFound(err) {
		t.Errorf("an unknown session: %v", err)
	}
	if err := l.SetMachineCeiling(-5); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a negative ceiling: %v", err)
	}
	if _, err := Open(Config{Path: l.db.Path()}); !errors.Is(err, ErrLocked) {
		t.Errorf("a second open: %v", err)
	}
}

func TestPruneForgetsOldSettlementsKeepsTotals(t *testing.T) {
	c := &clock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	l := open(t, filepath.Join(t.TempDir(), File), c, nil)
	register(t, l, "s", "", 0)
	old, _ := l.Admit(Admission{SessionID: "s", RequestID: "old", Tokens: 10})
	l.Settle("s", old.ID, Usage{Input: 4})
	c.Add(8 * 24 * time.Hour)
	young, _ := l.Admit(Admission{SessionID: "s", RequestID: "young", Tokens: 10})
	l.Settle("s", young.ID, Usage{Input: 6})
	n, err := l.Prune(c.Now().Add(-SettledRetention))
	if err != nil || n != 1 {
		t.Fatalf("pruned %d: %v", n, err)
	}
	if _, err := l.Settle("s", old.ID, Usage{}); !errdefs.IsNotFound(err) {
		t.Errorf("a pruned settlement: %v", err)
	}
	if again, _ := l.Settle("s", young.ID, Usage{Input: 99}); again.Charged != 6 {
		t.Errorf("a kept settlement: %+v", again)
	}
	if s, _ := l.Session("s"); s.Charged != 10 {
		t.Errorf("totals after pruning: %d", s.Charged)
	}
}

// A commit that fails leaves memory ahead of the file: the ledger then refuses everything
// rather than admit what it could not record, and a reopen rebuilds it from the file.
func TestFailedCommitFailsClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), File)
	l := open(t, path, nil, nil)
	register(t, l, "s", "", 0)
	kept, err := l.Admit(Admission{SessionID: "s", Tokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	commit := l.commit
	l.commit = func(func(*bolt.Tx) error) error { return errors.New("disk full") }
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 5}); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("the admission whose commit failed: %v", err)
	}
	l.commit = commit
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 5}); !errdefs.IsUnavailable(err) {
		t.Fatalf("an admission after a failed commit: %v", err)
	}
	if _, err := l.Settle("s", kept.ID, Usage{Input: 1}); !errdefs.IsUnavailable(err) {
		t.Fatalf("a settlement after a failed commit: %v", err)
	}
	l.Close()
	l = open(t, path, nil, nil)
	if s, _ := l.Session("s"); s.Reserved != 10 || s.Charged != 0 {
		t.Fatalf("after a reopen: %+v", s)
	}
	if _, err := l.Settle("s", kept.ID, Usage{Input: 1}); err != nil {
		t.Fatalf("settling after a reopen: %v", err)
	}
}

// A day's window that cannot be read is not taken for an empty one: the ledger refuses to
// admit or charge (unavailable) until a read succeeds, and then counts what the file holds.
func TestUnreadDayFailsClosed(t *testing.T) {
	c := &clock{now: time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)}
	l := open(t, filepath.Join(t.TempDir(), File), c, ptr(100))
	register(t, l, "s", "", 0)
	r, err := l.Admit(Admission{SessionID: "s", Tokens: 90})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Settle("s", r.ID, Usage{Input: 90}); err != nil {
		t.Fatal(err)
	}
	// The clock steps back a day and forward again: the day it returns to already has
	// charges on file, which the window must read back.
	c.Add(-24 * time.Hour)
	held, err := l.Admit(Admission{SessionID: "s", Tokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	view := l.view
	l.view = func(func(*bolt.Tx) error) error { return errors.New("input/output error") }
	c.Add(24 * time.Hour)

	_, err = l.Admit(Admission{SessionID: "s", Tokens: 20})
	var refused *Refusal
	if !errdefs.IsUnavailable(err) || errors.As(err, &refused) || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("an admission while the day is unread: %v", err)
	}
	if _, err := l.Settle("s", held.ID, Usage{Input: 1}); !errdefs.IsUnavailable(err) {
		t.Fatalf("a settlement while the day is unread: %v", err)
	}
	if s, _ := l.Session("s"); s.Reserved != 5 || s.Charged != 90 {
		t.Fatalf("the open reservation while the day is unread: %+v", s)
	}
	if n, ok := l.Remaining(); n != 0 || !ok {
		t.Errorf("remaining while the day is unread: %d %v", n, ok)
	}
	if _, err := l.Report(""); !errdefs.IsUnavailable(err) {
		t.Errorf("a report while the day is unread: %v", err)
	}

	l.view = view
	refusal(t, errOf(l.Admit(Admission{SessionID: "s", Tokens: 20})), LimitMachine)
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 5}); err != nil {
		t.Fatalf("an admission within what is left: %v", err)
	}
	if _, err := l.Settle("s", held.ID, Usage{Input: 1}); err != nil {
		t.Fatalf("settling once the day is read: %v", err)
	}
	if d, err := l.Report(""); err != nil || d.Date != "2026-03-02" || d.Charged != 91 || d.Reserved != 5 {
		t.Errorf("the day once read: %+v %v", d, err)
	}
}

// A range is granted the most that fits at the tightest ceiling — the session's, an
// ancestor's or the machine's — and refused, at that ceiling, only when its least does not
// fit; a least that could never fit after what is charged latches, one that open
// reservations alone keep out does not.
func TestAdmitRange(t *testing.T) {
	l := open(t, filepath.Join(t.TempDir(), File), nil, ptr(1000))
	register(t, l, "p", "", 300)
	register(t, l, "s", "p", 500)
	register(t, l, "other", "", 0)
	held, err := l.Admit(Admission{SessionID: "other", Tokens: 600})
	if err != nil {
		t.Fatal(err)
	}
	// The parent's 300 is the tightest.
	r, err := l.Admit(Admission{SessionID: "s", Tokens: 1000, MinTokens: 10})
	if err != nil || r.Tokens != 300 {
		t.Fatalf("granted %d (%v), want the parent's 300", r.Tokens, err)
	}
	got := refusal(t, errOf(l.Admit(Admission{SessionID: "s", Tokens: 1000, MinTokens: 1})), "ancestor p")
	if got.Requested != 1 || got.Used != 300 {
		t.Errorf("refusal: %+v", got)
	}
	if _, err := l.Settle("s", r.ID, Usage{Input: 100}); err != nil {
		t.Fatal(err)
	}
	// 200 left at the parent, 100 at the machine (600 held, 100 charged).
	r, err = l.Admit(Admission{SessionID: "s", Tokens: 1000, MinTokens: 50})
	if err != nil || r.Tokens != 200 {
		t.Fatalf("granted %d (%v), want the parent's 200", r.Tokens, err)
	}
	refusal(t, errOf(l.Admit(Admission{SessionID: "other", Tokens: 200, MinTokens: 150})), LimitMachine)
	r2, err := l.Admit(Admission{SessionID: "other", Tokens: 200, MinTokens: 10})
	if err != nil || r2.Tokens != 100 {
		t.Fatalf("granted %d (%v), want the machine's 100", r2.Tokens, err)
	}
	if _, err := l.Settle("s", r.ID, Usage{Input: 150}); err != nil {
		t.Fatal(err)
	}
	// 250 charged under the parent's 300: 60 can never fit, and the refusal latches.
	refusal(t, errOf(l.Admit(Admission{SessionID: "s", Tokens: 100, MinTokens: 60})), "ancestor p")
	if s, _ := l.Session("s"); s.Latched == nil {
		t.Error("a least that cannot fit after the charges did not latch")
	}
	_, _ = l.Settle("other", held.ID, Usage{})
	_, _ = l.Settle("other", r2.ID, Usage{})
	for _, bad := range []Admission{{SessionID: "other", Tokens: 10, MinTokens: 11}, {SessionID: "other", Tokens: 10, MinTokens: -1}} {
		if _, err := l.Admit(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%+v: %v, want invalid argument", bad, err)
		}
	}
}

// Headroom is what Admit would grant at most: the tightest ceiling's room, after charges and
// reservations; 0 once latched; none binding is MaxTokens.
func TestHeadroom(t *testing.T) {
	l := open(t, filepath.Join(t.TempDir(), File), nil, ptr(1000))
	register(t, l, "p", "", 300)
	register(t, l, "s", "p", 500)
	register(t, l, "other", "", 0)
	room := func(id string) int64 {
		t.Helper()
		n, err := l.Headroom(id)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := room("s"); got != 300 {
		t.Errorf("s: %d, want the parent's 300", got)
	}
	held, err := l.Admit(Admission{SessionID: "other", Tokens: 900})
	if err != nil {
		t.Fatal(err)
	}
	if got := room("s"); got != 100 {
		t.Errorf("s: %d, want the machine's 100 (900 reserved)", got)
	}
	if r, err := l.Admit(Admission{SessionID: "s", Tokens: 1000, MinTokens: 1}); err != nil || r.Tokens != 100 {
		t.Fatalf("granted %d (%v), want the 100 Headroom read", r.Tokens, err)
	}
	if got := room("other"); got != 0 {
		t.Errorf("other: %d, want 0", got)
	}
	_, _ = l.Settle("other", held.ID, Usage{})
	l2 := open(t, filepath.Join(t.TempDir(), File), nil, nil)
	register(t, l2, "free", "", 0)
	if n, err := l2.Headroom("free"); err != nil || n != MaxTokens {
		t.Errorf("no ceiling: %d (%v), want MaxTokens", n, err)
	}
	if _, err := l.Headroom("nobody"); !errdefs.IsNotFound(err) {
		t.Errorf("an unknown session: %v", err)
	}
	// A least the parent's 300 can never hold latches s; what is left stays s's to use.
	refusal(t, errOf(l.Admit(Admission{SessionID: "s", Tokens: 1000, MinTokens: 400})), "ancestor p")
	if got := room("s"); got != 200 {
		t.Errorf("latched: %d, want the 200 the parent leaves", got)
	}
}
