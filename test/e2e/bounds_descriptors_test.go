package e2e

import (
	"fmt"
	"io"
	"net"
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

// What each session of TestBoundsDescriptors asks for: CONNECT tunnels, forwarded requests
// on keep-alive connections, and model calls up to the gateway's max_calls_per_session as
// the test configures it, the early ones before the egress. The cap is set above the
// early calls (the default, 4, would refuse the fifth with 429 before it asks for a
// descriptor), so that the late calls meet the share, not the cap. Tunnels, forwarded and
// calls fit resources.endpoint_max_connections (64).
const (
	boundsTunnels   = 32
	boundsForwarded = 20
	boundsCalls     = 8
	boundsEarly     = 4
)

// holdEgress runs in three steps, each reported in a file of /work.
//
// First it opens boundsCalls connections to its gateway, probes each (GET of the base URL,
// which takes no slot) and sends a model call on the first boundsEarly of them, which the
// upstream holds; it writes /work/called and waits for /work/egress.
//
// Then, through the session's proxy, boundsTunnels CONNECT tunnels to web.test:443 and
// boundsForwarded keep-alive connections, each asking http://web.test/hello twice and
// then /hold (whose answer begins and then waits), keeping every one of them open. It
// sorts what it got: established (200 on the tunnel or /hold), refused for descriptors
// (503 with X-Roost-Denied: connections), closed unread by the endpoint (a reset: its
// connection was refused at accept) and anything else.
//
// Last it sends a model call on each of the remaining gateway connections, already
// accepted, and sorts their answers: status, the OpenAI envelope's error code, roost's
// code and the bound its message names (share or total); "held" for a call that got no
// answer within 5s (the upstream has it).
//
// It writes the counts to /work/holding and holds everything until the test writes
// /work/release.
var holdEgress = fmt.Sprintf(`python3 - <<'PY'
import http.client, json, os, socket, time, urllib.parse
TUNNELS, FORWARDED, CALLS, EARLY = %d, %d, %d, %d
proxy = urllib.parse.urlparse(os.environ["HTTP_PROXY"])
base = urllib.parse.urlparse(os.environ["OPENAI_BASE_URL"])
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
body = json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})

def report(name, line):
    print(name + ": " + line, flush=True)
    with open("/work/" + name + ".tmp", "w") as f:
        f.write(line + "\n")
    os.rename("/work/" + name + ".tmp", "/work/" + name)

def wait_for(name):
    deadline = time.time() + 250
    while not os.path.exists("/work/" + name) and time.time() < deadline:
        time.sleep(0.05)

calls, probed = [], {}
for _ in range(CALLS):
    c = http.client.HTTPConnection(base.hostname, base.port, timeout=20)
    try:
        c.request("GET", base.path.removesuffix("/v1"), headers=headers)
        r = c.getresponse()
        r.read()
        k = str(r.status)
    except OSError as e:
        k = type(e).__name__
    probed[k] = probed.get(k, 0) + 1
    calls.append(c)
for c in calls[:EARLY]:
    c.request("POST", base.path + "/chat/completions", body=body, headers=headers)
report("called", "probed=" + str(sorted(probed.items())))
wait_for("egress")

held, ok, connections, reset, other = [], 0, 0, 0, {}
def sort(status, denied):
    global ok, connections
    if status == 200:
        ok += 1
    elif status == 503 and denied == "connections":
        connections += 1
    else:
        other[str(status)] = other.get(str(status), 0) + 1

def tunnel():
    global reset
    try:
        s = socket.create_connection((proxy.hostname, proxy.port), timeout=20)
        s.sendall(b"CONNECT web.test:443 HTTP/1.1\r\nHost: web.test:443\r\n\r\n")
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
        other[type(e).__name__] = other.get(type(e).__name__, 0) + 1
        return
    head = buf.split(b"\r\n\r\n")[0].decode("latin-1").lower()
    m = [l for l in head.split("\r\n") if l.startswith("x-roost-denied:")]
    sort(int(head.split(" ")[1]), m[0].split(":", 1)[1].strip() if m else None)
    held.append(s)

def forward():
    global reset
    c = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=20)
    try:
        for path in ("/hello", "/hello", "/hold"):
            c.request("GET", "http://web.test" + path)
            r = c.getresponse()
            if path == "/hold" or r.status != 200:
                break
            if r.read() != b"hello\n":
                other["body"] = other.get("body", 0) + 1
                return
    except ConnectionResetError:
        reset += 1
        return
    except (OSError, http.client.HTTPException) as e:
        other[type(e).__name__] = other.get(type(e).__name__, 0) + 1
        return
    sort(r.status, r.getheader("X-Roost-Denied"))
    held.append((c, r))

for _ in range(TUNNELS):
    tunnel()
for _ in range(FORWARDED):
    forward()

late, sent = {}, []
for c in calls[EARLY:]:
    try:
        c.request("POST", base.path + "/chat/completions", body=body, headers=headers)
        sent.append(c)
    except OSError as e:
        late[type(e).__name__] = late.get(type(e).__name__, 0) + 1
# One deadline for them all: refused, each is answered at once; held, the next session's
# idle gateway connections must not wait past the endpoint's idle timeout for its turn.
deadline = time.time() + 5
for c in sent:
    try:
        c.sock.settimeout(max(deadline - time.time(), 0.1))
        r = c.getresponse()
        e = json.loads(r.read())
        msg = e.get("error", {}).get("message", "")
        scope = "share" if "holds its share" in msg else "total" if "all sessions together" in msg else repr(msg)
        k = "{} {}/{} {}".format(r.status, e.get("error", {}).get("code"), e.get("roost", {}).get("code"), scope)
    except TimeoutError:
        k = "held"
    except Exception as e:
        k = type(e).__name__
    late[k] = late.get(k, 0) + 1
report("holding", "ok={} connections={} reset={} other={} calls={}".format(ok, connections, reset, sorted(other.items()), sorted(late.items())))
wait_for("release")
print("released", flush=True)
PY
`, boundsTunnels, boundsForwarded, boundsCalls, boundsEarly)

// holdServers starts, in inet, what holdEgress holds open: on :443 a listener that takes
// each connection and keeps it until its client goes; on :80 /hello, and /hold, which
// answers its first bytes and then waits for the test's end.
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
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello\n") })
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

// heldUpstreamIn is a heldUpstream listening on ln.
func heldUpstreamIn(t *testing.T, ln net.Listener) *heldUpstream {
	t.Helper()
	u := &heldUpstream{release: make(chan struct{})}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		u.arrived.Add(1)
		<-u.release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { u.free(); srv.Close() })
	u.url = "http://" + ln.Addr().String()
	return u
}

// waitFiles waits for every one of dirs to hold name and returns their contents.
func waitFiles(t *testing.T, d *daemon, ids, dirs []string, name string) []string {
	t.Helper()
	var out []string
	for i, wd := range dirs {
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if data, err := os.ReadFile(filepath.Join(wd, name)); err == nil {
				out = append(out, string(data))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("session %s did not write %s:\n%s\nroostd's last words:\n%s", ids[i], name, d.ctl("logs", ids[i]).stdout, tail(d.log.String(), 30))
			}
		}
	}
	return out
}

// Nine sealed sessions each hold what roostd gives them of 52 proxied connections (32
// CONNECT tunnels, 20 forwarded requests on keep-alive connections waiting on their
// answer) and 8 model calls through the gateway to an upstream that holds them, under a
// roostd whose open-file limit is 1024: two descriptors in roostd for each, 1,080 in all.
// On main (2f404c5), whose budget counted endpoint connections only, 60 proxied
// connections a session ran roostd out of descriptors (accept4: too many open files) and
// roostctl ps failed with 69. With one descriptor budget a session past its share, or past
// the daemon's total, is refused — a proxied connection with 503 and X-Roost-Denied:
// connections, a model call with 503 and code connections in the upstream's envelope, a
// connection to an endpoint once the total is spent with a reset at accept — and the
// operator's ps, run and stop go on working. Without the gateway's slot (seen with its
// Acquire skipped) the calls past the share reach the upstream and roostd holds 72
// sockets the budget does not count.
func TestBoundsDescriptors(t *testing.T) {
	n := newTestNet(t)
	holdServers(t, n)
	up := heldUpstreamIn(t, listenIn(t, n.inet, inetAddr+":8000"))
	key := filepath.Join(t.TempDir(), "llm.key")
	if err := os.WriteFile(key, []byte("sk-operator\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(egressConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg = fmt.Appendf(cfg, "inference:\n  max_calls_per_session: %d\n  upstreams:\n    - name: llm\n      format: openai\n      url: %s\n      api_key_file: %s\n", boundsCalls, up.url, key)
	cfgPath := filepath.Join(t.TempDir(), "roostd.yaml")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, netns: n.daemon, nofile: 1024}
	state := stateDir(t)
	d.stateDir, d.socket, d.metricsAddr, d.args = state, filepath.Join(state, "roostd.sock"), "127.0.0.1:9464", []string{"--config", cfgPath}
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
	held := func(m, use string) int {
		v := regexp.MustCompile(`(?m)^roost_descriptors\{use="` + use + `"\} (\d+)$`).FindStringSubmatch(m)
		if v == nil {
			t.Fatalf("no roost_descriptors{use=%q}:\n%s", use, grepLines(m, "roost_descriptors"))
		}
		n, _ := strconv.Atoi(v[1])
		return n
	}

	const sessions = 9
	caps := egressCaps("sealed", "web.test", `"web.test:443"`)
	caps = strings.Replace(caps, "allow: [curl, cat, rm, \"@git\"]", "allow: [python3]", 1)
	caps = strings.Replace(caps, "deadline_seconds: 120", "deadline_seconds: 300", 1)
	caps += "inference:\n  upstream: llm\n  model: m\n"
	var ids, workdirs []string
	for i := range sessions {
		id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "holder"+strconv.Itoa(i), holdEgress, caps)))
		ids = append(ids, id)
		workdirs = append(workdirs, d.inspect(id).Workdir)
	}

	// Every session's early calls held upstream, each a slot of its share, before any
	// session spends the total on its egress.
	for i, line := range waitFiles(t, d, ids, workdirs, "called") {
		if want := fmt.Sprintf("probed=[('200', %d)]\n", boundsCalls); line != want {
			t.Fatalf("session %s probed its gateway: %q, want %q", ids[i], line, want)
		}
	}
	early := int64(sessions * boundsEarly)
	waitFor(t, "every session's early calls held upstream", func() bool { return up.arrived.Load() >= early })
	if m := scrape(t, d); held(m, "gateway") != int(early) {
		t.Errorf("%d model calls held upstream, roost_descriptors{use=\"gateway\"} %d", early, held(m, "gateway"))
	}

	// One session after another, so that the first ones meet their share before the total
	// is spent (at once, every session's endpoint connections spend the total first and
	// the rest are reset at accept: no session meets its share).
	var holding []string
	for i, wd := range workdirs {
		_ = os.WriteFile(filepath.Join(wd, "egress"), nil, 0o644)
		holding = append(holding, waitFiles(t, d, ids[i:i+1], workdirs[i:i+1], "holding")...)
	}
	counts := regexp.MustCompile(`^ok=(\d+) connections=(\d+) reset=(\d+) other=(.*) calls=(.*)\n$`)
	lateCalls := func(scope string) string {
		return fmt.Sprintf("[('503 connections/connections %s', %d)]", scope, boundsCalls-boundsEarly)
	}
	okAll, refusedAll := 0, 0
	for i, line := range holding {
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
		// Its calls' connections were accepted before the egress: past the session's share
		// each is refused by the gateway itself, in OpenAI's envelope — the first session's
		// on its share, the last's on the total the others spent, any other's on either.
		if want := []string{lateCalls("share"), lateCalls("total")}; i == 0 && m[5] != want[0] || i == sessions-1 && m[5] != want[1] || m[5] != want[0] && m[5] != want[1] {
			t.Errorf("session %s's model calls after its egress: %s, want %s", ids[i], m[5], strings.Join(want, " or "))
		}
	}
	if refusedAll == 0 {
		t.Errorf("%d connections established, none refused with 503 and X-Roost-Denied: connections: the load is past roostd's open-file limit and the budget refused none of it", okAll)
	}
	if n := up.arrived.Load(); n != early {
		t.Errorf("%d model calls reached the upstream; only the %d sent before the sessions' egress had slots", n, early)
	}

	// The metric counts what is held: an upstream socket per established connection (and
	// at most the idle pool's four a session, when a keep-alive request's socket was back
	// in the pool only after the session's last dial), a gateway slot per call held, an
	// endpoint connection for each of those, each refused one still open and each refused
	// call's; all together within what the budget gives sessions of 1024.
	m := scrape(t, d)
	upN, gwN, epN := held(m, "upstream"), held(m, "gateway"), held(m, "endpoint")
	t.Logf("roost_descriptors: upstream %d, gateway %d, endpoint %d; %d connections established, %d refused", upN, gwN, epN, okAll, refusedAll)
	if upN < okAll || upN > okAll+4*sessions || gwN != int(early) || epN < okAll+refusedAll+sessions*boundsCalls {
		t.Errorf("roost_descriptors: upstream %d, gateway %d, endpoint %d; %d established, %d refused, %d calls held", upN, gwN, epN, okAll, refusedAll, early)
	}
	if upN+gwN+epN > 768 {
		t.Errorf("%d descriptors held for sessions: past the budget of 768", upN+gwN+epN)
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
	// The stopped session's calls give their slots back while the others hold theirs.
	waitFor(t, "the stopped session's gateway slots back", func() bool { return held(scrape(t, d), "gateway") == int(early)-boundsEarly })
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
	up.free()
	// Every slot comes back once the sessions end.
	for _, id := range ids[1:] {
		if res := d.ctl("wait", id); res.code != 0 {
			t.Errorf("session %s: exit %d: %s\n%s", id, res.code, res.stderr, d.ctl("logs", id).stdout)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		m := scrape(t, d)
		if held(m, "upstream") == 0 && held(m, "gateway") == 0 && held(m, "endpoint") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots still held after every session ended:\n%s", grepLines(m, "roost_descriptors{"))
		}
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}
