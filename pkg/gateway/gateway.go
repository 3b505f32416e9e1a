// Package gateway is the inference gateway a session reaches through its endpoint: it
// forwards a model call to the upstream roostd's configuration declares, with the operator's
// key (the capsule never holds it), after admitting the call's most it could spend, and it
// settles the reservation from the usage the upstream reports — in a JSON answer or in a
// streamed (SSE) one. OpenAI and Anthropic wire formats are understood.
package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/spawn"
)

// Ledger is what the gateway needs of the spend ledger.
type Ledger interface {
	Admit(ledger.Admission) (ledger.Reservation, error)
	Settle(sessionID, reservationID string, u ledger.Usage) (ledger.Settlement, error)
	Changed() <-chan struct{}
}

var _ Ledger = (*ledger.Ledger)(nil)

// Caller is the session a call comes from, as its manifest declares it.
type Caller struct {
	SessionID string
	// Upstream and Model are inference.upstream and inference.model ("" when undeclared).
	Upstream, Model string
	// OnExhausted is inference.on_exhausted: "wait" holds a call refused at the machine's
	// ceiling until budget frees or Deadline passes.
	OnExhausted string
	Deadline    time.Time
}

// Gateway forwards sessions' model calls.
type Gateway struct {
	upstreams map[string]config.Upstream
	ledger    Ledger
	client    *http.Client
	log       *slog.Logger
}

// New returns a gateway to the given upstreams, metering into l.
func New(upstreams []config.Upstream, l Ledger, log *slog.Logger) *Gateway {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{upstreams: map[string]config.Upstream{}, ledger: l, log: log,
		client: &http.Client{Transport: &http.Transport{
			Proxy:                 nil,
			MaxIdleConnsPerHost:   32,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 10 * time.Minute,
			ForceAttemptHTTP2:     true,
		}}}
	for _, u := range upstreams {
		g.upstreams[u.Name] = u
	}
	return g
}

// Formats maps each upstream's name to its format.
func (g *Gateway) Formats() map[string]string {
	out := map[string]string{}
	for name, u := range g.upstreams {
		out[name] = u.Format
	}
	return out
}

// maxResponse bounds a non-streamed answer the gateway reads to find its usage.
const maxResponse = 64 << 20

// Serve forwards one call of c to upstream at path.
func (g *Gateway) Serve(w http.ResponseWriter, r *http.Request, c Caller, upstream, path string) {
	u, err := g.check(c, upstream)
	if err != nil {
		spawn.WriteError(w, err)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		spawn.WriteError(w, err)
		return
	}
	key, err := os.ReadFile(u.APIKeyFile)
	if err != nil {
		g.log.Error("reading an upstream's key", "upstream", u.Name, "err", err)
		reply(w, http.StatusBadGateway, fmt.Sprintf("roostd cannot read the key of upstream %q; the operator must fix %s", u.Name, u.APIKeyFile))
		return
	}
	call := call{upstream: u, path: path, body: body}
	if r.Method == http.MethodPost && len(bytes.TrimSpace(body)) > 0 {
		if err := call.prepare(c); err != nil {
			spawn.WriteError(w, err)
			return
		}
	}
	var res ledger.Reservation
	if call.metered {
		if res, err = g.admit(r.Context(), c, &call); err != nil {
			spawn.WriteError(w, err)
			return
		}
	}
	used, status := g.forward(w, r, &call, strings.TrimSpace(string(key)))
	if !call.metered {
		return
	}
	switch {
	case status == 0 || status >= 400:
		// The call failed: it is charged what was sent, no more.
		used = &ledger.Usage{Input: call.inputEstimate}
	case used == nil:
		// It succeeded but said nothing of its usage (a cut stream): the most it could cost.
		used = &ledger.Usage{Input: call.inputEstimate, Output: call.maxOutput}
	}
	if _, err := g.ledger.Settle(c.SessionID, res.ID, *used); err != nil {
		g.log.Error("settling a gateway call", "session", c.SessionID, "reservation", res.ID, "err", err)
	}
}

// check finds the upstream the session may call.
func (g *Gateway) check(c Caller, upstream string) (config.Upstream, error) {
	if c.Upstream == "" {
		return config.Upstream{}, fmt.Errorf("inference.upstream: the capsule declares none, so it may call no model through roost: %w", errdefs.ErrPermissionDenied)
	}
	if upstream != c.Upstream {
		return config.Upstream{}, fmt.Errorf("inference.upstream: the capsule declares %q; it may not call %q: %w", c.Upstream, upstream, errdefs.ErrPermissionDenied)
	}
	u, ok := g.upstreams[upstream]
	if !ok {
		return config.Upstream{}, fmt.Errorf("upstream %q is not in roostd's configuration (--config): %w", upstream, errdefs.ErrNotFound)
	}
	return u, nil
}

// call is one model call on its way through.
type call struct {
	upstream config.Upstream
	path     string
	body     []byte
	model    string
	metered  bool
	// inputEstimate is the input's tokens, estimated from its size; maxOutput the most the
	// answer may hold.
	inputEstimate, maxOutput int64
}

// prepare reads what the call may cost from its body, holds it to the capsule's declared
// model, and makes a streamed OpenAI chat call report its usage.
func (c *call) prepare(caller Caller) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(c.body, &fields); err != nil {
		return fmt.Errorf("the request body is not a JSON object: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	_ = json.Unmarshal(fields["model"], &c.model)
	changed := false
	switch {
	case caller.Model != "" && c.model == "":
		c.model = caller.Model
		fields["model"], _ = json.Marshal(caller.Model)
		changed = true
	case caller.Model != "" && c.model != caller.Model:
		return fmt.Errorf("inference.model: the capsule declares %q; the request names %q: %w", caller.Model, c.model, errdefs.ErrPermissionDenied)
	}
	c.maxOutput = c.upstream.DefaultMaxOutputTokens
	for _, name := range []string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
		var n int64
		if json.Unmarshal(fields[name], &n) == nil && n > 0 {
			c.maxOutput = min(n, ledger.MaxTokens)
			break
		}
	}
	var stream bool
	_ = json.Unmarshal(fields["stream"], &stream)
	if stream && c.upstream.Format == config.FormatOpenAI && strings.HasSuffix(c.path, "chat/completions") {
		opts := map[string]json.RawMessage{}
		_ = json.Unmarshal(fields["stream_options"], &opts)
		opts["include_usage"] = json.RawMessage("true")
		fields["stream_options"], _ = json.Marshal(opts)
		changed = true
	}
	if changed {
		body, err := json.Marshal(fields)
		if err != nil {
			return err
		}
		c.body = body
	}
	c.inputEstimate = estimateTokens(c.body)
	c.metered = true
	return nil
}

// estimateTokens estimates a request's input tokens from its size: about four bytes a
// token for English text and JSON, rounded up. Settlement replaces it with the truth.
func estimateTokens(body []byte) int64 { return int64(len(body)+3) / 4 }

// admit reserves the call's most; with on_exhausted: wait, a refusal at the machine's
// ceiling holds the call until budget frees, the session's deadline or the caller leaves.
func (g *Gateway) admit(ctx context.Context, c Caller, call *call) (ledger.Reservation, error) {
	var deadline <-chan time.Time
	if !c.Deadline.IsZero() {
		t := time.NewTimer(time.Until(c.Deadline))
		defer t.Stop()
		deadline = t.C
	}
	for {
		changed := g.ledger.Changed()
		res, err := g.ledger.Admit(ledger.Admission{SessionID: c.SessionID, Tokens: call.inputEstimate + call.maxOutput, Model: call.model})
		var refusal *ledger.Refusal
		if err == nil || !errors.As(err, &refusal) || refusal.Limit != ledger.LimitMachine || c.OnExhausted != "wait" {
			return res, err
		}
		select {
		case <-changed:
		case <-deadline:
			return res, err
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
}

// hopHeaders are not forwarded either way; credentials are roost's to set.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer",
	"Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Accept-Encoding", "Authorization", "X-Api-Key"}

// forward sends the call upstream and copies the answer back as it arrives, reading the
// usage it reports. status is 0 when no answer came.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, c *call, key string) (*ledger.Usage, int) {
	target := strings.TrimSuffix(c.upstream.URL, "/") + "/" + c.path
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, target, bytes.NewReader(c.body))
	if err != nil {
		reply(w, http.StatusBadRequest, err.Error())
		return nil, 0
	}
	for k, vs := range r.Header {
		out.Header[k] = vs
	}
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	switch c.upstream.Format {
	case config.FormatAnthropic:
		out.Header.Set("X-Api-Key", key)
		if out.Header.Get("Anthropic-Version") == "" {
			out.Header.Set("Anthropic-Version", "2023-06-01")
		}
	default:
		out.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := g.client.Do(out)
	if err != nil {
		if r.Context().Err() == nil {
			g.log.Warn("upstream call failed", "upstream", c.upstream.Name, "err", err)
			reply(w, http.StatusBadGateway, fmt.Sprintf("upstream %q did not answer: %v", c.upstream.Name, err))
		}
		return nil, 0
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	for _, h := range hopHeaders {
		w.Header().Del(h)
	}
	w.WriteHeader(resp.StatusCode)
	var meter usageMeter
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		meter.stream(w, resp.Body)
	} else {
		data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
		_, _ = w.Write(data)
		if err == nil {
			meter.json(data)
		}
	}
	return meter.usage(), resp.StatusCode
}

// usageMeter reads the usage an answer reports: OpenAI's prompt_tokens/completion_tokens
// (chat) or input_tokens/output_tokens (responses), Anthropic's input_tokens (plus cache
// reads and writes) and output_tokens — at the top of a JSON answer, or in a streamed
// event's message (Anthropic's message_start), response (OpenAI's response.completed) or
// own usage (OpenAI's last chat chunk, Anthropic's message_delta). Streams report running
// totals, so the largest seen wins.
type usageMeter struct {
	input, output int64
	seen          bool
}

func (m *usageMeter) usage() *ledger.Usage {
	if !m.seen {
		return nil
	}
	return &ledger.Usage{Input: m.input, Output: m.output}
}

type usageFields struct {
	PromptTokens             *int64 `json:"prompt_tokens"`
	CompletionTokens         *int64 `json:"completion_tokens"`
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens int64  `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64  `json:"cache_read_input_tokens"`
}

type usageCarrier struct {
	Usage    *usageFields `json:"usage"`
	Message  *usageHolder `json:"message"`
	Response *usageHolder `json:"response"`
}

type usageHolder struct {
	Usage *usageFields `json:"usage"`
}

func (m *usageMeter) json(data []byte) {
	var c usageCarrier
	if json.Unmarshal(data, &c) != nil {
		return
	}
	for _, u := range []*usageFields{c.Usage, holderUsage(c.Message), holderUsage(c.Response)} {
		if u != nil {
			m.add(u)
		}
	}
}

func holderUsage(h *usageHolder) *usageFields {
	if h == nil {
		return nil
	}
	return h.Usage
}

func (m *usageMeter) add(u *usageFields) {
	in, out := int64(-1), int64(-1)
	switch {
	case u.PromptTokens != nil:
		in = *u.PromptTokens
	case u.InputTokens != nil:
		in = *u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
	}
	switch {
	case u.CompletionTokens != nil:
		out = *u.CompletionTokens
	case u.OutputTokens != nil:
		out = *u.OutputTokens
	}
	if in < 0 && out < 0 {
		return
	}
	// An upstream reporting nonsense (negative, absurd) is held to what the ledger takes.
	m.seen = true
	m.input, m.output = min(max(m.input, in), ledger.MaxTokens), min(max(m.output, out), ledger.MaxTokens)
}

// stream copies a server-sent event stream through, flushing each line as it comes, and
// meters every data line.
func (m *usageMeter) stream(w http.ResponseWriter, body io.Reader) {
	flusher, _ := w.(http.Flusher)
	br := bufio.NewReaderSize(body, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if _, werr := w.Write(line); werr != nil {
				return
			}
			if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:")); ok {
				m.json(bytes.TrimSpace(data))
			}
			if flusher != nil && len(bytes.TrimSpace(line)) == 0 {
				flusher.Flush()
			}
		}
		if err != nil {
			if flusher != nil {
				flusher.Flush()
			}
			return
		}
	}
}

func reply(w http.ResponseWriter, status int, msg string) {
	data, _ := json.Marshal(map[string]string{"error": msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}
