package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// psRows parses ps's table: the header's columns, and each row's cells by those columns'
// offsets (a cell may hold spaces: the DETAIL column does). It fails on trailing spaces.
func psRows(t *testing.T, out string) []map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for _, l := range lines {
		if strings.HasSuffix(l, " ") {
			t.Fatalf("trailing spaces in %q:\n%s", l, out)
		}
	}
	header := lines[0]
	cols := regexp.MustCompile(`\S+`).FindAllStringIndex(header, -1)
	var rows []map[string]string
	for _, l := range lines[1:] {
		r := []rune(l)
		row := map[string]string{}
		for i, c := range cols {
			end := len(r)
			if i+1 < len(cols) {
				end = min(cols[i+1][0], len(r))
			}
			if c[0] < len(r) {
				row[header[c[0]:c[1]]] = strings.TrimSpace(string(r[c[0]:end]))
			}
		}
		rows = append(rows, row)
	}
	return rows
}

func TestNamedSessions(t *testing.T) {
	d := newDaemon(t)
	ticker := capsule(t, "ticker", "i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.1; done", "")
	id := strings.TrimSpace(d.ok("run", "--name", "web", "-d", ticker))

	// The name is taken while its session is held, whatever its state; the refusal names
	// the holder. A refused stage exits 125, as every refused stage does.
	res := d.ctl("run", "--name", "web", ticker)
	if res.code != 125 || !strings.Contains(res.stderr, `name "web" is taken by session `+id) {
		t.Fatalf("run --name web again: %+v", res)
	}
	res = d.ctl("stage", "--name", "Web_1", ticker)
	if res.code != 125 || !strings.Contains(res.stderr, `name "Web_1"`) || !strings.Contains(res.stderr, "[a-z0-9][a-z0-9_.-]*, at most 64 bytes") {
		t.Fatalf("stage --name Web_1: %+v", res)
	}
	if res = d.ctl("stage", "--name", strings.Repeat("x", 65), ticker); res.code != 125 || !strings.Contains(res.stderr, "65 bytes") {
		t.Fatalf("stage with a 65-byte name: %+v", res)
	}
	if n := len(d.ps()); n != 1 {
		t.Fatalf("refused names recorded %d sessions", n)
	}

	var s struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	}
	json.Unmarshal([]byte(d.ok("inspect", "--json", "web")), &s)
	if s.ID != id || s.Name != "web" {
		t.Fatalf("inspect web: %+v", s)
	}
	waitFor(t, "web's first line", func() bool { return strings.Contains(d.ok("logs", "web"), "\n") })
	if logs := d.ok("logs", "web"); !strings.HasPrefix(logs, "tick 1\n") {
		t.Fatalf("logs web: %q", logs)
	}
	if out := d.ok("stop", "--grace", "5s", "web"); !strings.Contains(out, "terminated (143)") {
		t.Fatalf("stop web: %q", out)
	}
	if res := d.ctl("wait", "web"); res.code != 143 {
		t.Fatalf("wait web: %+v", res)
	}

	// ps shows the name and the short id, which every command takes.
	rows := psRows(t, d.ok("ps", "--all"))
	if len(rows) != 1 || rows[0]["NAME"] != "web" || rows[0]["ID"] != id[len(id)-12:] {
		t.Fatalf("ps --all: %+v", rows)
	}
	json.Unmarshal([]byte(d.ok("inspect", "--json", rows[0]["ID"])), &s)
	if s.ID != id {
		t.Fatalf("inspect %s: %+v", rows[0]["ID"], s)
	}
	if out := d.ok("logs", rows[0]["ID"][:6]); !strings.HasPrefix(out, "tick 1\n") {
		t.Fatalf("logs by 6 digits of the short id: %q", out)
	}

	// Removed, the name is free again.
	d.ok("rm", "web")
	if res := d.ctl("inspect", "web"); res.code != 1 || !strings.Contains(res.stderr, `no session "web"`) {
		t.Fatalf("inspect web after rm: %+v", res)
	}
	again := strings.TrimSpace(d.ok("stage", "--name", "web", ticker))
	if again == id || d.inspect("web").ID != again {
		t.Fatalf("web after rm: %s (was %s)", again, id)
	}
}

func TestPsOrderFiltersFormat(t *testing.T) {
	d := newDaemon(t)
	alpha := capsule(t, "alpha", "true", "")
	beta := capsule(t, "beta", "true", "")
	one := strings.TrimSpace(d.ok("run", "--name", "one", "-d", alpha))
	if res := d.ctl("wait", one); res.code != 0 {
		t.Fatalf("wait one: %+v", res)
	}
	two := strings.TrimSpace(d.ok("stage", "--name", "two", alpha))
	three := strings.TrimSpace(d.ok("stage", "--name", "three", beta))
	four := strings.TrimSpace(d.ok("stage", beta))
	newestFirst := []string{four, three, two, one}

	// The table: newest first, short ids, names, aligned with no trailing spaces.
	out := d.ok("ps", "--all")
	if header := strings.Fields(strings.SplitN(out, "\n", 2)[0]); !slices.Equal(header, []string{"ID", "NAME", "CAPSULE", "STATE", "CLASS", "CREATED", "DETAIL"}) {
		t.Fatalf("ps --all header:\n%s", out)
	}
	rows := psRows(t, out)
	var got []string
	for _, r := range rows {
		got = append(got, r["ID"])
	}
	var want []string
	for _, id := range newestFirst {
		want = append(want, id[len(id)-12:])
	}
	if !slices.Equal(got, want) || rows[0]["NAME"] != "-" || rows[1]["NAME"] != "three" || rows[3]["STATE"] != "ok (0)" {
		t.Fatalf("ps --all:\n%s\nrows %+v, want ids %v", out, rows, want)
	}
	// Staged sessions made close together share the start of their ids, not their ends.
	if four[:8] != three[:8] {
		t.Logf("(ids made a moment apart happened to differ early: %s %s)", four, three)
	}
	if !strings.Contains(d.ok("ps", "--all", "--no-trunc"), one+"  one") {
		t.Fatalf("ps --no-trunc:\n%s", d.ok("ps", "--all", "--no-trunc"))
	}

	// --format: a template over each JSON object, newest first; --format json is --json.
	if out := d.ok("ps", "--all", "--format", "{{.id}}"); out != strings.Join(newestFirst, "\n")+"\n" {
		t.Fatalf("ps --format {{.id}}:\n%s", out)
	}
	if out := d.ok("ps", "--all", "--format", "{{.name}} {{.capsule.name}}@{{.capsule.version}} {{short .id}} {{.exit_code}}"); !strings.HasPrefix(out, " beta@0.1.0 "+four[len(four)-12:]+" \nthree beta@0.1.0 ") || !strings.HasSuffix(out, "one alpha@0.1.0 "+one[len(one)-12:]+" 0\n") {
		t.Fatalf("ps --format with nested keys:\n%s", out)
	}
	if a, b := d.ok("ps", "--all", "--format", "json"), d.ok("ps", "--all", "--json"); a != b {
		t.Fatalf("--format json and --json differ:\n%s\n%s", a, b)
	}
	if res := d.ctl("ps", "--format", "{{.id"); res.code != 2 {
		t.Fatalf("a broken template: %+v", res)
	}

	// --filter, repeatable and comma-separated: one key widens, keys narrow.
	ids := func(args ...string) []string {
		t.Helper()
		return strings.Fields(d.ok(append([]string{"ps", "--format", "{{.id}}"}, args...)...))
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--filter", "state=exited"}, []string{one}}, // implies --all
		{[]string{"--filter", "state=staged"}, []string{four, three, two}},
		{[]string{"--filter", "state=staged", "--filter", "state=exited"}, newestFirst},
		{[]string{"--all", "--filter", "capsule=alpha"}, []string{two, one}},
		{[]string{"--all", "--filter", "capsule=beta@0.1.0,name=t*"}, []string{three}},
		{[]string{"--all", "--filter", "capsule=beta@9.9.9"}, nil},
		{[]string{"--all", "--filter", "name=t*"}, []string{three, two}},
		{[]string{"--all", "--filter", "name=*"}, []string{three, two, one}},
		{[]string{"--all", "--filter", "parent=" + two}, nil},
		{[]string{"--filter", "capsule=alpha"}, []string{two}}, // no --all: not the ended one
	} {
		if got := ids(c.args...); !slices.Equal(got, c.want) {
			t.Errorf("ps %v: %v, want %v", c.args, got, c.want)
		}
	}
	res := d.ctl("ps", "--filter", "state=exited,colour=red")
	if res.code != 2 || !strings.Contains(res.stderr, `unknown key "colour"`) || !strings.Contains(res.stderr, "capsule, label, name, parent, state") {
		t.Fatalf("unknown filter key: %+v", res)
	}
	if res := d.ctl("ps", "--filter", "state=sleeping"); res.code != 2 || !strings.Contains(res.stderr, "staged, launching, running") {
		t.Fatalf("unknown state: %+v", res)
	}
	if res := d.ctl("ps", "--filter", "parent=nobody"); res.code != 1 || !strings.Contains(res.stderr, `no session "nobody"`) {
		t.Fatalf("unknown parent: %+v", res)
	}
	// -q keeps printing full ids.
	if q := strings.Fields(d.ok("ps", "-q", "--all")); len(q) != 4 || !slices.Contains(q, one) {
		t.Fatalf("ps -q --all: %v", q)
	}
}

// eventLines parses the events table, checking its columns line up and end without spaces.
func eventLines(t *testing.T, out string) [][]string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if !strings.HasPrefix(lines[0], "SEQ") {
		t.Fatalf("events table without its header:\n%s", out)
	}
	typeAt := strings.Index(lines[0], "TYPE")
	sessionAt := strings.Index(lines[0], "SESSION")
	var rows [][]string
	for _, l := range lines {
		if strings.HasSuffix(l, " ") {
			t.Fatalf("trailing spaces in %q", l)
		}
		if l[typeAt-1] != ' ' || l[typeAt] == ' ' || l[sessionAt-1] != ' ' || l[sessionAt] == ' ' {
			t.Fatalf("columns not aligned:\n%s", out)
		}
		rows = append(rows, strings.Fields(l))
	}
	return rows[1:]
}

type timedEvent struct {
	Type      string    `json:"type"`
	SessionID string    `json:"session_id"`
	Time      time.Time `json:"time"`
}

func jsonEvents(t *testing.T, out string) []timedEvent {
	t.Helper()
	var evs []timedEvent
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var ev timedEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func TestEventsFilterAndUntil(t *testing.T) {
	d := newDaemon(t)
	quick := capsule(t, "quick", "true", "")
	a := strings.TrimSpace(d.ok("run", "--name", "a", "-d", quick))
	d.ctl("wait", "a")
	// The scenario's gap: b's events come after a's end on the clock too, for --until.
	time.Sleep(50 * time.Millisecond)
	b := strings.TrimSpace(d.ok("run", "--name", "b", "-d", quick))
	d.ctl("wait", "b")

	all := jsonEvents(t, d.ok("events", "--json"))
	evs := jsonEvents(t, d.ok("events", "--json", "--filter", "session=a"))
	if len(evs) != 4 || evs[0].Type != "session.staged" || evs[3].Type != "session.exited" {
		t.Fatalf("events of a: %+v", evs)
	}
	for _, ev := range evs {
		if ev.SessionID != a {
			t.Fatalf("events --filter session=a: %+v", evs)
		}
	}
	evs = jsonEvents(t, d.ok("events", "--json", "--filter", "type=session.exited"))
	if len(evs) != 2 || evs[0].SessionID != a || evs[1].SessionID != b {
		t.Fatalf("events --filter type=session.exited: %+v", evs)
	}
	// By short id, with a pattern; two keys narrow.
	evs = jsonEvents(t, d.ok("events", "--json", "--filter", "type=session.*ing,session="+b[len(b)-12:]))
	if len(evs) != 2 || evs[0].Type != "session.launching" || evs[1].Type != "session.running" || evs[0].SessionID != b {
		t.Fatalf("events --filter type=session.*ing,session=<b's short id>: %+v", evs)
	}
	if res := d.ctl("events", "--filter", "kind=x"); res.code != 2 || !strings.Contains(res.stderr, `unknown key "kind"`) || !strings.Contains(res.stderr, "session, type") {
		t.Fatalf("unknown key: %+v", res)
	}
	if res := d.ctl("events", "--filter", "session=nobody"); res.code != 1 || !strings.Contains(res.stderr, `no session "nobody"`) {
		t.Fatalf("unknown session: %+v", res)
	}

	// --until a's end: a's events, none of b's.
	var aEnd time.Time
	for _, ev := range all {
		if ev.SessionID == a && ev.Type == "session.exited" {
			aEnd = ev.Time
		}
	}
	evs = jsonEvents(t, d.ok("events", "--json", "--until", aEnd.Format(time.RFC3339Nano)))
	if len(evs) != 4 || evs[3].SessionID != a || evs[3].Type != "session.exited" {
		t.Fatalf("events --until %s: %+v", aEnd.Format(time.RFC3339Nano), evs)
	}
	// A duration counts back from now: an hour ago, nothing had happened.
	if out := d.ok("events", "--until", "1h"); strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "SEQ") {
		t.Fatalf("events --until 1h:\n%s", out)
	}
	if res := d.ctl("events", "--until", "yesterday"); res.code != 2 {
		t.Fatalf("--until yesterday: %+v", res)
	}

	// The table: a header, aligned columns, short ids.
	rows := eventLines(t, d.ok("events"))
	if len(rows) != len(all) || rows[0][2] != "session.staged" || rows[0][3] != a[len(a)-12:] {
		t.Fatalf("events table: %v", rows)
	}

	// --follow --until: prints the past and what comes, aligned as it comes, and stops when
	// the clock reaches the time.
	cmd := exec.Command(filepath.Join(binDir, "roostctl"), "events", "--follow", "--until=-3s", "--filter", "type=session.exited")
	cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	var out, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// c is to come while it follows: once it has printed the past (a header, a's and b's
	// ends).
	waitFor(t, "the follower to print the past", func() bool { return strings.Count(out.String(), "\n") >= 3 })
	c := strings.TrimSpace(d.ok("run", "-d", "--name", "c", quick))
	d.ctl("wait", c)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("events --follow --until: %v\n%s%s", err, out.String(), stderr.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("events --follow --until=-3s still running after 20s:\n%s", out.String())
	}
	if took := time.Since(start); took < 2*time.Second {
		t.Fatalf("events --follow --until=-3s ended after %s", took)
	}
	rows = eventLines(t, out.String())
	if len(rows) != 3 || rows[2][3] != c[len(c)-12:] {
		t.Fatalf("events --follow --until:\n%s", out.String())
	}
}
