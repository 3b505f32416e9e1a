// Package fakellm is a stand-in for the OpenAI and Anthropic HTTP APIs, for testing roost's
// inference gateway without a network or a paid key. It serves real HTTP on loopback and
// answers in the providers' public wire formats, JSON and server-sent events alike, closely
// enough that the official SDKs accept its answers. That matters because the gateway meters
// tokens from whatever usage the upstream reports, and each provider reports it in a different
// place (OpenAI chat streams only on request and in a trailing chunk, Anthropic split across
// message_start and message_delta, the Responses API in its final event): a fake that
// simplified those shapes would let a gateway that misreads the real ones pass.
//
// Config.Script makes the Messages and Responses routes play a conversation with tool calls
// (script.go), for running a coding agent's CLI against the fake.
//
// Routes: HEAD / (a connectivity probe); POST /v1/chat/completions (honouring n),
// /v1/completions (n, best_of, a list of prompts), /v1/responses and /v1/embeddings
// (OpenAI); POST /v1/messages and /v1/messages/count_tokens (Anthropic); GET /v1/models and
// /v1/models/{id} in the shape of the provider whose headers the request carries
// (Anthropic's anthropic-version or x-api-key, else OpenAI's). Anything else is a 404 in the shape of the provider whose path it resembles.
package fakellm

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// DefaultReply is the assistant text when Config.Reply is empty.
const DefaultReply = "hello from the fake"

// Config says what the fake answers.
type Config struct {
	// APIKey is the only key accepted: OpenAI requests must carry "Authorization: Bearer <APIKey>",
	// Anthropic requests "x-api-key: <APIKey>" (and an "anthropic-version" header) or, as
	// Anthropic's SDKs since 1.0 send it, "Authorization: Bearer <APIKey>".
	// Left empty, any non-empty key is accepted; a missing key is refused either way.
	APIKey string
	// InputTokens and OutputTokens are the usage every successful answer reports.
	InputTokens, OutputTokens int
	// CountInput reports, instead of InputTokens, the input tokens counted from the
	// request as a tokenizer would count them (CountTokens, in tokens.go).
	CountInput bool
	// Reply is the assistant text (default DefaultReply).
	Reply string
	// Status, when non-zero, makes every request that passes authentication fail with that HTTP
	// status and the provider's error body (e.g. 500, 529 overloaded for Anthropic, 429).
	// Authentication is checked first, as the real services do, so a gateway that sends the
	// wrong key is still told so.
	Status int
	// CachedTokens is the part of every answer's input read from the prompt cache, reported
	// as each provider does (Anthropic's cache_read_input_tokens, besides InputTokens; OpenAI's
	// cached_tokens, within it and at most it).
	CachedTokens int
	// Script, when set, is the main conversation's answers (see Turn): a Messages or
	// Responses request that offers tools gets the turn after as many tool calls as its
	// history holds results of. Requests without tools, and a conversation past the
	// script's end, get Reply.
	Script []Turn
	// Models are what the models routes list, and the only ids they describe; empty lists
	// DefaultModels and describes any id asked for.
	Models []string

	// Test-only knobs, for a client's (a gateway's) handling of what real upstreams rarely
	// do but may.

	// ExceedLimits reports OutputTokens for every answer (every choice) even past the
	// request's own output limit, as an upstream that ignored the limit would.
	ExceedLimits bool
	// SSEComments puts a comment line (": keep-alive") before every event of a stream, as
	// proxies and some providers do.
	SSEComments bool
	// MultilineData spreads each JSON event's data over several data: lines (cut after the
	// commas between members and elements); a client joins them with newlines, which JSON
	// takes as whitespace.
	MultilineData bool
}

// DefaultModels are the models listed when Config.Models is empty.
var DefaultModels = []string{"fake-small", "fake-large"}

// input is the input tokens an answer to body reports.
func (c Config) input(body []byte) int {
	if c.CountInput {
		return CountTokens(body)
	}
	return c.InputTokens
}

func (c Config) reply() string {
	if c.Reply == "" {
		return DefaultReply
	}
	return c.Reply
}

// Request is one HTTP request as the fake received it.
type Request struct {
	Method, Path string
	Header       http.Header
	Body         []byte
}

// Server is a running fake. Its methods are safe for concurrent use.
type Server struct {
	url  string
	srv  *http.Server
	done chan struct{}
	once sync.Once

	mu     sync.Mutex
	cfg    Config
	reqs   []Request
	billed Usage
}

// Start listens on 127.0.0.1:0 (real TCP, real net/http) and serves until Close.
func Start(cfg Config) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fakellm: listen: %w", err)
	}
	s := &Server{
		url:  "http://" + ln.Addr().String(),
		done: make(chan struct{}),
		cfg:  cfg,
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// URL is the base URL, "http://127.0.0.1:PORT", without a trailing slash or /v1.
func (s *Server) URL() string { return s.url }

// Close stops serving, cutting any stream still open, and returns once the server is down.
func (s *Server) Close() {
	s.once.Do(func() {
		_ = s.srv.Close()
		<-s.done
	})
}

// SetConfig changes the answers from the next request on; a request already being answered
// keeps the configuration it started with, so a stream is never half one and half the other.
func (s *Server) SetConfig(cfg Config) {
	s.mu.Lock()
	s.cfg = cfg
	s.mu.Unlock()
}

// Requests returns every request received so far, in order, refused ones included. The
// result is a copy the caller may keep or change.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = Request{
			Method: r.Method,
			Path:   r.Path,
			Header: r.Header.Clone(),
			Body:   bytes.Clone(r.Body),
		}
	}
	return out
}

// ServeHTTP records the request, then answers it as the provider whose path it names would.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// A body cut short is still recorded as far as it came: the test wants to see it.
	body, _ := io.ReadAll(r.Body)
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))

	s.mu.Lock()
	s.reqs = append(s.reqs, Request{
		Method: r.Method,
		Path:   r.URL.Path,
		Header: r.Header.Clone(),
		Body:   bytes.Clone(body),
	})
	cfg := s.cfg
	s.mu.Unlock()

	path := strings.TrimSuffix(r.URL.Path, "/")
	model, isModel := strings.CutPrefix(path, "/v1/models/")
	if !isModel {
		model = ""
	}
	anthropic := r.Header.Get("anthropic-version") != "" || r.Header.Get("x-api-key") != ""
	switch {
	case r.Method == http.MethodHead && path == "":
		// Claude Code's connectivity probe: the API answers it without a key.
		w.WriteHeader(http.StatusOK)
	case r.Method == http.MethodPost && path == "/v1/chat/completions":
		s.serveChat(w, r, cfg, body)
	case r.Method == http.MethodPost && path == "/v1/completions":
		s.serveCompletions(w, r, cfg, body)
	case r.Method == http.MethodPost && path == "/v1/responses":
		s.serveResponses(w, r, cfg, body)
	case r.Method == http.MethodPost && path == "/v1/embeddings":
		s.serveEmbeddings(w, r, cfg, body)
	case r.Method == http.MethodPost && path == "/v1/messages":
		s.serveMessages(w, r, cfg, body)
	case r.Method == http.MethodPost && path == "/v1/messages/count_tokens":
		serveCountTokens(w, r, cfg, body)
	case r.Method == http.MethodGet && (path == "/v1/models" || isModel && model != "" && !strings.Contains(model, "/")):
		if anthropic {
			serveAnthropicModels(w, r, cfg, model)
		} else {
			serveOpenAIModels(w, r, cfg, model)
		}
	case strings.HasPrefix(r.URL.Path, "/v1/messages"):
		anthropicError(w, http.StatusNotFound, "not_found_error", "Not Found")
	default:
		openAIError(w, http.StatusNotFound, openAIErr{
			Message: fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path),
			Type:    "invalid_request_error",
		})
	}
}

// fields is a request body as its top-level members, kept raw so that a member's presence,
// its JSON type and its value can each be judged as the real validators do.
type fields map[string]json.RawMessage

func parseBody(body []byte) (fields, error) {
	var f fields
	if err := json.Unmarshal(body, &f); err != nil {
		return nil, err
	}
	if f == nil {
		// "null" decodes to a nil map without error, but is no request.
		return nil, errors.New("body is null")
	}
	return f, nil
}

// has reports whether key is present with a value other than null: the providers treat an
// explicit null as absent.
func (f fields) has(key string) bool {
	v, ok := f[key]
	return ok && string(bytes.TrimSpace(v)) != "null"
}

// kind names a JSON value's type with an article, as OpenAI's type errors do.
func kind(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	if bytes.ContainsAny(v, ".eE") {
		return "a decimal"
	}
	return "an integer"
}

func (f fields) str(key string) (string, bool) {
	var s string
	if err := json.Unmarshal(f[key], &s); err != nil {
		return "", false
	}
	return s, true
}

func (f fields) integer(key string) (int, bool) {
	var n int
	if kind(f[key]) != "an integer" {
		return 0, false
	}
	if err := json.Unmarshal(f[key], &n); err != nil {
		return 0, false
	}
	return n, true
}

func (f fields) boolean(key string) (bool, bool) {
	var b bool
	if err := json.Unmarshal(f[key], &b); err != nil || kind(f[key]) != "a boolean" {
		return false, false
	}
	return b, true
}

func (f fields) array(key string) ([]json.RawMessage, bool) {
	var a []json.RawMessage
	if kind(f[key]) != "an array" {
		return nil, false
	}
	if err := json.Unmarshal(f[key], &a); err != nil {
		return nil, false
	}
	return a, true
}

// randID is n random characters from the lower-case hex alphabet, which every provider's ids
// accept as a suffix.
func randID(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// marshal encodes v without HTML escaping, as the providers do: an answer's text should reach
// the client byte for byte as the fake was told to say it.
func marshal(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only the package's own types are encoded here; failing is a bug in the package.
		panic(fmt.Sprintf("fakellm: encoding %T: %v", v, err))
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(marshal(v))
}

// sse writes server-sent events, flushing each so the client sees it as soon as it is written:
// a gateway has to relay a stream incrementally, and only a fake that streams can show it does.
// After the first failed write (the client left) it writes nothing more.
type sse struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	cfg Config
	err error
}

// startSSE sends the stream's headers, which must already hold the provider's own.
func startSSE(w http.ResponseWriter, cfg Config) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	s := &sse{w: w, rc: http.NewResponseController(w), cfg: cfg}
	s.flush()
	return s
}

// event writes one event; an empty name leaves the event: line out, as OpenAI's chat stream does.
func (s *sse) event(name string, data []byte) {
	if s.err != nil {
		return
	}
	var buf bytes.Buffer
	if s.cfg.SSEComments {
		buf.WriteString(": keep-alive\n")
	}
	if name != "" {
		buf.WriteString("event: " + name + "\n")
	}
	lines := [][]byte{data}
	if s.cfg.MultilineData && json.Valid(data) {
		lines = splitJSON(data)
	}
	for _, l := range lines {
		buf.WriteString("data: ")
		buf.Write(l)
		buf.WriteString("\n")
	}
	buf.WriteString("\n")
	if _, s.err = s.w.Write(buf.Bytes()); s.err == nil {
		s.flush()
	}
}

func (s *sse) flush() {
	if s.err == nil {
		s.err = s.rc.Flush()
	}
}

// splitJSON cuts a JSON text after every comma outside its strings: joined again with
// newlines it is the same value.
func splitJSON(data []byte) [][]byte {
	var out [][]byte
	start, inString, escaped := 0, false, false
	for i, c := range data {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && c == ',':
			out = append(out, data[start:i+1])
			start = i + 1
		}
	}
	return append(out, data[start:])
}

// splitReply cuts text into the pieces a stream sends as deltas: at word starts, as a
// tokenizer roughly would, and into halves when there is only one word, so that even a short
// reply arrives in more than one delta and a client that keeps only the last delta is caught.
func splitReply(text string) []string {
	var parts []string
	start := 0
	for i, r := range text {
		if r == ' ' && i > start {
			parts = append(parts, text[start:i])
			start = i
		}
	}
	parts = append(parts, text[start:])
	if len(parts) == 1 && utf8.RuneCountInString(text) > 1 {
		half := 0
		for range utf8.RuneCountInString(text) / 2 {
			_, size := utf8.DecodeRuneInString(text[half:])
			half += size
		}
		parts = []string{text[:half], text[half:]}
	}
	return parts
}

// capped is the output usage and whether the request's own limit cut the answer short: the
// fake has no text to shorten, so it reports what a real model would have stopped at.
func capped(cfg Config, limit int, limited bool) (int, bool) {
	if limited && limit < cfg.OutputTokens && !cfg.ExceedLimits {
		return max(limit, 0), true
	}
	return cfg.OutputTokens, false
}
