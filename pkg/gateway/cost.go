package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"roost.dev/roost/pkg/ledger"
)

// call is one model call on its way through.
type call struct {
	route *route
	body  []byte
	// model is what the body names (after the declared one is filled in); label what the
	// spend metrics count it as.
	model, label string
	// input is the input's tokens, estimated from the body's size; output the most the
	// answer may hold, every choice counted. Admission reserves their sum.
	input, output int64
}

// reservation is what the call is admitted for.
func (c *call) reservation() int64 { return min(c.input+c.output, ledger.MaxTokens) }

// prepare reads a built-in route's JSON body: holds it to the capsule's declared model
// (filling it in when the body names none), reads the call's worst case, makes a streamed
// OpenAI call report its usage, and writes the body again from what was read — so a key
// given twice reaches the upstream once, as the gateway read it.
func (c *call) prepare(caller Caller, defaultOutput int64) error {
	fields, err := parseObject(c.body)
	if err != nil {
		return err
	}
	if raw, ok := present(fields, "model"); ok {
		if json.Unmarshal(raw, &c.model) != nil {
			return invalid("model: expected a string, got %s", raw)
		}
	}
	switch {
	case caller.Model != "" && c.model == "":
		c.model = caller.Model
		fields["model"], _ = json.Marshal(caller.Model)
	case caller.Model != "" && c.model != caller.Model:
		return &apiError{status: 403, code: "model_not_allowed",
			msg: fmt.Sprintf("inference.model: the capsule declares %q; the request names %q", caller.Model, c.model)}
	}

	// limit is the first output limit the route honours that the body sets; times is how
	// many answers of that limit the call may produce.
	limit, times := int64(0), int64(1)
	var limits, multipliers []string
	switch c.route.kind {
	case kindChat:
		limits, multipliers = []string{"max_completion_tokens", "max_tokens"}, []string{"n"}
	case kindCompletions:
		limits, multipliers = []string{"max_tokens"}, []string{"n", "best_of"}
	case kindResponses:
		limits = []string{"max_output_tokens"}
	case kindMessages:
		limits = []string{"max_tokens"}
	}
	for _, name := range limits {
		// Both of chat's limits may be set; the larger is the worst case.
		n, err := count(fields, name)
		if err != nil {
			return err
		}
		limit = max(limit, n)
	}
	if limit <= 0 && len(limits) > 0 {
		limit = defaultOutput
	}
	for _, name := range multipliers {
		// best_of is how many completions are generated, n how many come back (n ≤ best_of).
		n, err := count(fields, name)
		if err != nil {
			return err
		}
		times = max(times, n)
	}
	if c.route.kind == kindCompletions {
		times = mul(times, prompts(fields["prompt"]))
	}
	c.output = mul(limit, times)

	var stream bool
	_ = json.Unmarshal(fields["stream"], &stream)
	if stream && (c.route.kind == kindChat || c.route.kind == kindCompletions) {
		opts := map[string]json.RawMessage{}
		_ = json.Unmarshal(fields["stream_options"], &opts)
		opts["include_usage"] = json.RawMessage("true")
		fields["stream_options"], _ = json.Marshal(opts)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(fields); err != nil {
		return invalid("the request body cannot be re-encoded: %v", err)
	}
	c.body = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	c.input = estimateTokens(c.body)
	return nil
}

func invalid(format string, args ...any) error {
	return &apiError{status: 400, code: "invalid_request", msg: fmt.Sprintf(format, args...)}
}

func parseObject(body []byte) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, invalid("the request body is not a JSON object: %v", err)
	}
	if fields == nil {
		return nil, invalid("the request body is not a JSON object: null")
	}
	return fields, nil
}

// present is a member's value unless it is absent or null (the providers take null as
// absent).
func present(fields map[string]json.RawMessage, name string) (json.RawMessage, bool) {
	v, ok := fields[name]
	if !ok || string(bytes.TrimSpace(v)) == "null" {
		return nil, false
	}
	return v, true
}

// count reads a member that counts tokens or answers: absent, null or below one is 0 (the
// upstream refuses below one, or takes its default); a fraction counts as the next whole
// number; a value that is not a number is refused rather than guessed at, since a lenient
// upstream may take "50" for 50.
func count(fields map[string]json.RawMessage, name string) (int64, error) {
	raw, ok := present(fields, name)
	if !ok {
		return 0, nil
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return 0, invalid("%s: expected a number, got %s", name, raw)
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	switch {
	case err != nil && !math.IsInf(f, 0):
		return 0, invalid("%s: expected a number, got %s", name, raw)
	case f < 1:
		return 0, nil
	case f >= ledger.MaxTokens:
		return ledger.MaxTokens, nil
	}
	return int64(math.Ceil(f)), nil
}

// prompts is how many prompts a completions call's prompt holds: a list of strings or of
// token lists is one prompt each, a string or one token list is one.
func prompts(raw json.RawMessage) int64 {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
		return 1
	}
	if first := bytes.TrimSpace(list[0]); len(first) > 0 && (first[0] == '-' || ('0' <= first[0] && first[0] <= '9')) {
		return 1
	}
	return int64(len(list))
}

// mul multiplies counts no larger than ledger.MaxTokens, saturating there.
func mul(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > ledger.MaxTokens/b {
		return ledger.MaxTokens
	}
	return min(a*b, ledger.MaxTokens)
}

// estimateTokens estimates a request's input tokens from its size: about four bytes a
// token for English text and JSON, rounded up. Settlement replaces it with the truth.
func estimateTokens(body []byte) int64 { return int64(len(body)+3) / 4 }
