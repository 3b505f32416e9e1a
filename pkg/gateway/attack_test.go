package gateway

// The gateway tried as an attacker would: routes and paths the upstream must never see, the
// caller's credentials, ceilings overrun by multipliers, unmetered routes charged, and the
// errors the providers' SDKs have to understand.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/metrics"
)

// raw sends one request with exactly the request-target given (no client cleans or escapes
// it), under the rig's /v1/inference/up/.
func (r *rig) raw(method, target, body string, header ...string) (int, http.Header, string) {
	r.t.Helper()
	addr := strings.TrimPrefix(strings.TrimSuffix(r.url, "/v1/inference/up"), "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		r.t.Fatal(err)
	}
	defer c.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "%s /v1/inference/up/%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Length: %d\r\n", method, target, addr, len(body))
	fmt.Fprintf(&b, "Authorization: Bearer roost-placeholder\r\n")
	for i := 0; i+1 < len(header); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", header[i], header[i+1])
	}
	b.WriteString("\r\n" + body)
	if _, err := io.WriteString(c, b.String()); err != nil {
		r.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data)
}

// nothingUpstream fails unless the fake upstream saw no request at all.
func (r *rig) nothingUpstream() {
	r.t.Helper()
	if reqs := r.fake.Requests(); len(reqs) != 0 {
		r.t.Fatalf("the upstream saw %d requests, the first %s %s", len(reqs), reqs[0].Method, reqs[0].Path)
	}
}

// noModelCall fails the test if a model call reached the upstream: a count of its input
// (messages/count_tokens, free) may have, when its ceilings left less than its worst case.
func (r *rig) noModelCall() {
	r.t.Helper()
	for _, req := range r.fake.Requests() {
		if !strings.HasSuffix(req.Path, "/count_tokens") {
			r.t.Fatalf("the upstream saw %s %s", req.Method, req.Path)
		}
	}
}

// openAIEnvelope is OpenAI's error body, with roost's detail beside it.
type openAIEnvelope struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
	Roost map[string]any `json:"roost"`
}

// anthropicEnvelope is Anthropic's.
type anthropicEnvelope struct {
	Type  string `json:"type"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	Roost map[string]any `json:"roost"`
}

// envelope checks an error body is the provider's shape with the given type, and returns its
// message and roost's detail.
func envelope(t *testing.T, format, body, wantType string) (string, map[string]any) {
	t.Helper()
	if format == config.FormatAnthropic {
		var e anthropicEnvelope
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Type != "error" || e.Error == nil || e.Error.Message == "" {
			t.Fatalf("not Anthropic's error shape: %s", body)
		}
		if e.Error.Type != wantType {
			t.Errorf("error type %q, want %q: %s", e.Error.Type, wantType, body)
		}
		return e.Error.Message, e.Roost
	}
	var e openAIEnvelope
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil || e.Error.Message == "" {
		t.Fatalf("not OpenAI's error shape: %s", body)
	}
	if e.Error.Type != wantType {
		t.Errorf("error type %q, want %q: %s", e.Error.Type, wantType, body)
	}
	if e.Error.Param != nil || !strings.Contains(body, `"param":null`) || e.Error.Code == nil || *e.Error.Code == "" {
		t.Errorf("param and code must be there (param null): %s", body)
	}
	return e.Error.Message, e.Roost
}

func permissionType(format string) string {
	if format == config.FormatAnthropic {
		return "permission_error"
	}
	return "request_forbidden"
}

// Everything the providers' APIs offer besides model calls is refused, naming the method and
// the route, and never reaches the upstream.
func TestRoutesOffTheAllowlistRefused(t *testing.T) {
	for _, tc := range []struct {
		format, method, path string
	}{
		{config.FormatOpenAI, "DELETE", "v1/files/file-abc"},
		{config.FormatOpenAI, "GET", "v1/organization/admin_api_keys"},
		{config.FormatOpenAI, "POST", "v1/batches/x/cancel"},
		{config.FormatOpenAI, "POST", "v1/files"},
		{config.FormatOpenAI, "GET", "v1/chat/completions"},
		{config.FormatOpenAI, "PUT", "v1/chat/completions"},
		{config.FormatOpenAI, "POST", "v1/models"},
		{config.FormatOpenAI, "POST", "v1/messages"},
		{config.FormatOpenAI, "POST", "chat/completions"},
		{config.FormatAnthropic, "POST", "v1/messages/batches"},
		{config.FormatAnthropic, "DELETE", "v1/files/file_011"},
		{config.FormatAnthropic, "GET", "v1/organizations/api_keys"},
		{config.FormatAnthropic, "GET", "v1/messages"},
		{config.FormatAnthropic, "POST", "v1/chat/completions"},
	} {
		t.Run(tc.format+" "+tc.method+" "+tc.path, func(t *testing.T) {
			r := newRig(t, tc.format, 0, Caller{})
			status, h, body := r.raw(tc.method, tc.path, `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, "Content-Type", "application/json")
			if status != http.StatusForbidden {
				t.Fatalf("%d %s", status, body)
			}
			msg, _ := envelope(t, tc.format, body, permissionType(tc.format))
			if !strings.Contains(msg, tc.method+" "+tc.path) {
				t.Errorf("the message does not name the route: %q", msg)
			}
			if h.Get("X-Should-Retry") != "false" {
				t.Errorf("x-should-retry %q", h.Get("X-Should-Retry"))
			}
			r.nothingUpstream()
		})
	}
}

// Paths that could mean something else to the upstream or a proxy in front of it are
// refused before anything is matched: dot segments, encoded slashes and backslashes (once
// or twice encoded), backslashes, empty segments.
func TestUnsafePathsRefused(t *testing.T) {
	for _, target := range []string{
		"v1/%2e%2e/%2e%2e/admin/secrets",
		"v1/%2E%2E/%2E%2E/admin/secrets",
		"v1/chat%2fcompletions",
		"v1/chat%2Fcompletions",
		"v1%2fchat%2fcompletions",
		"v1/chat%5ccompletions",
		"v1/chat%5Ccompletions",
		"v1/chat%252fcompletions",
		"v1/chat%255ccompletions",
		`v1\chat\completions`,
		"v1/%2e/chat/completions",
		"v1/chat/completions/",
		"v1/chat/completions%00",
		"v1/models/gpt%2f..%2f..%2fadmin",
	} {
		t.Run(target, func(t *testing.T) {
			r := newRig(t, config.FormatOpenAI, 0, Caller{})
			setUpstreamURL(r, r.fake.URL()+"/tenant-a/openai")
			status, _, body := r.raw("POST", target, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
			if status != http.StatusBadRequest {
				t.Fatalf("%d %s", status, body)
			}
			envelope(t, config.FormatOpenAI, body, "invalid_request_error")
			r.nothingUpstream()
		})
	}
	// What a server's mux would redirect, handed to the gateway as such.
	for _, path := range []string{"v1//chat/completions", "v1/../../admin/secrets", "v1/./chat/completions", "./v1/models", "v1/models/.."} {
		t.Run("direct "+path, func(t *testing.T) {
			r := newRig(t, config.FormatOpenAI, 0, Caller{})
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("POST", "/v1/inference/up/"+path, strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
			r.gw.Serve(rec, req, r.caller, "up", path)
			if rec.Code != http.StatusBadRequest {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
			r.nothingUpstream()
		})
	}
}

// The upstream sees the operator's key and nothing of the caller's credentials,
// organisation or cookies; what the SDKs need (version and beta headers, idempotency keys,
// their own x-stainless-*) goes through.
func TestCallerCredentialsDropped(t *testing.T) {
	hostile := []string{
		"Authorization", "Bearer sk-capsule-own", "X-Api-Key", "sk-capsule-own",
		"OpenAI-Organization", "org-evil", "OpenAI-Project", "proj_evil", "Cookie", "session=evil",
		"Proxy-Authorization", "Basic ZXZpbA==", "X-Forwarded-For", "10.0.0.1", "Forwarded", "for=10.0.0.1",
		"X-Evil", "1", "Anthropic-Dangerous-Direct-Browser-Access", "true", "Helicone-Auth", "Bearer evil",
	}
	friendly := []string{"Idempotency-Key", "stainless-node-retry-1", "X-Stainless-Lang", "js", "X-Stainless-Retry-Count", "0", "User-Agent", "OpenAI/JS 6.49.0", "Accept", "application/json"}
	t.Run("openai", func(t *testing.T) {
		r := newRig(t, config.FormatOpenAI, 0, Caller{})
		hdr := append(append(append([]string{}, hostile...), friendly...), "OpenAI-Beta", "assistants=v2")
		if status, _, body := r.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, hdr...); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
		h := r.fake.Requests()[0].Header
		if got := h.Values("Authorization"); len(got) != 1 || got[0] != "Bearer "+operatorKey {
			t.Errorf("the upstream saw Authorization %q", got)
		}
		for _, name := range []string{"X-Api-Key", "OpenAI-Organization", "OpenAI-Project", "Cookie", "Proxy-Authorization", "X-Forwarded-For", "Forwarded", "X-Evil", "Anthropic-Dangerous-Direct-Browser-Access", "Helicone-Auth"} {
			if v := h.Values(name); len(v) != 0 {
				t.Errorf("the upstream saw %s: %q", name, v)
			}
		}
		for i := 0; i < len(friendly); i += 2 {
			if got := h.Get(friendly[i]); got != friendly[i+1] {
				t.Errorf("the upstream saw %s %q, want %q", friendly[i], got, friendly[i+1])
			}
		}
		if h.Get("OpenAI-Beta") != "assistants=v2" {
			t.Errorf("OpenAI-Beta %q", h.Get("OpenAI-Beta"))
		}
	})
	t.Run("anthropic", func(t *testing.T) {
		r := newRig(t, config.FormatAnthropic, 0, Caller{})
		hdr := append(append(append([]string{}, hostile...), friendly...), "Anthropic-Version", "2023-06-01", "Anthropic-Beta", "prompt-caching-2024-07-31")
		if status, _, body := r.post("/v1/messages", `{"model":"c","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`, hdr...); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
		h := r.fake.Requests()[0].Header
		if got := h.Values("X-Api-Key"); len(got) != 1 || got[0] != operatorKey {
			t.Errorf("the upstream saw X-Api-Key %q", got)
		}
		for _, name := range []string{"Authorization", "OpenAI-Organization", "Cookie", "X-Evil", "Anthropic-Dangerous-Direct-Browser-Access"} {
			if v := h.Values(name); len(v) != 0 {
				t.Errorf("the upstream saw %s: %q", name, v)
			}
		}
		if h.Get("Anthropic-Version") != "2023-06-01" || h.Get("Anthropic-Beta") != "prompt-caching-2024-07-31" || h.Get("Idempotency-Key") == "" {
			t.Errorf("the upstream saw %v", h)
		}
	})
}

// n, best_of and a list of prompts multiply what a call may produce: admission reserves the
// product, and lowers the limit only as far as MinOutputTokens an answer, so a call whose
// least could cross the ceiling never leaves.
func TestAdmissionCountsEveryChoice(t *testing.T) {
	for _, tc := range []struct{ name, path, body string }{
		{"chat n", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":50,"max_tokens":400}`},
		{"chat n, max_completion_tokens", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":5,"max_completion_tokens":400}`},
		{"completions best_of", "/v1/completions", `{"model":"m","prompt":"hi","best_of":5,"n":1,"max_tokens":400}`},
		{"completions n", "/v1/completions", `{"model":"m","prompt":"hi","n":4,"max_tokens":400}`},
		{"completions prompts", "/v1/completions", `{"model":"m","prompt":["a","b","c","d"],"max_tokens":400}`},
		{"chat n given twice, the last large", "/v1/chat/completions", `{"model":"m","n":1,"messages":[{"role":"user","content":"hi"}],"max_tokens":400,"n":50}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, config.FormatOpenAI, 1000, Caller{})
			status, h, body := r.post(tc.path, tc.body)
			if status != http.StatusTooManyRequests {
				t.Fatalf("%d %s", status, body)
			}
			msg, roost := envelope(t, config.FormatOpenAI, body, "insufficient_quota")
			if req, _ := roost["requested"].(float64); req < 1000 || roost["limit"] != "session" || !strings.Contains(msg, "max_session_tokens") {
				t.Errorf("the refusal: %s", body)
			}
			if h.Get("X-Should-Retry") != "false" {
				t.Errorf("x-should-retry %q", h.Get("X-Should-Retry"))
			}
			r.nothingUpstream()
			if s := r.spent(); s.Charged != 0 || s.Reserved != 0 {
				t.Errorf("ledger: %+v", s)
			}
		})
	}
	// A key given twice reaches the upstream once, as the gateway read it: an upstream that
	// takes the first of two keys cannot see an n the gateway did not admit.
	twice := newRig(t, config.FormatOpenAI, 1000, Caller{})
	if status, _, out := twice.post("/v1/chat/completions", `{"model":"m","n":50,"messages":[{"role":"user","content":"hi"}],"max_tokens":40,"n":1}`); status != 200 {
		t.Fatalf("n given twice, the last small: %d %s", status, out)
	}
	if sent := string(twice.fake.Requests()[0].Body); strings.Count(sent, `"n":`) != 1 || !strings.Contains(sent, `"n":1`) {
		t.Errorf("the upstream saw %s", sent)
	}
	// A multiplier that is not a number is refused rather than guessed.
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"n":"50","max_tokens":400}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2,"max_tokens":"400"}`,
	} {
		r := newRig(t, config.FormatOpenAI, 0, Caller{})
		if status, _, out := r.post("/v1/chat/completions", body); status != http.StatusBadRequest {
			t.Errorf("%s: %d %s", body, status, out)
		}
		r.nothingUpstream()
	}
}

// n: 2, max_tokens: 100 is admitted for both choices' worst case and charged exactly what the
// upstream reports for both.
func TestAdmitsWorstCaseChargesBothChoices(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2,"max_tokens":100}`
	r := newRig(t, config.FormatOpenAI, 0, Caller{})
	status, _, out := r.post("/v1/chat/completions", body)
	if status != 200 {
		t.Fatalf("%d %s", status, out)
	}
	var c struct {
		Choices []struct{ Index int } `json:"choices"`
	}
	if json.Unmarshal([]byte(out), &c); len(c.Choices) != 2 {
		t.Errorf("%d choices came back: %s", len(c.Choices), out)
	}
	if s := r.spent(); s.InputTokens != 12 || s.OutputTokens != 60 || s.Charged != 72 || s.Reserved != 0 {
		t.Errorf("ledger: %+v, want 12 + 2×30", s)
	}
	estimate := estimateBody(r.fake.Requests()[0].Body)
	worst := estimate + 2*100
	// One token short of the worst case: refused, though one choice would fit.
	short := newRig(t, config.FormatOpenAI, worst-1, Caller{})
	if status, _, out := short.post("/v1/chat/completions", body); status != 429 || !strings.Contains(out, `"requested":`+strconv.FormatInt(worst, 10)) {
		t.Fatalf("ceiling %d: %d %s", worst-1, status, out)
	}
	short.nothingUpstream()
	exact := newRig(t, config.FormatOpenAI, worst, Caller{})
	if status, _, out := exact.post("/v1/chat/completions", body); status != 200 {
		t.Fatalf("ceiling %d: %d %s", worst, status, out)
	}
}

// count_tokens and the models routes are forwarded without admission: a session whose
// ceiling admits nothing still calls them, and is charged nothing.
func TestUnmeteredRoutesNeverCharged(t *testing.T) {
	for _, tc := range []struct {
		format, method, path, body, want string
	}{
		{config.FormatAnthropic, "POST", "v1/messages/count_tokens", `{"model":"claude-x","messages":[{"role":"user","content":"hi"}]}`, `"input_tokens":`},
		{config.FormatAnthropic, "GET", "v1/models", "", `"data":`},
		{config.FormatAnthropic, "GET", "v1/models/claude-x", "", `"id":"claude-x"`},
		{config.FormatAnthropic, "GET", "v1/models?limit=2", "", `"data":`},
		{config.FormatOpenAI, "GET", "v1/models", "", `"object":"list"`},
		{config.FormatOpenAI, "GET", "v1/models/gpt-x", "", `"id":"gpt-x"`},
	} {
		t.Run(tc.format+" "+tc.method+" "+tc.path, func(t *testing.T) {
			r := newRig(t, tc.format, 1, Caller{})
			hdr := []string{"Content-Type", "application/json"}
			if tc.format == config.FormatAnthropic {
				hdr = append(hdr, "Anthropic-Version", "2023-06-01")
			}
			status, _, out := r.raw(tc.method, tc.path, tc.body, hdr...)
			if status != 200 || !strings.Contains(out, tc.want) {
				t.Fatalf("%d %s", status, out)
			}
			if s := r.spent(); s.Charged != 0 || s.Reserved != 0 || s.Latched != nil {
				t.Errorf("ledger: %+v", s)
			}
			if n := len(r.fake.Requests()); n != 1 {
				t.Errorf("the upstream saw %d requests", n)
			}
		})
	}
}

// sseUpstream serves one fixed event stream; the rig's gateway is pointed at it.
func sseUpstream(t *testing.T, r *rig, stream string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, stream)
	}))
	t.Cleanup(srv.Close)
	setUpstreamURL(r, srv.URL)
}

// Events whose data spans several data: lines, comment lines, CRLF and CR line ends: the
// usage is read as an SSE client reads it, and the stream passes through byte for byte.
func TestStreamMultilineDataAndComments(t *testing.T) {
	for _, tc := range []struct {
		name, format, path, body, stream string
		in, out                          int64
	}{
		{"anthropic", config.FormatAnthropic, "/v1/messages", `{"model":"c","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			": keep-alive\n\nevent: message_start\ndata: {\"type\":\"message_start\",\ndata:  \"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n" +
				":comment\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":\ndata: {\"output_tokens\":15}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			9, 15},
		{"openai crlf", config.FormatOpenAI, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			": OPENROUTER PROCESSING\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n\r\ndata: {\"choices\":[],\r\ndata: \"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\r\n\r\ndata: [DONE]\r\n\r\n",
			3, 4},
		{"openai cr", config.FormatOpenAI, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			"data: {\"choices\":[],\rdata: \"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\r\rdata: [DONE]\r\r",
			5, 6},
		{"responses", config.FormatOpenAI, "/v1/responses", `{"model":"m","stream":true,"input":"hi"}`,
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n: ping\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\ndata: \"response\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":8}}}\n\n",
			7, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.format, 0, Caller{})
			sseUpstream(t, r, tc.stream)
			status, _, out := r.post(tc.path, tc.body, "Anthropic-Version", "2023-06-01")
			if status != 200 || out != tc.stream {
				t.Fatalf("%d %q", status, out)
			}
			if s := r.spent(); s.InputTokens != tc.in || s.OutputTokens != tc.out || s.Reserved != 0 {
				t.Errorf("ledger: %+v, want %d + %d", s, tc.in, tc.out)
			}
		})
	}
}

// roost's own refusals come in the provider's envelope, with roost's numbers beside, and
// tell the SDKs whether to retry.
func TestRefusalEnvelopes(t *testing.T) {
	for _, tc := range []struct{ format, path, body, quota string }{
		{config.FormatOpenAI, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`, "insufficient_quota"},
		{config.FormatAnthropic, "/v1/messages", `{"model":"c","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`, "rate_limit_error"},
	} {
		t.Run(tc.format+" session", func(t *testing.T) {
			r := newRig(t, tc.format, 100, Caller{})
			if status, _, out := r.post(tc.path, tc.body, "Anthropic-Version", "2023-06-01"); status != 200 {
				t.Fatalf("first call: %d %s", status, out)
			}
			status, h, out := r.post(tc.path, tc.body, "Anthropic-Version", "2023-06-01")
			if status != http.StatusTooManyRequests {
				t.Fatalf("%d %s", status, out)
			}
			msg, roost := envelope(t, tc.format, out, tc.quota)
			if !strings.Contains(msg, "max_session_tokens") || !strings.Contains(msg, "42 of 100") || roost["limit"] != "session" || roost["ceiling"] != 100.0 || roost["used"] != 42.0 {
				t.Errorf("the refusal: %s", out)
			}
			if h.Get("X-Should-Retry") != "false" || h.Get("Content-Type") != "application/json" {
				t.Errorf("headers %v", h)
			}
		})
		t.Run(tc.format+" machine", func(t *testing.T) {
			r := newRig(t, tc.format, 0, Caller{})
			if err := r.ledger.SetMachineCeiling(10); err != nil {
				t.Fatal(err)
			}
			status, h, out := r.post(tc.path, tc.body, "Anthropic-Version", "2023-06-01")
			if status != http.StatusTooManyRequests {
				t.Fatalf("%d %s", status, out)
			}
			typ := "rate_limit_error"
			if tc.format == config.FormatOpenAI {
				typ = "tokens"
			}
			if _, roost := envelope(t, tc.format, out, typ); roost["limit"] != "machine" {
				t.Errorf("the refusal: %s", out)
			}
			now := time.Now().UTC()
			left := now.Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(now).Seconds()
			after, err := strconv.Atoi(h.Get("Retry-After"))
			if err != nil || float64(after) < left-2 || float64(after) > left+2 {
				t.Errorf("retry-after %q, want about %.0f", h.Get("Retry-After"), left)
			}
			r.nothingUpstream()
		})
		t.Run(tc.format+" model", func(t *testing.T) {
			r := newRig(t, tc.format, 0, Caller{Model: "declared"})
			status, h, out := r.post(tc.path, tc.body, "Anthropic-Version", "2023-06-01")
			if status != http.StatusForbidden || h.Get("X-Should-Retry") != "false" {
				t.Fatalf("%d %v %s", status, h, out)
			}
			if msg, _ := envelope(t, tc.format, out, permissionType(tc.format)); !strings.Contains(msg, `inference.model: the capsule declares "declared"`) {
				t.Errorf("the message: %q", msg)
			}
			r.nothingUpstream()
		})
	}
}

// A capsule without inference.model names any model it likes; the label does not follow.
func TestModelLabelBounded(t *testing.T) {
	mtr := metrics.New(nil, func() map[string]int { return nil })
	r := newRig(t, config.FormatOpenAI, 0, Caller{}, func(c *rigConfig) { c.observer = mtr })
	for i := range 200 {
		body := fmt.Sprintf(`{"model":"m-%d-%x","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, i, rand.Uint64())
		if status, _, out := r.post("/v1/chat/completions", body); status != 200 {
			t.Fatalf("%d %s", status, out)
		}
	}
	rec := httptest.NewRecorder()
	mtr.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var series []string
	for line := range strings.Lines(rec.Body.String()) {
		if strings.HasPrefix(line, "roost_spent_tokens_total{") || strings.HasPrefix(line, "roost_tokens_spent_total{") {
			series = append(series, strings.TrimSpace(line))
		}
	}
	want := []string{`roost_spent_tokens_total{capsule="agent",model="other"} 3400`, `roost_tokens_spent_total{capsule="agent",model="other"} 3400`}
	if len(series) != len(want) || series[0] != want[0] || series[1] != want[1] {
		t.Fatalf("%d series, want %q:\n%s", len(series), want, strings.Join(series[:min(len(series), 5)], "\n"))
	}
}

// setUpstreamURL points the rig's gateway at another upstream URL.
func setUpstreamURL(r *rig, url string) {
	u := r.gw.upstreams["up"].Upstream
	u.URL = url
	r.gw.upstreams["up"] = newUpstream(u)
}
