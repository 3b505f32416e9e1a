package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// holdConnections opens 500 TCP connections to the session's own endpoint and sends
// nothing on any of them. Half a second later it sorts them: a socket the endpoint closed
// reads EOF or a reset at once; one it still holds has nothing to read. It reports the
// counts in /work/holding and waits, holding everything, until the test writes
// /work/release.
const holdConnections = `python3 - <<'PY'
import os, select, socket, time, urllib.parse
u = urllib.parse.urlparse(os.environ["ROOST_ENDPOINT"])
socks, failed = [], 0
for _ in range(500):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((u.hostname, u.port))
        socks.append(s)
    except OSError:
        failed += 1
        s.close()
time.sleep(0.5)
readable, _, _ = select.select(socks, [], [], 0.5)
refused = 0
for s in readable:
    try:
        if s.recv(1) == b"":
            refused += 1
    except OSError:
        refused += 1
still_open = len(socks) - refused
line = "connected=%d failed=%d refused=%d open=%d" % (len(socks), failed, refused, still_open)
print(line, flush=True)
with open("/work/holding.tmp", "w") as f:
    f.write(line + "\n")
os.rename("/work/holding.tmp", "/work/holding")
deadline = time.time() + 40
while not os.path.exists("/work/release") and time.time() < deadline:
    time.sleep(0.05)
print("released", flush=True)
PY
`

// A sealed capsule floods its own endpoint with idle connections: past
// resources.endpoint_max_connections (64) they are closed at once, roostd keeps answering
// roostctl while the capsule holds what it got, and the cut is recorded and counted.
func TestBoundsEndpointConnections(t *testing.T) {
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "flooder", holdConnections, sealedCaps("python3", "", 60))))
	workdir := d.inspect(id).Workdir
	var holding string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if data, err := os.ReadFile(filepath.Join(workdir, "holding")); err == nil {
			holding = strings.TrimSpace(string(data))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the capsule never reported its connections: %+v\n%s\nroostd: %s", d.inspect(id), d.ctl("logs", id).stdout, d.log)
		}
	}
	// While the capsule holds its connections, the control socket answers promptly.
	for i := range 5 {
		start := time.Now()
		res := d.ctl("ps", "--no-trunc")
		took := time.Since(start)
		if res.code != 0 || !strings.Contains(res.stdout, id) {
			t.Errorf("roostctl ps #%d: %+v", i, res)
		}
		if took > time.Second {
			t.Errorf("roostctl ps #%d took %s while the capsule held its connections", i, took)
		}
	}
	if err := os.WriteFile(filepath.Join(workdir, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if res := d.ctl("wait", id); res.code != 0 {
		t.Fatalf("the capsule: %+v\n%s\nroostd: %s", res, d.ctl("logs", id).stdout, d.log)
	}

	counts := map[string]int{}
	for _, m := range regexp.MustCompile(`(\w+)=(\d+)`).FindAllStringSubmatch(holding, -1) {
		counts[m[1]], _ = strconv.Atoi(m[2])
	}
	t.Logf("the capsule: %s", holding)
	if counts["connected"]+counts["failed"] != 500 {
		t.Fatalf("the capsule's report: %q", holding)
	}
	if counts["open"] > 64 {
		t.Errorf("the capsule held %d connections to its endpoint, past the cap of 64 (%s)", counts["open"], holding)
	}
	if counts["refused"]+counts["failed"] < 400 {
		t.Errorf("only %d of 500 connections were refused (%s)", counts["refused"]+counts["failed"], holding)
	}

	var limitEvent string
	for _, line := range strings.Split(d.ok("events", "--json", "--since", "0"), "\n") {
		if strings.Contains(line, "session.limit") && strings.Contains(line, id) {
			limitEvent = line
		}
	}
	if !strings.Contains(limitEvent, "endpoint_connections") {
		t.Errorf("no session.limit event for endpoint_connections: %q", limitEvent)
	}
	t.Logf("the event: %s", limitEvent)
	m := regexp.MustCompile(`(?m)^roost_limit_hits_total\{limit="endpoint_connections"\} (\d+)`).FindStringSubmatch(scrape(t, d))
	if m == nil || m[1] == "0" {
		t.Errorf("roost_limit_hits_total{limit=\"endpoint_connections\"}: %v", m)
	} else {
		t.Logf("roost_limit_hits_total{limit=\"endpoint_connections\"} %s", m[1])
	}
	if s := d.inspect(id); s.ExitStatus != "ok" {
		t.Errorf("the session ended %s: %q", s.ExitStatus, s.Detail)
	}
}
