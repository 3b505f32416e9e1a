package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"roost.dev/roost/internal/fakellm"
	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/metrics"
)

// scrape returns the lines of the metrics that start with prefix.
func scrape(mtr *metrics.Metrics, prefix string) []string {
	rec := httptest.NewRecorder()
	mtr.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var out []string
	for line := range strings.Lines(rec.Body.String()) {
		if strings.HasPrefix(line, prefix) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// overruns collects what a caller's OnOverrun hears.
type overruns struct {
	mu  sync.Mutex
	got []ledger.Settlement
}

func (o *overruns) hook(s ledger.Settlement) { o.mu.Lock(); o.got = append(o.got, s); o.mu.Unlock() }

func (o *overruns) all() []ledger.Settlement {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]ledger.Settlement(nil), o.got...)
}

// An upstream that reports more than the call's own limits allow: the truth is charged, past
// the reservation, and the overrun is told (the session's spend.overrun event) and counted.
func TestOverrunChargedAndTold(t *testing.T) {
	for _, tc := range []struct{ name, format, path, body string }{
		{"openai json", config.FormatOpenAI, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`},
		{"anthropic stream", config.FormatAnthropic, "/v1/messages", `{"model":"c","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mtr := metrics.New(nil, func() map[string]int { return nil })
			var heard overruns
			r := newRig(t, tc.format, 0, Caller{OnOverrun: heard.hook}, func(c *rigConfig) { c.observer = mtr })
			r.fake.SetConfig(fakellm.Config{APIKey: operatorKey, InputTokens: 12, OutputTokens: 30, ExceedLimits: true})
			if status, _, out := r.post(tc.path, tc.body, "Anthropic-Version", "2023-06-01"); status != 200 {
				t.Fatalf("%d %s", status, out)
			}
			reserved := estimateBody(r.fake.Requests()[0].Body) + 10
			if s := r.spent(); s.Charged != 42 || s.OutputTokens != 30 || s.Reserved != 0 {
				t.Errorf("ledger: %+v, want the reported 12 + 30", s)
			}
			if got := heard.all(); len(got) != 1 || got[0].Reserved != reserved || got[0].Charged != 42 || got[0].SessionID != "s1" {
				t.Errorf("overruns heard: %+v, want reserved %d charged 42", got, reserved)
			}
			if got := scrape(mtr, "roost_spend_overruns_total{"); len(got) != 1 || got[0] != `roost_spend_overruns_total{capsule="agent"} 1` {
				t.Errorf("metrics: %q", got)
			}
		})
	}
}

// With the fake honouring n, best_of and lists of prompts, the allowlisted routes' worst case
// covers what they report: no overrun, each call charged exactly its usage.
func TestNoOverrunOnAllowlistedRoutes(t *testing.T) {
	for _, tc := range []struct {
		path, body string
		out        int64
	}{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2,"max_tokens":100}`, 60},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":3,"max_tokens":10,"stream":true}`, 30},
		{"/v1/completions", `{"model":"m","prompt":"hi","best_of":3,"max_tokens":10}`, 30},
		{"/v1/completions", `{"model":"m","prompt":["a","b"],"n":2,"max_tokens":10}`, 40},
		{"/v1/completions", `{"model":"m","prompt":"hi","n":2,"max_tokens":5,"stream":true}`, 10},
		{"/v1/embeddings", `{"model":"m","input":["a","b"]}`, 0},
		{"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":20}`, 20},
	} {
		t.Run(tc.body, func(t *testing.T) {
			var heard overruns
			r := newRig(t, config.FormatOpenAI, 0, Caller{OnOverrun: heard.hook})
			// The input is estimated from the body's size (four bytes a token), not bounded:
			// the fake reports less than these small bodies' estimates.
			r.fake.SetConfig(fakellm.Config{APIKey: operatorKey, InputTokens: 5, OutputTokens: 30})
			if status, _, out := r.post(tc.path, tc.body); status != 200 {
				t.Fatalf("%d %s", status, out)
			}
			if s := r.spent(); s.InputTokens != 5 || s.OutputTokens != tc.out || s.Reserved != 0 {
				t.Errorf("ledger: %+v, want 5 + %d", s, tc.out)
			}
			if got := heard.all(); len(got) != 0 {
				t.Errorf("overruns: %+v", got)
			}
		})
	}
}

// The fake's streams with a comment before every event and every event's data over several
// lines are metered exactly.
func TestFakeStreamsCommentedAndMultiline(t *testing.T) {
	for _, tc := range []struct{ format, path, body string }{
		{config.FormatOpenAI, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{config.FormatOpenAI, "/v1/responses", `{"model":"m","stream":true,"input":"hi"}`},
		{config.FormatOpenAI, "/v1/completions", `{"model":"m","stream":true,"prompt":"hi","max_tokens":100}`},
		{config.FormatAnthropic, "/v1/messages", `{"model":"c","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			r := newRig(t, tc.format, 0, Caller{})
			r.fake.SetConfig(fakellm.Config{APIKey: operatorKey, InputTokens: 12, OutputTokens: 30, SSEComments: true, MultilineData: true})
			status, _, out := r.post(tc.path, tc.body, "Anthropic-Version", "2023-06-01")
			if status != 200 || !strings.Contains(out, ": keep-alive\n") || !strings.Contains(out, ",\ndata: ") {
				t.Fatalf("%d %s", status, out)
			}
			if s := r.spent(); s.InputTokens != 12 || s.OutputTokens != 30 || s.Reserved != 0 {
				t.Errorf("ledger: %+v", s)
			}
		})
	}
}

// A stream cut before its usage is whole is charged the most it could have cost: Anthropic's
// message_start reports the input and one token of output, the rest is never told.
func TestCutStreamChargesWorstCase(t *testing.T) {
	r := newRig(t, config.FormatAnthropic, 0, Caller{})
	sseUpstream(t, r, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n")
	body := `{"model":"c","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	if status, _, out := r.post("/v1/messages", body, "Anthropic-Version", "2023-06-01"); status != 200 {
		t.Fatalf("%d %s", status, out)
	}
	if s := r.spent(); s.OutputTokens != 64 || s.InputTokens < 9 || s.Reserved != 0 {
		t.Errorf("ledger: %+v, want all 64 of output", s)
	}
}

// declaredUpstream is an upstream serving the routes TestDeclaredRoutes declares; it records
// each request's method, escaped path and query.
type declaredUpstream struct {
	mu   sync.Mutex
	seen []string
}

func (d *declaredUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	d.mu.Lock()
	d.seen = append(d.seen, r.Method+" "+r.URL.EscapedPath()+"?"+r.URL.RawQuery+" auth="+r.Header.Get("Authorization"))
	d.mu.Unlock()
	switch path := r.URL.Path; {
	case strings.HasSuffix(path, "/v1/audio/speech"):
		w.Header().Set("Content-Type", "audio/mpeg")
		w.Write([]byte("ID3 not really mp3"))
	case strings.HasSuffix(path, "/v1/images/generations"):
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"data":[],"usage":{"input_tokens":50,"output_tokens":100,"total_tokens":150}}`))
	default:
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"ok":true}`))
	}
}

func (d *declaredUpstream) requests() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.seen...)
}

// Routes the operator declares: unmetered ones are forwarded uncharged; metered ones are
// admitted for their declared tokens and charged the usage reported, or the declared tokens
// when none is; a wildcard segment goes as one escaped segment; only declared query
// parameters pass.
func TestDeclaredRoutes(t *testing.T) {
	no, yes := false, true
	routes := []config.Route{
		{Method: "POST", Path: "v1/audio/speech", Metered: &no},
		{Method: "POST", Path: "v1/images/generations", Metered: &yes, Tokens: 500},
		{Method: "POST", Path: "v1/moderations", Metered: &yes, Tokens: 40},
		{Method: "GET", Path: "v1/files/{id}/content", Metered: &no, Query: []string{"limit"}},
	}
	up := &declaredUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	r := newRig(t, config.FormatOpenAI, 600, Caller{}, func(c *rigConfig) { c.upstream.Routes = routes })
	setUpstreamURL(r, srv.URL+"/base")

	if status, _, out := r.raw("POST", "v1/audio/speech", `{"model":"tts-1","input":"hi","voice":"alloy"}`); status != 200 || out != "ID3 not really mp3" {
		t.Fatalf("speech: %d %s", status, out)
	}
	if s := r.spent(); s.Charged != 0 || s.Reserved != 0 {
		t.Errorf("after an unmetered route: %+v", s)
	}
	if status, _, out := r.raw("POST", "v1/images/generations", `{"model":"gpt-image-1","prompt":"a cat"}`); status != 200 {
		t.Fatalf("images: %d %s", status, out)
	}
	if s := r.spent(); s.Charged != 150 || s.Reserved != 0 {
		t.Errorf("after a metered route reporting usage: %+v", s)
	}
	if status, _, out := r.raw("POST", "v1/moderations", `{"input":"hi"}`); status != 200 {
		t.Fatalf("moderations: %d %s", status, out)
	}
	if s := r.spent(); s.Charged != 190 {
		t.Errorf("after a metered route reporting nothing: %+v", s)
	}
	if status, _, out := r.raw("GET", "v1/files/file:a%20b/content?limit=1", ""); status != 200 {
		t.Fatalf("file content: %d %s", status, out)
	}
	if status, _, out := r.raw("GET", "v1/files/x/content?purpose=evil", ""); status != 400 || !strings.Contains(out, `query parameter \"purpose\"`) {
		t.Fatalf("an undeclared query parameter: %d %s", status, out)
	}
	if status, _, out := r.raw("DELETE", "v1/files/x/content", ""); status != 403 {
		t.Fatalf("another method: %d %s", status, out)
	}
	// 190 charged of 600: another image call's 500 would cross the ceiling.
	before := len(up.requests())
	if status, _, out := r.raw("POST", "v1/images/generations", `{}`); status != 429 || !strings.Contains(out, `"requested":500`) {
		t.Fatalf("past the ceiling: %d %s", status, out)
	}
	want := []string{
		"POST /base/v1/audio/speech? auth=Bearer " + operatorKey,
		"POST /base/v1/images/generations? auth=Bearer " + operatorKey,
		"POST /base/v1/moderations? auth=Bearer " + operatorKey,
		"GET /base/v1/files/file:a%20b/content?limit=1 auth=Bearer " + operatorKey,
	}
	got := up.requests()
	if len(got) != before || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the upstream saw:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The model label: the declared model, or one the upstream's models list names; anything
// else is "other".
func TestModelLabelListed(t *testing.T) {
	mtr := metrics.New(nil, func() map[string]int { return nil })
	r := newRig(t, config.FormatOpenAI, 0, Caller{}, func(c *rigConfig) {
		c.observer = mtr
		c.upstream.Models = []string{"gpt-listed"}
	})
	for _, model := range []string{"gpt-listed", "gpt-listed", "gpt-random", "gpt-listed-not"} {
		if status, _, out := r.post("/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, model)); status != 200 {
			t.Fatalf("%d %s", status, out)
		}
	}
	r.caller.Model = "gpt-declared"
	if status, _, out := r.post("/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`); status != 200 {
		t.Fatalf("%d %s", status, out)
	}
	got := scrape(mtr, "roost_spent_tokens_total{")
	want := []string{
		`roost_spent_tokens_total{capsule="agent",model="gpt-declared"} 17`,
		`roost_spent_tokens_total{capsule="agent",model="gpt-listed"} 34`,
		`roost_spent_tokens_total{capsule="agent",model="other"} 34`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("series:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Query parameters: only the route's own pass (Anthropic's beta=true, its models paging).
func TestQueryParameters(t *testing.T) {
	r := newRig(t, config.FormatOpenAI, 0, Caller{})
	if status, _, out := r.raw("POST", "v1/chat/completions?api-version=2024-01-01", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); status != 400 || !strings.Contains(out, "api-version") {
		t.Fatalf("%d %s", status, out)
	}
	if status, _, out := r.raw("POST", "v1/chat/completions?%zz", `{}`); status != 400 {
		t.Fatalf("a query that does not parse: %d %s", status, out)
	}
	r.nothingUpstream()
	a := newRig(t, config.FormatAnthropic, 0, Caller{})
	if status, _, out := a.raw("POST", "v1/messages?beta=true", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "Anthropic-Version", "2023-06-01"); status != 200 {
		t.Fatalf("beta=true: %d %s", status, out)
	}
}

// An upstream URL with a path of its own keeps it: the route goes under it; an id goes as one
// escaped segment.
func TestUpstreamPathPrefix(t *testing.T) {
	up := &declaredUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	r := newRig(t, config.FormatOpenAI, 0, Caller{})
	setUpstreamURL(r, srv.URL+"/tenant-a/openai/")
	r.raw("GET", "v1/models/ft:gpt-4o:org:x", "")
	r.raw("GET", "v1/models/a%20b", "")
	r.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	want := []string{
		"GET /tenant-a/openai/v1/models/ft:gpt-4o:org:x? auth=Bearer " + operatorKey,
		"GET /tenant-a/openai/v1/models/a%20b? auth=Bearer " + operatorKey,
		"POST /tenant-a/openai/v1/chat/completions? auth=Bearer " + operatorKey,
	}
	if got := up.requests(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the upstream saw:\n%s", strings.Join(got, "\n"))
	}
}

// Every built-in route is one the configuration refuses to declare again.
func TestBuiltinRoutesMatchConfig(t *testing.T) {
	for format, routes := range builtinRoutes {
		for _, rt := range routes {
			path := strings.ReplaceAll(strings.Join(rt.segs, "/"), wildcard, "{id}")
			src := fmt.Sprintf("inference:\n  upstreams:\n    - name: u\n      format: %s\n      url: http://x\n      api_key_file: /k\n      routes:\n        - {method: %s, path: %q, metered: false}\n", format, rt.method, path)
			if _, err := config.Parse([]byte(src), "roostd.yaml"); err == nil || !strings.Contains(err.Error(), "is built in") {
				t.Errorf("%s %s: %v", format, rt.String(), err)
			}
		}
	}
}

// A body past the endpoint's bound, an unreachable upstream: each in the envelope, the
// first permanent, the second left to the SDK's retries.
func TestOtherErrorEnvelopes(t *testing.T) {
	r := newRig(t, config.FormatAnthropic, 0, Caller{})
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/v1/inference/up/v1/messages", strings.NewReader(`{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"a long conversation"}]}`))
	req.Body = http.MaxBytesReader(rec, req.Body, 10)
	r.gw.Serve(rec, req, r.caller, "up", "v1/messages")
	if rec.Code != http.StatusRequestEntityTooLarge || rec.Header().Get("X-Should-Retry") != "false" {
		t.Fatalf("%d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	envelope(t, config.FormatAnthropic, rec.Body.String(), "request_too_large")
	r.nothingUpstream()

	r.fake.Close()
	status, h, out := r.post("/v1/messages", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "Anthropic-Version", "2023-06-01")
	if status != http.StatusBadGateway || h.Get("X-Should-Retry") != "" {
		t.Fatalf("%d %v %s", status, h, out)
	}
	var e anthropicEnvelope
	if json.Unmarshal([]byte(out), &e); e.Error == nil || e.Error.Type != "api_error" || e.Roost["code"] != "upstream_unreachable" {
		t.Errorf("%s", out)
	}
}
