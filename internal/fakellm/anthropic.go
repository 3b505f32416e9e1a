package fakellm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// anthropicVersion is the form of an anthropic-version value: a single date. The API refuses
// dates it does not know, but the SDKs move to new ones (the TypeScript SDK sends 2026-10-21
// since 1.0), so the fake accepts any date and refuses only what cannot be one, such as the
// "2023-06-01, 2023-06-01" a gateway that adds the header twice produces.
var anthropicVersion = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)

// anthropicHeaders sets what every Anthropic answer carries; the SDKs report request-id with
// every error.
func anthropicHeaders(w http.ResponseWriter) string {
	id := "req_011C" + randID(20)
	w.Header().Set("request-id", id)
	return id
}

func anthropicError(w http.ResponseWriter, status int, typ, message string) {
	id := anthropicHeaders(w)
	type detail struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	writeJSON(w, status, struct {
		Type      string `json:"type"`
		Error     detail `json:"error"`
		RequestID string `json:"request_id"`
	}{"error", detail{typ, message}, id})
}

// anthropicStatusErr is the error type and message Anthropic sends with status.
func anthropicStatusErr(status int) (string, string) {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error", "Invalid request"
	case http.StatusUnauthorized:
		return "authentication_error", "invalid x-api-key"
	case http.StatusPaymentRequired:
		return "billing_error", "Your credit balance is too low to access the Anthropic API."
	case http.StatusForbidden:
		return "permission_error", "Your API key does not have permission to use the specified resource."
	case http.StatusNotFound:
		return "not_found_error", "Not Found"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large", "Request exceeds the maximum allowed number of bytes."
	case http.StatusTooManyRequests:
		return "rate_limit_error", "Number of requests has exceeded your rate limit. Please try again later."
	case http.StatusGatewayTimeout:
		return "timeout_error", "Request timed out"
	case 529:
		return "overloaded_error", "Overloaded"
	}
	if status >= 500 {
		return "api_error", "Internal server error"
	}
	return "invalid_request_error", http.StatusText(status)
}

type anthropicUsage struct {
	InputTokens              int    `json:"input_tokens"`
	CacheCreationInputTokens int    `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int    `json:"cache_read_input_tokens"`
	OutputTokens             int    `json:"output_tokens"`
	ServiceTier              string `json:"service_tier"`
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// toolUseBlock is a tool call in a message's content.
type toolUseBlock struct {
	Type  string          `json:"type"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

type message struct {
	ID    string `json:"id"`
	Type  string `json:"type"`
	Role  string `json:"role"`
	Model string `json:"model"`
	// Content holds textBlock and *toolUseBlock values.
	Content      []any          `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        anthropicUsage `json:"usage"`
}

// anthropicAuth refuses, and answers for, a request without the configured key or without a
// valid anthropic-version; then applies Config.Status. It reports whether to go on.
func anthropicAuth(w http.ResponseWriter, r *http.Request, cfg Config) bool {
	// x-api-key is the documented header; the SDKs since 1.0 send the key as a bearer token
	// instead, which the API takes too. x-api-key wins when both are there.
	key := r.Header.Get("x-api-key")
	if key == "" {
		if scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
			key = strings.TrimSpace(token)
		}
	}
	switch {
	case key == "":
		anthropicError(w, http.StatusUnauthorized, "authentication_error", "x-api-key header is required")
		return false
	case cfg.APIKey != "" && key != cfg.APIKey:
		anthropicError(w, http.StatusUnauthorized, "authentication_error", "invalid x-api-key")
		return false
	}
	// Joined as an HTTP/1.1 intermediary would fold them, so a doubled header reads as the
	// API reports it.
	switch version := strings.Join(r.Header.Values("anthropic-version"), ", "); {
	case version == "":
		anthropicError(w, http.StatusBadRequest, "invalid_request_error", "anthropic-version: header is required")
		return false
	case !anthropicVersion.MatchString(version):
		anthropicError(w, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("anthropic-version: %q is not a valid version", version))
		return false
	}
	if cfg.Status != 0 {
		typ, msg := anthropicStatusErr(cfg.Status)
		anthropicError(w, cfg.Status, typ, msg)
		return false
	}
	return true
}

func (s *Server) serveMessages(w http.ResponseWriter, r *http.Request, cfg Config, body []byte) {
	if !anthropicAuth(w, r, cfg) {
		return
	}
	f, err := parseBody(body)
	if err != nil {
		anthropicError(w, http.StatusBadRequest, "invalid_request_error", "There was an issue with your request body: it is not valid JSON.")
		return
	}
	// Field checks in the order and words of Anthropic's validator.
	invalid := func(msg string) {
		anthropicError(w, http.StatusBadRequest, "invalid_request_error", msg)
	}
	if !f.has("model") {
		invalid("model: Field required")
		return
	}
	model, ok := f.str("model")
	if !ok {
		invalid("model: Input should be a valid string")
		return
	}
	if !f.has("max_tokens") {
		invalid("max_tokens: Field required")
		return
	}
	maxTokens, ok := f.integer("max_tokens")
	if !ok {
		invalid("max_tokens: Input should be a valid integer")
		return
	}
	if maxTokens < 1 {
		invalid("max_tokens: Input should be greater than or equal to 1")
		return
	}
	if msg := thinkingError(f, maxTokens, r.Header.Get("Anthropic-Beta")); msg != "" {
		invalid(msg)
		return
	}
	if !f.has("messages") {
		invalid("messages: Field required")
		return
	}
	msgs, ok := f.array("messages")
	if !ok {
		invalid("messages: Input should be a valid list")
		return
	}
	if len(msgs) == 0 {
		invalid("messages: at least one message is required")
		return
	}
	stream := false
	if f.has("stream") {
		if stream, ok = f.boolean("stream"); !ok {
			invalid("stream: Input should be a valid boolean")
			return
		}
	}

	turn, offered, scripted := scriptTurn(cfg, f, anthropicResults)
	if scripted {
		turn, _ = unoffered(turn, offered)
	} else {
		turn = Turn{Text: cfg.reply()}
	}
	out, truncated := capped(cfg, maxTokens, true)
	stop := "end_turn"
	switch {
	case truncated:
		stop = "max_tokens"
	case turn.Tool != "":
		stop = "tool_use"
	}
	// The blocks the answer holds: its text, then the tool call it makes. A call cut short
	// by max_tokens is not made; the text is what was said before the cut.
	var content []any
	if turn.Text != "" || turn.Tool == "" {
		content = append(content, textBlock{Type: "text", Text: turn.Text})
	}
	var call *toolUseBlock
	if turn.Tool != "" && !truncated {
		call = &toolUseBlock{Type: "tool_use", ID: "toolu_01" + randID(22), Name: turn.Tool, Input: turn.Input}
		content = append(content, call)
	}
	msg := message{
		ID:      "msg_01" + randID(22),
		Type:    "message",
		Role:    "assistant",
		Model:   model,
		Content: content,
		Usage: anthropicUsage{
			InputTokens:          cfg.input(body),
			CacheReadInputTokens: cfg.CachedTokens,
			OutputTokens:         out,
			ServiceTier:          "standard",
		},
		StopReason: &stop,
	}
	s.bill(Usage{InputTokens: cfg.input(body), OutputTokens: out, CachedTokens: cfg.CachedTokens,
		Tokens: cfg.input(body) + cfg.CachedTokens + out})
	if !stream {
		anthropicHeaders(w)
		writeJSON(w, http.StatusOK, msg)
		return
	}

	anthropicHeaders(w)
	ev := startSSE(w, cfg)
	// The stream opens with the message as it stands before any text: no content, no stop
	// reason, the whole input usage and a token of output. The final output count arrives
	// only in message_delta, and is cumulative, not an increment.
	start := msg
	start.Content = []any{}
	start.StopReason = nil
	start.Usage.OutputTokens = 1
	writeEvent(ev, "message_start", struct {
		Type    string  `json:"type"`
		Message message `json:"message"`
	}{"message_start", start})
	type blockStart struct {
		Type         string `json:"type"`
		Index        int    `json:"index"`
		ContentBlock any    `json:"content_block"`
	}
	type blockDelta struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
		Delta any    `json:"delta"`
	}
	type blockStop struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}
	for i, block := range content {
		switch b := block.(type) {
		case textBlock:
			writeEvent(ev, "content_block_start", blockStart{"content_block_start", i, textBlock{Type: "text"}})
			if i == 0 {
				writeEvent(ev, "ping", struct {
					Type string `json:"type"`
				}{"ping"})
			}
			for _, part := range splitReply(b.Text) {
				writeEvent(ev, "content_block_delta", blockDelta{"content_block_delta", i, textBlock{Type: "text_delta", Text: part}})
			}
		case *toolUseBlock:
			// The call opens with an empty input; the input follows as pieces of its JSON
			// text, the first of them empty, as the API sends them.
			opening := *b
			opening.Input = []byte("{}")
			writeEvent(ev, "content_block_start", blockStart{"content_block_start", i, opening})
			type inputDelta struct {
				Type        string `json:"type"`
				PartialJSON string `json:"partial_json"`
			}
			for _, part := range append([]string{""}, splitJSONText(string(b.Input))...) {
				writeEvent(ev, "content_block_delta", blockDelta{"content_block_delta", i, inputDelta{"input_json_delta", part}})
			}
		}
		writeEvent(ev, "content_block_stop", blockStop{"content_block_stop", i})
	}
	type stopDelta struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	type outputUsage struct {
		OutputTokens int `json:"output_tokens"`
	}
	writeEvent(ev, "message_delta", struct {
		Type  string      `json:"type"`
		Delta stopDelta   `json:"delta"`
		Usage outputUsage `json:"usage"`
	}{"message_delta", stopDelta{StopReason: stop}, outputUsage{out}})
	writeEvent(ev, "message_stop", struct {
		Type string `json:"type"`
	}{"message_stop"})
}

// writeEvent sends v as event name; Anthropic repeats the name as the data's type, and each
// caller's v does.
func writeEvent(ev *sse, name string, v any) { ev.event(name, marshal(v)) }

// serveCountTokens answers messages/count_tokens: the input the messages would be, which is
// Config.InputTokens; nothing is generated.
func serveCountTokens(w http.ResponseWriter, r *http.Request, cfg Config, body []byte) {
	if !anthropicAuth(w, r, cfg) {
		return
	}
	f, err := parseBody(body)
	if err != nil {
		anthropicError(w, http.StatusBadRequest, "invalid_request_error", "There was an issue with your request body: it is not valid JSON.")
		return
	}
	invalid := func(msg string) {
		anthropicError(w, http.StatusBadRequest, "invalid_request_error", msg)
	}
	if _, ok := f.str("model"); !ok {
		invalid("model: Field required")
		return
	}
	if msgs, ok := f.array("messages"); !ok || len(msgs) == 0 {
		invalid("messages: Field required")
		return
	}
	anthropicHeaders(w)
	writeJSON(w, http.StatusOK, struct {
		InputTokens int `json:"input_tokens"`
	}{cfg.input(body)})
}

type anthropicModel struct {
	Type        string `json:"type"`
	ID          string `json:"id"`
	DisplayName string `json:"display_name"`
	CreatedAt   string `json:"created_at"`
}

// serveAnthropicModels lists the models (id "") a page at a time (limit, after_id), or
// describes one.
func serveAnthropicModels(w http.ResponseWriter, r *http.Request, cfg Config, id string) {
	if !anthropicAuth(w, r, cfg) {
		return
	}
	model := func(id string) anthropicModel {
		return anthropicModel{Type: "model", ID: id, DisplayName: id, CreatedAt: time.Unix(fakeCreated, 0).UTC().Format(time.RFC3339)}
	}
	if id != "" {
		if !knownModel(cfg, id) {
			anthropicError(w, http.StatusNotFound, "not_found_error", "model: "+id)
			return
		}
		anthropicHeaders(w)
		writeJSON(w, http.StatusOK, model(id))
		return
	}
	all := listedModels(cfg)
	q := r.URL.Query()
	if after := q.Get("after_id"); after != "" {
		if i := slices.Index(all, after); i >= 0 {
			all = all[i+1:]
		}
	}
	limit := 20
	if l, err := strconv.Atoi(q.Get("limit")); err == nil {
		if l < 1 || l > 1000 {
			anthropicError(w, http.StatusBadRequest, "invalid_request_error", "limit: Input should be between 1 and 1000")
			return
		}
		limit = l
	}
	page := all[:min(limit, len(all))]
	data := []anthropicModel{}
	for _, m := range page {
		data = append(data, model(m))
	}
	var first, last *string
	if len(page) > 0 {
		first, last = &page[0], &page[len(page)-1]
	}
	anthropicHeaders(w)
	writeJSON(w, http.StatusOK, struct {
		Data    []anthropicModel `json:"data"`
		HasMore bool             `json:"has_more"`
		FirstID *string          `json:"first_id"`
		LastID  *string          `json:"last_id"`
	}{data, len(page) < len(all), first, last})
}

// thinkingError is what Anthropic says of an enabled thinking budget it refuses: under
// 1,024 tokens, or not below max_tokens — which interleaved thinking (a beta) allows, the
// budget then spanning the turn's thinking blocks.
func thinkingError(f fields, maxTokens int, beta string) string {
	if !f.has("thinking") {
		return ""
	}
	var th struct {
		Type   string `json:"type"`
		Budget int    `json:"budget_tokens"`
	}
	if json.Unmarshal(f["thinking"], &th) != nil || th.Type != "enabled" {
		return ""
	}
	switch {
	case th.Budget < 1024:
		return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
	case th.Budget >= maxTokens && !strings.Contains(beta, "interleaved-thinking"):
		return "`max_tokens` must be greater than `thinking.budget_tokens`."
	}
	return ""
}
