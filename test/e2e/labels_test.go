package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Labels given at stage are in the record (inspect, ps --format) for good, roostd selects
// sessions by them (ps --filter label=), events selects the events of the sessions they
// match, and labels that break a rule are refused naming the label, with nothing recorded.
func TestLabels(t *testing.T) {
	d := newDaemon(t)
	dir := capsule(t, "labelled", "true", "")
	a := strings.TrimSpace(d.ok("stage", "-l", "team=a", "--label", "example.com/run=r-1", dir))
	b := strings.TrimSpace(d.ok("stage", "-l", "team=b", "-l", "tier", dir))
	plain := strings.TrimSpace(d.ok("stage", dir))
	for _, id := range []string{a, b, plain} {
		d.ok("launch", id)
		d.ok("wait", id)
	}

	psIDs := func(args ...string) []string {
		t.Helper()
		ids := strings.Fields(d.ok(append([]string{"ps", "--all", "-q"}, args...)...))
		slices.Sort(ids)
		return ids
	}
	sorted := func(ids ...string) []string { slices.Sort(ids); return ids }
	for _, c := range []struct {
		filters []string
		want    []string
	}{
		{[]string{"label=team=a"}, []string{a}},
		{[]string{"label=team"}, sorted(a, b)},
		{[]string{"label=tier="}, []string{b}},
		{[]string{"label=team,label=tier"}, []string{b}},
		{[]string{"label=team=a", "label=tier"}, nil},
		{[]string{"label=team=c"}, nil},
		{[]string{"label=team", "state=exited", "capsule=labelled"}, sorted(a, b)},
	} {
		var args []string
		for _, f := range c.filters {
			args = append(args, "--filter", f)
		}
		if got := psIDs(args...); !slices.Equal(got, c.want) {
			t.Errorf("ps %s: %v, want %v", strings.Join(args, " "), got, c.want)
		}
	}
	if out := d.ok("ps", "--all", "--filter", "label=team", "--format", `{{index .labels "team"}} {{.labels}}`); out != "b map[team:b tier:]\na map[example.com/run:r-1 team:a]\n" {
		t.Errorf("ps --format over labels:\n%s", out)
	}
	labelsOf := func(id string) map[string]string {
		t.Helper()
		var rec struct {
			Labels map[string]string `json:"labels"`
		}
		if err := json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &rec); err != nil {
			t.Fatal(err)
		}
		return rec.Labels
	}
	if l := labelsOf(a); len(l) != 2 || l["team"] != "a" || l["example.com/run"] != "r-1" {
		t.Errorf("inspect --json: labels %v", l)
	}
	if l := labelsOf(plain); l == nil || len(l) != 0 {
		t.Errorf("inspect --json of a session without labels: %v (want {})", l)
	}
	if out := d.ok("inspect", a); !strings.Contains(out, "labels:       example.com/run=r-1\n              team=a\n") {
		t.Errorf("inspect:\n%s", out)
	}

	many := []string{"stage"}
	for i := range 65 {
		many = append(many, "-l", fmt.Sprintf("k%d=v", i))
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"stage", "-l", "a b=c"}, []string{`label "a b": its name has ' ' at byte 1`, "a label key is [PREFIX/]NAME"}},
		{[]string{"run", "-l", "team=a b"}, []string{`label "team": its value has ' ' at byte 1`, "a label value is empty, or at most 256"}},
		{[]string{"stage", "-l", "roost.dev/x=1"}, []string{`label "roost.dev/x": keys under roost.dev/ are reserved for roost`}},
		{many, []string{"65 labels: a session has at most 64"}},
	} {
		res := d.ctl(append(c.args, dir)...)
		for _, want := range c.want {
			if res.code != 125 || !strings.Contains(res.stderr, want) {
				t.Errorf("%.40s: exit %d, stderr %q; want 125 and %q", strings.Join(c.args, " "), res.code, res.stderr, want)
			}
		}
	}
	if n := len(d.ps()); n != 3 {
		t.Errorf("refused labels recorded sessions: %d listed, want 3", n)
	}
	for _, args := range [][]string{{"ps", "--filter", "label=a b"}, {"events", "--filter", "label=a b"}} {
		if res := d.ctl(args...); res.code != 2 || !strings.Contains(res.stderr, `label selector "a b": label "a b": its name has ' ' at byte 1`) {
			t.Errorf("%s: %+v, want a usage error naming the selector", strings.Join(args, " "), res)
		}
	}

	// events: every event of a and b, none of the unlabelled session's.
	eventsOf := func(out string) map[string][]string {
		t.Helper()
		got := map[string][]string{}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			var ev event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("event line %q: %v", sc.Text(), err)
			}
			got[ev.SessionID] = append(got[ev.SessionID], ev.Type)
		}
		return got
	}
	lived := []string{"session.staged", "session.launching", "session.running", "session.exited"}
	got := eventsOf(d.ok("events", "--json", "--filter", "label=team"))
	if len(got) != 2 || !slices.Equal(got[a], lived) || !slices.Equal(got[b], lived) {
		t.Errorf("events --filter label=team: %v, want %v for %s and %s alone", got, lived, a, b)
	}
	if got := eventsOf(d.ok("events", "--json", "--filter", "label=team=b,type=session.exited")); len(got) != 1 || !slices.Equal(got[b], []string{"session.exited"}) {
		t.Errorf("events --filter label=team=b,type=session.exited: %v", got)
	}

	// A follower meets sessions staged after it began: it asks roostd for their labels.
	follow := exec.Command(filepath.Join(binDir, "roostctl"), "events", "--json", "--follow", "--until=-6s", "--filter", "label=team=c")
	follow.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	var followOut, followErr bytes.Buffer
	follow.Stdout, follow.Stderr = &followOut, &followErr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	late := strings.TrimSpace(d.ok("run", "-d", "-l", "team=c", dir))
	other := strings.TrimSpace(d.ok("run", "-d", "-l", "team=d", dir))
	d.ok("wait", late)
	d.ok("wait", other)
	if err := follow.Wait(); err != nil {
		t.Fatalf("events --follow: %v\n%s", err, followErr.String())
	}
	if got := eventsOf(followOut.String()); len(got) != 1 || !slices.Equal(got[late], lived) {
		t.Errorf("events --follow --filter label=team=c: %v, want %v for %s alone", got, lived, late)
	}

	// The labels are the record's: a restarted roostd has them, and selects by them.
	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("roostd after SIGTERM: %v\n%s", err, d.log)
	}
	d.start()
	if l := labelsOf(a); len(l) != 2 || l["team"] != "a" || l["example.com/run"] != "r-1" {
		t.Errorf("inspect --json after a restart: labels %v", l)
	}
	if got := psIDs("--filter", "label=team=a"); !slices.Equal(got, []string{a}) {
		t.Errorf("ps --filter label=team=a after a restart: %v", got)
	}
}
