package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"roost.dev/roost/internal/fakellm"
	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/ledger"
)

const operatorKey = "sk-operator-secret"

// rig is a gateway in front of a fake upstream, served on loopback as a session's endpoint
// would serve it, metering into a real ledger.
type rig struct {
	t      testing.TB
	fake   *fakellm.Server
	ledger *ledger.Ledger
	gw     *Gateway
	url    string
	caller Caller
}

// rigOption changes a rig before its gateway starts: the upstream's configuration (its URL
// is the fake's), the ledger's observer.
type rigOption func(*rigConfig)

type rigConfig struct {
	upstream config.Upstream
	observer ledger.Observer
	limits   Limits
	// fleet opens the ledger as a fleet node's, with no allowance until the test sets one.
	fleet bool
}

func newRig(t testing.TB, format string, ceiling int64, caller Caller, opts ...rigOption) *rig {
	t.Helper()
	fake, err := fakellm.Start(fakellm.Config{APIKey: operatorKey, InputTokens: 12, OutputTokens: 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte(operatorKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := rigConfig{upstream: config.Upstream{Name: "up", Format: format, URL: fake.URL(), APIKeyFile: keyFile, DefaultMaxOutputTokens: 100}}
	for _, o := range opts {
		o(&cfg)
	}
	l, err := ledger.Open(ledger.Config{Path: filepath.Join(dir, ledger.File), Observer: cfg.observer, Fleet: cfg.fleet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := l.Register(ledger.Session{ID: "s1", Capsule: "agent", Ceiling: ceiling}); err != nil {
		t.Fatal(err)
	}
	g := New([]config.Upstream{cfg.upstream}, l, nil, WithLimits(cfg.limits))
	caller.SessionID = "s1"
	if caller.Upstream == "" {
		caller.Upstream = "up"
	}
	r := &rig{t: t, fake: fake, ledger: l, gw: g, caller: caller}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/inference/{upstream}/{path...}", func(w http.ResponseWriter, req *http.Request) {
		g.Serve(w, req, r.caller, req.PathValue("upstream"), req.PathValue("path"))
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	r.url = "http://" + ln.Addr().String() + "/v1/inference/up"
	return r
}

// post sends body as the capsule would, with a placeholder key the gateway must replace.
func (r *rig) post(path, body string, header ...string) (int, http.Header, string) {
	r.t.Helper()
	req, _ := http.NewRequest("POST", r.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer roost-placeholder")
	req.Header.Set("X-Api-Key", "roost-placeholder")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data)
}

func (r *rig) spent() ledger.Spend {
	r.t.Helper()
	s, err := r.ledger.Session("s1")
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// Every shape each provider reports usage in, JSON and streamed: the ledger ends with the
// reported 12 + 30, nothing reserved, and the upstream saw only the operator's key.
func TestMetersEveryFormat(t *testing.T) {
	for _, tc := range []struct {
		name, format, path, body, want string
	}{
		{"openai chat", config.FormatOpenAI, "/v1/chat/completions", `{"model":"gpt-x","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`, `"completion_tokens":30`},
		{"openai chat stream", config.FormatOpenAI, "/v1/chat/completions", `{"model":"gpt-x","messages":[{"role":"user","content":"hi"}],"stream":true}`, "data: [DONE]"},
		{"openai responses", config.FormatOpenAI, "/v1/responses", `{"model":"gpt-x","input":"hi","max_output_tokens":60}`, `"output_tokens":30`},
		{"openai responses stream", config.FormatOpenAI, "/v1/responses", `{"model":"gpt-x","input":"hi","stream":true}`, "response.completed"},
		{"anthropic", config.FormatAnthropic, "/v1/messages", `{"model":"claude-x","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`, `"output_tokens":30`},
		{"anthropic stream", config.FormatAnthropic, "/v1/messages", `{"model":"claude-x","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "message_stop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.format, 0, Caller{})
			status, _, body := r.post(tc.path, tc.body)
			if status != 200 || !strings.Contains(body, tc.want) {
				t.Fatalf("%d %s", status, body)
			}
			if s := r.spent(); s.Charged != 42 || s.InputTokens != 12 || s.OutputTokens != 30 || s.Reserved != 0 {
				t.Errorf("ledger: %+v", s)
			}
			reqs := r.fake.Requests()
			if len(reqs) != 1 {
				t.Fatalf("the upstream saw %d requests", len(reqs))
			}
			h := reqs[0].Header
			got := h.Get("Authorization") + h.Get("X-Api-Key")
			if strings.Contains(got, "placeholder") || !strings.Contains(got, operatorKey) {
				t.Errorf("the upstream saw credentials %q", got)
			}
		})
	}
}

// A streamed chat call comes back as an event stream, and the gateway asked the upstream for
// the usage the capsule did not ask for.
func TestStreamedChatAsksForUsage(t *testing.T) {
	r := newRig(t, config.FormatOpenAI, 0, Caller{})
	req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || resp.ContentLength != -1 {
		t.Fatalf("content type %q, length %d", resp.Header.Get("Content-Type"), resp.ContentLength)
	}
	var events int
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	if events < 4 {
		t.Errorf("%d events came through", events)
	}
	// The capsule did not ask for usage in the stream; the gateway did, for the meter.
	if body := string(r.fake.Requests()[0].Body); !strings.Contains(body, `"include_usage":true`) {
		t.Errorf("the upstream request: %s", body)
	}
}

// max_session_tokens 100: the second call would cross it, is refused with the ceiling in
// numbers, and never reaches the upstream.
func TestRefusedCallNeverLeaves(t *testing.T) {
	r := newRig(t, config.FormatOpenAI, 100, Caller{})
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`
	if status, _, out := r.post("/v1/chat/completions", body); status != 200 {
		t.Fatalf("first call: %d %s", status, out)
	}
	status, _, out := r.post("/v1/chat/completions", body)
	if status != http.StatusTooManyRequests || !strings.Contains(out, `"limit":"session"`) || !strings.Contains(out, `"ceiling":100`) || !strings.Contains(out, `"used":42`) {
		t.Fatalf("second call: %d %s", status, out)
	}
	if n := len(r.fake.Requests()); n != 1 {
		t.Fatalf("the upstream saw %d requests", n)
	}
}

func TestRefusesOtherUpstreamsAndModels(t *testing.T) {
	r := newRig(t, config.FormatOpenAI, 0, Caller{Model: "gpt-x"})
	if status, _, out := r.post("/v1/chat/completions", `{"model":"gpt-big","messages":[{"role":"user","content":"hi"}]}`); status != 403 || !strings.Contains(out, `inference.model: the capsule declares \"gpt-x\"; the request names \"gpt-big\"`) {
		t.Fatalf("another model: %d %s", status, out)
	}
	// No model named: the declared one is sent.
	if status, _, out := r.post("/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`); status != 200 {
		t.Fatalf("no model: %d %s", status, out)
	}
	if body := string(r.fake.Requests()[0].Body); !strings.Contains(body, `"model":"gpt-x"`) {
		t.Errorf("the upstream request: %s", body)
	}
	r.caller.Upstream = "other"
	if status, _, out := r.post("/v1/chat/completions", `{}`); status != 403 || !strings.Contains(out, `inference.upstream: the capsule declares \"other\"; it may not call \"up\"`) {
		t.Fatalf("another upstream: %d %s", status, out)
	}
	if status, _, out := r.post("/v1/chat/completions", `not json`); status != 403 {
		t.Fatalf("not json, wrong upstream first: %d %s", status, out)
	}
	r.caller.Upstream = "up"
	if status, _, out := r.post("/v1/chat/completions", `not json`); status != 400 || !strings.Contains(out, "not a JSON object") {
		t.Fatalf("not json: %d %s", status, out)
	}
	if n := len(r.fake.Requests()); n != 1 {
		t.Fatalf("the upstream saw %d requests", n)
	}
}

// A failed call is charged its input estimate only; an unreachable upstream too.
func TestFailedCallChargesInputEstimate(t *testing.T) {
	r := newRig(t, config.FormatAnthropic, 0, Caller{})
	r.fake.SetConfig(fakellm.Config{APIKey: operatorKey, Status: 529})
	body := `{"model":"c","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	status, _, out := r.post("/v1/messages", body)
	if status != 529 || !strings.Contains(out, "overloaded_error") {
		t.Fatalf("%d %s", status, out)
	}
	// The body forwarded is the one the gateway re-encoded; the estimate is of that.
	estimate := estimateBody(r.fake.Requests()[0].Body)
	if s := r.spent(); s.Charged != estimate || s.OutputTokens != 0 || s.Reserved != 0 {
		t.Fatalf("after a failed call: %+v (estimate %d)", s, estimate)
	}
	r.fake.Close()
	status, _, out = r.post("/v1/messages", body)
	if status != http.StatusBadGateway || !strings.Contains(out, `did not answer`) {
		t.Fatalf("unreachable: %d %s", status, out)
	}
	if s := r.spent(); s.Charged != 2*estimate || s.Reserved != 0 {
		t.Fatalf("after an unreachable upstream: %+v", s)
	}
}

// on_exhausted: wait holds a call refused at the machine's ceiling until it is raised.
func TestWaitForBudget(t *testing.T) {
	r := newRig(t, config.FormatOpenAI, 0, Caller{OnExhausted: "wait", Deadline: time.Now().Add(time.Minute)})
	if err := r.ledger.SetMachineCeiling(10); err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	go func() {
		status, _, _ := r.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":40}`)
		done <- status
	}()
	select {
	case status := <-done:
		t.Fatalf("the call was not held: %d", status)
	case <-time.After(200 * time.Millisecond):
	}
	if n := len(r.fake.Requests()); n != 0 {
		t.Fatalf("a held call reached the upstream")
	}
	if err := r.ledger.SetMachineCeiling(1000); err != nil {
		t.Fatal(err)
	}
	if status := <-done; status != 200 {
		t.Fatalf("after the ceiling was raised: %d", status)
	}

	// Past the deadline the refusal stands.
	r.caller.Deadline = time.Now().Add(100 * time.Millisecond)
	if err := r.ledger.SetMachineCeiling(10); err != nil {
		t.Fatal(err)
	}
	if status, _, out := r.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); status != 429 || !strings.Contains(out, `"limit":"machine"`) {
		t.Fatalf("at the deadline: %d %s", status, out)
	}
}

// A fleet node's allowance is a pool like the machine's ceiling, not calls in flight: a call
// it refuses is answered at once (not held until the session's deadline), in the upstream's
// envelope with a retry-after, sooner when the fleet's store is unreachable; with
// on_exhausted: wait it is held until the node holds tokens again.
func TestFleetAllowanceRefusal(t *testing.T) {
	asFleet := func(c *rigConfig) { c.fleet = true }
	day := time.Now().UTC().Format(time.DateOnly)
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":40}`
	r := newRig(t, config.FormatOpenAI, 0, Caller{Deadline: time.Now().Add(time.Hour)}, asFleet)
	if err := r.ledger.SetAllowance(ledger.Allowance{Day: day, Tokens: 10}); err != nil {
		t.Fatal(err)
	}
	// A refusal held to the deadline would hang here for an hour.
	status, hdr, out := r.post("/v1/chat/completions", body)
	if status != 429 || !strings.Contains(out, `"limit":"fleet"`) || !strings.Contains(out, `"type":"tokens"`) || hdr.Get("Retry-After") != "1" {
		t.Fatalf("refused by the fleet allowance: %d retry-after %q %s", status, hdr.Get("Retry-After"), out)
	}
	if err := r.ledger.SetAllowance(ledger.Allowance{Day: day, Tokens: 10, Unreachable: true}); err != nil {
		t.Fatal(err)
	}
	status, hdr, out = r.post("/v1/chat/completions", body)
	if status != 429 || !strings.Contains(out, "fleet ledger unreachable") || hdr.Get("Retry-After") != "5" {
		t.Fatalf("refused, the fleet unreachable: %d retry-after %q %s", status, hdr.Get("Retry-After"), out)
	}

	w := newRig(t, config.FormatOpenAI, 0, Caller{OnExhausted: "wait", Deadline: time.Now().Add(time.Minute)}, asFleet)
	if err := w.ledger.SetAllowance(ledger.Allowance{Day: day, Tokens: 10}); err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	go func() {
		status, _, _ := w.post("/v1/chat/completions", body)
		done <- status
	}()
	select {
	case status := <-done:
		t.Fatalf("with on_exhausted: wait the call was not held: %d", status)
	case <-time.After(200 * time.Millisecond):
	}
	if err := w.ledger.SetAllowance(ledger.Allowance{Day: day, Tokens: 100_000}); err != nil {
		t.Fatal(err)
	}
	if status := <-done; status != 200 {
		t.Fatalf("once the node held tokens: %d", status)
	}
}

// Each provider's usage shapes, read as the ledger is to be charged: Anthropic's cache reads
// and writes are input; streams report running totals, so the largest wins; nothing usable
// is no usage.
func TestUsageShapes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []string
		want   *ledger.Usage
	}{
		{"openai chat", []string{`{"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}`}, &ledger.Usage{Input: 12, Output: 30}},
		{"openai responses", []string{`{"type":"response.completed","response":{"usage":{"input_tokens":5,"output_tokens":6}}}`}, &ledger.Usage{Input: 5, Output: 6}},
		{"anthropic with cache", []string{`{"usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":7}}`}, &ledger.Usage{Input: 1110, Output: 7}},
		{"anthropic stream", []string{
			`{"type":"message_start","message":{"usage":{"input_tokens":9,"cache_read_input_tokens":1,"output_tokens":1}}}`,
			`{"type":"message_delta","usage":{"output_tokens":15}}`,
		}, &ledger.Usage{Input: 10, Output: 15}},
		{"openai stream, usage null until the end", []string{`{"choices":[],"usage":null}`, `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}`}, &ledger.Usage{Input: 3, Output: 4}},
		{"no usage", []string{`{"choices":[]}`, `[DONE]`, `not json`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &meter{sse: true}
			for _, e := range tc.events {
				m.Write([]byte("data: " + e + "\n\n"))
			}
			got, _ := m.usage()
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("usage %+v, want %+v", got, tc.want)
			}
			if len(tc.events) == 1 {
				// The same as a JSON answer.
				j := &meter{}
				j.Write([]byte(tc.events[0]))
				j.end()
				if got, _ := j.usage(); (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
					t.Fatalf("as JSON: usage %+v, want %+v", got, tc.want)
				}
			}
		})
	}
}

// The gateway passes each event on as the upstream sends it: the capsule reads the first
// event while the upstream still holds the rest back.
func TestStreamPassesEventsThroughAtOnce(t *testing.T) {
	release := make(chan struct{})
	upstream := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"first\"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go upstream.Serve(ln)
	t.Cleanup(func() { upstream.Close() })
	r := newRig(t, config.FormatOpenAI, 0, Caller{})
	setUpstreamURL(r, "http://"+ln.Addr().String())

	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	type result struct {
		line string
		rest io.ReadCloser
		err  error
	}
	first := make(chan result, 1)
	go func() {
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[],"stream":true}`))
		if err != nil {
			first <- result{err: err}
			return
		}
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		first <- result{line, struct {
			io.Reader
			io.Closer
		}{br, resp.Body}, err}
	}()
	var got result
	select {
	case got = <-first:
		if got.err != nil || !strings.Contains(got.line, "first") {
			t.Fatalf("first line %q, %v", got.line, got.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first event did not come through while the upstream held the rest")
	}
	once.Do(func() { close(release) })
	io.ReadAll(got.rest)
	got.rest.Close()
	if s := r.spent(); s.Charged != 3 || s.Reserved != 0 {
		t.Fatalf("ledger after the stream: %+v", s)
	}
}
