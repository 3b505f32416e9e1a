package session

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"roost.dev/roost/pkg/session/delegate"
	"roost.dev/roost/pkg/session/store"

	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/spawn"
)

// A settlement above its reservation is charged the truth and recorded as a spend.overrun
// event with both numbers; one within it records nothing.
func TestSpendOverrunEvent(t *testing.T) {
	dir := stateDir(t)
	l, err := ledger.Open(ledger.Config{Path: filepath.Join(t.TempDir(), ledger.File)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	cfg := testConfig(dir, &recorder{})
	cfg.Ledger = l
	m, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	rec := run(t, m, StageOptions{Capsule: capsule(t, "sleep 30", "")})
	t.Cleanup(func() { m.Stop(context.Background(), rec.ID, time.Second, "") })

	for _, tc := range []struct{ reserve, in, out int64 }{{10, 3, 4}, {10, 30, 5}} {
		res, err := m.backend.Admit(rec.ID, spawn.AdmitRequest{Tokens: tc.reserve})
		if err != nil {
			t.Fatal(err)
		}
		s, err := m.backend.Settle(rec.ID, spawn.SettleRequest{Reservation: res.ID, InputTokens: tc.in, OutputTokens: tc.out})
		if err != nil || s.Charged != tc.in+tc.out {
			t.Fatalf("settled %+v %v", s, err)
		}
	}
	var overruns []string
	m.Events(context.Background(), 0, false, func(ev store.Event) error {
		if ev.Type == delegate.EventSpendOverrun && ev.SessionID == rec.ID {
			overruns = append(overruns, ev.Detail)
		}
		return nil
	})
	if len(overruns) != 1 || overruns[0] != "reserved 10, charged 35 (input 30, output 5)" {
		t.Fatalf("spend.overrun events: %q", overruns)
	}
}
