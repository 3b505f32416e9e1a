package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
)

// scrape reads the metrics through their real handler, as Prometheus would.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func hasLine(out, line string) bool {
	for _, l := range strings.Split(out, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

// Before anything happens, every limit and every class×status end is a series at zero.
func TestKnownSeriesStartAtZero(t *testing.T) {
	out := scrape(t, New(nil, func() map[string]int { return nil }))
	for _, l := range store.Limits {
		if line := `roost_limit_hits_total{limit="` + l + `"} 0`; !hasLine(out, line) {
			t.Errorf("no %s in:\n%s", line, out)
		}
	}
	for _, c := range manifest.Classes {
		for _, s := range store.EndStatuses {
			if line := `roost_sessions_ended_total{class="` + c.String() + `",status="` + s + `"} 0`; !hasLine(out, line) {
				t.Errorf("no %s", line)
			}
		}
	}
	if n := strings.Count(out, "\nroost_sessions_ended_total{"); n != len(manifest.Classes)*len(store.EndStatuses) {
		t.Errorf("%d roost_sessions_ended_total series, want %d", n, len(manifest.Classes)*len(store.EndStatuses))
	}
}

func TestSessionEndedCountsByClassAndStatus(t *testing.T) {
	m := New(nil, func() map[string]int { return nil })
	m.SessionEnded("sealed", store.EndOOM)
	m.SessionEnded("sealed", store.EndOOM)
	m.SessionEnded("advisory", string(store.StatusDeadlineReached))
	m.LimitHit(store.LimitDiskFull)
	out := scrape(t, m)
	for _, line := range []string{
		`roost_sessions_ended_total{class="sealed",status="oom"} 2`,
		`roost_sessions_ended_total{class="advisory",status="deadline_reached"} 1`,
		`roost_sessions_ended_total{class="sealed",status="deadline_reached"} 0`,
		`roost_sessions_ended_total{class="advisory",status="oom"} 0`,
		`roost_limit_hits_total{limit="disk_full"} 1`,
		`roost_limit_hits_total{limit="log_bytes"} 0`,
	} {
		if !hasLine(out, line) {
			t.Errorf("no %s", line)
		}
	}
}
