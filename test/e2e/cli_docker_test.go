package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// seqEvent is an events --json line with its sequence number.
type seqEvent struct {
	Seq       string    `json:"seq"`
	Type      string    `json:"type"`
	SessionID string    `json:"session_id"`
	Time      time.Time `json:"time"`
}

func seqEvents(t *testing.T, out string) []seqEvent {
	t.Helper()
	var evs []seqEvent
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var ev seqEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// TestEventsSinceTimes: events --since takes a time, Unix seconds with a fraction or a
// duration, as docker events does; a plain integer stays a sequence number, as --after-seq.
func TestEventsSinceTimes(t *testing.T) {
	d := newDaemon(t)
	quick := capsule(t, "quick", "true", "")
	a := strings.TrimSpace(d.ok("run", "--name", "a", "-d", quick))
	d.ok("wait", a)
	// b's events come after a's on the clock too.
	time.Sleep(50 * time.Millisecond)
	b := strings.TrimSpace(d.ok("run", "--name", "b", "-d", quick))
	d.ok("wait", b)
	all := seqEvents(t, d.ok("events", "--json"))
	if len(all) != 8 {
		t.Fatalf("events: %+v", all)
	}

	// A duration counts back from now: the last ten minutes hold every event, the last
	// millisecond none.
	if evs := seqEvents(t, d.ok("events", "--json", "--since", "10m")); len(evs) != len(all) {
		t.Fatalf("events --since 10m: %d events, want %d", len(evs), len(all))
	}
	if out := d.ok("events", "--since", "1ms"); strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "SEQ") {
		t.Fatalf("events --since 1ms:\n%s", out)
	}
	// A time: from b's first event, b's events alone; as Unix seconds with a fraction too.
	bStart := all[4].Time
	for _, since := range []string{bStart.Format(time.RFC3339Nano), fmt.Sprintf("%d.%09d", bStart.Unix(), bStart.Nanosecond())} {
		evs := seqEvents(t, d.ok("events", "--json", "--since", since))
		if len(evs) != 4 || evs[0].SessionID != b || evs[0].Type != "session.staged" {
			t.Fatalf("events --since %s: %+v", since, evs)
		}
	}
	// --since and --until make a window: a's events alone.
	evs := seqEvents(t, d.ok("events", "--json", "--since", all[0].Time.Format(time.RFC3339Nano), "--until", all[3].Time.Format(time.RFC3339Nano)))
	if len(evs) != 4 || evs[0].SessionID != a || evs[3].Type != "session.exited" {
		t.Fatalf("events --since a's start --until a's end: %+v", evs)
	}

	// A sequence number: --after-seq N, and --since N as scripts have written it.
	n := all[5].Seq
	for _, flag := range []string{"--after-seq", "--since"} {
		evs := seqEvents(t, d.ok("events", "--json", flag, n))
		if len(evs) != 2 || evs[0].Seq != all[6].Seq {
			t.Fatalf("events %s %s: %+v", flag, n, evs)
		}
	}
	// A follower resumes after a sequence number: what comes next, once.
	seq, _ := strconv.Atoi(all[7].Seq)
	c := strings.TrimSpace(d.ok("run", "--name", "c", "-d", quick))
	d.ok("wait", c)
	if evs := seqEvents(t, d.ok("events", "--json", "--after-seq", strconv.Itoa(seq))); len(evs) != 4 || evs[0].SessionID != c {
		t.Fatalf("events --after-seq %d: %+v", seq, evs)
	}

	for _, bad := range [][]string{{"--since", "yesterday"}, {"--since", "-10m"}, {"--since", "1700000000."}} {
		res := d.ctl(append([]string{"events"}, bad...)...)
		if res.code != 2 || !strings.Contains(res.stderr, "--since") || !strings.Contains(res.stderr, "Unix seconds with a fraction") || res.stdout != "" {
			t.Errorf("events %s: %+v", strings.Join(bad, " "), res)
		}
	}
	if res := d.ctl("events", "--since", "3", "--after-seq", "2"); res.code != 2 || !strings.Contains(res.stderr, "give one") {
		t.Errorf("events --since 3 --after-seq 2: %+v", res)
	}
}

// TestExplainSession: explain SESSION shows what the session was staged with, the
// explanation explain CAPSULE gives; an argument that is neither says so of both.
func TestExplainSession(t *testing.T) {
	d := newDaemon(t)
	dir := capsule(t, "explained", "sleep 60", "capabilities:\n  resources:\n    cgroup_pids_max: 17\n")
	id := strings.TrimSpace(d.ok("stage", "--name", "explained", dir))
	t.Cleanup(func() { d.ctl("rm", "-f", id) })

	out := d.ok("explain", "explained")
	for _, want := range []string{"session      " + id + " (explained)", "state        staged\n", "capsule      explained@0.1.0", "GRANT", "resources.cgroup_pids_max", "17"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain explained: no %q in\n%s", want, out)
		}
	}
	var fromSession, fromCapsule struct {
		Capsule struct {
			Name   string `json:"name"`
			Sha256 string `json:"sha256"`
		} `json:"capsule"`
		Grants []struct {
			Key   string `json:"key"`
			Value string `json:"value"`
		} `json:"grants"`
	}
	for ref, into := range map[string]any{id[:12]: &fromSession, dir: &fromCapsule} {
		if err := json.Unmarshal([]byte(d.ok("explain", "--json", ref)), into); err != nil {
			t.Fatalf("explain --json %s: %v", ref, err)
		}
	}
	if fromSession.Capsule.Sha256 == "" || fromSession.Capsule.Sha256 != fromCapsule.Capsule.Sha256 || len(fromSession.Grants) == 0 || fmt.Sprint(fromSession.Grants) != fmt.Sprint(fromCapsule.Grants) {
		t.Errorf("explain --json of the session and of its capsule differ:\n%+v\n%+v", fromSession, fromCapsule)
	}

	res := d.ctl("explain", "nosuch")
	if res.code != 1 || !strings.Contains(res.stderr, "no capsule there") || !strings.Contains(res.stderr, `no session "nosuch"`) {
		t.Errorf("explain nosuch: %+v", res)
	}
	if res := d.ctl("explain", "--oci", "explained"); res.code != 2 || !strings.Contains(res.stderr, "--oci") {
		t.Errorf("explain --oci explained: %+v", res)
	}
}

// TestRmAndSetLimitJSON: rm --json prints each removed session's record, spend set-limit
// --json the new ceiling and the one it replaced.
func TestRmAndSetLimitJSON(t *testing.T) {
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "--name", "gone", "-d", capsule(t, "quick", "true", "")))
	d.ok("wait", id)
	var rec struct {
		ID    string `json:"id"`
		Name  string `json:"name"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(d.ok("rm", "--json", "gone")), &rec); err != nil || rec.ID != id || rec.Name != "gone" || rec.State != "exited" {
		t.Fatalf("rm --json gone: %+v, %v", rec, err)
	}
	if res := d.ctl("inspect", id); res.code != 1 {
		t.Fatalf("inspect after rm --json: %+v", res)
	}

	var limit struct{ Previous, Tokens string }
	d.ok("spend", "set-limit", "1000")
	if err := json.Unmarshal([]byte(d.ok("spend", "set-limit", "--json", "2000")), &limit); err != nil || limit.Previous != "1000" || limit.Tokens != "2000" {
		t.Fatalf("spend set-limit --json 2000: %+v, %v", limit, err)
	}
}
