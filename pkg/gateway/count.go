package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"time"

	"roost.dev/roost/pkg/config"
)

// Counting input at the upstream. The estimate bounds what the upstream bills from above
// (estimate.go), some 20 % above on the bodies coding agents send; that is nothing while a
// call's worst case fits, but once its ceilings leave less, every token over-counted is a
// token of output the call cannot have, and a session whose budget is near a call's
// estimated input is refused outright though the call would fit. So when a Messages call's
// worst case does not fit what its ceilings leave, the gateway asks the upstream itself —
// Anthropic's messages/count_tokens, which is free and bills nothing — and admits the call
// for that count with a margin (the count is documented as an estimate that may differ
// from the bill "by a small amount"). The round trip is paid only by calls near a ceiling;
// a count that fails leaves the estimate, which only admits less.

// countedFields are the members messages/count_tokens takes (it refuses others, max_tokens
// and stream among them).
var countedFields = []string{"model", "system", "messages", "tools", "tool_choice", "thinking", "mcp_servers"}

// countTimeout bounds the count's round trip: past it the call goes on with its estimate.
const countTimeout = 10 * time.Second

// maxCountAnswer bounds what of the count's answer is read.
const maxCountAnswer = 64 << 10

// countedMargin is what is admitted above the upstream's count: a fiftieth, and 16.
func countedMargin(n int64) int64 { return n + n/50 + 16 }

// canCount says whether the call's input can be counted at its upstream.
func (c *call) canCount(format string) bool {
	return format == config.FormatAnthropic && c.route.kind == kindMessages && c.fields != nil
}

// countInput asks the upstream how many input tokens the call's body is and, when it
// answers, admits the call for that (with countedMargin) rather than the estimate.
// messages is the call's own URL; header what is sent with it (the operator's key).
func (g *Gateway) countInput(ctx context.Context, messages *url.URL, header http.Header, cl *call) {
	body := bytes.Join(cl.fields.subset(countedFields, cl.set), nil)
	target := *messages
	target.Path += "/count_tokens"
	if target.RawPath != "" {
		target.RawPath += "/count_tokens"
	}
	ctx, cancel := context.WithTimeout(ctx, countTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header = header.Clone()
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.transport.RoundTrip(req)
	if err != nil {
		g.log.Debug("counting a call's input at its upstream", "err", err)
		return
	}
	defer resp.Body.Close()
	var answer struct {
		InputTokens *int64 `json:"input_tokens"`
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, maxCountAnswer)).Decode(&answer)
	if resp.StatusCode != http.StatusOK || err != nil || answer.InputTokens == nil || *answer.InputTokens < 0 {
		g.log.Debug("counting a call's input at its upstream", "status", resp.StatusCode, "err", err)
		return
	}
	cl.input, cl.counted = countedMargin(*answer.InputTokens), true
}
