// Package gateway is the inference gateway a session reaches through its endpoint: it
// forwards a model call to the upstream roostd's configuration declares, with the operator's
// key (the capsule never holds it), after admitting the most the call could spend, and it
// settles the reservation from the usage the upstream reports — in a JSON answer or in a
// streamed (SSE) one. OpenAI and Anthropic wire formats are understood.
//
// It forwards only what it can meter or knows to be free: each format's model-call routes
// (metered) and its model listing and token counting (never charged), plus what the
// operator declares per upstream; every other route is refused before anything leaves, as
// is a path that could mean something else upstream. The path sent is built from the route
// alone, and of the caller's headers only those the SDKs need are passed on.
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/fdbudget"
	"roost.dev/roost/pkg/ledger"
)

// Ledger is what the gateway needs of the spend ledger.
type Ledger interface {
	Admit(ledger.Admission) (ledger.Reservation, error)
	Settle(sessionID, reservationID string, u ledger.Usage) (ledger.Settlement, error)
	Changed() <-chan struct{}
	Headroom(sessionID string) (int64, error)
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
	// OnOverrun, when set, hears of a call whose reported usage was charged above what it
	// was admitted for (the settlement's Charged above its Reserved).
	OnOverrun func(ledger.Settlement)
	// OnCall, when set, hears of every metered call once it is settled, on the call's own
	// goroutine before its answer ends: it must not wait on the disk for long.
	OnCall func(CallRecord)
}

// CallRecord is one metered call as it was admitted and charged.
type CallRecord struct {
	At       time.Time
	Upstream string
	// Route is the method and path as the route names them ("POST v1/messages").
	Route string
	// Model is the call's label in the spend metrics.
	Model string
	// Status is the upstream's HTTP status; 0 when it did not answer.
	Status                            int
	InputTokens, OutputTokens         int64
	CacheReadTokens, CacheWriteTokens int64
	Reserved, Charged                 int64
	Latency                           time.Duration
	Streamed                          bool
	// LoweredFrom and LoweredTo are the output cap per answer the call came with and the
	// one the gateway lowered it to so that it fit its ceilings; zero when not lowered.
	LoweredFrom, LoweredTo int64
	// InputCounted says the call was admitted for its upstream's count of its input
	// (messages/count_tokens), not the gateway's estimate: its ceilings left less than its
	// worst case.
	InputCounted bool
}

// LoweredHeader is the response header that says the gateway lowered a call's output cap
// to what its ceilings leave: "64000->12000", per answer.
const LoweredHeader = "X-Roost-Max-Tokens-Lowered"

// Gateway forwards sessions' model calls.
type Gateway struct {
	upstreams map[string]*upstream
	ledger    Ledger
	transport http.RoundTripper
	log       *slog.Logger
	now       func() time.Time
	limits    Limits
	inflight  inflight
	// fds is roostd's descriptor budget; a call holds a slot of its session's share for
	// its upstream socket while it lasts. Nil for none.
	fds *fdbudget.Budget
}

// WithDescriptors has every call take a slot of b for its session while it lasts.
func WithDescriptors(b *fdbudget.Budget) Option {
	return func(g *Gateway) { g.fds = b }
}

// upstream is one configured upstream, ready to be called.
type upstream struct {
	config.Upstream
	// base is the parsed URL; nil when it does not parse (the configuration was not
	// checked), and then every call fails.
	base   *url.URL
	routes []route
	models map[string]bool
}

// New returns a gateway to the given upstreams, metering into l.
func New(upstreams []config.Upstream, l Ledger, log *slog.Logger, opts ...Option) *Gateway {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{upstreams: map[string]*upstream{}, ledger: l, log: log, now: time.Now,
		transport: &http.Transport{
			Proxy: nil,
			// Idle connections are no call's and so in no session's share: few, within
			// the descriptor budget's reserve.
			MaxIdleConns:          32,
			MaxIdleConnsPerHost:   32,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 10 * time.Minute,
			ForceAttemptHTTP2:     true,
		},
		limits:   Limits{BodyBytesInFlight: DefaultBodyBytesInFlight, CallsPerSession: DefaultCallsPerSession, MaxBody: DefaultMaxBody},
		inflight: inflight{calls: map[string]int{}},
	}
	for _, u := range upstreams {
		g.upstreams[u.Name] = newUpstream(u)
	}
	for _, o := range opts {
		o(g)
	}
	return g
}

func newUpstream(u config.Upstream) *upstream {
	up := &upstream{Upstream: u, routes: routesOf(u), models: map[string]bool{}}
	if base, err := url.Parse(u.URL); err == nil && base.Host != "" {
		up.base = base
	}
	for _, m := range u.Models {
		up.models[m] = true
	}
	return up
}

// Formats maps each upstream's name to its format.
func (g *Gateway) Formats() map[string]string {
	out := map[string]string{}
	for name, u := range g.upstreams {
		out[name] = u.Format
	}
	return out
}

// Serve forwards one call of c to upstream at path, the call's path under the upstream as
// the server decoded it (r.URL holds it as it came).
func (g *Gateway) Serve(w http.ResponseWriter, r *http.Request, c Caller, upstream, path string) {
	format := g.formatFor(c, upstream)
	fail := func(err error) {
		e := g.asAPIError(err)
		if e == nil {
			return
		}
		e.write(w, format)
		if e.status != http.StatusRequestEntityTooLarge && r.Method != http.MethodGet {
			// A client that sends its whole body before it reads the answer (Python's
			// http.client, httpx) would find the connection reset rather than the refusal
			// if the body were left unread: read to its end (at most the largest body),
			// keeping none of it.
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, g.limits.MaxBody))
		}
	}
	u, err := g.check(c, upstream)
	if err != nil {
		fail(err)
		return
	}
	if path == "" && (r.Method == http.MethodHead || r.Method == http.MethodGet) {
		// Clients probe their base URL before calling (claude sends HEAD /): it is there.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			fmt.Fprintf(w, "{\"upstream\":%q,\"format\":%q}\n", u.Name, u.Format)
		}
		return
	}
	rt, upPath, query, err := match(u.routes, r.Method, r.URL, path)
	if err != nil {
		fail(err)
		return
	}
	leave, err := g.enter(c.SessionID)
	if err != nil {
		fail(err)
		return
	}
	defer leave()
	if g.fds != nil {
		slot, err := g.fds.Acquire(c.SessionID, fdbudget.Gateway)
		if err != nil {
			fail(&apiError{status: http.StatusServiceUnavailable, code: "connections", retry: true, msg: "roost: " + err.Error()})
			return
		}
		defer slot.Release()
	}
	var body []byte
	if r.Method != http.MethodGet {
		// Reserved before it is read, held until the call ends (the proxy may send it
		// again on a retried connection).
		var held int64
		body, held, err = g.readBody(r)
		defer g.unreserve(held)
		if err != nil {
			fail(err)
			return
		}
	}
	key, err := os.ReadFile(u.APIKeyFile)
	if err != nil || u.base == nil {
		g.log.Error("an upstream cannot be called", "upstream", u.Name, "url", u.URL, "key_file", u.APIKeyFile, "err", err)
		fail(&apiError{status: http.StatusBadGateway, code: "upstream_misconfigured",
			msg: fmt.Sprintf("roostd cannot call upstream %q: its key (%s) or url is unusable; the operator must fix it", u.Name, u.APIKeyFile)})
		return
	}
	cl := &call{route: rt, body: body}
	switch {
	case rt.jsonBody():
		if err := cl.prepare(c, u.DefaultMaxOutputTokens); err != nil {
			fail(err)
			return
		}
	case rt.metered:
		cl.output, cl.model = rt.tokens, modelOf(body)
	}
	cl.label = u.label(c, cl.model)

	target := &url.URL{Scheme: u.base.Scheme, User: u.base.User, Host: u.base.Host, RawQuery: query.Encode()}
	target.RawPath = strings.TrimSuffix(u.base.EscapedPath(), "/") + "/" + upPath
	target.Path, _ = url.PathUnescape(target.RawPath)
	header := outHeader(r.Header, u, rt, strings.TrimSpace(string(key)))

	meter := &meter{}
	status := 0
	if rt.metered {
		started := g.now()
		if cl.canCount(u.Format) {
			// Counted only when it may change what is admitted: the worst case does not fit,
			// and the least output would, were the input nothing.
			if room, err := g.ledger.Headroom(c.SessionID); err == nil && room < cl.reservation() && room > cl.least()-cl.input {
				g.countInput(r.Context(), target, header, cl)
			}
		}
		res, err := g.admit(r.Context(), c, cl)
		if err != nil {
			fail(err)
			return
		}
		cl.lower(res.Tokens)
		// Deferred: the proxy ends the handler with a panic (http.ErrAbortHandler) when the
		// answer is cut mid-copy, and the reservation must be settled even so.
		defer g.settle(c, u.Name, cl, res, meter, &status, started)
	}
	// httputil.ReverseProxy does the forwarding: hop-by-hop headers, 1xx answers,
	// trailers, flushing a stream as each write arrives (FlushInterval -1), and a client
	// that goes away cancelling the upstream call.
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := pr.Out
			out.URL, out.Host, out.Header = target, "", header
			out.Trailer, out.TransferEncoding = nil, nil
			out.Body, out.GetBody, out.ContentLength = nil, nil, 0
			if sent := cl.out(); sent.size() > 0 {
				out.Body, out.ContentLength = sent.reader(), sent.size()
				out.GetBody = func() (io.ReadCloser, error) { return sent.reader(), nil }
			}
		},
		Transport:     g.transport,
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			status = resp.StatusCode
			if cl.lowered[0] > 0 {
				resp.Header.Set(LoweredHeader, fmt.Sprintf("%d->%d", cl.lowered[0], cl.lowered[1]))
			}
			// The upstream's cookies are its own business with roostd, not the capsule's.
			resp.Header.Del("Set-Cookie")
			if rt.metered {
				// Without a length the answer ends when the handler returns — after the
				// deferred settlement — so a caller that has read it whole finds its spend
				// settled (its next call is admitted against the truth, not the reservation).
				resp.Header.Del("Content-Length")
				resp.ContentLength = -1
				mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
				meter.sse = mt == "text/event-stream"
				resp.Body = &meteredBody{ReadCloser: resp.Body, meter: meter}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			g.log.Warn("upstream call failed", "upstream", u.Name, "err", err)
			(&apiError{status: http.StatusBadGateway, code: "upstream_unreachable", retry: true,
				msg: fmt.Sprintf("upstream %q did not answer: %v", u.Name, err)}).write(w, format)
		},
		ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	proxy.ServeHTTP(w, r)
}

// formatFor is the format errors are answered in: the named upstream's, else the one the
// capsule declares, else OpenAI's.
func (g *Gateway) formatFor(c Caller, name string) string {
	for _, n := range []string{name, c.Upstream} {
		if u, ok := g.upstreams[n]; ok {
			return u.Format
		}
	}
	return config.FormatOpenAI
}

// check finds the upstream the session may call.
func (g *Gateway) check(c Caller, name string) (*upstream, error) {
	if c.Upstream == "" {
		return nil, &apiError{status: http.StatusForbidden, code: "upstream_not_allowed",
			msg: "inference.upstream: the capsule declares none, so it may call no model through roost"}
	}
	if name != c.Upstream {
		return nil, &apiError{status: http.StatusForbidden, code: "upstream_not_allowed",
			msg: fmt.Sprintf("inference.upstream: the capsule declares %q; it may not call %q", c.Upstream, name)}
	}
	u, ok := g.upstreams[name]
	if !ok {
		return nil, &apiError{status: http.StatusNotFound, code: "upstream_unknown",
			msg: fmt.Sprintf("upstream %q is not in roostd's configuration (--config)", name)}
	}
	return u, nil
}

// label is what the spend metrics count a call's model as: the capsule's declared model or
// one the operator lists for the upstream, else "other" — so no capsule chooses a label.
func (u *upstream) label(c Caller, model string) string {
	if model != "" && (model == c.Model || u.models[model]) {
		return model
	}
	return "other"
}

// modelOf is the model a declared route's JSON body names, if it is one.
func modelOf(body []byte) string {
	var b struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &b)
	return b.Model
}

// forwardedHeaders are the caller's request headers passed upstream (lower case), besides
// the SDKs' own X-Stainless-* (retry count, timeout, platform): what the providers read to
// serve the call — versions and betas, and the ids agents send of their session, thread,
// conversation and request (claude's x-claude-code-session-id, codex's session_id,
// conversation_id and originator, …), which an upstream may key its prompt cache on.
// Nothing that authenticates or attributes (Authorization, X-Api-Key, OpenAI-Organization,
// OpenAI-Project, ChatGPT-Account-Id, Cookie, …) nor proxy or hop-by-hop headers
// (Forwarded, X-Forwarded-*, Connection, …) pass; the operator's key is set instead.
// Accept-Encoding does not pass either: the transport asks for gzip itself and
// decompresses, so the meter reads plain text.
var forwardedHeaders = []string{"accept", "content-type", "user-agent", "anthropic-version", "anthropic-beta", "openai-beta",
	"idempotency-key", "x-app", "x-claude-code-session-id", "session-id", "session_id", "thread-id", "thread_id",
	"conversation-id", "conversation_id", "x-client-request-id", "originator", "version"}

func outHeader(in http.Header, u *upstream, rt *route, key string) http.Header {
	out := http.Header{}
	for k, vs := range in {
		lk := strings.ToLower(k)
		if slices.Contains(forwardedHeaders, lk) || strings.HasPrefix(lk, "x-stainless-") {
			// Kept as the caller spelled it: session_id is no header Go would spell so.
			out[k] = slices.Clone(vs)
		}
	}
	if rt.jsonBody() {
		// The gateway read the body as JSON and sends it as JSON, whatever the caller said.
		out.Set("Content-Type", "application/json")
	}
	switch u.Format {
	case config.FormatAnthropic:
		out.Set("X-Api-Key", key)
		if out.Get("Anthropic-Version") == "" {
			out.Set("Anthropic-Version", "2023-06-01")
		}
	default:
		out.Set("Authorization", "Bearer "+key)
	}
	return out
}

// admit reserves the most the call could spend, or as much of it as the ceilings leave down
// to its least (lower then fits the call to it). A refusal the session's own calls in
// flight make holds the call until they settle, the session's deadline or the caller
// leaves: it is not exhausted, only busy. With on_exhausted: wait, so does a refusal at the
// machine's ceiling or a fleet node's allowance, until budget frees.
func (g *Gateway) admit(ctx context.Context, c Caller, cl *call) (ledger.Reservation, error) {
	var deadline <-chan time.Time
	if !c.Deadline.IsZero() {
		t := time.NewTimer(time.Until(c.Deadline))
		defer t.Stop()
		deadline = t.C
	}
	for {
		changed := g.ledger.Changed()
		res, err := g.ledger.Admit(ledger.Admission{SessionID: c.SessionID, Tokens: cl.reservation(), MinTokens: cl.least(), Model: cl.label})
		var refusal *ledger.Refusal
		if err == nil || !errors.As(err, &refusal) {
			return res, err
		}
		pool := refusal.Limit == ledger.LimitMachine || refusal.Limit == ledger.LimitFleet
		busy := !pool && !refusal.Latched
		if !busy && (!pool || c.OnExhausted != "wait") {
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

// settle charges a metered call: the usage the upstream reported for the whole answer;
// what was sent (the input estimate) when it failed or never answered; and when it answered
// without reporting its whole usage (a stream cut short), the most it could have cost — or
// what it did report, if that is more. What is charged is the truth even above the
// reservation; then the overrun is told (Caller.OnOverrun) and logged.
func (g *Gateway) settle(c Caller, upstream string, cl *call, res ledger.Reservation, m *meter, status *int, started time.Time) {
	used, whole := m.usage()
	switch {
	case *status == 0 || *status >= 400:
		used = &ledger.Usage{Input: cl.input}
	case used == nil || !whole:
		in, out := cl.input, cl.output
		if used != nil {
			in, out = max(in, used.Input), max(out, used.Output)
		}
		used = &ledger.Usage{Input: in, Output: out}
	}
	s, err := g.ledger.Settle(c.SessionID, res.ID, *used)
	if err != nil {
		g.log.Error("settling a gateway call", "session", c.SessionID, "reservation", res.ID, "err", err)
		return
	}
	if s.Charged > s.Reserved {
		g.log.Warn("a gateway call spent more than it was admitted for", "session", c.SessionID, "route", cl.route.String(),
			"model", cl.label, "reserved", s.Reserved, "charged", s.Charged)
		if c.OnOverrun != nil {
			c.OnOverrun(s)
		}
	}
	if c.OnCall != nil {
		c.OnCall(CallRecord{At: started.UTC(), Upstream: upstream, Route: cl.route.String(), Model: cl.label, Status: *status,
			InputTokens: s.InputTokens, OutputTokens: s.OutputTokens, CacheReadTokens: m.cacheRead, CacheWriteTokens: m.cacheWrite,
			Reserved: s.Reserved, Charged: s.Charged, Latency: g.now().Sub(started), Streamed: m.sse,
			LoweredFrom: cl.lowered[0], LoweredTo: cl.lowered[1], InputCounted: cl.counted})
	}
}

// meteredBody passes an answer through its meter as the proxy reads it.
type meteredBody struct {
	io.ReadCloser
	meter *meter
}

func (b *meteredBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	_, _ = b.meter.Write(p[:n])
	if err == io.EOF {
		b.meter.end()
	}
	return n, err
}
