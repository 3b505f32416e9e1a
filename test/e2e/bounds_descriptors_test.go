package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// holdEgress opens, through the session's proxy, 40 CONNECT tunnels to web.test:443 and 20
// forwarded requests for http://web.test/hold (whose answer begins and then waits), and
// keeps every one of them open. It sorts what it got: established (200 on the tunnel or
// the request), refused for descriptors (503 with X-Roost-Denied: connections), closed
// unread by the endpoint (a reset: its connection was refused at accept) and anything
// else, writes the counts to /work/holding and holds everything until the test
// writes /work/release.
const holdEgress = `python3 - <<'PY'
import os, socket, time, urllib.parse
u = urllib.parse.urlparse(os.environ["HTTP_PROXY"])
held, ok, connections, reset, other = [], 0, 0, 0, {}
def ask(req):
    global ok, connections, reset
    try:
        s = socket.create_connection((u.hostname, u.port), timeout=20)
        s.sendall(req)
        buf = b""
        while b"\r\n\r\n" not in buf:
            c = s.recv(4096)
            if not c:
                raise ConnectionResetError("closed before the answer")
            buf += c
    except (ConnectionResetError, BrokenPipeError):
        reset += 1
        return
    except OSError as e:
        k = type(e).__name__
        other[k] = other.get(k, 0) + 1
        return
    head = buf.split(b"\r\n\r\n")[0].decode("latin-1").lower()
    status = head.split(" ")[1]
    if status == "200":
        ok += 1
    elif status == "503" and "\r\nx-roost-denied: connections" in head:
        connections += 1
    else:
        other[status] = other.get(status, 0) + 1
    held.append(s)
for _ in range(40):
    ask(b"CONNECT web.test:443 HTTP/1.1\r\nHost: web.test:443\r\n\r\n")
for _ in range(20):
    ask(b"GET http://web.test/hold HTTP/1.1\r\nHost: web.test\r\n\r\n")
line = "ok=%d connections=%d reset=%d other=%s" % (ok, connections, reset, sorted(other.items()))
print(line, flush=True)
with open("/work/holding.tmp", "w") as f:
    f.write(line + "\n")
os.rename("/work/holding.tmp", "/work/holding")
deadline = time.time() + 150
while not os.path.exists("/work/release") and time.time() < deadline:
    time.sleep(0.05)
print("released", flush=True)
PY
`

// holdServers starts, in inet, what holdEgress holds open: on :443 a listener that takes
// each connection and keeps it until its client goes; on :80 /hold, which answers its
// first bytes and then waits for the test's end.
func holdServers(t *testing.T, n *testNet) {
	t.Helper()
	done := make(chan struct{})
	raw := listenIn(t, n.inet, inetAddr+":443")
	go func() {
		for {
			c, err := raw.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	mux := http.NewServeMux()
	mux.HandleFunc("/hold", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "held\n")
		w.(http.Flusher).Flush()
		select {
		case <-done:
		case <-r.Context().Done():
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(listenIn(t, n.inet, inetAddr+":80"))
	// Registered after the listeners' cleanups, so run before them: the held handlers
	// return first.
	t.Cleanup(func() { close(done); srv.Close() })
}

// Nine sealed sessions each hold 60 proxied connections (40 CONNECT tunnels, 20 forwarded
// requests waiting on their answer) under a roostd whose open-file limit is 1024: each is
// two descriptors in roostd, 1,080 in all. On main (2f404c5), whose budget counted endpoint
// connections only, this ran roostd out of descriptors (accept4: too many open files) and
// roostctl ps failed with 69. With one descriptor budget a session past its share, or past
// the daemon's total, is refused with 503 and X-Roost-Denied: connections, and the
// operator's ps, run and stop go on working.
func TestBoundsDescriptors(t *testing.T) {
	n := newTestNet(t)
	holdServers(t, n)
	d := &daemon{t: t, netns: n.daemon, nofile: 1024}
	state := stateDir(t)
	d.stateDir, d.socket, d.metricsAddr, d.args = state, filepath.Join(state, "roostd.sock"), "127.0.0.1:9464", []string{"--config", egressConfig(t)}
	d.start()
	t.Cleanup(func() {
		for _, id := range strings.Fields(d.ctl("ps", "-q").stdout) {
			d.ctl("kill", id)
		}
		d.cmd.Process.Signal(unix.SIGTERM)
		d.cmd.Wait()
	})
	if !strings.Contains(d.log.String(), "open_file_limit=1024") {
		t.Errorf("roostd does not log its open-file limit of 1024:\n%s", d.log)
	}

	const sessions = 9
	caps := egressCaps("sealed", "web.test", `"web.test:443"`)
	caps = strings.Replace(caps, "allow: [curl, cat, rm, \"@git\"]", "allow: [python3]", 1)
	var ids, workdirs []string
	for i := range sessions {
		id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "holder"+strconv.Itoa(i), holdEgress, caps)))
		ids = append(ids, id)
		workdirs = append(workdirs, d.inspect(id).Workdir)
	}
	counts := regexp.MustCompile(`^ok=(\d+) connections=(\d+) reset=(\d+) other=(.*)\n$`)
	okAll, refusedAll := 0, 0
	for i, wd := range workdirs {
		var line string
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if data, err := os.ReadFile(filepath.Join(wd, "holding")); err == nil {
				line = string(data)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("session %s did not report what it holds:\n%s\nroostd's last words:\n%s", ids[i], d.ctl("logs", ids[i]).stdout, tail(d.log.String(), 30))
			}
		}
		m := counts.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("session %s: %q", ids[i], line)
		}
		t.Logf("session %d (%s): %s", i, ids[i], strings.TrimSpace(line))
		ok, _ := strconv.Atoi(m[1])
		refused, _ := strconv.Atoi(m[2])
		okAll += ok
		refusedAll += refused
		if m[4] != "[]" {
			t.Errorf("session %s had connections fail otherwise than refused for descriptors: %s", ids[i], m[4])
		}
	}
	if refusedAll == 0 {
		t.Errorf("%d connections established, none refused with 503 and X-Roost-Denied: connections: the load is past roostd's open-file limit and the budget refused none of it", okAll)
	}
	// Each established one holds two descriptors (its endpoint connection and its upstream):
	// together within what the budget gives sessions of 1024.
	if okAll*2 > 768 {
		t.Errorf("%d connections established, %d descriptors: past the budget of 768", okAll, okAll*2)
	}

	// The metric counts what is held: an upstream socket per established connection, an
	// endpoint connection for each of those and each refused one still open.
	held := func(m, use string) int {
		v := regexp.MustCompile(`(?m)^roost_descriptors\{use="` + use + `"\} (\d+)$`).FindStringSubmatch(m)
		if v == nil {
			t.Fatalf("no roost_descriptors{use=%q}:\n%s", use, grepLines(m, "roost_descriptors"))
		}
		n, _ := strconv.Atoi(v[1])
		return n
	}
	m := scrape(t, d)
	if up, ep := held(m, "upstream"), held(m, "endpoint"); up != okAll || ep < okAll+refusedAll {
		t.Errorf("roost_descriptors: upstream %d, endpoint %d; %d established, %d refused", up, ep, okAll, refusedAll)
	}
	if !strings.Contains(m, `roost_descriptors_budget{bound="total"} 768`) {
		t.Errorf("roost_descriptors_budget:\n%s", grepLines(m, "roost_descriptors_budget"))
	}

	// Everything held: the operator's commands work.
	start := time.Now()
	if res := d.ctl("ps"); res.code != 0 {
		t.Errorf("roostctl ps while sessions hold their share: exit %d: %s", res.code, res.stderr)
	}
	t.Logf("ps took %s", time.Since(start))
	if res := d.ctl("run", capsule(t, "newcomer", "echo here", sealedCaps("echo", "", 30))); res.code != 0 || res.stdout != "here\n" {
		t.Errorf("roostctl run while sessions hold their share: exit %d: %q %s", res.code, res.stdout, res.stderr)
	}
	if res := d.ctl("stop", ids[0]); res.code != 0 {
		t.Errorf("roostctl stop while sessions hold their share: exit %d: %s", res.code, res.stderr)
	}
	if res := d.ctl("doctor"); res.code != 0 || !strings.Contains(res.stdout, "descriptors") {
		t.Errorf("roostctl doctor does not show the descriptor budget: exit %d:\n%s%s", res.code, res.stdout, res.stderr)
	} else {
		t.Logf("doctor: %s", grepLines(res.stdout, "descriptors"))
	}
	if res := d.ctl("rm", ids[0]); res.code != 0 {
		t.Errorf("roostctl rm while sessions hold their share: exit %d: %s", res.code, res.stderr)
	}
	if strings.Contains(d.log.String(), "too many open files") {
		t.Errorf("roostd ran out of descriptors:\n%s", tail(d.log.String(), 30))
	}
	for _, wd := range workdirs {
		_ = os.WriteFile(filepath.Join(wd, "release"), nil, 0o644)
	}
	// Every slot comes back once the sessions let go.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		m := scrape(t, d)
		if held(m, "upstream") == 0 && held(m, "endpoint") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots still held after every session let go:\n%s", grepLines(m, "roost_descriptors{"))
		}
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}
