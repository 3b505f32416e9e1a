package gateway

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"roost.dev/roost/internal/fakellm"
	"roost.dev/roost/pkg/config"
)

// claudeCodeBody is a call shaped like Claude Code's: a system prompt of about systemBytes
// of prose and code, 24 tools with JSON schemas, a few messages with a tool call and its
// result, thinking enabled below max_tokens, streamed.
func claudeCodeBody(maxTokens, systemBytes int) string {
	rng := rand.New(rand.NewPCG(1, 2))
	words := strings.Fields("the session runs a capsule and its tools read files write patches in the repository when asked " +
		"never commit secrets prefer small changes use grep before editing explain why; return JSON with fields path, line, reason " +
		"IMPORTANT: you must follow the user's instructions exactly (unless unsafe) — e.g. `git status`, `go test ./...`")
	var sys strings.Builder
	for sys.Len() < systemBytes {
		if rng.IntN(12) == 0 {
			sys.WriteString("\n\n```go\nfunc (g *Gateway) Serve(w http.ResponseWriter, r *http.Request) {\n\tif err := g.check(r); err != nil {\n\t\treturn\n\t}\n}\n```\n\n- ")
		}
		sys.WriteString(words[rng.IntN(len(words))])
		sys.WriteByte("       .,\n"[rng.IntN(10)])
	}
	var tools []string
	for i := range 24 {
		tools = append(tools, fmt.Sprintf(`{"name":"Tool%d","description":"Reads or edits files in the workspace; use it when the user asks to change file number %d. Prefer it over shell commands.","input_schema":{"type":"object","properties":{"file_path":{"type":"string","description":"The absolute path to the file"},"offset":{"type":"number","description":"The line to start at"},"replace_all":{"type":"boolean","default":false}},"required":["file_path"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"}}`, i, i))
	}
	system, _ := json.Marshal(sys.String())
	return `{"model":"claude-x","messages":[{"role":"user","content":[{"type":"text","text":"Fix the failing test in pkg/gateway, then run it.\n"}]},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"toolu_01","name":"Tool1","input":{"file_path":"/work/pkg/gateway/gateway.go"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01","content":"package gateway\n\nimport \"fmt\"\n\nfunc f() { fmt.Println(\"héllo 世界 ✓\") }\n"}]}],` +
		`"system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}},{"type":"text","text":` + string(system) + `}],` +
		`"tools":[` + strings.Join(tools, ",") + `],"metadata":{"user_id":"u"},"max_tokens":` + strconv.Itoa(maxTokens) +
		`,"thinking":{"type":"enabled","budget_tokens":` + strconv.Itoa(maxTokens-1) + `},"stream":true}`
}

// The estimate bounds what a tokenizer bills (fakellm.CountTokens) on every kind of text,
// and closely on a Claude Code call: 1.21× here (1.18× on a body Claude Code 2.1.197 sent),
// where bytes ÷ 4 is 0.71× (0.89×), under what is billed.
func TestEstimateBoundsTokenizer(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		most       float64
	}{
		{"claude code", claudeCodeBody(64000, 62<<10), 1.3},
		{"cjk", `{"messages":[{"role":"user","content":"` + strings.Repeat("会话在容器中运行代理。", 400) + `"}]}`, 1.3},
		{"emoji and accents", `{"messages":[{"role":"user","content":"` + strings.Repeat("café ✓ 🚀 naïve ", 300) + `"}]}`, 2},
		{"dense code", `{"input":` + strconv.Quote(strings.Repeat("if(a[i]>b[j]){x+=f(y,z)*2;}else{q--;}\n\t\t", 300)) + `}`, 2},
		{"digits and escapes", `{"prompt":"` + strings.Repeat(`12345 67\n\t\"x\" \u00e9\\ `, 300) + `"}`, 2.5},
		{"indentation", `{"input":` + strconv.Quote(strings.Repeat("\n        return nil\n    }\n", 300)) + `}`, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			est, billed := estimateBody([]byte(tc.body)), int64(fakellm.CountTokens([]byte(tc.body)))
			ratio := float64(est) / float64(billed)
			t.Logf("%d bytes: estimate %d, billed %d (%.2f×), bytes÷4 %d", len(tc.body), est, billed, ratio, len(tc.body)/4)
			if est < billed || ratio > tc.most {
				t.Errorf("estimate %d for %d billed: %.2f×, want 1 to %.2f", est, billed, ratio, tc.most)
			}
		})
	}
}

// A call whose worst case does not fit what its ceiling leaves is lowered to what fits —
// each limit the body sets, a thinking budget below it, or the default's member added —
// and says so; one whose least (MinOutputTokens an answer, a thinking budget's floor) does
// not fit is refused with the least it asked for.
func TestLowersToWhatFits(t *testing.T) {
	withDefault := func(c *rigConfig) { c.upstream.DefaultMaxOutputTokens = 4096 }
	for _, tc := range []struct {
		name, format, path, body string
		// room is the output the ceiling leaves above the input estimate; per the cap
		// each answer is lowered to (0: refused).
		room, per int64
		sent      []string
	}{
		{"anthropic thinking", config.FormatAnthropic, "/v1/messages", `{"model":"c","max_tokens":64000,"thinking":{"type":"enabled","budget_tokens":63999},"messages":[{"role":"user","content":"hi"}]}`,
			12000, 12000, []string{`"max_tokens":12000`, `"thinking":{"type":"enabled","budget_tokens":11999}`}},
		{"chat both limits, n", config.FormatOpenAI, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2,"max_tokens":900,"max_completion_tokens":1000}`,
			1201, 600, []string{`"max_tokens":600`, `"max_completion_tokens":600`, `"n":2`}},
		{"chat default assumed", config.FormatOpenAI, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			700, 700, []string{`"max_completion_tokens":700`}},
		{"responses", config.FormatOpenAI, "/v1/responses", `{"model":"m","input":"hi","max_output_tokens":5000}`,
			300, 300, []string{`"max_output_tokens":300`}},
		{"completions best_of", config.FormatOpenAI, "/v1/completions", `{"model":"m","prompt":"hi","best_of":3,"max_tokens":1000}`,
			900, 300, []string{`"max_tokens":300`, `"best_of":3`}},
		{"least does not fit", config.FormatAnthropic, "/v1/messages", `{"model":"c","max_tokens":64000,"messages":[{"role":"user","content":"hi"}]}`,
			255, 0, nil},
		{"thinking floor does not fit", config.FormatAnthropic, "/v1/messages", `{"model":"c","max_tokens":64000,"thinking":{"type":"enabled","budget_tokens":2000},"messages":[{"role":"user","content":"hi"}]}`,
			1024, 0, nil},
		{"n times the least does not fit", config.FormatOpenAI, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":4,"max_tokens":1000}`,
			1023, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			input := estimateBody([]byte(tc.body))
			var mu sync.Mutex
			var calls []CallRecord
			// A Messages call is admitted for its upstream's count when it does not fit.
			admitted := input
			if tc.format == config.FormatAnthropic {
				admitted = countedMargin(input)
			}
			r := newRig(t, tc.format, admitted+tc.room, Caller{OnCall: func(c CallRecord) { mu.Lock(); calls = append(calls, c); mu.Unlock() }}, withDefault)
			r.fake.SetConfig(fakellm.Config{APIKey: operatorKey, InputTokens: int(input), OutputTokens: 100000})
			status, h, out := r.post(tc.path, tc.body, "Anthropic-Version", "2023-06-01")
			if tc.per == 0 {
				if status != http.StatusTooManyRequests || h.Get("X-Should-Retry") != "false" || h.Get(LoweredHeader) != "" {
					t.Fatalf("%d %v %s", status, h, out)
				}
				_, roost := envelope(t, tc.format, out, map[string]string{config.FormatOpenAI: "insufficient_quota", config.FormatAnthropic: "rate_limit_error"}[tc.format])
				if roost["limit"] != "session" || roost["requested"].(float64) <= float64(admitted+tc.room) || roost["latched"] != true {
					t.Errorf("the refusal: %s", out)
				}
				r.noModelCall()
				return
			}
			if status != 200 {
				t.Fatalf("%d %s", status, out)
			}
			from := map[string]string{"chat default assumed": "4096", "chat both limits, n": "1000", "responses": "5000", "completions best_of": "1000"}[tc.name]
			if from == "" {
				from = "64000"
			}
			if got, want := h.Get(LoweredHeader), from+"->"+strconv.FormatInt(tc.per, 10); got != want {
				t.Errorf("%s: %q, want %q", LoweredHeader, got, want)
			}
			reqs := r.fake.Requests()
			sent := string(reqs[len(reqs)-1].Body)
			for _, want := range tc.sent {
				if !strings.Contains(sent, want) {
					t.Errorf("the upstream saw %s, want %s in it", sent, want)
				}
			}
			// The answers filled their caps: the ceiling is met to the token, not crossed.
			s := r.spent()
			if s.Charged > admitted+tc.room || s.Reserved != 0 {
				t.Errorf("ledger %+v under a ceiling of %d", s, admitted+tc.room)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(calls) != 1 || calls[0].LoweredFrom == 0 || calls[0].LoweredTo != tc.per || calls[0].Charged != s.Charged {
				t.Errorf("call records %+v", calls)
			}
		})
	}
	// A call that fits is sent as it came, without the header.
	r := newRig(t, config.FormatAnthropic, 0, Caller{})
	body := `{"model":"c","max_tokens":64000,"messages":[{"role":"user","content":"hi"}]}`
	if status, h, out := r.post("/v1/messages", body, "Anthropic-Version", "2023-06-01"); status != 200 || h.Get(LoweredHeader) != "" {
		t.Fatalf("%d %v %s", status, h, out)
	}
	if sent := string(r.fake.Requests()[0].Body); sent != body {
		t.Errorf("the upstream saw %s", sent)
	}
}

// Over random budgets, request sizes and concurrent calls, against a fake that bills what a
// tokenizer counts and answers with every token its cap allows: what is charged never
// passes the budget, no call is charged above its reservation, and a call is refused only
// when not even its least fits after what was charged.
func TestNeverOverNeverRefusedWhileLeastFits(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 9))
			budget := 2000 + rng.Int64N(60000)
			var overruns overruns
			r := newRig(t, config.FormatAnthropic, budget, Caller{OnOverrun: overruns.hook})
			r.fake.SetConfig(fakellm.Config{APIKey: operatorKey, CountInput: true, OutputTokens: 1 << 20})
			var mu sync.Mutex
			var leasts []float64
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(seed, uint64(w)))
					for range 8 {
						body := `{"model":"c","max_tokens":` + strconv.Itoa(1+rng.IntN(20000)) + `,"stream":` + strconv.FormatBool(rng.IntN(2) == 0) +
							`,"messages":[{"role":"user","content":` + strconv.Quote(strings.Repeat("word, 12 ü ", rng.IntN(400))) + `}]}`
						status, _, out := r.post("/v1/messages", body, "Anthropic-Version", "2023-06-01")
						switch status {
						case 200:
						case http.StatusTooManyRequests:
							_, roost := envelope(t, config.FormatAnthropic, out, "rate_limit_error")
							mu.Lock()
							leasts = append(leasts, roost["requested"].(float64))
							mu.Unlock()
						default:
							t.Errorf("%d %s", status, out)
						}
					}
				}()
			}
			wg.Wait()
			s := r.spent()
			if s.Charged > budget || s.Reserved != 0 {
				t.Fatalf("charged %d (reserved %d) of a budget of %d", s.Charged, s.Reserved, budget)
			}
			if got := overruns.all(); len(got) != 0 {
				t.Errorf("calls charged above their reservation: %+v", got)
			}
			for _, least := range leasts {
				if float64(s.Charged)+least <= float64(budget) {
					t.Errorf("refused a least of %.0f with %d of %d charged", least, s.Charged, budget)
				}
			}
			t.Logf("budget %d: charged %d, %d refusals", budget, s.Charged, len(leasts))
		})
	}
}

// A session under a 30k or a 100k budget makes Claude Code's calls (max_tokens 64000, a
// body of 50 or 80 KB: ~80k tokens each at worst) until what is left cannot hold another
// call's input and least output — where reserving the worst case refused the first call of
// either. (An 80 KB body bills ~29k tokens of input: under 30k, one such call cannot fit.)
func TestClaudeCodeSpendsItsBudget(t *testing.T) {
	for _, tc := range []struct{ budget, system int64 }{{30_000, 32 << 10}, {100_000, 62 << 10}} {
		budget := tc.budget
		t.Run(fmt.Sprint(budget), func(t *testing.T) {
			r := newRig(t, config.FormatAnthropic, budget, Caller{})
			r.fake.SetConfig(fakellm.Config{APIKey: operatorKey, CountInput: true, OutputTokens: 1500})
			body := claudeCodeBody(64000, int(tc.system))
			least := estimateBody([]byte(body)) + minThinkingTokens + 1
			calls := 0
			for {
				status, h, out := r.post("/v1/messages", body, "Anthropic-Version", "2023-06-01", "Anthropic-Beta", "claude-code-20250219")
				if status == http.StatusTooManyRequests {
					break
				}
				if status != 200 {
					t.Fatalf("call %d: %d %s", calls, status, out)
				}
				if left := budget - r.spent().Charged; left+1500 < 64000 && h.Get(LoweredHeader) == "" && calls == 0 {
					t.Errorf("call %d was not lowered", calls)
				}
				calls++
			}
			s := r.spent()
			left := budget - s.Charged
			t.Logf("budget %d, %d bytes: %d calls, charged %d, %d left (a call's least is %d)", budget, len(body), calls, s.Charged, left, least)
			if calls == 0 || s.Charged > budget || left >= least {
				t.Errorf("%d calls, %d of %d charged: refused with %d left, a call needing %d", calls, s.Charged, budget, left, least)
			}
		})
	}
}

// The ids agents send of their session, thread and request reach the upstream (which may
// key its prompt cache on them), as claude 2.1.197 and codex send them; credentials and
// hop-by-hop headers do not. The gateway's base URL answers a probe with 200.
func TestAgentHeadersForwarded(t *testing.T) {
	r := newRig(t, config.FormatOpenAI, 0, Caller{})
	req, _ := http.NewRequest("POST", r.url+"/v1/responses", strings.NewReader(`{"model":"m","input":"hi"}`))
	req.Header.Set("Authorization", "Bearer roost-placeholder")
	friendly := map[string]string{"session_id": "s-1", "conversation_id": "c-1", "originator": "codex_cli_rs", "X-Claude-Code-Session-Id": "b24b",
		"X-Client-Request-Id": "r-1", "Thread-Id": "t-1", "X-App": "cli", "Version": "0.171.0", "X-Stainless-Os": "Linux"}
	hostile := map[string]string{"Chatgpt-Account-Id": "acct", "OpenAI-Organization": "org", "Cookie": "a=b", "Keep-Alive": "timeout=5", "Te": "trailers", "X-Api-Key": "k"}
	for k, v := range friendly {
		req.Header[k] = []string{v}
	}
	for k, v := range hostile {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%d", resp.StatusCode)
	}
	h := r.fake.Requests()[0].Header
	for k, v := range friendly {
		if got := h.Get(k); got != v {
			t.Errorf("the upstream saw %s %q, want %q", k, got, v)
		}
	}
	for k := range hostile {
		if got := h.Values(k); len(got) != 0 {
			t.Errorf("the upstream saw %s %q", k, got)
		}
	}
	for _, method := range []string{"HEAD", "GET"} {
		req, _ := http.NewRequest(method, r.url+"/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s /: %d", method, resp.StatusCode)
		}
	}
	if n := len(r.fake.Requests()); n != 1 {
		t.Errorf("the probes reached the upstream: %d requests", n)
	}
	// POST / names no route.
	if status, _, out := r.post("/", `{}`); status != 400 || !strings.Contains(out, "invalid_path") {
		t.Errorf("POST /: %d %s", status, out)
	}
}

// FuzzEstimate feeds the input estimate any JSON object: it never panics, and it bounds
// what fakellm's tokenizer bills for the same body.
func FuzzEstimate(f *testing.F) {
	f.Add(`{"messages":[{"role":"user","content":"hi \u00e9\n\t  x 12345"}],"tools":[{"name":"a","input_schema":{}}]}`)
	f.Add(`{"system":"  \n\n   indented\\\"x","input":[{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]}`)
	f.Add(`{"prompt":["会话 🚀", 1, true, null, {"data":"QUJD"}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		if !json.Valid([]byte(body)) || !strings.HasPrefix(strings.TrimLeft(body, " \t\r\n"), "{") {
			return
		}
		est, billed := estimateBody([]byte(body)), int64(fakellm.CountTokens([]byte(body)))
		if est < 1 || est < billed {
			t.Fatalf("estimate %d, billed %d: %s", est, billed, body)
		}
	})
}

// A Messages call whose worst case does not fit is admitted for the upstream's own count of
// its input (messages/count_tokens), not the estimate: Claude Code's 80 KB calls, billed 1,500
// input tokens apiece, spend a 20,000-token session down to less than one more call's least,
// where the estimate (some 25,000 tokens of input) would have refused the first. The count
// asks with only the members count_tokens takes.
func TestCountsInputNearTheCeiling(t *testing.T) {
	const budget, billed = 20_000, 1500
	var mu sync.Mutex
	var calls []CallRecord
	r := newRig(t, config.FormatAnthropic, budget, Caller{OnCall: func(c CallRecord) { mu.Lock(); calls = append(calls, c); mu.Unlock() }})
	r.fake.SetConfig(fakellm.Config{APIKey: operatorKey, InputTokens: billed, OutputTokens: billed})
	body := claudeCodeBody(64000, 80<<10)
	if est := estimateBody([]byte(body)); est <= budget {
		t.Fatalf("the body's estimate is %d tokens: the test needs one above the budget", est)
	}
	n := 0
	for ; ; n++ {
		status, h, out := r.post("/v1/messages", body, "Anthropic-Version", "2023-06-01", "Anthropic-Beta", "claude-code-20250219")
		if status == http.StatusTooManyRequests {
			break
		}
		if status != 200 || h.Get(LoweredHeader) == "" {
			t.Fatalf("call %d: %d %s: %s", n, status, h.Get(LoweredHeader), out)
		}
	}
	s := r.spent()
	least := countedMargin(billed) + minThinkingTokens + 1
	t.Logf("%d calls, %d of %d charged, %d left; a call's least is %d", n, s.Charged, budget, budget-s.Charged, least)
	if n == 0 || s.Charged > budget || budget-s.Charged >= least || s.Reserved != 0 {
		t.Fatalf("%d calls, ledger %+v: refused with %d left, a call needing %d", n, s, budget-s.Charged, least)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, c := range calls {
		if !c.InputCounted || c.InputTokens != billed || c.Charged > c.Reserved {
			t.Errorf("call record %+v", c)
		}
	}
	counts := 0
	for _, req := range r.fake.Requests() {
		if !strings.HasSuffix(req.Path, "/count_tokens") {
			continue
		}
		counts++
		var members map[string]json.RawMessage
		if err := json.Unmarshal(req.Body, &members); err != nil {
			t.Fatal(err)
		}
		for name := range members {
			if !slices.Contains(countedFields, name) {
				t.Errorf("the count was sent %s", name)
			}
		}
		for _, name := range []string{"model", "system", "messages", "tools", "thinking"} {
			if _, ok := members[name]; !ok {
				t.Errorf("the count was not sent %s", name)
			}
		}
		if req.Header.Get("X-Api-Key") != operatorKey || req.Header.Get("Anthropic-Beta") != "claude-code-20250219" {
			t.Errorf("the count's headers: %v", req.Header)
		}
	}
	if counts != n+1 {
		t.Errorf("%d counts for %d calls and a refusal", counts, n)
	}
}
