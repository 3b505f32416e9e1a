package ledger

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func openFleet(t *testing.T, path string, c *clock) *Ledger {
	t.Helper()
	l, err := Open(Config{Path: path, Fleet: true, Clock: c.Now, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// A fleet node with no allowance admits nothing; with one it admits up to it, the day it is
// for only, and refuses past it at limit "fleet" — never latched, since a block may come.
func TestAllowanceBoundsAdmission(t *testing.T) {
	c := &clock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	l := openFleet(t, filepath.Join(t.TempDir(), File), c)
	register(t, l, "s", "", 0)
	_, err := l.Admit(Admission{SessionID: "s", Tokens: 1})
	if r := refusal(t, err, LimitFleet); r.Ceiling != 0 || r.Latched {
		t.Fatalf("refusal without an allowance: %+v", r)
	}
	if err := l.SetAllowance(Allowance{Day: "2026-05-01", Tokens: 1000}); err != nil {
		t.Fatal(err)
	}
	a, err := l.Admit(Admission{SessionID: "s", Tokens: 600})
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Admit(Admission{SessionID: "s", Tokens: 600, MinTokens: 100})
	if err != nil || b.Tokens != 400 {
		t.Fatalf("got %+v, %v; want 400 granted of the 400 left", b, err)
	}
	_, err = l.Admit(Admission{SessionID: "s", Tokens: 1})
	if r := refusal(t, err, LimitFleet); r.Ceiling != 1000 || r.Used != 1000 || r.Latched || r.Detail != "" {
		t.Fatalf("refusal at a spent allowance: %+v", r)
	}
	if _, err := l.Settle("s", a.ID, Usage{Input: 100, Output: 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 400}); err != nil {
		t.Fatalf("what a settlement freed: %v", err)
	}
	allow, charged, reserved, err := l.Funded("2026-05-01")
	if err != nil || allow.Tokens != 1000 || charged != 200 || reserved != 800 {
		t.Fatalf("funded: %+v %d %d %v; want 1000, 200 charged, 800 reserved", allow, charged, reserved, err)
	}
	// The next day holds nothing until it is given an allowance of its own.
	c.Add(24 * time.Hour)
	_, err = l.Admit(Admission{SessionID: "s", Tokens: 1})
	refusal(t, err, LimitFleet)
}

// A call admitted before midnight and settled after is charged to the new day's window, as
// any, but to what the old day's allowance funded: that is what the node gives back of the
// old day's blocks by, and the new day's allowance is not spent by it.
func TestAllowanceFundsAcrossMidnight(t *testing.T) {
	c := &clock{now: time.Date(2026, 5, 1, 23, 59, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), File)
	l := openFleet(t, path, c)
	register(t, l, "s", "", 0)
	if err := l.SetAllowance(Allowance{Day: "2026-05-01", Tokens: 1000}); err != nil {
		t.Fatal(err)
	}
	r, err := l.Admit(Admission{SessionID: "s", Tokens: 500})
	if err != nil {
		t.Fatal(err)
	}
	c.Add(2 * time.Minute)
	if err := l.SetAllowance(Allowance{Day: "2026-05-02", Tokens: 300}); err != nil {
		t.Fatal(err)
	}
	s, err := l.Settle("s", r.ID, Usage{Input: 50, Output: 250})
	if err != nil || s.Day != "2026-05-02" || s.Funded != "2026-05-01" {
		t.Fatalf("settled %+v, %v; want charged on the 2nd, funded by the 1st", s, err)
	}
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 300}); err != nil {
		t.Fatalf("the 2nd's allowance was spent by the 1st's call: %v", err)
	}
	// Both survive a restart: the settled sum from the file, the open one from its reservation.
	l.Close()
	l = openFleet(t, path, c)
	for day, want := range map[string][2]int64{"2026-05-01": {300, 0}, "2026-05-02": {0, 300}} {
		_, charged, reserved, err := l.Funded(day)
		if err != nil || charged != want[0] || reserved != want[1] {
			t.Errorf("%s after a restart: %d charged, %d reserved, %v; want %v", day, charged, reserved, err, want)
		}
	}
	_, err = l.Admit(Admission{SessionID: "s", Tokens: 1})
	refusal(t, err, LimitFleet)
}

// The allowance is kept in the file: a node restarted admits no more than it held.
func TestAllowanceSurvivesRestart(t *testing.T) {
	c := &clock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), File)
	l := openFleet(t, path, c)
	register(t, l, "s", "", 0)
	if err := l.SetAllowance(Allowance{Day: "2026-05-01", Tokens: 100, Unreachable: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 60}); err != nil {
		t.Fatal(err)
	}
	_, err := l.Admit(Admission{SessionID: "s", Tokens: 60})
	if r := refusal(t, err, LimitFleet); r.Detail != "fleet ledger unreachable" || !strings.Contains(err.Error(), "fleet ledger unreachable") {
		t.Fatalf("refusal while unreachable: %+v (%v)", r, err)
	}
	l.Close()
	l = openFleet(t, path, c)
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 41}); err == nil {
		t.Fatal("a restarted node admitted past its allowance")
	}
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 40}); err != nil {
		t.Fatal(err)
	}
}

// An admission that leaves less than Low, and a refusal at the allowance, signal
// AllowanceLow; one that leaves more does not.
func TestAllowanceLowSignals(t *testing.T) {
	c := &clock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	l := openFleet(t, filepath.Join(t.TempDir(), File), c)
	register(t, l, "s", "", 0)
	if err := l.SetAllowance(Allowance{Day: "2026-05-01", Tokens: 1000, Low: 500}); err != nil {
		t.Fatal(err)
	}
	signalled := func() bool {
		select {
		case <-l.AllowanceLow():
			return true
		default:
			return false
		}
	}
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 400}); err != nil || signalled() {
		t.Fatalf("600 left of 1000 (low 500): signalled %v, %v", !signalled(), err)
	}
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 200}); err != nil || !signalled() {
		t.Fatalf("400 left, below 500: no signal (%v)", err)
	}
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 500}); err == nil || !signalled() {
		t.Fatalf("a refusal at the allowance: no signal (%v)", err)
	}
}

func TestAllowanceBadInput(t *testing.T) {
	c := &clock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	l := openFleet(t, filepath.Join(t.TempDir(), File), c)
	for _, a := range []Allowance{{Day: "1 May", Tokens: 1}, {Day: "2026-05-01", Tokens: -1}, {Day: "2026-05-01", Tokens: MaxTokens + 1}} {
		if err := l.SetAllowance(a); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%+v: %v, want invalid argument", a, err)
		}
	}
	plain := open(t, filepath.Join(t.TempDir(), File), c, nil)
	if err := plain.SetAllowance(Allowance{Day: "2026-05-01", Tokens: 1}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("an allowance on a ledger not in fleet mode: %v", err)
	}
}

// ReduceAllowance takes back no more than is free: what is charged and reserved stays
// funded, and an allowance of another day is left alone.
func TestReduceAllowance(t *testing.T) {
	c := &clock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), File)
	l := openFleet(t, path, c)
	register(t, l, "s", "", 0)
	if err := l.SetAllowance(Allowance{Day: "2026-05-01", Tokens: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admit(Admission{SessionID: "s", Tokens: 700}); err != nil {
		t.Fatal(err)
	}
	if cut, err := l.ReduceAllowance("2026-04-30", 100); cut != 0 || err != nil {
		t.Fatalf("another day's: cut %d, %v", cut, err)
	}
	if cut, err := l.ReduceAllowance("2026-05-01", 500); cut != 300 || err != nil {
		t.Fatalf("cut %d (%v), want the 300 free", cut, err)
	}
	_, err := l.Admit(Admission{SessionID: "s", Tokens: 1})
	refusal(t, err, LimitFleet)
	l.Close()
	l = openFleet(t, path, c)
	if a, _, reserved, err := l.Funded("2026-05-01"); a.Tokens != 700 || reserved != 700 || err != nil {
		t.Fatalf("after a restart: %+v, %d reserved, %v", a, reserved, err)
	}
}
