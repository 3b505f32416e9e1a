package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/fakellm"
)

// waitFor polls until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

type dayLedger struct {
	Date             string `json:"date"`
	MachineCeiling   string `json:"machine_ceiling"`
	Charged          string `json:"charged"`
	Reserved         string `json:"reserved"`
	OpenReservations int    `json:"open_reservations"`
	Sessions         []struct {
		SessionID string `json:"session_id"`
		Capsule   string `json:"capsule"`
		Charged   string `json:"charged"`
		Reserved  string `json:"reserved"`
	} `json:"sessions"`
}

func (d *daemon) spend() dayLedger {
	d.t.Helper()
	var l dayLedger
	if err := json.Unmarshal([]byte(d.ok("spend", "--json")), &l); err != nil {
		d.t.Fatal(err)
	}
	return l
}

// roostd --machine-tokens-per-day 1000: 600 is reserved, the next 600 is refused naming the
// machine, and roostctl spend shows the reservation under the ceiling.
func TestMachineCeiling(t *testing.T) {
	d := newDaemon(t, "--machine-tokens-per-day", "1000")
	work := t.TempDir()
	id := strings.TrimSpace(d.ok("run", "--detach", "--workdir", work, capsule(t, "spender", apiShell+`
echo "first: $(curl -s -w ' %{http_code}' -H "Authorization: Bearer $ROOST_CREDENTIAL" -d '{"tokens":600,"request_id":"a"}' "$ROOST_ENDPOINT/v1/spend/admit")"
echo "second: $(curl -s -w ' %{http_code}' -H "Authorization: Bearer $ROOST_CREDENTIAL" -d '{"tokens":600,"request_id":"b"}' "$ROOST_ENDPOINT/v1/spend/admit")"
echo asked > /work/asked
while [ ! -e /work/done ]; do sleep 0.05; done
`, sealedCaps("curl, sleep", "", 60))))
	waitFor(t, "the admissions", func() bool { _, err := os.Stat(filepath.Join(work, "asked")); return err == nil })
	l := d.spend()
	if l.MachineCeiling != "1000" || l.Reserved != "600" || l.OpenReservations != 1 || l.Charged != "0" || len(l.Sessions) != 1 || l.Sessions[0].SessionID != id || l.Sessions[0].Reserved != "600" {
		t.Fatalf("spend --json: %+v", l)
	}
	os.WriteFile(filepath.Join(work, "done"), nil, 0o644)
	d.ok("wait", id)
	out := d.ok("logs", id)
	if !strings.Contains(out, `first: {"reservation":"rsv_`) || !strings.Contains(out, `"tokens":600`) {
		t.Errorf("first admission: %s", out)
	}
	if !strings.Contains(out, `second: {"error":"spend refused at the machine's tokens per day`) || !strings.Contains(out, `"limit":"machine","ceiling":1000,"used":600,"requested":600}`+"\n 429") {
		t.Errorf("second admission: %s", out)
	}
	// Never settled: the reservation is charged in full at the session's end.
	if l := d.spend(); l.Charged != "600" || l.Reserved != "0" {
		t.Errorf("after the end: %+v", l)
	}
	if s := d.inspectSpend(id); s != 600 {
		t.Errorf("inspect shows %d tokens", s)
	}
	metrics := scrape(t, d)
	for _, want := range []string{`roost_spend_refusals_total{limit="machine"} 1`, `roost_tokens_spent_total{capsule="spender",model=""} 600`, `roost_budget_remaining_tokens{scope="machine"} 400`, "roost_spend_reservations_open 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(metrics, "spen"))
		}
	}
	// The ceiling changes at run time.
	if out := d.ok("spend", "set-limit", "5000"); out != "machine ceiling: 5000 tokens per UTC day (was 1000 tokens per UTC day)\n" {
		t.Errorf("set-limit: %q", out)
	}
	if res := d.ctl("spend", "set-limit", "lots"); res.code != 2 || !strings.Contains(res.stderr, `TOKENS "lots"`) {
		t.Errorf("a bad limit: %+v", res)
	}
}

func (d *daemon) inspectSpend(id string) int64 {
	d.t.Helper()
	var s struct {
		Spend struct {
			Tokens string `json:"tokens"`
		} `json:"spend"`
	}
	if err := json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &s); err != nil {
		d.t.Fatal(err)
	}
	n, _ := strconv.ParseInt(s.Spend.Tokens, 10, 64)
	return n
}

// gatewayDaemon starts a fake upstream of format and a roostd configured with it as "llm".
func gatewayDaemon(t *testing.T, format string) (*daemon, *fakellm.Server) {
	t.Helper()
	fake, err := fakellm.Start(fakellm.Config{APIKey: "sk-operator", InputTokens: 12, OutputTokens: 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	dir := t.TempDir()
	key := filepath.Join(dir, "llm.key")
	os.WriteFile(key, []byte("sk-operator\n"), 0o600)
	cfg := filepath.Join(dir, "roostd.yaml")
	os.WriteFile(cfg, fmt.Appendf(nil, "inference:\n  upstreams:\n    - name: llm\n      format: %s\n      url: %s\n      api_key_file: %s\n", format, fake.URL(), key), 0o600)
	return newDaemon(t, "--config", cfg), fake
}

// A sealed capsule calls its model through the gateway, with curl and with python's
// standard library, JSON and streamed: the upstream sees the operator's key, never the
// capsule's, and the ledger holds exactly the usage the upstream reported.
func TestGatewayFromSealedCapsule(t *testing.T) {
	d, fake := gatewayDaemon(t, "openai")
	script := `
echo "curl: $(curl -s -H "Authorization: Bearer $OPENAI_API_KEY" -H 'Content-Type: application/json' \
  -d '{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":100}' "$OPENAI_BASE_URL/chat/completions")"
python3 - <<'PY'
import json, os, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": "gpt-test", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
text = ""
with urllib.request.urlopen(req) as resp:
    for line in resp:
        line = line.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
print("python streamed:", text)
PY
`
	// The model is declared: the metric's model label takes only declared (or configured)
	// names, anything else counting as "other".
	caps := sealedCaps("curl, python3", "", 60) + "inference:\n  upstream: llm\n  model: gpt-test\n"
	id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "agent", script, caps)))
	if res := d.ctl("wait", id); res.code != 0 {
		t.Fatalf("the capsule: %+v\n%s", res, d.ok("logs", id))
	}
	out := d.ok("logs", id)
	if !strings.Contains(out, `"prompt_tokens":12`) || !strings.Contains(out, "python streamed: "+fakellm.DefaultReply) {
		t.Fatalf("the capsule's output:\n%s", out)
	}
	reqs := fake.Requests()
	if len(reqs) != 2 {
		t.Fatalf("the upstream saw %d requests", len(reqs))
	}
	for _, r := range reqs {
		if got := r.Header.Get("Authorization"); got != "Bearer sk-operator" {
			t.Errorf("the upstream saw Authorization %q", got)
		}
	}
	if n := d.inspectSpend(id); n != 84 {
		t.Errorf("the session was charged %d tokens, want 2×(12+30)", n)
	}
	trace, _ := os.ReadFile(filepath.Join(d.inspect(id).RecordsDir, "trace.jsonl"))
	if !strings.Contains(string(trace), `"tokens":84,"input_tokens":24,"output_tokens":60`) {
		t.Errorf("session_end carries no token totals:\n%s", grepLines(string(trace), "session_end"))
	}
	if m := scrape(t, d); !strings.Contains(m, `roost_spent_tokens_total{capsule="agent",model="gpt-test"} 84`) {
		t.Errorf("metrics:\n%s", grepLines(m, "roost_tokens"))
	}
}

// The Anthropic format, through python's standard library, streamed.
func TestGatewayAnthropicStream(t *testing.T) {
	d, fake := gatewayDaemon(t, "anthropic")
	script := `python3 - <<'PY'
import json, os, urllib.request
req = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages",
    data=json.dumps({"model": "claude-test", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01", "content-type": "application/json"})
events = []
with urllib.request.urlopen(req) as resp:
    for line in resp:
        line = line.decode().strip()
        if line.startswith("event: "):
            events.append(line[7:])
print("events:", " ".join(events))
PY
`
	caps := sealedCaps("python3", "", 60) + "inference:\n  upstream: llm\n  model: claude-test\n"
	id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "claude-agent", script, caps)))
	if res := d.ctl("wait", id); res.code != 0 {
		t.Fatalf("the capsule: %+v\n%s", res, d.ok("logs", id))
	}
	if out := d.ok("logs", id); !strings.Contains(out, "events: message_start content_block_start ping content_block_delta") || !strings.HasSuffix(strings.TrimSpace(out), "message_delta message_stop") {
		t.Fatalf("the capsule's output:\n%s", out)
	}
	if r := fake.Requests(); len(r) != 1 || r[0].Header.Get("X-Api-Key") != "sk-operator" {
		t.Fatalf("the upstream saw %+v", r)
	}
	if n := d.inspectSpend(id); n != 42 {
		t.Errorf("the session was charged %d tokens, want 42", n)
	}
}

// max_session_tokens 100: the second call would cross it; it is refused and nothing reaches
// the upstream. A capsule naming an upstream roostd does not know is refused at stage.
func TestGatewaySessionCeiling(t *testing.T) {
	d, fake := gatewayDaemon(t, "openai")
	call := `curl -s -w '%{http_code}\n' -H "Authorization: Bearer $OPENAI_API_KEY" -d '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50}' "$OPENAI_BASE_URL/chat/completions"`
	caps := sealedCaps("curl", "", 60) + "inference:\n  upstream: llm\n  max_session_tokens: 100\n"
	out := d.ok("run", capsule(t, "capped", call+"\n"+call, caps))
	// curl appends each status to the body it printed.
	if !strings.Contains(out, `"total_tokens":42`) || !strings.Contains(out, "}200\n") || !strings.HasSuffix(out, "}\n429\n") || !strings.Contains(out, `"limit":"session","ceiling":100,"used":42`) {
		t.Fatalf("the capsule's output:\n%s", out)
	}
	if n := len(fake.Requests()); n != 1 {
		t.Fatalf("the upstream saw %d requests", n)
	}
	res := d.ctl("run", capsule(t, "lost", "true", "inference:\n  upstream: elsewhere\n"))
	if res.code != 125 || !strings.Contains(res.stderr, `inference.upstream: "elsewhere" is not an upstream roostd knows (its --config declares: llm)`) {
		t.Fatalf("an unknown upstream: %+v", res)
	}
}

// SIGKILL roostd again and again while a sealed capsule admits and settles: every settlement
// it was told of is in the ledger afterwards, exactly once.
func TestSettlementsSurviveDaemonKills(t *testing.T) {
	d := newDaemon(t)
	work := t.TempDir()
	const n = 120
	script := fmt.Sprintf(`
post() { curl -s -m 5 -o /work/reply -w '%%{http_code}' -H "Authorization: Bearer $ROOST_CREDENTIAL" -d "$2" "$ROOST_ENDPOINT/v1/spend/$1"; }
i=1
while [ $i -le %d ]; do
  until [ "$(post admit "{\"tokens\":50,\"request_id\":\"call-$i\"}")" = 200 ]; do sleep 0.05; done
  rsv=$(sed -n 's/.*"reservation":"\([^"]*\)".*/\1/p' /work/reply)
  until [ "$(post settle "{\"reservation\":\"$rsv\",\"input_tokens\":$((i %% 7 + 1)),\"output_tokens\":2}")" = 200 ]; do sleep 0.05; done
  echo $i >> /work/acked
  i=$((i + 1))
done
`, n)
	id := strings.TrimSpace(d.ok("run", "--detach", "--workdir", work, capsule(t, "meter", script, sealedCaps("curl, sed, sleep", "", 300))))
	acked := func() int {
		data, _ := os.ReadFile(filepath.Join(work, "acked"))
		return strings.Count(string(data), "\n")
	}
	for _, at := range []int{15, 45, 80} {
		waitFor(t, fmt.Sprint(at, " settlements"), func() bool { return acked() >= at })
		d.kill9()
		// The scenario: the capsule's calls meet no daemon for a while, and retry.
		time.Sleep(100 * time.Millisecond)
		d.start()
	}
	if res := d.ctl("wait", id); res.code != 0 {
		t.Fatalf("the capsule: %+v\n%s", res, d.ok("logs", id))
	}
	if acked() != n {
		t.Fatalf("%d settlements acknowledged, want %d", acked(), n)
	}
	var want int64
	for i := 1; i <= n; i++ {
		want += int64(i%7+1) + 2
	}
	if got := d.inspectSpend(id); got != want {
		t.Fatalf("the ledger charged %d tokens; the capsule settled %d", got, want)
	}
	if l := d.spend(); l.Charged != strconv.FormatInt(want, 10) || l.Reserved != "0" {
		t.Fatalf("the day: %+v, want %d charged", l, want)
	}
}
