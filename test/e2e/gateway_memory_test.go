package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// bigCall is the size of each model call's body in the memory tests: 31 MiB, just under
// the endpoint's bound.
const bigCall = 31 << 20

// heldUpstream is a model upstream that reads each call's body and holds the call until
// released, so the calls the gateway forwards are all in flight at once.
type heldUpstream struct {
	url     string
	arrived atomic.Int64
	release chan struct{}
	once    sync.Once
}

func startHeldUpstream(t *testing.T) *heldUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return heldUpstreamIn(t, ln)
}

func (u *heldUpstream) free() { u.once.Do(func() { close(u.release) }) }

// memoryDaemon is a roostd whose one upstream, llm, is up; its gateway's bounds are the
// defaults.
func memoryDaemon(t *testing.T, up *heldUpstream) *daemon {
	t.Helper()
	dir := t.TempDir()
	key := filepath.Join(dir, "llm.key")
	os.WriteFile(key, []byte("sk-operator\n"), 0o600)
	cfg := filepath.Join(dir, "roostd.yaml")
	os.WriteFile(cfg, fmt.Appendf(nil, "inference:\n  upstreams:\n    - name: llm\n      format: openai\n      url: %s\n      api_key_file: %s\n", up.url, key), 0o600)
	return newDaemon(t, "--config", cfg)
}

// procStatus is a field of roostd's /proc/<pid>/status, in bytes.
func (d *daemon) procStatus(field string) int64 {
	d.t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		d.t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				d.t.Fatal(err)
			}
			return kb << 10
		}
	}
	d.t.Fatalf("no %s in roostd's status", field)
	return 0
}

// bigCaller is a capsule sending calls 31 MiB calls at once once /work/go exists, each
// writing its status and roost's code to /work/result-<i>.
func bigCaller(t *testing.T, calls int) string {
	script := fmt.Sprintf(`python3 - <<'PY'
import json, os, threading, time, urllib.request, urllib.error
head = '{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"'
tail = '"}]}'
body = (head + "x" * (%d - len(head) - len(tail)) + tail).encode()
while not os.path.exists("/work/go"):
    time.sleep(0.02)
def call(i):
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            out = "%%d ok" %% resp.status
    except urllib.error.HTTPError as e:
        out = "%%d %%s" %% (e.code, json.loads(e.read()).get("roost", {}).get("code"))
    except Exception as e:
        out = "error " + repr(e)
    with open("/work/result-%%d" %% i, "w") as f:
        f.write(out)
threads = [threading.Thread(target=call, args=(i,)) for i in range(%d)]
for th in threads: th.start()
for th in threads: th.join()
PY
`, bigCall, calls)
	return capsule(t, "big-caller", script, sealedCaps("python3", "", 300)+"inference:\n  upstream: llm\n  model: m\n")
}

// callResults are the calls' outcomes written so far in the sessions' workdirs.
func callResults(works []string) []string {
	var out []string
	for _, w := range works {
		files, _ := filepath.Glob(filepath.Join(w, "result-*"))
		for _, f := range files {
			data, _ := os.ReadFile(f)
			out = append(out, string(data))
		}
	}
	return out
}

// bigCalls runs sessions of calls 31 MiB calls each against a held upstream: once every call
// is either held upstream or answered, roostd's resident memory is measured against what it
// held before, the upstream released and the sessions waited for. It returns the outcomes
// and how many calls were in flight together.
func bigCalls(t *testing.T, sessions, calls int) (outcomes []string, inFlight int64) {
	up := startHeldUpstream(t)
	d := memoryDaemon(t, up)
	dir := bigCaller(t, calls)
	var ids, works []string
	for range sessions {
		work := t.TempDir()
		os.Chmod(work, 0o777)
		works = append(works, work)
		ids = append(ids, strings.TrimSpace(d.ok("run", "--detach", "--workdir", work, dir)))
	}
	waitFor(t, "the sessions to run", func() bool {
		for _, s := range d.ps() {
			if s.State != "running" {
				return false
			}
		}
		return len(d.ps()) == sessions
	})
	before := d.procStatus("VmRSS")
	for _, w := range works {
		os.WriteFile(filepath.Join(w, "go"), nil, 0o644)
	}
	total := int64(sessions * calls)
	waitFor(t, "every call held upstream or answered", func() bool { return up.arrived.Load()+int64(len(callResults(works))) == total })
	inFlight = up.arrived.Load()
	held, peak := d.procStatus("VmRSS"), d.procStatus("VmHWM")
	up.free()
	for _, id := range ids {
		if res := d.ctl("wait", id); res.code != 0 {
			t.Fatalf("session %s: %+v\n%s", id, res, d.ok("logs", id))
		}
	}
	peak = max(peak, d.procStatus("VmHWM"))
	bytes := inFlight * bigCall
	t.Logf("%d sessions × %d calls of %d MiB: %d in flight (%d MiB); roostd's RSS %d MiB before, %d MiB held (+%d MiB), peak %d MiB (+%d MiB, %.2f× the bytes in flight)",
		sessions, calls, bigCall>>20, inFlight, bytes>>20, before>>20, held>>20, (held-before)>>20, peak>>20, (peak-before)>>20, float64(peak-before)/float64(bytes))
	if peak-before >= 2*bytes {
		t.Errorf("roostd's RSS rose %d MiB holding %d MiB of bodies: not less than twice", (peak-before)>>20, bytes>>20)
	}
	return callResults(works), inFlight
}

// tally is how many of outcomes are want.
func tally(outcomes []string, want string) int {
	n := 0
	for _, o := range outcomes {
		if o == want {
			n++
		}
	}
	return n
}

// Eight 31 MiB calls at once from one session: four, the session's most, are held upstream
// at once and the other four refused with 429 naming the bound; roostd's memory rises by
// less than twice the bodies it holds.
func TestGatewayMemoryOneSession(t *testing.T) {
	outcomes, inFlight := bigCalls(t, 1, 8)
	if inFlight != 4 || tally(outcomes, "200 ok") != 4 || tally(outcomes, "429 session_calls_in_flight") != 4 {
		t.Fatalf("%d held at once; outcomes %q", inFlight, outcomes)
	}
}

// Nine sessions' 31 MiB calls at once: the eight that fit the gateway's 256 MiB of bodies in
// flight are held upstream at once, the ninth refused with 503 naming the bound; roostd's
// memory rises by less than twice the bodies it holds.
func TestGatewayMemorySessions(t *testing.T) {
	outcomes, inFlight := bigCalls(t, 9, 1)
	if inFlight != 8 || tally(outcomes, "200 ok") != 8 || tally(outcomes, "503 gateway_body_bytes_in_flight") != 1 {
		t.Fatalf("%d held at once; outcomes %q", inFlight, outcomes)
	}
}
