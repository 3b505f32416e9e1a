package session

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
)

// refusalCounter is the test observer with ExecRefusalObserver's count.
type refusalCounter struct {
	*recorder
	mu sync.Mutex
	n  map[string]int64
}

func (c *refusalCounter) ExecRefused(class string, n int64) {
	c.mu.Lock()
	c.n[class] += n
	c.mu.Unlock()
}

// What roost-init recorded as refused becomes, once each, trace records, events (bounded)
// and counts; a sealed root's missing program counts only where the host has it.
func TestExecRefusalsJournaled(t *testing.T) {
	obs := &refusalCounter{recorder: &recorder{}, n: map[string]int64{}}
	cfg := testConfig(stateDir(t), obs.recorder)
	cfg.Observer = obs
	m, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rec := run(t, m, StageOptions{Capsule: capsule(t, "true", "")})
	rec = waitEnd(t, m, rec.ID)

	var lines []byte
	add := func(r records.ExecRefusal) {
		data, _ := json.Marshal(r)
		lines = append(append(lines, data...), '\n')
	}
	const distinct = maxRefusalEvents + 50
	for i := range distinct {
		add(records.ExecRefusal{Path: fmt.Sprintf("/usr/bin/tool%d", i), Program: "/usr/bin/make", Argv0: "tool", Reason: records.RefusedNotAllowed, Count: 2})
	}
	add(records.ExecRefusal{Path: "/usr/bin/no-such-program-anywhere", Program: "/usr/bin/dash", Reason: records.RefusedAbsent, Absent: true, Count: 1})
	add(records.ExecRefusal{Path: "/usr/bin/sh", Program: "/usr/bin/dash", Reason: records.RefusedAbsent, Absent: true, Count: 1})
	add(records.ExecRefusal{More: 5})
	if err := os.WriteFile(filepath.Join(rec.RecordsDir, records.RefusalsFile), lines, 0o600); err != nil {
		t.Fatal(err)
	}
	m.journal.readRecords(rec)
	m.journal.readRecords(rec)

	const want = 2*distinct + 1 + 5
	var traced int64
	entries := 0
	for _, r := range readTrace(t, rec.RecordsDir) {
		if r["event_type"] == "exec_refused" {
			entries++
			traced += int64(r["count"].(float64))
			if r["path"] == "/usr/bin/no-such-program-anywhere" {
				t.Errorf("a program the host lacks too is traced as refused: %v", r)
			}
		}
	}
	if entries != distinct+2 || traced != want {
		t.Errorf("the trace holds %d refused-exec records counting %d, want %d counting %d", entries, traced, distinct+2, want)
	}
	events := 0
	if err := m.Events(context.Background(), 0, false, func(ev store.Event) error {
		if ev.Type == store.EventExecRefused && ev.SessionID == rec.ID {
			events++
			if events == 1 && ev.Detail != `/usr/bin/tool0 by /usr/bin/make as "tool": not on the allowlist, 2 times` {
				t.Errorf("event detail %q", ev.Detail)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if events != maxRefusalEvents+1 {
		t.Errorf("%d events, want %d and the one that says there are more", events, maxRefusalEvents)
	}
	obs.mu.Lock()
	counted := obs.n[rec.Achieved]
	obs.mu.Unlock()
	if counted != want {
		t.Errorf("the metric counted %d, want %d", counted, want)
	}
	st := ExecRefusals(rec)
	if st == nil || st.Count != want || len(st.Recent) != 5 || st.Recent[4] != "/usr/bin/sh" {
		t.Errorf("inspect's view: %+v", st)
	}
}
