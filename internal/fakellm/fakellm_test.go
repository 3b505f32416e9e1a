package fakellm_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"roost.dev/roost/internal/fakellm"
)

const (
	testKey   = "sk-test-0123456789abcdef"
	testReply = "The quick brown fox jumps"
	version   = "2023-06-01"
)

func baseConfig() fakellm.Config {
	return fakellm.Config{APIKey: testKey, InputTokens: 11, OutputTokens: 7, Reply: testReply}
}

func start(t *testing.T, cfg fakellm.Config) *fakellm.Server {
	t.Helper()
	s, err := fakellm.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func openAIHeader(key string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}}
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
	return h
}

func anthropicHeader(key string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}, "Anthropic-Version": {version}}
	if key != "" {
		h.Set("x-api-key", key)
	}
	return h
}

// do sends one request and returns the response with its body read whole; streams are
// read after the fact, which is enough to check their events.
func do(t *testing.T, s *fakellm.Server, method, path string, h http.Header, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, s.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

type event struct {
	name, data string
}

// readSSE parses a server-sent event stream as the WHATWG spec reads one: fields per line,
// comments skipped, multi-line data joined with newlines, an event dispatched at a blank line.
// It fails on a trailing event with no blank line after it, which a real client would drop.
func readSSE(t *testing.T, body []byte) []event {
	t.Helper()
	var (
		events []event
		cur    event
		data   []string
		seen   bool
	)
	r := bufio.NewReader(bytes.NewReader(body))
	for {
		line, err := r.ReadString('\n')
		if errors.Is(err, io.EOF) {
			if line != "" || seen {
				t.Fatalf("stream ends mid-event: %q", line)
			}
			return events
		}
		if err != nil {
			t.Fatal(err)
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if line == "" {
			if seen {
				cur.data = strings.Join(data, "\n")
				events = append(events, cur)
			}
			cur, data, seen = event{}, nil, false
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		seen = true
		switch field {
		case "event":
			cur.name = value
		case "data":
			data = append(data, value)
		}
	}
}

func checkStreamHeaders(t *testing.T, resp *http.Response) {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("Content-Type %q", ct)
	}
	// A stream whose length is known up front was buffered, not streamed.
	if resp.ContentLength != -1 || !slices.Contains(resp.TransferEncoding, "chunked") {
		t.Errorf("not chunked: length %d, transfer-encoding %v", resp.ContentLength, resp.TransferEncoding)
	}
}

// hasKey reports whether the JSON object raw has key, and its raw value.
func hasKey(t *testing.T, raw string, key string) (string, bool) {
	t.Helper()
	m := decode[map[string]json.RawMessage](t, []byte(raw))
	v, ok := m[key]
	return string(v), ok
}

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	RequestID string `json:"request_id"`
}

type chatUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens *int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

type chatCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string          `json:"role"`
			Content string          `json:"content"`
			Refusal json.RawMessage `json:"refusal"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage             chatUsage `json:"usage"`
	SystemFingerprint string    `json:"system_fingerprint"`
}

const chatBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`

func TestChatCompletion(t *testing.T) {
	s := start(t, baseConfig())
	before := time.Now().Unix()
	resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader(testKey), chatBody)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if !strings.HasPrefix(resp.Header.Get("x-request-id"), "req_") {
		t.Errorf("x-request-id %q", resp.Header.Get("x-request-id"))
	}
	c := decode[chatCompletion](t, b)
	if !strings.HasPrefix(c.ID, "chatcmpl-") || c.Object != "chat.completion" || c.Model != "gpt-4o-mini" {
		t.Errorf("id %q object %q model %q", c.ID, c.Object, c.Model)
	}
	if c.Created < before || c.Created > time.Now().Unix() {
		t.Errorf("created %d", c.Created)
	}
	if !strings.HasPrefix(c.SystemFingerprint, "fp_") {
		t.Errorf("system_fingerprint %q", c.SystemFingerprint)
	}
	if len(c.Choices) != 1 {
		t.Fatalf("choices: %s", b)
	}
	ch := c.Choices[0]
	if ch.Index != 0 || ch.Message.Role != "assistant" || ch.Message.Content != testReply || string(ch.Message.Refusal) != "null" {
		t.Errorf("choice %+v", ch)
	}
	if ch.FinishReason != "stop" {
		t.Errorf("finish_reason %q", ch.FinishReason)
	}
	u := c.Usage
	if u.PromptTokens != 11 || u.CompletionTokens != 7 || u.TotalTokens != 18 {
		t.Errorf("usage %+v", u)
	}
	if u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens == nil || *u.PromptTokensDetails.CachedTokens != 0 ||
		u.CompletionTokensDetails == nil || u.CompletionTokensDetails.ReasoningTokens == nil || *u.CompletionTokensDetails.ReasoningTokens != 0 {
		t.Errorf("usage details: %s", b)
	}
}

func TestChatCompletionLimit(t *testing.T) {
	s := start(t, baseConfig())
	for _, tc := range []struct {
		name   string
		limits string
		finish string
		out    int
	}{
		{"max_tokens", `"max_tokens":3`, "length", 3},
		{"max_completion_tokens", `"max_completion_tokens":4`, "length", 4},
		{"tighter wins", `"max_tokens":5,"max_completion_tokens":2`, "length", 2},
		{"roomy", `"max_tokens":100`, "stop", 7},
		{"exact", `"max_completion_tokens":7`, "stop", 7},
		{"null", `"max_tokens":null`, "stop", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"model":"m","messages":[{"role":"user","content":"hi"}],` + tc.limits + `}`
			resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader(testKey), body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			c := decode[chatCompletion](t, b)
			if c.Choices[0].FinishReason != tc.finish || c.Usage.CompletionTokens != tc.out || c.Usage.TotalTokens != 11+tc.out {
				t.Errorf("finish %q usage %+v, want %q and %d", c.Choices[0].FinishReason, c.Usage, tc.finish, tc.out)
			}
		})
	}
}

type chatChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

// chatStream reads a chat completion stream, checking what every stream must satisfy, and
// returns its chunks with their raw data.
func chatStream(t *testing.T, resp *http.Response, b []byte) ([]chatChunk, []string) {
	t.Helper()
	checkStreamHeaders(t, resp)
	events := readSSE(t, b)
	if len(events) < 2 || events[len(events)-1].data != "[DONE]" {
		t.Fatalf("stream does not end in [DONE]:\n%s", b)
	}
	var chunks []chatChunk
	var raws []string
	for _, e := range events[:len(events)-1] {
		if e.name != "" {
			t.Errorf("chat stream event named %q", e.name)
		}
		c := decode[chatChunk](t, []byte(e.data))
		if c.Object != "chat.completion.chunk" || !strings.HasPrefix(c.ID, "chatcmpl-") || c.ID != decode[chatChunk](t, []byte(events[0].data)).ID {
			t.Errorf("chunk header: %s", e.data)
		}
		chunks = append(chunks, c)
		raws = append(raws, e.data)
	}
	return chunks, raws
}

func TestChatStream(t *testing.T) {
	s := start(t, baseConfig())
	for _, includeUsage := range []bool{false, true} {
		t.Run(fmt.Sprintf("include_usage=%v", includeUsage), func(t *testing.T) {
			body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			if includeUsage {
				body = `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
			}
			resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader(testKey), body)
			chunks, raws := chatStream(t, resp, b)

			choiceChunks := chunks
			if includeUsage {
				last := chunks[len(chunks)-1]
				if len(last.Choices) != 0 || last.Usage == nil {
					t.Fatalf("last chunk is not the usage chunk: %s", raws[len(raws)-1])
				}
				if u := last.Usage; u.PromptTokens != 11 || u.CompletionTokens != 7 || u.TotalTokens != 18 {
					t.Errorf("usage %+v", u)
				}
				choiceChunks = chunks[:len(chunks)-1]
				for _, raw := range raws[:len(raws)-1] {
					if v, ok := hasKey(t, raw, "usage"); !ok || v != "null" {
						t.Errorf("chunk before the last has usage %q (present %v): %s", v, ok, raw)
					}
				}
			} else {
				for _, raw := range raws {
					if _, ok := hasKey(t, raw, "usage"); ok {
						t.Errorf("usage present without include_usage: %s", raw)
					}
				}
			}

			if len(choiceChunks) < 4 {
				t.Fatalf("want role, several content and a finish chunk, got %d chunks", len(choiceChunks))
			}
			first := choiceChunks[0]
			if len(first.Choices) != 1 || first.Choices[0].Delta.Role != "assistant" {
				t.Errorf("first chunk has no assistant role: %s", raws[0])
			}
			var text strings.Builder
			contentChunks := 0
			for i, c := range choiceChunks {
				if len(c.Choices) != 1 {
					t.Fatalf("chunk %d has %d choices", i, len(c.Choices))
				}
				ch := c.Choices[0]
				if ch.Delta.Content != nil && *ch.Delta.Content != "" {
					contentChunks++
					text.WriteString(*ch.Delta.Content)
				}
				final := i == len(choiceChunks)-1
				if final != (ch.FinishReason != nil) {
					t.Errorf("chunk %d finish_reason %v", i, ch.FinishReason)
				}
			}
			if text.String() != testReply {
				t.Errorf("content %q, want %q", text.String(), testReply)
			}
			if contentChunks < 2 {
				t.Errorf("reply came in %d content deltas", contentChunks)
			}
			if fr := choiceChunks[len(choiceChunks)-1].Choices[0].FinishReason; *fr != "stop" {
				t.Errorf("finish_reason %q", *fr)
			}
		})
	}
}

func TestChatStreamLimit(t *testing.T) {
	s := start(t, baseConfig())
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader(testKey), body)
	chunks, _ := chatStream(t, resp, b)
	finish := chunks[len(chunks)-2].Choices[0].FinishReason
	if finish == nil || *finish != "length" {
		t.Errorf("finish_reason %v", finish)
	}
	if u := chunks[len(chunks)-1].Usage; u == nil || u.CompletionTokens != 5 || u.TotalTokens != 16 {
		t.Errorf("usage %+v", u)
	}
}

func TestOneWordReplyStreamsInPieces(t *testing.T) {
	cfg := baseConfig()
	cfg.Reply = "héllo"
	s := start(t, cfg)
	resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader(testKey),
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	chunks, _ := chatStream(t, resp, b)
	var parts []string
	for _, c := range chunks {
		if d := c.Choices[0].Delta.Content; d != nil && *d != "" {
			parts = append(parts, *d)
		}
	}
	if len(parts) < 2 || strings.Join(parts, "") != "héllo" {
		t.Errorf("deltas %q", parts)
	}
}

func TestChatInvalid(t *testing.T) {
	s := start(t, baseConfig())
	for _, tc := range []struct {
		name, body, param, code string
	}{
		{"not json", `{"model":`, "", ""},
		{"not an object", `[1]`, "", ""},
		{"no model", `{"messages":[{"role":"user","content":"hi"}]}`, "model", ""},
		{"no messages", `{"model":"m"}`, "messages", ""},
		{"null messages", `{"model":"m","messages":null}`, "messages", ""},
		{"empty messages", `{"model":"m","messages":[]}`, "messages", "empty_array"},
		{"messages not array", `{"model":"m","messages":"hi"}`, "messages", "invalid_type"},
		{"model not string", `{"model":4,"messages":[{"role":"user","content":"hi"}]}`, "model", "invalid_type"},
		{"max_tokens string", `{"model":"m","max_tokens":"5","messages":[{"role":"user","content":"hi"}]}`, "max_tokens", "invalid_type"},
		{"stream not bool", `{"model":"m","stream":"yes","messages":[{"role":"user","content":"hi"}]}`, "stream", "invalid_type"},
		{"stream_options without stream", `{"model":"m","stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, "stream_options", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader(testKey), tc.body)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			e := decode[openAIError](t, b)
			if e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
				t.Errorf("error %s", b)
			}
			checkNullable(t, "param", e.Error.Param, tc.param)
			checkNullable(t, "code", e.Error.Code, tc.code)
			// OpenAI sends param and code even when they are null.
			for _, k := range []string{"param", "code"} {
				inner, _ := hasKey(t, string(b), "error")
				if _, ok := hasKey(t, inner, k); !ok {
					t.Errorf("error has no %s: %s", k, b)
				}
			}
		})
	}
}

// checkNullable checks a nullable string against want, "" meaning null.
func checkNullable(t *testing.T, name string, got *string, want string) {
	t.Helper()
	switch {
	case want == "" && got != nil:
		t.Errorf("%s %q, want null", name, *got)
	case want != "" && (got == nil || *got != want):
		t.Errorf("%s %v, want %q", name, got, want)
	}
}

func TestOpenAIAuth(t *testing.T) {
	s := start(t, baseConfig())
	for _, path := range []string{"/v1/chat/completions", "/v1/responses"} {
		for _, tc := range []struct {
			name string
			h    http.Header
		}{
			{"missing", openAIHeader("")},
			{"wrong", openAIHeader("sk-wrong-0000000000000000")},
			{"other scheme", http.Header{"Authorization": {"Basic " + testKey}}},
			{"anthropic header", anthropicHeader(testKey)},
		} {
			t.Run(path+"/"+tc.name, func(t *testing.T) {
				resp, b := do(t, s, "POST", path, tc.h, `{"model":"m","messages":[{"role":"user","content":"hi"}],"input":"hi"}`)
				if resp.StatusCode != http.StatusUnauthorized {
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
				e := decode[openAIError](t, b)
				if e.Error.Type != "invalid_request_error" || e.Error.Code == nil || *e.Error.Code != "invalid_api_key" || e.Error.Param != nil {
					t.Errorf("error %s", b)
				}
				if strings.Contains(e.Error.Message, "sk-wrong-0000000000000000") {
					t.Errorf("key echoed whole: %s", e.Error.Message)
				}
			})
		}
	}
	resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader("sk-wrong-0000000000000000"), chatBody)
	if e := decode[openAIError](t, b); resp.StatusCode != 401 || !strings.HasPrefix(e.Error.Message, "Incorrect API key provided") {
		t.Errorf("wrong key: %d %s", resp.StatusCode, b)
	}
}

type responseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails *struct {
		ReasoningTokens *int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

type outputItem struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Status  string `json:"status"`
	Role    string `json:"role"`
	Content []struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Annotations []any  `json:"annotations"`
	} `json:"content"`
}

type response struct {
	ID                string         `json:"id"`
	Object            string         `json:"object"`
	CreatedAt         int64          `json:"created_at"`
	Status            string         `json:"status"`
	Model             string         `json:"model"`
	Output            []outputItem   `json:"output"`
	Usage             *responseUsage `json:"usage"`
	MaxOutputTokens   *int           `json:"max_output_tokens"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
}

func checkResponse(t *testing.T, r response, status string, out int) {
	t.Helper()
	if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.Model != "gpt-4.1" || r.CreatedAt == 0 {
		t.Errorf("response header %+v", r)
	}
	if r.Status != status {
		t.Errorf("status %q, want %q", r.Status, status)
	}
	if len(r.Output) != 1 {
		t.Fatalf("output %+v", r.Output)
	}
	item := r.Output[0]
	if item.Type != "message" || !strings.HasPrefix(item.ID, "msg_") || item.Status != status || item.Role != "assistant" ||
		len(item.Content) != 1 || item.Content[0].Type != "output_text" || item.Content[0].Text != testReply || item.Content[0].Annotations == nil {
		t.Errorf("output item %+v", item)
	}
	u := r.Usage
	if u == nil || u.InputTokens != 11 || u.OutputTokens != out || u.TotalTokens != 11+out ||
		u.InputTokensDetails == nil || u.InputTokensDetails.CachedTokens == nil ||
		u.OutputTokensDetails == nil || u.OutputTokensDetails.ReasoningTokens == nil {
		t.Errorf("usage %+v", u)
	}
}

func TestResponses(t *testing.T) {
	s := start(t, baseConfig())
	resp, b := do(t, s, "POST", "/v1/responses", openAIHeader(testKey), `{"model":"gpt-4.1","input":"hi"}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	r := decode[response](t, b)
	checkResponse(t, r, "completed", 7)
	if r.IncompleteDetails != nil || r.MaxOutputTokens != nil {
		t.Errorf("incomplete_details %+v max_output_tokens %v", r.IncompleteDetails, r.MaxOutputTokens)
	}

	resp, b = do(t, s, "POST", "/v1/responses", openAIHeader(testKey),
		`{"model":"gpt-4.1","input":[{"role":"user","content":"hi"}],"max_output_tokens":5}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	r = decode[response](t, b)
	checkResponse(t, r, "incomplete", 5)
	if r.IncompleteDetails == nil || r.IncompleteDetails.Reason != "max_output_tokens" || r.MaxOutputTokens == nil || *r.MaxOutputTokens != 5 {
		t.Errorf("incomplete_details %+v max_output_tokens %v", r.IncompleteDetails, r.MaxOutputTokens)
	}
}

func TestResponsesInvalid(t *testing.T) {
	s := start(t, baseConfig())
	for _, tc := range []struct{ name, body, param string }{
		{"no input", `{"model":"gpt-4.1"}`, "input"},
		{"no model", `{"input":"hi"}`, "model"},
		{"max_output_tokens string", `{"model":"m","input":"hi","max_output_tokens":"5"}`, "max_output_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := do(t, s, "POST", "/v1/responses", openAIHeader(testKey), tc.body)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			e := decode[openAIError](t, b)
			if e.Error.Type != "invalid_request_error" {
				t.Errorf("error %s", b)
			}
			checkNullable(t, "param", e.Error.Param, tc.param)
		})
	}
}

type responseEvent struct {
	Type           string      `json:"type"`
	SequenceNumber *int        `json:"sequence_number"`
	Response       *response   `json:"response"`
	Item           *outputItem `json:"item"`
	ItemID         string      `json:"item_id"`
	Delta          string      `json:"delta"`
	Text           string      `json:"text"`
}

func TestResponsesStream(t *testing.T) {
	s := start(t, baseConfig())
	for _, tc := range []struct {
		name, limit, final, status string
		out                        int
	}{
		{"complete", "", "response.completed", "completed", 7},
		{"cut short", `,"max_output_tokens":6`, "response.incomplete", "incomplete", 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := do(t, s, "POST", "/v1/responses", openAIHeader(testKey), `{"model":"gpt-4.1","input":"hi","stream":true`+tc.limit+`}`)
			checkStreamHeaders(t, resp)
			events := readSSE(t, b)
			var names []string
			var text strings.Builder
			var parsed []responseEvent
			for i, e := range events {
				ev := decode[responseEvent](t, []byte(e.data))
				if ev.Type != e.name {
					t.Errorf("event %q carries type %q", e.name, ev.Type)
				}
				if ev.SequenceNumber == nil || *ev.SequenceNumber != i {
					t.Errorf("event %d (%s) sequence_number %v", i, e.name, ev.SequenceNumber)
				}
				if e.name == "response.output_text.delta" {
					text.WriteString(ev.Delta)
				}
				// Only the final event may carry usage: a meter that adds every usage it sees
				// must see exactly one.
				if ev.Response != nil && ev.Response.Usage != nil && i != len(events)-1 {
					t.Errorf("usage in %s", e.name)
				}
				if ev.Response != nil && i < 2 && ev.Response.Status != "in_progress" {
					t.Errorf("%s status %q", e.name, ev.Response.Status)
				}
				names = append(names, e.name)
				parsed = append(parsed, ev)
			}
			deltas := slices.Index(names, "response.output_text.done") - slices.Index(names, "response.output_text.delta")
			want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
			for range deltas {
				want = append(want, "response.output_text.delta")
			}
			want = append(want, "response.output_text.done", "response.content_part.done", "response.output_item.done", tc.final)
			if deltas < 2 || !slices.Equal(names, want) {
				t.Fatalf("events\n%q\nwant\n%q", names, want)
			}
			if text.String() != testReply {
				t.Errorf("deltas make %q", text.String())
			}
			if done := parsed[len(parsed)-4]; done.Text != testReply || done.ItemID != parsed[2].Item.ID {
				t.Errorf("output_text.done %+v", done)
			}
			final := parsed[len(parsed)-1].Response
			if final == nil {
				t.Fatal("final event has no response")
			}
			checkResponse(t, *final, tc.status, tc.out)
		})
	}
}

type anthropicUsage struct {
	InputTokens              *int `json:"input_tokens"`
	OutputTokens             *int `json:"output_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
}

type message struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Model   string `json:"model"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StopReason   *string         `json:"stop_reason"`
	StopSequence json.RawMessage `json:"stop_sequence"`
	Usage        anthropicUsage  `json:"usage"`
}

func intIs(p *int, want int) bool { return p != nil && *p == want }

const messagesBody = `{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"hi"}]}`

func TestMessages(t *testing.T) {
	s := start(t, baseConfig())
	for _, tc := range []struct {
		name, body, stop string
		out              int
	}{
		{"end_turn", messagesBody, "end_turn", 7},
		{"max_tokens", `{"model":"claude-sonnet-4-5","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens", 3},
		{"exact", `{"model":"claude-sonnet-4-5","max_tokens":7,"messages":[{"role":"user","content":"hi"}]}`, "end_turn", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := do(t, s, "POST", "/v1/messages", anthropicHeader(testKey), tc.body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			if !strings.HasPrefix(resp.Header.Get("request-id"), "req_") {
				t.Errorf("request-id %q", resp.Header.Get("request-id"))
			}
			m := decode[message](t, b)
			if !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" || m.Role != "assistant" || m.Model != "claude-sonnet-4-5" {
				t.Errorf("message %+v", m)
			}
			if len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text != testReply {
				t.Errorf("content %+v", m.Content)
			}
			if m.StopReason == nil || *m.StopReason != tc.stop || string(m.StopSequence) != "null" {
				t.Errorf("stop_reason %v stop_sequence %s", m.StopReason, m.StopSequence)
			}
			u := m.Usage
			if !intIs(u.InputTokens, 11) || !intIs(u.OutputTokens, tc.out) || !intIs(u.CacheCreationInputTokens, 0) || !intIs(u.CacheReadInputTokens, 0) {
				t.Errorf("usage %s", b)
			}
		})
	}
}

type messageEvent struct {
	Type         string   `json:"type"`
	Message      *message `json:"message"`
	Index        *int     `json:"index"`
	ContentBlock *struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	} `json:"content_block"`
	Delta *struct {
		Type         string          `json:"type"`
		Text         string          `json:"text"`
		StopReason   string          `json:"stop_reason"`
		StopSequence json.RawMessage `json:"stop_sequence"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
}

func TestMessagesStream(t *testing.T) {
	s := start(t, baseConfig())
	for _, tc := range []struct {
		name, maxTokens, stop string
		out                   int
	}{
		{"end_turn", "1024", "end_turn", 7},
		{"max_tokens", "4", "max_tokens", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"model":"claude-sonnet-4-5","max_tokens":` + tc.maxTokens + `,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
			resp, b := do(t, s, "POST", "/v1/messages", anthropicHeader(testKey), body)
			checkStreamHeaders(t, resp)
			events := readSSE(t, b)
			var names []string
			var text strings.Builder
			var parsed []messageEvent
			for _, e := range events {
				ev := decode[messageEvent](t, []byte(e.data))
				if ev.Type != e.name {
					t.Errorf("event %q carries type %q", e.name, ev.Type)
				}
				if e.name == "content_block_delta" {
					if ev.Delta == nil || ev.Delta.Type != "text_delta" || !intIs(ev.Index, 0) {
						t.Errorf("delta %s", e.data)
					} else {
						text.WriteString(ev.Delta.Text)
					}
				}
				names = append(names, e.name)
				parsed = append(parsed, ev)
			}
			deltas := slices.Index(names, "content_block_stop") - slices.Index(names, "content_block_delta")
			want := []string{"message_start", "content_block_start", "ping"}
			for range deltas {
				want = append(want, "content_block_delta")
			}
			want = append(want, "content_block_stop", "message_delta", "message_stop")
			if deltas < 2 || !slices.Equal(names, want) {
				t.Fatalf("events\n%q\nwant\n%q", names, want)
			}
			if text.String() != testReply {
				t.Errorf("deltas make %q", text.String())
			}

			start := parsed[0].Message
			if start == nil || !strings.HasPrefix(start.ID, "msg_") || start.Role != "assistant" || start.Model != "claude-sonnet-4-5" ||
				len(start.Content) != 0 || start.StopReason != nil {
				t.Errorf("message_start %s", events[0].data)
			} else if !intIs(start.Usage.InputTokens, 11) || !intIs(start.Usage.OutputTokens, 1) {
				t.Errorf("message_start usage %s", events[0].data)
			}
			if cb := parsed[1].ContentBlock; cb == nil || cb.Type != "text" || cb.Text == nil || *cb.Text != "" || !intIs(parsed[1].Index, 0) {
				t.Errorf("content_block_start %s", events[1].data)
			}
			md := parsed[len(parsed)-2]
			if md.Delta == nil || md.Delta.StopReason != tc.stop || string(md.Delta.StopSequence) != "null" {
				t.Errorf("message_delta %s", events[len(events)-2].data)
			}
			// message_delta's output count is the total, and the input was reported once.
			if md.Usage == nil || !intIs(md.Usage.OutputTokens, tc.out) || md.Usage.InputTokens != nil {
				t.Errorf("message_delta usage %s", events[len(events)-2].data)
			}
		})
	}
}

func TestMessagesRefused(t *testing.T) {
	s := start(t, baseConfig())
	withVersion := func(v ...string) http.Header {
		h := anthropicHeader(testKey)
		h["Anthropic-Version"] = v
		return h
	}
	for _, tc := range []struct {
		name   string
		h      http.Header
		body   string
		status int
		typ    string
		msg    string
	}{
		{"no key", anthropicHeader(""), messagesBody, 401, "authentication_error", "x-api-key header is required"},
		{"wrong key", anthropicHeader("sk-ant-wrong"), messagesBody, 401, "authentication_error", "invalid x-api-key"},
		{"wrong bearer", http.Header{"Authorization": {"Bearer sk-ant-wrong"}, "Anthropic-Version": {version}}, messagesBody, 401, "authentication_error", "invalid x-api-key"},
		{"x-api-key wins", http.Header{"X-Api-Key": {"sk-ant-wrong"}, "Authorization": {"Bearer " + testKey}, "Anthropic-Version": {version}}, messagesBody, 401, "authentication_error", "invalid x-api-key"},
		{"no version", withVersion(), messagesBody, 400, "invalid_request_error", "anthropic-version: header is required"},
		{"bad version", withVersion("latest"), messagesBody, 400, "invalid_request_error", `anthropic-version: "latest" is not a valid version`},
		{"doubled version", withVersion(version, version), messagesBody, 400, "invalid_request_error", `anthropic-version: "2023-06-01, 2023-06-01" is not a valid version`},
		{"not json", anthropicHeader(testKey), `{`, 400, "invalid_request_error", ""},
		{"no model", anthropicHeader(testKey), `{"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "model: Field required"},
		{"no max_tokens", anthropicHeader(testKey), `{"model":"c","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "max_tokens: Field required"},
		{"zero max_tokens", anthropicHeader(testKey), `{"model":"c","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "max_tokens: Input should be greater than or equal to 1"},
		{"string max_tokens", anthropicHeader(testKey), `{"model":"c","max_tokens":"5","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "max_tokens: Input should be a valid integer"},
		{"no messages", anthropicHeader(testKey), `{"model":"c","max_tokens":5}`, 400, "invalid_request_error", "messages: Field required"},
		{"empty messages", anthropicHeader(testKey), `{"model":"c","max_tokens":5,"messages":[]}`, 400, "invalid_request_error", "messages: at least one message is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := do(t, s, "POST", "/v1/messages", tc.h, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			e := decode[anthropicError](t, b)
			if e.Type != "error" || e.Error.Type != tc.typ || (tc.msg != "" && e.Error.Message != tc.msg) || e.Error.Message == "" {
				t.Errorf("error %s", b)
			}
			if e.RequestID == "" || e.RequestID != resp.Header.Get("request-id") {
				t.Errorf("request_id %q, header %q", e.RequestID, resp.Header.Get("request-id"))
			}
		})
	}
}

// TestMessagesBearer sends the headers the current TypeScript SDK sends: the key as a bearer
// token and a newer API version.
func TestMessagesBearer(t *testing.T) {
	s := start(t, baseConfig())
	h := http.Header{"Authorization": {"Bearer " + testKey}, "Anthropic-Version": {"2026-10-21"}, "Content-Type": {"application/json"}}
	resp, b := do(t, s, "POST", "/v1/messages", h, messagesBody)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if m := decode[message](t, b); len(m.Content) != 1 || m.Content[0].Text != testReply {
		t.Errorf("message %s", b)
	}
}

func TestStatus(t *testing.T) {
	s := start(t, baseConfig())
	for _, tc := range []struct {
		status                     int
		anthropicType, openAIType  string
		openAICode                 string
		anthropicMsg, openAIPrefix string
	}{
		{529, "overloaded_error", "server_error", "", "Overloaded", "The server had an error"},
		{500, "api_error", "server_error", "", "Internal server error", "The server had an error"},
		{503, "api_error", "server_error", "", "", "The server is overloaded"},
		{429, "rate_limit_error", "requests", "rate_limit_exceeded", "", "Rate limit reached"},
		{403, "permission_error", "invalid_request_error", "", "", ""},
	} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			cfg := baseConfig()
			cfg.Status = tc.status
			s.SetConfig(cfg)

			for _, path := range []string{"/v1/chat/completions", "/v1/responses"} {
				resp, b := do(t, s, "POST", path, openAIHeader(testKey), chatBody)
				if resp.StatusCode != tc.status {
					t.Errorf("%s: status %d: %s", path, resp.StatusCode, b)
				}
				e := decode[openAIError](t, b)
				if e.Error.Type != tc.openAIType || !strings.HasPrefix(e.Error.Message, tc.openAIPrefix) || e.Error.Message == "" {
					t.Errorf("%s: error %s", path, b)
				}
				checkNullable(t, "code", e.Error.Code, tc.openAICode)
			}
			for _, stream := range []string{"false", "true"} {
				body := `{"model":"c","max_tokens":5,"stream":` + stream + `,"messages":[{"role":"user","content":"hi"}]}`
				resp, b := do(t, s, "POST", "/v1/messages", anthropicHeader(testKey), body)
				if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/json" {
					t.Errorf("messages: status %d type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
				}
				e := decode[anthropicError](t, b)
				if e.Type != "error" || e.Error.Type != tc.anthropicType || (tc.anthropicMsg != "" && e.Error.Message != tc.anthropicMsg) {
					t.Errorf("messages: error %s", b)
				}
			}
			// The key is checked before the configured failure, as the real services do.
			if resp, b := do(t, s, "POST", "/v1/messages", anthropicHeader("sk-ant-wrong"), messagesBody); resp.StatusCode != 401 {
				t.Errorf("wrong key under Status: %d %s", resp.StatusCode, b)
			}
			if resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader(""), chatBody); resp.StatusCode != 401 {
				t.Errorf("no key under Status: %d %s", resp.StatusCode, b)
			}
		})
	}
	s.SetConfig(baseConfig())
	if resp, b := do(t, s, "POST", "/v1/messages", anthropicHeader(testKey), messagesBody); resp.StatusCode != 200 {
		t.Errorf("after clearing Status: %d %s", resp.StatusCode, b)
	}
}

func TestNotFound(t *testing.T) {
	s := start(t, baseConfig())
	for _, tc := range []struct {
		method, path string
		anthropic    bool
	}{
		{"POST", "/v1/files", false},
		{"POST", "/v1/models", false},
		{"GET", "/v1/models/a/b", false},
		{"DELETE", "/v1/models/fake-small", false},
		{"GET", "/v1/chat/completions", false},
		{"POST", "/", false},
		{"POST", "/v1/messages/batches", true},
		{"GET", "/v1/messages/count_tokens", true},
		{"GET", "/v1/messages", true},
	} {
		t.Run(tc.method+tc.path, func(t *testing.T) {
			h := openAIHeader(testKey)
			if tc.anthropic {
				h = anthropicHeader(testKey)
			}
			resp, b := do(t, s, tc.method, tc.path, h, `{}`)
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			if tc.anthropic {
				if e := decode[anthropicError](t, b); e.Type != "error" || e.Error.Type != "not_found_error" {
					t.Errorf("error %s", b)
				}
				return
			}
			e := decode[openAIError](t, b)
			if e.Error.Type != "invalid_request_error" || e.Error.Message != fmt.Sprintf("Invalid URL (%s %s)", tc.method, tc.path) {
				t.Errorf("error %s", b)
			}
		})
	}
}

func TestRequests(t *testing.T) {
	s := start(t, baseConfig())
	if got := s.Requests(); len(got) != 0 {
		t.Fatalf("fresh server has %d requests", len(got))
	}
	sent := []struct {
		method, path string
		h            http.Header
		body         string
		status       int
	}{
		{"POST", "/v1/chat/completions", openAIHeader(testKey), chatBody, 200},
		{"POST", "/v1/messages", anthropicHeader("sk-ant-wrong"), messagesBody, 401},
		{"POST", "/v1/responses", openAIHeader(testKey), "{not json", 400},
		{"GET", "/nowhere", http.Header{"X-Trace": {"t1"}}, "", 404},
		{"POST", "/v1/messages", anthropicHeader(testKey), strings.Replace(messagesBody, `"max_tokens":1024`, `"max_tokens":1024,"stream":true`, 1), 200},
	}
	for _, r := range sent {
		if resp, b := do(t, s, r.method, r.path, r.h.Clone(), r.body); resp.StatusCode != r.status {
			t.Fatalf("%s %s: status %d: %s", r.method, r.path, resp.StatusCode, b)
		}
	}
	got := s.Requests()
	if len(got) != len(sent) {
		t.Fatalf("%d requests recorded, want %d", len(got), len(sent))
	}
	for i, r := range sent {
		g := got[i]
		if g.Method != r.method || g.Path != r.path || string(g.Body) != r.body {
			t.Errorf("request %d: %s %s %q, want %s %s %q", i, g.Method, g.Path, g.Body, r.method, r.path, r.body)
		}
		for k := range r.h {
			if g.Header.Get(k) != r.h.Get(k) {
				t.Errorf("request %d: header %s %q, want %q", i, k, g.Header.Get(k), r.h.Get(k))
			}
		}
	}
	// What Requests returns belongs to the caller.
	got[0].Body[0] = 'X'
	got[0].Header.Set("Authorization", "changed")
	again := s.Requests()
	if string(again[0].Body) != chatBody || again[0].Header.Get("Authorization") != "Bearer "+testKey {
		t.Errorf("changing a returned request changed the record: %q %q", again[0].Body, again[0].Header.Get("Authorization"))
	}
}

func TestDefaults(t *testing.T) {
	// No key configured: any key is taken, but one must still be sent.
	s := start(t, fakellm.Config{InputTokens: 1, OutputTokens: 2})
	resp, b := do(t, s, "POST", "/v1/chat/completions", openAIHeader("anything"), chatBody)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if c := decode[chatCompletion](t, b); c.Choices[0].Message.Content != fakellm.DefaultReply {
		t.Errorf("reply %q", c.Choices[0].Message.Content)
	}
	if resp, _ := do(t, s, "POST", "/v1/messages", anthropicHeader(""), messagesBody); resp.StatusCode != 401 {
		t.Errorf("no key with no key configured: status %d", resp.StatusCode)
	}
	if !strings.HasPrefix(s.URL(), "http://127.0.0.1:") {
		t.Errorf("URL %q", s.URL())
	}
}

// TestSetConfigConcurrent changes the answers while requests are in flight: each answer must
// be wholly one configuration or the other, and the race detector must stay quiet.
func TestSetConfigConcurrent(t *testing.T) {
	a := fakellm.Config{APIKey: testKey, InputTokens: 1, OutputTokens: 2, Reply: "reply a"}
	b := fakellm.Config{APIKey: testKey, InputTokens: 30, OutputTokens: 40, Reply: "reply b"}
	s := start(t, a)
	stop := make(chan struct{})
	var flips sync.WaitGroup
	flips.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				s.SetConfig(b)
			} else {
				s.SetConfig(a)
			}
			_ = s.Requests()
		}
	})
	var clients sync.WaitGroup
	errs := make(chan error, 100)
	for range 8 {
		clients.Go(func() {
			for range 10 {
				req, _ := http.NewRequest("POST", s.URL()+"/v1/messages",
					strings.NewReader(`{"model":"c","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
				req.Header = anthropicHeader(testKey)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err
					return
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					errs <- err
					return
				}
				var in, out int
				var text strings.Builder
				for _, line := range strings.Split(string(body), "\n") {
					data, ok := strings.CutPrefix(line, "data: ")
					if !ok {
						continue
					}
					var ev messageEvent
					if err := json.Unmarshal([]byte(data), &ev); err != nil {
						errs <- err
						return
					}
					switch {
					case ev.Message != nil:
						in = *ev.Message.Usage.InputTokens
					case ev.Type == "message_delta":
						out = *ev.Usage.OutputTokens
					case ev.Type == "content_block_delta":
						text.WriteString(ev.Delta.Text)
					}
				}
				if got := fmt.Sprintf("%d %d %s", in, out, text.String()); got != "1 2 reply a" && got != "30 40 reply b" {
					errs <- fmt.Errorf("mixed answer: %s", got)
					return
				}
			}
		})
	}
	clients.Wait()
	close(stop)
	flips.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := len(s.Requests()); n != 80 {
		t.Errorf("%d requests recorded, want 80", n)
	}
}

func TestClose(t *testing.T) {
	s, err := fakellm.Start(baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	url := s.URL()
	s.Close()
	s.Close()
	client := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err == nil {
		resp.Body.Close()
		t.Fatal("server still answers after Close")
	}
	if got := s.Requests(); len(got) != 0 {
		t.Errorf("requests after Close: %d", len(got))
	}
}
