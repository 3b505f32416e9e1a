package fakellm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// systemFingerprint has the form of OpenAI's ("fp_" and ten hex digits), which some clients log.
const systemFingerprint = "fp_fa4e11c0de"

// openAIErr is the body of every OpenAI error, inside {"error": ...}. Param and Code are
// pointers because OpenAI sends an explicit null for each when it has none, and clients
// read the field's presence.
type openAIErr struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func ptr[T any](v T) *T { return &v }

// openAIHeaders sets what every OpenAI answer carries; the SDKs surface x-request-id on
// errors, so a gateway that drops it is visible.
func openAIHeaders(w http.ResponseWriter) string {
	id := "req_" + randID(32)
	h := w.Header()
	h.Set("x-request-id", id)
	h.Set("openai-version", "2020-10-01")
	h.Set("openai-processing-ms", "1")
	return id
}

func openAIError(w http.ResponseWriter, status int, e openAIErr) {
	openAIHeaders(w)
	writeJSON(w, status, struct {
		Error openAIErr `json:"error"`
	}{e})
}

// openAIStatusErr is the body OpenAI sends with status when nothing more specific applies.
func openAIStatusErr(status int) openAIErr {
	switch {
	case status == http.StatusUnauthorized:
		return openAIErr{
			Message: "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
			Type:    "invalid_request_error",
			Code:    ptr("invalid_api_key"),
		}
	case status == http.StatusTooManyRequests:
		// OpenAI puts the limit that was hit ("requests" or "tokens") in type and the
		// condition in code.
		return openAIErr{
			Message: "Rate limit reached for requests. Please try again in 1s. Visit https://platform.openai.com/account/rate-limits to learn more.",
			Type:    "requests",
			Code:    ptr("rate_limit_exceeded"),
		}
	case status == http.StatusServiceUnavailable:
		return openAIErr{Message: "The server is overloaded or not ready yet.", Type: "server_error"}
	case status >= 500:
		return openAIErr{
			Message: "The server had an error while processing your request. Sorry about that!",
			Type:    "server_error",
		}
	default:
		return openAIErr{Message: http.StatusText(status), Type: "invalid_request_error"}
	}
}

// openAIAuth refuses, and answers for, a request without the configured bearer key.
func openAIAuth(w http.ResponseWriter, r *http.Request, cfg Config) bool {
	scheme, key, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	key = strings.TrimSpace(key)
	if !strings.EqualFold(scheme, "Bearer") || key == "" {
		openAIError(w, http.StatusUnauthorized, openAIErr{
			Message: "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY). You can obtain an API key from https://platform.openai.com/account/api-keys.",
			Type:    "invalid_request_error",
			Code:    ptr("invalid_api_key"),
		})
		return false
	}
	if cfg.APIKey != "" && key != cfg.APIKey {
		openAIError(w, http.StatusUnauthorized, openAIErr{
			Message: fmt.Sprintf("Incorrect API key provided: %s. You can find your API key at https://platform.openai.com/account/api-keys.", maskKey(key)),
			Type:    "invalid_request_error",
			Code:    ptr("invalid_api_key"),
		})
		return false
	}
	return true
}

// maskKey hides most of a key, as OpenAI does, so a key a test leaks into an error does not
// land whole in a log.
func maskKey(key string) string {
	if len(key) <= 8 {
		return strings.Repeat("*", len(key))
	}
	return key[:3] + strings.Repeat("*", len(key)-7) + key[len(key)-4:]
}

// openAIParams reads a body's parameters and reports the first one that is wrong the way
// OpenAI's validator words it.
type openAIParams struct {
	f   fields
	err *openAIErr
}

func (p *openAIParams) fail(param, format string, args ...any) {
	if p.err == nil {
		p.err = &openAIErr{Message: fmt.Sprintf(format, args...), Type: "invalid_request_error", Param: ptr(param)}
	}
}

func (p *openAIParams) failType(param, want string) {
	if p.err == nil {
		p.fail(param, "Invalid type for '%s': expected %s, but got %s instead.", param, want, kind(p.f[param]))
		p.err.Code = ptr("invalid_type")
	}
}

func (p *openAIParams) requiredString(key string) string {
	if p.err != nil {
		return ""
	}
	if !p.f.has(key) {
		p.fail(key, "Missing required parameter: '%s'.", key)
		return ""
	}
	s, ok := p.f.str(key)
	if !ok {
		p.failType(key, "a string")
	}
	return s
}

// optionalInt is the value of key and whether the request set it.
func (p *openAIParams) optionalInt(key string) (int, bool) {
	if p.err != nil || !p.f.has(key) {
		return 0, false
	}
	n, ok := p.f.integer(key)
	if !ok {
		p.failType(key, "an integer")
	}
	return n, ok
}

// choices reads a count of answers (n, best_of): an integer from 1 to 128, def when absent.
func (p *openAIParams) choices(key string, def int) int {
	n, ok := p.optionalInt(key)
	switch {
	case !ok:
		return def
	case n < 1:
		p.fail(key, "Invalid '%s': integer below minimum value. Expected a value >= 1, but got %d instead.", key, n)
		p.err.Code = ptr("integer_below_min_value")
	case n > 128:
		p.fail(key, "Invalid '%s': integer above maximum value. Expected a value <= 128, but got %d instead.", key, n)
		p.err.Code = ptr("integer_above_max_value")
	}
	return n
}

func (p *openAIParams) optionalBool(key string) bool {
	if p.err != nil || !p.f.has(key) {
		return false
	}
	b, ok := p.f.boolean(key)
	if !ok {
		p.failType(key, "a boolean")
	}
	return b
}

// openAIRequest authenticates, applies Config.Status and parses the body: everything the two
// OpenAI routes share before they differ. It answers and returns nil when the request fails.
func openAIRequest(w http.ResponseWriter, r *http.Request, cfg Config, body []byte) *openAIParams {
	if !openAIAuth(w, r, cfg) {
		return nil
	}
	if cfg.Status != 0 {
		openAIError(w, cfg.Status, openAIStatusErr(cfg.Status))
		return nil
	}
	f, err := parseBody(body)
	if err != nil {
		openAIError(w, http.StatusBadRequest, openAIErr{
			Message: "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)",
			Type:    "invalid_request_error",
		})
		return nil
	}
	return &openAIParams{f: f}
}

type chatUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
		AudioTokens  int `json:"audio_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens          int `json:"reasoning_tokens"`
		AudioTokens              int `json:"audio_tokens"`
		AcceptedPredictionTokens int `json:"accepted_prediction_tokens"`
		RejectedPredictionTokens int `json:"rejected_prediction_tokens"`
	} `json:"completion_tokens_details"`
}

type chatMessage struct {
	Role        string  `json:"role"`
	Content     string  `json:"content"`
	Refusal     *string `json:"refusal"`
	Annotations []any   `json:"annotations"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	Logprobs     any         `json:"logprobs"`
	FinishReason string      `json:"finish_reason"`
}

type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	Usage             chatUsage    `json:"usage"`
	ServiceTier       string       `json:"service_tier"`
	SystemFingerprint string       `json:"system_fingerprint"`
}

type chunkChoice struct {
	Index        int     `json:"index"`
	Delta        any     `json:"delta"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type chatChunk struct {
	ID                string        `json:"id"`
	Object            string        `json:"object"`
	Created           int64         `json:"created"`
	Model             string        `json:"model"`
	ServiceTier       string        `json:"service_tier"`
	SystemFingerprint string        `json:"system_fingerprint"`
	Choices           []chunkChoice `json:"choices"`
	// Usage is absent unless the client asked for usage; then it is null on every chunk
	// but the last. Left nil it is omitted; rawNull makes it an explicit null.
	Usage any `json:"usage,omitempty"`
}

// rawNull marshals as an explicit null where a nil interface would be left out.
type rawNull struct{}

func (rawNull) MarshalJSON() ([]byte, error) { return []byte("null"), nil }

func (s *Server) serveChat(w http.ResponseWriter, r *http.Request, cfg Config, body []byte) {
	p := openAIRequest(w, r, cfg, body)
	if p == nil {
		return
	}
	model := p.requiredString("model")
	if p.err == nil {
		if !p.f.has("messages") {
			p.fail("messages", "Missing required parameter: 'messages'.")
		} else if msgs, ok := p.f.array("messages"); !ok {
			p.failType("messages", "an array")
		} else if len(msgs) == 0 {
			p.fail("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.")
			p.err.Code = ptr("empty_array")
		}
	}
	stream := p.optionalBool("stream")
	includeUsage := false
	if p.err == nil && p.f.has("stream_options") {
		// OpenAI refuses stream_options on a non-streaming request; a gateway that adds
		// include_usage to every request to meter streams has to get this right.
		if !stream {
			p.fail("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
		} else if opts, err := parseBody(p.f["stream_options"]); err != nil {
			p.failType("stream_options", "an object")
		} else {
			op := &openAIParams{f: opts}
			includeUsage = op.optionalBool("include_usage")
			if op.err != nil {
				p.fail("stream_options.include_usage", "Invalid type for 'stream_options.include_usage': expected a boolean, but got %s instead.", kind(opts["include_usage"]))
				p.err.Code = ptr("invalid_type")
			}
		}
	}
	// max_tokens is the deprecated spelling of max_completion_tokens; both still work, and
	// the tighter limit wins.
	limit, limited := p.optionalInt("max_completion_tokens")
	if n, ok := p.optionalInt("max_tokens"); ok && (!limited || n < limit) {
		limit, limited = n, true
	}
	// n answers come back, each its own choice, and the usage counts them all.
	n := p.choices("n", 1)
	if p.err != nil {
		openAIError(w, http.StatusBadRequest, *p.err)
		return
	}

	out, truncated := capped(cfg, limit, limited)
	finish := "stop"
	if truncated {
		finish = "length"
	}
	var usage chatUsage
	usage.PromptTokens = cfg.input(body)
	usage.CompletionTokens = n * out
	usage.TotalTokens = cfg.input(body) + n*out
	s.bill(Usage{InputTokens: usage.PromptTokens, OutputTokens: usage.CompletionTokens, Tokens: usage.TotalTokens})

	id := "chatcmpl-" + randID(29)
	created := time.Now().Unix()
	if !stream {
		openAIHeaders(w)
		writeJSON(w, http.StatusOK, chatCompletion{
			ID:      id,
			Object:  "chat.completion",
			Created: created,
			Model:   model,
			Choices: func() []chatChoice {
				choices := make([]chatChoice, n)
				for i := range choices {
					choices[i] = chatChoice{Index: i, Message: chatMessage{Role: "assistant", Content: cfg.reply(), Annotations: []any{}}, FinishReason: finish}
				}
				return choices
			}(),
			Usage:             usage,
			ServiceTier:       "default",
			SystemFingerprint: systemFingerprint,
		})
		return
	}

	openAIHeaders(w)
	ev := startSSE(w, cfg)
	chunk := func(choices []chunkChoice, u any) {
		c := chatChunk{
			ID:                id,
			Object:            "chat.completion.chunk",
			Created:           created,
			Model:             model,
			ServiceTier:       "default",
			SystemFingerprint: systemFingerprint,
			Choices:           choices,
		}
		if includeUsage {
			c.Usage = u
		}
		ev.event("", marshal(c))
	}
	// Each choice streams in turn, its index on every chunk.
	for i := range n {
		delta := func(d any, finish *string) []chunkChoice {
			return []chunkChoice{{Index: i, Delta: d, FinishReason: finish}}
		}
		chunk(delta(struct {
			Role    string  `json:"role"`
			Content string  `json:"content"`
			Refusal *string `json:"refusal"`
		}{Role: "assistant"}, nil), rawNull{})
		for _, part := range splitReply(cfg.reply()) {
			chunk(delta(struct {
				Content string `json:"content"`
			}{part}, nil), rawNull{})
		}
		chunk(delta(struct{}{}, &finish), rawNull{})
	}
	if includeUsage {
		chunk([]chunkChoice{}, usage)
	}
	ev.event("", []byte("[DONE]"))
}

type responseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

type outputText struct {
	Type        string `json:"type"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
	Text        string `json:"text"`
}

type outputItem struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Status  string       `json:"status"`
	Content []outputText `json:"content"`
	Role    string       `json:"role"`
}

// functionCall is a call of one of the request's function tools among a response's output.
type functionCall struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Status    string `json:"status"`
	Arguments string `json:"arguments"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
}

// applyPatchCall is a call of the Responses API's built-in apply_patch: its operation is the
// scripted turn's Input.
type applyPatchCall struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	Status    string          `json:"status"`
	CallID    string          `json:"call_id"`
	Operation json.RawMessage `json:"operation"`
}

type response struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	CreatedAt         int64  `json:"created_at"`
	Status            string `json:"status"`
	Background        bool   `json:"background"`
	Error             any    `json:"error"`
	IncompleteDetails any    `json:"incomplete_details"`
	Instructions      any    `json:"instructions"`
	MaxOutputTokens   any    `json:"max_output_tokens"`
	Model             string `json:"model"`
	// Output holds outputItem and functionCall values.
	Output             []any          `json:"output"`
	ParallelToolCalls  bool           `json:"parallel_tool_calls"`
	PreviousResponseID any            `json:"previous_response_id"`
	Reasoning          any            `json:"reasoning"`
	ServiceTier        string         `json:"service_tier"`
	Store              bool           `json:"store"`
	Temperature        float64        `json:"temperature"`
	Text               any            `json:"text"`
	ToolChoice         string         `json:"tool_choice"`
	Tools              []any          `json:"tools"`
	TopP               float64        `json:"top_p"`
	Truncation         string         `json:"truncation"`
	Usage              *responseUsage `json:"usage"`
	User               any            `json:"user"`
	Metadata           map[string]any `json:"metadata"`
}

// responseEvent is every Responses streaming event; each kind fills its own fields.
type responseEvent struct {
	Type           string      `json:"type"`
	SequenceNumber int         `json:"sequence_number"`
	Response       *response   `json:"response,omitempty"`
	ItemID         string      `json:"item_id,omitempty"`
	OutputIndex    *int        `json:"output_index,omitempty"`
	ContentIndex   *int        `json:"content_index,omitempty"`
	Item           any         `json:"item,omitempty"`
	Part           *outputText `json:"part,omitempty"`
	Delta          *string     `json:"delta,omitempty"`
	Text           *string     `json:"text,omitempty"`
	Arguments      *string     `json:"arguments,omitempty"`
	// Logprobs is [] on the text events and absent elsewhere, as OpenAI sends it.
	Logprobs []any `json:"logprobs,omitzero"`
}

func (s *Server) serveResponses(w http.ResponseWriter, r *http.Request, cfg Config, body []byte) {
	p := openAIRequest(w, r, cfg, body)
	if p == nil {
		return
	}
	model := p.requiredString("model")
	if p.err == nil && !p.f.has("input") {
		p.fail("input", "Missing required parameter: 'input'.")
	}
	stream := p.optionalBool("stream")
	limit, limited := p.optionalInt("max_output_tokens")
	var instructions any
	if p.err == nil && p.f.has("instructions") {
		if s, ok := p.f.str("instructions"); ok {
			instructions = s
		} else {
			p.failType("instructions", "a string")
		}
	}
	if p.err != nil {
		openAIError(w, http.StatusBadRequest, *p.err)
		return
	}

	turn, offered, scripted := scriptTurn(cfg, p.f, responsesResults)
	if scripted {
		turn, _ = unoffered(turn, offered)
	} else {
		turn = Turn{Text: cfg.reply()}
	}
	out, truncated := capped(cfg, limit, limited)
	status, incomplete := "completed", any(nil)
	if truncated {
		status = "incomplete"
		incomplete = map[string]string{"reason": "max_output_tokens"}
	}
	in := cfg.input(body)
	cached := min(cfg.CachedTokens, in)
	usage := &responseUsage{InputTokens: in, OutputTokens: out, TotalTokens: in + out}
	usage.InputTokensDetails.CachedTokens = cached
	s.bill(Usage{InputTokens: in, OutputTokens: out, CachedTokens: cached, Tokens: usage.TotalTokens})
	// The output: the message, then the call it makes. A call cut short by
	// max_output_tokens is not made.
	var output []any
	var item *outputItem
	if turn.Text != "" || turn.Tool == "" {
		part := outputText{Type: "output_text", Annotations: []any{}, Logprobs: []any{}, Text: turn.Text}
		item = &outputItem{ID: "msg_" + randID(48), Type: "message", Status: status, Content: []outputText{part}, Role: "assistant"}
		output = append(output, *item)
	}
	var call *functionCall
	var patch *applyPatchCall
	switch {
	case turn.Tool == "" || truncated:
	case turn.Tool == builtinApplyPatch && offersBuiltin(p.f, builtinApplyPatch):
		patch = &applyPatchCall{ID: "apc_" + randID(48), Type: "apply_patch_call", Status: "completed",
			CallID: "call_" + randID(24), Operation: turn.Input}
		output = append(output, *patch)
	default:
		call = &functionCall{ID: "fc_" + randID(48), Type: "function_call", Status: "completed",
			Arguments: string(turn.Input), CallID: "call_" + randID(24), Name: turn.Tool}
		output = append(output, *call)
	}
	resp := response{
		ID:                "resp_" + randID(48),
		Object:            "response",
		CreatedAt:         time.Now().Unix(),
		Status:            status,
		IncompleteDetails: incomplete,
		Instructions:      instructions,
		Model:             model,
		Output:            output,
		ParallelToolCalls: true,
		Reasoning:         map[string]any{"effort": nil, "summary": nil},
		ServiceTier:       "default",
		Store:             true,
		Temperature:       1,
		Text:              map[string]any{"format": map[string]string{"type": "text"}},
		ToolChoice:        "auto",
		Tools:             []any{},
		TopP:              1,
		Truncation:        "disabled",
		Usage:             usage,
		Metadata:          map[string]any{},
	}
	if limited {
		resp.MaxOutputTokens = limit
	}
	if !stream {
		openAIHeaders(w)
		writeJSON(w, http.StatusOK, resp)
		return
	}

	openAIHeaders(w)
	ev := startSSE(w, cfg)
	seq := 0
	emit := func(e responseEvent) {
		e.SequenceNumber = seq
		seq++
		ev.event(e.Type, marshal(e))
	}
	// Until the last event the response is in progress: no output yet and no usage, which is
	// what makes response.completed the only place a meter can read it.
	pending := resp
	pending.Status, pending.IncompleteDetails, pending.Output, pending.Usage = "in_progress", nil, []any{}, nil
	zero := ptr(0)
	emit(responseEvent{Type: "response.created", Response: &pending})
	emit(responseEvent{Type: "response.in_progress", Response: &pending})
	index := 0
	if item != nil {
		at := ptr(index)
		part := item.Content[0]
		emit(responseEvent{Type: "response.output_item.added", OutputIndex: at,
			Item: &outputItem{ID: item.ID, Type: "message", Status: "in_progress", Content: []outputText{}, Role: "assistant"}})
		emit(responseEvent{Type: "response.content_part.added", ItemID: item.ID, OutputIndex: at, ContentIndex: zero,
			Part: &outputText{Type: "output_text", Annotations: []any{}, Logprobs: []any{}, Text: ""}})
		for _, d := range splitReply(part.Text) {
			emit(responseEvent{Type: "response.output_text.delta", ItemID: item.ID, OutputIndex: at, ContentIndex: zero,
				Delta: ptr(d), Logprobs: []any{}})
		}
		emit(responseEvent{Type: "response.output_text.done", ItemID: item.ID, OutputIndex: at, ContentIndex: zero,
			Text: ptr(part.Text), Logprobs: []any{}})
		emit(responseEvent{Type: "response.content_part.done", ItemID: item.ID, OutputIndex: at, ContentIndex: zero, Part: &part})
		emit(responseEvent{Type: "response.output_item.done", OutputIndex: at, Item: item})
		index++
	}
	if call != nil {
		// The call opens with no arguments; they follow in pieces of their JSON text.
		at := ptr(index)
		opening := *call
		opening.Status, opening.Arguments = "in_progress", ""
		emit(responseEvent{Type: "response.output_item.added", OutputIndex: at, Item: &opening})
		for _, d := range splitJSONText(call.Arguments) {
			emit(responseEvent{Type: "response.function_call_arguments.delta", ItemID: call.ID, OutputIndex: at, Delta: ptr(d)})
		}
		emit(responseEvent{Type: "response.function_call_arguments.done", ItemID: call.ID, OutputIndex: at, Arguments: ptr(call.Arguments)})
		emit(responseEvent{Type: "response.output_item.done", OutputIndex: at, Item: call})
	}
	if patch != nil {
		// The operation comes whole, in the item's added and done events.
		at := ptr(index)
		opening := *patch
		opening.Status = "in_progress"
		emit(responseEvent{Type: "response.output_item.added", OutputIndex: at, Item: &opening})
		emit(responseEvent{Type: "response.output_item.done", OutputIndex: at, Item: patch})
	}
	final := "response.completed"
	if truncated {
		// A response cut short by max_output_tokens ends in response.incomplete instead, with
		// the usage in the same place.
		final = "response.incomplete"
	}
	emit(responseEvent{Type: final, Response: &resp})
}

// completionsDefaultMaxTokens is what legacy completions produce at most when the request
// sets no max_tokens.
const completionsDefaultMaxTokens = 16

type textChoice struct {
	Text         string  `json:"text"`
	Index        int     `json:"index"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type textCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint"`
	Choices           []textChoice `json:"choices"`
	Usage             any          `json:"usage,omitempty"`
}

// serveCompletions answers the legacy completions API: n choices for each prompt (a string,
// a token list, or a list of either), generated best_of times each, all of which count in
// the usage.
func (s *Server) serveCompletions(w http.ResponseWriter, r *http.Request, cfg Config, body []byte) {
	p := openAIRequest(w, r, cfg, body)
	if p == nil {
		return
	}
	model := p.requiredString("model")
	prompts := 1
	if p.err == nil {
		if !p.f.has("prompt") {
			p.fail("prompt", "Missing required parameter: 'prompt'.")
		} else if list, ok := p.f.array("prompt"); ok && len(list) > 0 && kind(list[0]) != "an integer" {
			prompts = len(list)
		}
	}
	stream := p.optionalBool("stream")
	limit, limited := p.optionalInt("max_tokens")
	if !limited {
		limit, limited = completionsDefaultMaxTokens, true
	}
	n := p.choices("n", 1)
	bestOf := p.choices("best_of", n)
	if p.err == nil && bestOf < n {
		p.fail("best_of", "best_of must be greater than or equal to n.")
	}
	if p.err == nil && stream && bestOf > n {
		p.fail("best_of", "Cannot stream results with best_of greater than n.")
	}
	includeUsage := false
	if p.err == nil && p.f.has("stream_options") {
		if !stream {
			p.fail("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
		} else if opts, err := parseBody(p.f["stream_options"]); err != nil {
			p.failType("stream_options", "an object")
		} else {
			op := &openAIParams{f: opts}
			includeUsage = op.optionalBool("include_usage")
			if op.err != nil {
				p.fail("stream_options.include_usage", "Invalid type for 'stream_options.include_usage': expected a boolean, but got %s instead.", kind(opts["include_usage"]))
			}
		}
	}
	if p.err != nil {
		openAIError(w, http.StatusBadRequest, *p.err)
		return
	}
	out, truncated := capped(cfg, limit, limited)
	finish := "stop"
	if truncated {
		finish = "length"
	}
	usage := chatUsage{PromptTokens: cfg.input(body), CompletionTokens: prompts * bestOf * out}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	s.bill(Usage{InputTokens: usage.PromptTokens, OutputTokens: usage.CompletionTokens, Tokens: usage.TotalTokens})
	c := textCompletion{ID: "cmpl-" + randID(29), Object: "text_completion", Created: time.Now().Unix(), Model: model, SystemFingerprint: systemFingerprint}
	openAIHeaders(w)
	if !stream {
		for i := range prompts * n {
			c.Choices = append(c.Choices, textChoice{Text: cfg.reply(), Index: i, FinishReason: &finish})
		}
		c.Usage = usage
		writeJSON(w, http.StatusOK, c)
		return
	}
	ev := startSSE(w, cfg)
	for i := range prompts * n {
		parts := splitReply(cfg.reply())
		for j, part := range parts {
			chunk := c
			var fr *string
			if j == len(parts)-1 {
				fr = &finish
			}
			chunk.Choices = []textChoice{{Text: part, Index: i, FinishReason: fr}}
			ev.event("", marshal(chunk))
		}
	}
	if includeUsage {
		chunk := c
		chunk.Choices, chunk.Usage = []textChoice{}, usage
		ev.event("", marshal(chunk))
	}
	ev.event("", []byte("[DONE]"))
}

// embeddingDimensions is the length of every embedding when the request sets none.
const embeddingDimensions = 8

// serveEmbeddings answers one embedding per input (a string, a token list, or a list of
// either); the usage is input only.
func (s *Server) serveEmbeddings(w http.ResponseWriter, r *http.Request, cfg Config, body []byte) {
	p := openAIRequest(w, r, cfg, body)
	if p == nil {
		return
	}
	model := p.requiredString("model")
	inputs := 1
	if p.err == nil {
		if !p.f.has("input") {
			p.fail("input", "Missing required parameter: 'input'.")
		} else if list, ok := p.f.array("input"); ok && len(list) > 0 && kind(list[0]) != "an integer" {
			inputs = len(list)
		}
	}
	dims, ok := p.optionalInt("dimensions")
	if !ok {
		dims = embeddingDimensions
	} else if p.err == nil && dims < 1 {
		p.fail("dimensions", "Invalid 'dimensions': integer below minimum value. Expected a value >= 1, but got %d instead.", dims)
	}
	if p.err != nil {
		openAIError(w, http.StatusBadRequest, *p.err)
		return
	}
	type embedding struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float64 `json:"embedding"`
	}
	data := make([]embedding, inputs)
	for i := range data {
		v := make([]float64, min(dims, 4096))
		for j := range v {
			v[j] = float64((i+j)%7) / 7
		}
		data[i] = embedding{Object: "embedding", Index: i, Embedding: v}
	}
	s.bill(Usage{InputTokens: cfg.input(body), Tokens: cfg.input(body)})
	openAIHeaders(w)
	writeJSON(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []embedding `json:"data"`
		Model  string      `json:"model"`
		Usage  any         `json:"usage"`
	}{"list", data, model, map[string]int{"prompt_tokens": cfg.input(body), "total_tokens": cfg.input(body)}})
}

// fakeCreated is when every listed model was made: a fixed time, so listings compare equal.
const fakeCreated = 1700000000

// listedModels is what the models routes list.
func listedModels(cfg Config) []string {
	if len(cfg.Models) > 0 {
		return cfg.Models
	}
	return DefaultModels
}

// knownModel says whether the models routes describe id.
func knownModel(cfg Config, id string) bool {
	return len(cfg.Models) == 0 || slices.Contains(cfg.Models, id)
}

type openAIModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// serveOpenAIModels lists the models (id "") or describes one.
func serveOpenAIModels(w http.ResponseWriter, r *http.Request, cfg Config, id string) {
	if !openAIAuth(w, r, cfg) {
		return
	}
	if cfg.Status != 0 {
		openAIError(w, cfg.Status, openAIStatusErr(cfg.Status))
		return
	}
	openAIHeaders(w)
	if id != "" {
		if !knownModel(cfg, id) {
			openAIError(w, http.StatusNotFound, openAIErr{
				Message: fmt.Sprintf("The model '%s' does not exist", id),
				Type:    "invalid_request_error", Param: ptr("model"), Code: ptr("model_not_found"),
			})
			return
		}
		writeJSON(w, http.StatusOK, openAIModel{ID: id, Object: "model", Created: fakeCreated, OwnedBy: "fakellm"})
		return
	}
	var data []openAIModel
	for _, m := range listedModels(cfg) {
		data = append(data, openAIModel{ID: m, Object: "model", Created: fakeCreated, OwnedBy: "fakellm"})
	}
	writeJSON(w, http.StatusOK, struct {
		Object string        `json:"object"`
		Data   []openAIModel `json:"data"`
	}{"list", data})
}
