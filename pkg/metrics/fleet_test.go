package metrics

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/ledger"
)

// A fleet node on a real etcd member through the watched store: its grants are counted, its
// Txns timed, and its part of the day and the day's ceiling reported.
func TestFleetMetrics(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	st, err := etcdstore.New(etcdstore.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dir := t.TempDir()
	led, err := ledger.Open(ledger.Config{Path: filepath.Join(dir, ledger.File), Fleet: true, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	m := New(nil, func() map[string]int { return nil })
	var node *fleet.Node
	watched := m.WatchFleet(st, func() fleet.Status { return node.Status() })
	if err := fleet.SetCeiling(context.Background(), st, "", time.Now().UTC().Format(time.DateOnly), 4000); err != nil {
		t.Fatal(err)
	}
	node, err = fleet.Open(fleet.Config{Store: watched, Node: "node-a", StateDir: dir, Ledger: led, MinBlock: 100, MaxBlock: 1000, Tick: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	for node.Status().Held == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	out := scrape(t, m)
	for _, want := range []string{`roost_fleet_tokens{state="ceiling"} 4000`, `roost_fleet_tokens{state="used"} 0`, "roost_fleet_unreachable 0",
		`roost_fleet_block_grants_total{result="ambiguous"} 0`, "roost_fleet_etcd_seconds_count"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	if strings.Contains(out, `roost_fleet_block_grants_total{result="granted"} 0`) {
		t.Errorf("a block was taken, none counted:\n%s", out)
	}
}

// Placements are counted by result, every result there from the first scrape; forwarded
// calls by the code they ended with.
func TestPlacementAndForwardedMetrics(t *testing.T) {
	m := New(nil, func() map[string]int { return nil })
	placed := m.WatchPlacements()
	forwarded := m.WatchForwarded()
	out := scrape(t, m)
	for _, r := range PlacementResults {
		if want := `roost_fleet_placements_total{result="` + r + `"} 0`; !strings.Contains(out, want) {
			t.Errorf("no %s before any placement in:\n%s", want, out)
		}
	}
	placed("forwarded")
	placed("forwarded")
	placed("unplaced")
	forwarded("OK")
	forwarded("Unavailable")
	out = scrape(t, m)
	for _, want := range []string{`roost_fleet_placements_total{result="forwarded"} 2`, `roost_fleet_placements_total{result="unplaced"} 1`,
		`roost_fleet_placements_total{result="here"} 0`, `roost_fleet_forwarded_calls_total{code="OK"} 1`, `roost_fleet_forwarded_calls_total{code="Unavailable"} 1`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
}
