package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The programs below talk to roost the way a capsule would: curl against $ROOST_ENDPOINT
// with $ROOST_CREDENTIAL, from inside their sealed roots.
const apiShell = `api() { curl -sS -H "Authorization: Bearer $ROOST_CREDENTIAL" "$@"; }
field() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }
`

func sealedCaps(shell, spawn string, deadline int) string {
	caps := fmt.Sprintf("capabilities:\n  containment: sealed\n  shell:\n    allow: [%s]\n  limits:\n    deadline_seconds: %d\n", shell, deadline)
	if spawn != "" {
		caps += fmt.Sprintf("  spawn:\n    allow: [%s]\n", spawn)
	}
	return caps
}

func (d *daemon) push(dir string) {
	d.t.Helper()
	d.ok("push", dir)
}

func (d *daemon) byCapsule(name string) []session {
	var out []session
	for _, s := range d.ps() {
		if s.Capsule.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// Three levels of sealed sessions: the parent spawns a middle capsule and waits for it;
// the middle one, unable to see or stop its parent, spawns a worker and relays what the
// worker wrote; the parent reads it, and the child's completion, from its own /work.
func TestSealedDelegation(t *testing.T) {
	d := newDaemon(t)
	d.push(capsule(t, "worker", `cat "$ROOST_TASK_FILE" > /work/got.txt; echo "worker saw: $(cat "$ROOST_TASK_FILE")"`,
		sealedCaps("cat", "", 30)))
	d.push(capsule(t, "middle", apiShell+`
parent=$(cat "$ROOST_TASK_FILE")
echo "stop parent: $(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $ROOST_CREDENTIAL" "$ROOST_ENDPOINT/v1/children/$parent/stop")" > /work/probe.txt
echo "see parent: $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $ROOST_CREDENTIAL" "$ROOST_ENDPOINT/v1/children/$parent")" >> /work/probe.txt
out=$(api -d '{"capsule":"worker","version":"0.1.0","task":"from the middle","wait":true}' "$ROOST_ENDPOINT/v1/spawn")
dir=$(echo "$out" | field workdir)
cat "/work/$dir/got.txt" > /work/relayed.txt
`, sealedCaps("curl, cat, sed", "worker", 60)))

	parent := capsule(t, "parent", apiShell+`
out=$(api -d "{\"capsule\":\"middle\",\"version\":\"0.1.0\",\"task\":\"$ROOST_SESSION_ID\",\"wait\":true}" "$ROOST_ENDPOINT/v1/spawn")
echo "spawn: $out"
dir=$(echo "$out" | field workdir)
echo "relayed: $(cat "/work/$dir/relayed.txt")"
cat "/work/$dir/probe.txt"
cat "/work/$dir/completion.json"
a=$(curl -si "$ROOST_ENDPOINT/v1/self")
b=$(curl -si -H "Authorization: Bearer roost1.c2VzX2ZvcmdlZA.Zm9yZ2Vk" "$ROOST_ENDPOINT/v1/self")
[ -n "$a" ] && [ "$a" = "$b" ] && echo "identical refusals"
echo "$a" | sed -n 1p
`, sealedCaps("curl, cat, sed", "middle, worker", 120))
	res := d.ctl("run", parent)
	if res.code != 0 {
		t.Fatalf("parent: %+v\nroostd: %s", res, d.log)
	}
	for _, want := range []string{
		`"capsule":"middle@0.1.0"`, `"status":"ok"`,
		"relayed: from the middle",
		"stop parent: 404", "see parent: 404",
		`"status": "ok"`, "identical refusals", "HTTP/1.1 403 Forbidden",
	} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("the parent's output lacks %q:\n%s", want, res.stdout)
		}
	}
	p, m, w := d.byCapsule("parent"), d.byCapsule("middle"), d.byCapsule("worker")
	if len(p) != 1 || len(m) != 1 || len(w) != 1 {
		t.Fatalf("sessions: %d parents, %d middles, %d workers", len(p), len(m), len(w))
	}
	for _, s := range []session{p[0], m[0], w[0]} {
		if s.ExitStatus != "ok" || s.Containment.Achieved != "sealed" {
			t.Errorf("%s: %s, %s", s.Capsule.Name, s.ExitStatus, s.Containment.Achieved)
		}
	}
	// The worker works beneath the middle one's workdir, which is beneath the parent's.
	if !strings.HasPrefix(w[0].Workdir, m[0].Workdir+"/.roost/children/worker-") ||
		!strings.HasPrefix(m[0].Workdir, p[0].Workdir+"/.roost/children/middle-") {
		t.Errorf("workdirs: parent %s, middle %s, worker %s", p[0].Workdir, m[0].Workdir, w[0].Workdir)
	}
	if out := d.ok("logs", w[0].ID); out != "worker saw: from the middle\n" {
		t.Errorf("the worker's log: %q", out)
	}
	tree := d.ok("ps", "--all", "--tree", "--no-trunc")
	if !strings.Contains(tree, "└─ "+m[0].ID) || !strings.Contains(tree, "   └─ "+w[0].ID) {
		t.Errorf("ps --tree:\n%s", tree)
	}
	trace, _ := os.ReadFile(filepath.Join(p[0].RecordsDir, "trace.jsonl"))
	if !strings.Contains(string(trace), `"event_type":"delegation","session_id":"`+p[0].ID) || !strings.Contains(string(trace), m[0].ID) {
		t.Errorf("the parent's trace does not record the delegation:\n%s", trace)
	}
	if pins := d.sessionPins(); len(pins) != 0 {
		t.Errorf("%d network namespaces still pinned after every session ended", len(pins))
	}
	metrics := scrape(t, d)
	if !strings.Contains(metrics, `roost_spawn_admissions_total{result="granted"} 2`) || !strings.Contains(metrics, `roost_spawn_seconds_count{decision="granted"} 2`) {
		t.Errorf("spawn metrics:\n%s", grepLines(metrics, "roost_spawn"))
	}
}

// A child whose envelope is wider than its parent's is refused, naming the key and the
// entry, and nothing is launched.
func TestSpawnRefusedOutsideEnvelope(t *testing.T) {
	d := newDaemon(t)
	d.push(capsule(t, "wide", "echo should not run", sealedCaps("cat", "", 30)+"  network:\n    allow: [api.example.com]\n"))
	d.push(capsule(t, "stranger", "echo should not run", sealedCaps("cat", "", 30)))
	parent := capsule(t, "parent", apiShell+`
echo "wide: $(curl -s -w ' %{http_code}' -H "Authorization: Bearer $ROOST_CREDENTIAL" -d '{"capsule":"wide","version":"0.1.0"}' "$ROOST_ENDPOINT/v1/spawn")"
echo "stranger: $(curl -s -w ' %{http_code}' -H "Authorization: Bearer $ROOST_CREDENTIAL" -d '{"capsule":"stranger","version":"0.1.0"}' "$ROOST_ENDPOINT/v1/spawn")"
echo "malformed: $(curl -s -w ' %{http_code}' -H "Authorization: Bearer $ROOST_CREDENTIAL" -d '{"capsule":"wide","versoin":"0.1.0"}' "$ROOST_ENDPOINT/v1/spawn")"
`, sealedCaps("curl", "wide", 60)+"  network:\n    allow: [example.com:443]\n")
	res := d.ctl("run", parent)
	if res.code != 0 {
		t.Fatalf("parent: %+v", res)
	}
	for _, want := range []string{
		`wide: {"error":"capabilities.network.allow: the child declares \"api.example.com\", which its parent does not hold"}` + "\n 403",
		`stranger: {"error":"capabilities.spawn.allow: \"stranger\" is not among the capsules this session may spawn (wide)"}` + "\n 403",
		`malformed: {"error":"the request body is not a spawn request`,
	} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("the parent's output lacks %q:\n%s", want, res.stdout)
		}
	}
	if len(d.ps()) != 1 {
		t.Errorf("a refused spawn launched something: %+v", d.ps())
	}
	metrics := scrape(t, d)
	for _, want := range []string{`result="refused_envelope"} 1`, `result="refused_spawn_allow"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(metrics, "roost_spawn_admissions"))
		}
	}
}

// Killing a parent ends its child, and both ends are recorded.
func TestKillParentEndsChild(t *testing.T) {
	d := newDaemon(t)
	d.push(capsule(t, "sleeper", "echo child up; sleep 60", sealedCaps("sleep", "", 90)))
	parent := capsule(t, "parent", apiShell+`
api -d '{"capsule":"sleeper","version":"0.1.0"}' "$ROOST_ENDPOINT/v1/spawn" >/dev/null
sleep 60
`, sealedCaps("curl, sleep", "sleeper", 120))
	id := strings.TrimSpace(d.ok("run", "--detach", parent))
	var child session
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if kids := d.byCapsule("sleeper"); len(kids) == 1 && kids[0].State == "running" {
			child = kids[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child never ran: %+v\n%s", d.ps(), d.log)
		}
	}
	if tree := d.ok("ps", "--tree", "--no-trunc"); !strings.Contains(tree, "└─ "+child.ID) {
		t.Errorf("ps --tree:\n%s", tree)
	}
	d.ctl("kill", id)
	p, c := d.inspect(id), d.inspect(child.ID)
	if p.State != "exited" || p.ExitStatus != "terminated" {
		t.Errorf("parent: %s %s %q", p.State, p.ExitStatus, p.Detail)
	}
	if c.State != "exited" || c.ExitStatus != "terminated" || !strings.Contains(c.Detail, "its parent "+id+" ended") {
		t.Errorf("child: %s %s %q", c.State, c.ExitStatus, c.Detail)
	}
	if _, err := os.Stat(filepath.Join(c.Workdir, "completion.json")); err != nil {
		t.Errorf("the child left no completion.json: %v", err)
	}
}

// Every identity failure gets the same bytes: a forged credential, an ended session's
// credential and another live session's credential, on a session's loopback endpoint.
func TestIdentityFailuresIdentical(t *testing.T) {
	d := newDaemon(t)
	holder := capsule(t, "holder", `echo "$ROOST_ENDPOINT" > endpoint; echo "$ROOST_CREDENTIAL" > credential; sleep 60`,
		"capabilities:\n  containment: advisory\n")
	ended := capsule(t, "ended", `echo "$ROOST_CREDENTIAL" > credential`, "capabilities:\n  containment: advisory\n")
	a := strings.TrimSpace(d.ok("run", "--detach", holder))
	b := strings.TrimSpace(d.ok("run", "--detach", holder))
	d.ok("run", ended)
	read := func(s session, name string) string {
		path := filepath.Join(s.Workdir, name)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			data, err := os.ReadFile(path)
			if err == nil && bytes.HasSuffix(data, []byte("\n")) {
				return strings.TrimSpace(string(data))
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v", path, err)
			}
		}
	}
	sa, sb := d.inspect(a), d.inspect(b)
	addr := strings.TrimPrefix(read(sa, "endpoint"), "http://")
	own := read(sa, "credential")
	endedCred := read(d.byCapsule("ended")[0], "credential")
	forged := own[:len(own)-2] + "AA"
	if forged == own {
		forged = own[:len(own)-2] + "BB"
	}
	raw := func(cred string) string {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /v1/self HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", cred)
		data, err := io.ReadAll(bufio.NewReader(conn))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	if ok := raw(own); !strings.HasPrefix(ok, "HTTP/1.1 200") || !strings.Contains(ok, a) {
		t.Fatalf("the session's own credential: %q", ok)
	}
	refusals := map[string]string{
		"forged":  raw(forged),
		"ended":   raw(endedCred),
		"foreign": raw(read(sb, "credential")),
		"absent":  raw(""),
	}
	want := refusals["forged"]
	if !strings.HasPrefix(want, "HTTP/1.1 403 Forbidden\r\n") || strings.Contains(want, "Date:") {
		t.Fatalf("refusal: %q", want)
	}
	for what, got := range refusals {
		if got != want {
			t.Errorf("%s credential:\n%q\nforged credential:\n%q", what, got, want)
		}
	}
}

func scrape(t *testing.T, d *daemon) string {
	t.Helper()
	if d.netns != "" {
		// Its metrics listen on loopback in its namespace.
		out, err := exec.Command("nsenter", "--net="+d.netns, "curl", "-sS", "--noproxy", "*", "http://"+d.metricsAddr+"/metrics").Output()
		if err != nil {
			t.Fatalf("scraping roostd's metrics in %s: %v", d.netns, err)
		}
		return string(out)
	}
	resp, err := http.Get("http://" + d.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return string(data)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A sealed session keeps its endpoint across a daemon crash: the restarted roostd listens
// again in the session's pinned network namespace, and the credential it was given still
// spawns.
func TestDelegationAfterDaemonKill(t *testing.T) {
	d := newDaemon(t)
	d.push(capsule(t, "worker", "echo worker ran", sealedCaps("", "", 30)))
	work := t.TempDir()
	parent := capsule(t, "parent", apiShell+`
while [ ! -e /work/go ]; do sleep 0.05; done
api -d '{"capsule":"worker","version":"0.1.0","wait":true}' "$ROOST_ENDPOINT/v1/spawn"
`, sealedCaps("curl, sleep", "worker", 60))
	id := strings.TrimSpace(d.ok("run", "--detach", "--workdir", work, parent))
	d.kill9()
	d.start()
	if err := os.WriteFile(filepath.Join(work, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if res := d.ctl("wait", id); res.code != 0 {
		t.Fatalf("parent after the restart: %+v\n%s", res, d.log)
	}
	out := d.ok("logs", id)
	if !strings.Contains(out, `"completion":{`) || !strings.Contains(out, `"status":"ok"`) {
		t.Fatalf("the parent's spawn after the restart: %s", out)
	}
	if w := d.byCapsule("worker"); len(w) != 1 || w[0].ExitStatus != "ok" || d.ok("logs", w[0].ID) != "worker ran\n" {
		t.Fatalf("worker: %+v", w)
	}
}
