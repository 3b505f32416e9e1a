package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// endedTotal sums roost_sessions_ended_total's series in a scrape.
func endedTotal(t *testing.T, scrape string) float64 {
	t.Helper()
	sum := 0.0
	for _, l := range strings.Split(scrape, "\n") {
		if !strings.HasPrefix(l, "roost_sessions_ended_total{") {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		sum += v
	}
	return sum
}

// How sessions end reaches /metrics: an OOM kill and a deadline, each counted once by its
// class and status, from series present at zero before either; and a restarted daemon
// counts the end it recovers, not again the ends recorded before it.
func TestSessionEndMetrics(t *testing.T) {
	d := newDaemon(t)
	before := scrape(t, d)
	for _, line := range []string{`roost_sessions_ended_total{class="sealed",status="oom"} 0`,
		`roost_sessions_ended_total{class="advisory",status="deadline_reached"} 0`,
		`roost_limit_hits_total{limit="workdir_bytes"} 0`} {
		if grepLines(before, line) != line {
			t.Fatalf("before any session, no %s in:\n%s", line, before)
		}
	}

	res := d.ctl("run", capsule(t, "membomb", "tail /dev/zero", "capabilities:\n  containment: sealed\n  resources:\n    cgroup_memory_bytes: 67108864\n  shell:\n    allow: [tail]\n"))
	list := d.ps()
	bomb := d.inspect(list[len(list)-1].ID)
	if res.code != 137 || bomb.ExitStatus != "crashed" || bomb.Detail != "oom" || bomb.Containment.Achieved != "sealed" {
		t.Fatalf("memory bomb: exit %d, %s %q, class %q", res.code, bomb.ExitStatus, bomb.Detail, bomb.Containment.Achieved)
	}
	res = d.ctl("run", "--deadline", "1s", capsule(t, "sleeper", "sleep 60", ""))
	list = d.ps()
	slept := d.inspect(list[len(list)-1].ID)
	if res.code != 124 || slept.ExitStatus != "deadline_reached" {
		t.Fatalf("deadline: exit %d, %s %q", res.code, slept.ExitStatus, slept.Detail)
	}

	after := scrape(t, d)
	for _, line := range []string{`roost_sessions_ended_total{class="sealed",status="oom"} 1`,
		`roost_sessions_ended_total{class="` + slept.Containment.Achieved + `",status="deadline_reached"} 1`} {
		if got := grepLines(after, line); got != line {
			t.Errorf("after the ends: %q, want %s", got, line)
		}
	}
	if n := endedTotal(t, after); n != 2 {
		t.Errorf("roost_sessions_ended_total sums to %v after two ends, want 2", n)
	}

	// A session that ends while the daemon is down is counted by the daemon that recovers
	// it; the two ends recorded before are not replayed.
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "short", "sleep 1", "")))
	short := d.inspect(id)
	d.kill9()
	for deadline := time.Now().Add(30 * time.Second); !programEnded(short); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("session %s did not end within 30s of its daemon's death", id)
		}
	}
	d.start()
	if short = d.inspect(id); short.State != "exited" || short.ExitStatus != "ok" {
		t.Fatalf("recovered session %s: %s %s %q", id, short.State, short.ExitStatus, short.Detail)
	}
	restarted := scrape(t, d)
	line := `roost_sessions_ended_total{class="` + short.Containment.Achieved + `",status="ok"} 1`
	if got := grepLines(restarted, line); got != line {
		t.Errorf("after the restart: %q, want %s", got, line)
	}
	if n := endedTotal(t, restarted); n != 1 {
		t.Errorf("roost_sessions_ended_total sums to %v after a restart that recovered one end, want 1", n)
	}
}
