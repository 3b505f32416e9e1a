package gateway

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"roost.dev/roost/pkg/ledger"
)

// call is one model call on its way through.
type call struct {
	route *route
	// body is the request's body as it came; sent what is sent upstream (nil: body).
	body []byte
	sent pieces
	// model is what the body names (after the declared one is filled in); label what the
	// spend metrics count it as.
	model, label string
	// input is the input's tokens, estimated from the body's size; output the most the
	// answer may hold, every choice counted. Admission reserves their sum.
	input, output int64
}

// reservation is what the call is admitted for.
func (c *call) reservation() int64 { return min(c.input+c.output, ledger.MaxTokens) }

// out is what is sent upstream.
func (c *call) out() pieces {
	if c.sent == nil {
		return pieces{c.body}
	}
	return c.sent
}

// prepare reads a built-in route's JSON body: holds it to the capsule's declared model
// (filling it in when the body names none), reads the call's worst case, makes a streamed
// OpenAI call report its usage, and, when it must, splices the body — so a key given
// twice reaches the upstream once, as the gateway read it. Each member it reads is checked
// for type: a wrong one is a 400 naming it.
func (c *call) prepare(caller Caller, defaultOutput int64) error {
	if !json.Valid(c.body) {
		// Decoding into nothing costs nothing and says what is wrong where.
		err := json.Unmarshal(c.body, &struct{}{})
		return invalid("the request body is not a JSON object: %v", err)
	}
	fields, err := parseObject(c.body, "")
	if err != nil {
		return err
	}
	set, order := map[string][][]byte{}, []string(nil)
	if raw, ok := fields.get("model"); ok {
		if raw[0] != '"' || json.Unmarshal(raw, &c.model) != nil {
			return invalid("model: expected a string, got %s", snippet(raw))
		}
	}
	switch {
	case caller.Model != "" && c.model == "":
		c.model = caller.Model
		v, _ := json.Marshal(caller.Model)
		set["model"], order = [][]byte{v}, append(order, "model")
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
		n, err := prompts(fields)
		if err != nil {
			return err
		}
		times = mul(times, n)
	}
	c.output = mul(limit, times)

	stream := false
	if raw, ok := fields.get("stream"); ok {
		switch string(raw) {
		case "true":
			stream = true
		case "false":
		default:
			return invalid("stream: expected a boolean, got %s", snippet(raw))
		}
	}
	if c.route.kind == kindChat || c.route.kind == kindCompletions {
		v, err := streamOptions(fields, stream)
		if err != nil {
			return err
		}
		if v != nil {
			set["stream_options"], order = v, append(order, "stream_options")
		}
	}
	if len(set) > 0 || !fields.unique() {
		c.sent = fields.splice(set, order)
	}
	c.input = estimateTokens(c.out().size())
	return nil
}

// streamOptions reads a chat or completions call's stream_options: an object when given;
// null only when the call is not streamed, since a streamed one's must say include_usage —
// the gateway's meter reads the usage chunk it asks for. It returns the value to send when
// it must change (nil when it is sent as it came).
func streamOptions(fields *object, stream bool) ([][]byte, error) {
	raw, present := fields.get("stream_options")
	switch {
	case !present && fields.has("stream_options") && stream:
		return nil, invalid("stream_options: expected an object, got null (a streamed call's must say include_usage; roost's gateway meters from it)")
	case present && raw[0] != '{':
		return nil, invalid("stream_options: expected an object, got %s", snippet(raw))
	case !stream:
		return nil, nil
	case !present:
		return [][]byte{[]byte(`{"include_usage":true}`)}, nil
	}
	opts, err := parseObject(raw, "stream_options")
	if err != nil {
		return nil, err
	}
	if v, _ := opts.get("include_usage"); string(v) == "true" && opts.unique() {
		return nil, nil
	}
	kept := opts.splice(map[string][][]byte{"include_usage": {[]byte("true")}}, []string{"include_usage"})
	return kept, nil
}

func invalid(format string, args ...any) error {
	return &apiError{status: 400, code: "invalid_request", msg: fmt.Sprintf(format, args...)}
}

// count reads a member that counts tokens or answers: absent, null or below one is 0 (the
// upstream refuses below one, or takes its default); a fraction counts as the next whole
// number; a value that is not a number is refused rather than guessed at, since a lenient
// upstream may take "50" for 50.
func count(fields *object, name string) (int64, error) {
	raw, ok := fields.get(name)
	if !ok {
		return 0, nil
	}
	if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0, invalid("%s: expected a number, got %s", name, snippet(raw))
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	switch {
	case err != nil && !math.IsInf(f, 0):
		return 0, invalid("%s: expected a number, got %s", name, snippet(raw))
	case f < 1:
		return 0, nil
	case f >= ledger.MaxTokens:
		return ledger.MaxTokens, nil
	}
	return int64(math.Ceil(f)), nil
}

// prompts is how many prompts a completions call's prompt holds: a list of strings or of
// token lists is one prompt each; a string, one token list or none is one.
func prompts(fields *object) (int64, error) {
	raw, ok := fields.get("prompt")
	switch {
	case !ok || raw[0] == '"':
		return 1, nil
	case raw[0] != '[':
		return 0, invalid("prompt: expected a string or a list, got %s", snippet(raw))
	}
	n, first := elements(raw)
	if n == 0 || first[0] == '-' || ('0' <= first[0] && first[0] <= '9') {
		return 1, nil
	}
	return n, nil
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
func estimateTokens(size int64) int64 { return (size + 3) / 4 }
