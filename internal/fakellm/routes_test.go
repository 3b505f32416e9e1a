package fakellm_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"roost.dev/roost/internal/fakellm"
)

// n choices come back, each with its index, and the usage counts every one of them, JSON and
// streamed.
func TestChatChoices(t *testing.T) {
	s := start(t, baseConfig())
	resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader(testKey), `{"model":"m","n":3,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	c := decode[chatCompletion](t, b)
	if len(c.Choices) != 3 || c.Choices[2].Index != 2 || c.Choices[1].Message.Content != testReply || c.Choices[0].FinishReason != "length" {
		t.Errorf("choices: %s", b)
	}
	if c.Usage.PromptTokens != 11 || c.Usage.CompletionTokens != 15 || c.Usage.TotalTokens != 26 {
		t.Errorf("usage %+v, want 11 + 3×5", c.Usage)
	}

	resp, b = do(t, s, "POST", "/v1/chat/completions", openAIHeader(testKey), `{"model":"m","n":2,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	chunks, _ := chatStream(t, resp, b)
	text := map[int]string{}
	finished := map[int]bool{}
	for _, ch := range chunks[:len(chunks)-1] {
		for _, choice := range ch.Choices {
			if choice.Delta.Content != nil {
				text[choice.Index] += *choice.Delta.Content
			}
			if choice.FinishReason != nil {
				finished[choice.Index] = true
			}
		}
	}
	if text[0] != testReply || text[1] != testReply || !finished[0] || !finished[1] {
		t.Errorf("choices streamed %v, finished %v", text, finished)
	}
	if u := chunks[len(chunks)-1].Usage; u == nil || u.CompletionTokens != 14 || u.TotalTokens != 25 {
		t.Errorf("usage %+v, want 11 + 2×7", u)
	}

	for body, want := range map[string]string{
		`{"model":"m","n":0,"messages":[{"role":"user","content":"hi"}]}`:   "integer_below_min_value",
		`{"model":"m","n":129,"messages":[{"role":"user","content":"hi"}]}`: "integer_above_max_value",
		`{"model":"m","n":"2","messages":[{"role":"user","content":"hi"}]}`: "invalid_type",
	} {
		if resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader(testKey), body); resp.StatusCode != 400 || decode[openAIError](t, b).Error.Code == nil || *decode[openAIError](t, b).Error.Code != want {
			t.Errorf("%s: %d %s", body, resp.StatusCode, b)
		}
	}
}

type textCompletion struct {
	Object  string `json:"object"`
	Choices []struct {
		Text         string  `json:"text"`
		Index        int     `json:"index"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

// Legacy completions: n choices per prompt, best_of generations per choice counted in the
// usage, 16 tokens at most by default.
func TestCompletions(t *testing.T) {
	cfg := baseConfig()
	cfg.OutputTokens = 30
	s := start(t, cfg)
	for _, tc := range []struct {
		body         string
		choices, out int
	}{
		{`{"model":"m","prompt":"hi"}`, 1, 16},
		{`{"model":"m","prompt":"hi","max_tokens":100}`, 1, 30},
		{`{"model":"m","prompt":"hi","max_tokens":10,"n":2,"best_of":5}`, 2, 50},
		{`{"model":"m","prompt":["a","b","c"],"max_tokens":10,"n":2}`, 6, 60},
		{`{"model":"m","prompt":[1,2,3],"max_tokens":10}`, 1, 10},
		{`{"model":"m","prompt":[[1],[2]],"max_tokens":10}`, 2, 20},
	} {
		resp, b := do(t, s, "POST", "/v1/completions", openAIHeader(testKey), tc.body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", tc.body, resp.StatusCode, b)
		}
		c := decode[textCompletion](t, b)
		if c.Object != "text_completion" || len(c.Choices) != tc.choices || c.Choices[0].Text != testReply || c.Usage == nil || c.Usage.CompletionTokens != tc.out || c.Usage.PromptTokens != 11 {
			t.Errorf("%s: %s", tc.body, b)
		}
	}
	if resp, b := do(t, s, "POST", "/v1/completions", openAIHeader(testKey), `{"model":"m","prompt":"hi","n":3,"best_of":2}`); resp.StatusCode != 400 {
		t.Errorf("best_of below n: %d %s", resp.StatusCode, b)
	}
	resp, b := do(t, s, "POST", "/v1/completions", openAIHeader(testKey), `{"model":"m","prompt":"hi","n":2,"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`)
	checkStreamHeaders(t, resp)
	events := readSSE(t, b)
	if events[len(events)-1].data != "[DONE]" {
		t.Fatalf("stream: %s", b)
	}
	last := decode[textCompletion](t, []byte(events[len(events)-2].data))
	if len(last.Choices) != 0 || last.Usage == nil || last.Usage.CompletionTokens != 8 {
		t.Errorf("usage chunk: %s", events[len(events)-2].data)
	}
}

func TestEmbeddings(t *testing.T) {
	s := start(t, baseConfig())
	resp, b := do(t, s, "POST", "/v1/embeddings", openAIHeader(testKey), `{"model":"e","input":["a","b"],"dimensions":3}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var e struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
		Usage map[string]int `json:"usage"`
	}
	if json.Unmarshal(b, &e); len(e.Data) != 2 || len(e.Data[1].Embedding) != 3 || e.Usage["prompt_tokens"] != 11 || e.Usage["total_tokens"] != 11 {
		t.Errorf("%s", b)
	}
	if _, ok := e.Usage["completion_tokens"]; ok {
		t.Errorf("embeddings report output: %s", b)
	}
	if resp, b := do(t, s, "POST", "/v1/embeddings", openAIHeader(testKey), `{"model":"e"}`); resp.StatusCode != 400 {
		t.Errorf("no input: %d %s", resp.StatusCode, b)
	}
}

// The models routes answer in the shape of the provider the request's headers name.
func TestModels(t *testing.T) {
	s := start(t, baseConfig())
	resp, b := do(t, s, "GET", "/v1/models", openAIHeader(testKey), "")
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object string
		} `json:"data"`
	}
	if json.Unmarshal(b, &list); resp.StatusCode != 200 || list.Object != "list" || len(list.Data) != len(fakellm.DefaultModels) || list.Data[0].ID != fakellm.DefaultModels[0] || list.Data[0].Object != "model" {
		t.Errorf("openai list: %d %s", resp.StatusCode, b)
	}
	if resp, b := do(t, s, "GET", "/v1/models/anything", openAIHeader(testKey), ""); resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"anything"`) {
		t.Errorf("openai model: %d %s", resp.StatusCode, b)
	}
	if resp, _ := do(t, s, "GET", "/v1/models", openAIHeader(""), ""); resp.StatusCode != 401 {
		t.Errorf("no key: %d", resp.StatusCode)
	}

	cfg := baseConfig()
	cfg.Models = []string{"claude-a", "claude-b", "claude-c"}
	s.SetConfig(cfg)
	resp, b = do(t, s, "GET", "/v1/models?limit=2", anthropicHeader(testKey), "")
	var page struct {
		Data []struct {
			Type, ID string
		} `json:"data"`
		HasMore bool   `json:"has_more"`
		LastID  string `json:"last_id"`
	}
	if json.Unmarshal(b, &page); resp.StatusCode != 200 || len(page.Data) != 2 || page.Data[0].Type != "model" || !page.HasMore || page.LastID != "claude-b" {
		t.Errorf("anthropic page: %d %s", resp.StatusCode, b)
	}
	if resp, b := do(t, s, "GET", "/v1/models?after_id=claude-b", anthropicHeader(testKey), ""); !strings.Contains(string(b), `"id":"claude-c"`) || strings.Contains(string(b), `"claude-a"`) || resp.StatusCode != 200 {
		t.Errorf("anthropic next page: %d %s", resp.StatusCode, b)
	}
	if resp, b := do(t, s, "GET", "/v1/models/claude-z", anthropicHeader(testKey), ""); resp.StatusCode != 404 || decode[anthropicError](t, b).Error.Type != "not_found_error" {
		t.Errorf("anthropic unknown model: %d %s", resp.StatusCode, b)
	}
	if resp, b := do(t, s, "GET", "/v1/models/claude-a", anthropicHeader(testKey), ""); resp.StatusCode != 200 || !strings.Contains(string(b), `"type":"model","id":"claude-a"`) {
		t.Errorf("anthropic model: %d %s", resp.StatusCode, b)
	}
}

func TestCountTokens(t *testing.T) {
	s := start(t, baseConfig())
	resp, b := do(t, s, "POST", "/v1/messages/count_tokens", anthropicHeader(testKey), `{"model":"c","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || string(b) != `{"input_tokens":11}` {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
	if resp, _ := do(t, s, "POST", "/v1/messages/count_tokens", anthropicHeader("wrong"), `{"model":"c","messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != 401 {
		t.Errorf("wrong key: %d", resp.StatusCode)
	}
	if resp, _ := do(t, s, "POST", "/v1/messages/count_tokens", anthropicHeader(testKey), `{"messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != 400 {
		t.Errorf("no model: %d", resp.StatusCode)
	}
}

// ExceedLimits reports the configured output whatever the request's limit.
func TestExceedLimits(t *testing.T) {
	cfg := baseConfig()
	cfg.ExceedLimits = true
	s := start(t, cfg)
	resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader(testKey), `{"model":"m","n":2,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`)
	if c := decode[chatCompletion](t, b); resp.StatusCode != 200 || c.Usage.CompletionTokens != 14 {
		t.Errorf("chat: %s", b)
	}
	resp, b = do(t, s, "POST", "/v1/messages", anthropicHeader(testKey), strings.Replace(messagesBody, `"max_tokens":1024`, `"max_tokens":2`, 1))
	if m := decode[message](t, b); resp.StatusCode != 200 || !intIs(m.Usage.OutputTokens, 7) {
		t.Errorf("messages: %s", b)
	}
}

// With comments and data over several lines, a stream reads as the same events.
func TestStreamComments(t *testing.T) {
	plain := start(t, baseConfig())
	cfg := baseConfig()
	cfg.SSEComments, cfg.MultilineData = true, true
	odd := start(t, cfg)
	for _, tc := range []struct {
		path string
		h    http.Header
		body string
	}{
		{"/v1/chat/completions", openAIHeader(testKey), `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a, \"b\", c"}]}`},
		{"/v1/messages", anthropicHeader(testKey), strings.Replace(messagesBody, `"max_tokens":1024`, `"max_tokens":1024,"stream":true`, 1)},
		{"/v1/responses", openAIHeader(testKey), `{"model":"m","input":"hi","stream":true}`},
	} {
		_, pb := do(t, plain, "POST", tc.path, tc.h.Clone(), tc.body)
		resp, ob := do(t, odd, "POST", tc.path, tc.h.Clone(), tc.body)
		checkStreamHeaders(t, resp)
		if !strings.Contains(string(ob), "\n: keep-alive\n") && !strings.HasPrefix(string(ob), ": keep-alive\n") {
			t.Errorf("%s: no comments:\n%s", tc.path, ob)
		}
		pe, oe := readSSE(t, pb), readSSE(t, ob)
		if len(pe) != len(oe) {
			t.Fatalf("%s: %d events, %d with comments", tc.path, len(pe), len(oe))
		}
		multi := false
		for i := range pe {
			multi = multi || strings.Contains(oe[i].data, "\n")
			if pe[i].name != oe[i].name || !sameJSON(t, pe[i].data, oe[i].data) {
				t.Errorf("%s: event %d: %q %s, want %q %s", tc.path, i, oe[i].name, oe[i].data, pe[i].name, pe[i].data)
			}
		}
		if !multi {
			t.Errorf("%s: no event spans lines:\n%s", tc.path, ob)
		}
	}
}

// sameJSON: a and b are the same value, ids and times aside.
func sameJSON(t *testing.T, a, b string) bool {
	t.Helper()
	if a == "[DONE]" || b == "[DONE]" {
		return a == b
	}
	var va, vb any
	if json.Unmarshal([]byte(a), &va) != nil || json.Unmarshal([]byte(b), &vb) != nil {
		return false
	}
	return shape(va) == shape(vb)
}

// shape is a value with its strings that vary between answers (ids) blanked.
func shape(v any) string {
	var walk func(any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if k == "id" || k == "created" || k == "created_at" || k == "item_id" {
					x[k] = nil
				} else {
					x[k] = walk(e)
				}
			}
		case []any:
			for i, e := range x {
				x[i] = walk(e)
			}
		}
		return v
	}
	out, _ := json.Marshal(walk(v))
	return string(out)
}
