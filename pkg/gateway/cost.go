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
	// input is the input's tokens, estimated from the body (estimateInput); output the
	// most the answer may hold, every choice counted. Admission reserves their sum.
	input, output int64

	// What prepare read, for lower to splice again: the body's members, the values it sets
	// (in order), the output limits the body sets (limitNames, each at most perChoice
	// tokens) or, when it sets none, the member that says the default (defaultName),
	// how many answers of perChoice the call may produce, and a thinking budget the limit
	// must stay above (0: none).
	fields     *object
	set        map[string][][]byte
	order      []string
	limitNames []string
	defaulted  string
	perChoice  int64
	times      int64
	thinking   int64
	// lowered is the output cap per answer the call came with and the one it was lowered
	// to; zero when it was not.
	lowered [2]int64
	// counted says input is the upstream's count of the body (count.go), not the estimate.
	counted bool
}

// MinOutputTokens is the least output an answer is admitted with when its ceilings leave
// less than its limit: the gateway lowers the call's limit down to this rather than refuse,
// and refuses below it — an answer cut at a few tokens is no answer.
const MinOutputTokens = 256

// minThinkingTokens is the least thinking budget Anthropic takes; a limit must stay above
// the budget, so a thinking call is lowered no further than this and one more.
const minThinkingTokens = 1024

// reservation is what the call is admitted for at most.
func (c *call) reservation() int64 { return min(c.input+c.output, ledger.MaxTokens) }

// least is the least the call can be admitted for: its input and MinOutputTokens an
// answer (more for a thinking call), or everything when the call has no limit to lower.
func (c *call) least() int64 {
	if c.perChoice == 0 {
		return c.reservation()
	}
	floor := int64(MinOutputTokens)
	if c.thinking > 0 {
		floor = minThinkingTokens + 1
	}
	return min(c.input+mul(min(floor, c.perChoice), c.times), c.reservation())
}

// lower fits the call to the tokens it was granted: when that is less than it asked, each
// output limit the body sets above what fits (or, when it set none, the member naming the
// default that was assumed) is lowered to it, and a thinking budget below it, in a splice
// of the body as it came.
func (c *call) lower(granted int64) {
	if granted >= c.reservation() || c.perChoice == 0 {
		return
	}
	per := (granted - c.input) / c.times
	if per >= c.perChoice {
		return
	}
	v := []byte(strconv.FormatInt(per, 10))
	names := c.limitNames
	if len(names) == 0 {
		names = []string{c.defaulted}
	}
	for _, name := range names {
		if _, ok := c.set[name]; !ok {
			c.order = append(c.order, name)
		}
		c.set[name] = [][]byte{v}
	}
	if c.thinking >= per {
		raw, _ := c.fields.get("thinking")
		th, _ := parseObject(raw, "thinking")
		c.set["thinking"] = th.splice(map[string][][]byte{"budget_tokens": {[]byte(strconv.FormatInt(per-1, 10))}}, []string{"budget_tokens"})
		c.order = append(c.order, "thinking")
	}
	c.sent = c.fields.splice(c.set, c.order)
	c.lowered = [2]int64{c.perChoice, per}
	c.perChoice, c.output = per, mul(per, c.times)
}

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
		if n > 0 {
			c.limitNames = append(c.limitNames, name)
		}
		limit = max(limit, n)
	}
	if limit <= 0 && len(limits) > 0 {
		limit = defaultOutput
		// The newest of the route's names for its limit says the default once lowered.
		c.defaulted = limits[0]
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
	c.perChoice, c.times = limit, times
	if c.route.kind == kindMessages {
		if c.thinking, err = thinkingBudget(fields); err != nil {
			return err
		}
	}

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
	c.fields, c.set, c.order = fields, set, order
	c.input = estimateSent(fields, set, order)
	return nil
}

// thinkingBudget is an Anthropic call's thinking.budget_tokens when thinking is enabled
// (0 when not): the output limit must stay above it, so lowering the limit lowers it too.
func thinkingBudget(fields *object) (int64, error) {
	raw, ok := fields.get("thinking")
	if !ok {
		return 0, nil
	}
	if raw[0] != '{' {
		return 0, invalid("thinking: expected an object, got %s", snippet(raw))
	}
	th, err := parseObject(raw, "thinking")
	if err != nil {
		return 0, err
	}
	if t, _ := th.get("type"); string(t) != `"enabled"` {
		return 0, nil
	}
	n, err := count(th, "budget_tokens")
	if err != nil {
		return 0, invalid("thinking.%v", err)
	}
	return n, nil
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
