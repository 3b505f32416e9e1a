package gateway

import (
	"bytes"
	"encoding/json"

	"roost.dev/roost/pkg/ledger"
)

// meter reads the usage an answer reports as it passes through to the caller: OpenAI's
// prompt_tokens/completion_tokens (chat, completions, embeddings) or input_tokens/
// output_tokens (responses), Anthropic's input_tokens (plus cache reads and writes) and
// output_tokens — at the top of a JSON answer, or in a streamed event's message
// (Anthropic's message_start), response (OpenAI's response.completed) or own usage (OpenAI's
// last chat chunk, Anthropic's message_delta). Streams report running totals, so the largest
// seen wins.
//
// It holds none of the answer: a JSON answer, and each event's data, is read by a scan as
// it passes, keeping only the members above (each bounded), so an answer of any size costs
// it a few small buffers.
//
// A stream is read as the Server-Sent Events specification says a client reads it: lines end
// in CRLF, LF or CR; a line starting with ':' is a comment; an event's data is its data:
// lines joined with newlines, dispatched at a blank line; an event the stream ends before
// dispatching is dropped.
type meter struct {
	sse bool
	// scan reads a JSON answer, or the stream's event being gathered.
	scan scan

	// A stream's line in progress: field is its name so far (bounded), named that its ':'
	// has passed, data that it is a data: line, space that its value's leading space may
	// still be dropped, empty that it has no byte yet.
	field        []byte
	named, data  bool
	space, empty bool
	// hasData: the event has a data: line; head the first bytes of its data (to know
	// "[DONE]") and dataLen their number.
	hasData bool
	head    [7]byte
	dataLen int
	// afterCR: the last byte was a CR, so a LF next ends no further line.
	afterCR bool

	input, output int64
	// cacheRead and cacheWrite are the parts of input an Anthropic answer says were read
	// from and written to its prompt cache.
	cacheRead, cacheWrite int64
	// seen: some usage was reported; final: the answer's whole usage was (a JSON answer's,
	// a stream's last).
	seen, final bool
	// done: the stream said it ended ([DONE], message_stop, response.completed).
	done bool
	// started: a line began (the first line's state is set up on its first byte).
	started bool
}

// usage is what the answer reported and whether that is its whole usage.
func (m *meter) usage() (*ledger.Usage, bool) {
	if !m.seen {
		return nil, false
	}
	return &ledger.Usage{Input: m.input, Output: m.output}, m.final || m.done
}

// Write takes the next bytes of the answer; it never fails.
func (m *meter) Write(p []byte) (int, error) {
	n := len(p)
	if !m.sse {
		m.scan.write(p)
		return n, nil
	}
	if !m.started {
		m.started = true
		m.newLine()
	}
	for len(p) > 0 {
		if m.afterCR && p[0] == '\n' {
			p = p[1:]
			m.afterCR = false
			continue
		}
		m.afterCR = false
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			m.part(p)
			break
		}
		m.part(p[:i])
		m.afterCR = p[i] == '\r'
		p = p[i+1:]
		m.endLine()
		m.newLine()
	}
	return n, nil
}

func (m *meter) newLine() {
	m.field, m.named, m.data, m.space, m.empty = m.field[:0], false, false, false, true
}

// part is part of a line.
func (m *meter) part(p []byte) {
	if len(p) == 0 {
		return
	}
	m.empty = false
	if !m.named {
		i := 0
		for ; i < len(p) && p[i] != ':'; i++ {
		}
		if len(m.field)+i <= len("data") {
			m.field = append(m.field, p[:i]...)
		} else {
			m.field = append(m.field[:0], '!')
		}
		if i == len(p) {
			return
		}
		m.named = true
		if string(m.field) == "data" {
			m.dataLine()
			m.space = true
		}
		p = p[i+1:]
	}
	if !m.data || len(p) == 0 {
		return
	}
	if m.space {
		m.space = false
		if p[0] == ' ' {
			p = p[1:]
		}
	}
	m.value(p)
}

// dataLine is a data: line's start: the event's data so far is joined to it by a newline.
func (m *meter) dataLine() {
	if m.hasData {
		m.value([]byte("\n"))
	}
	m.hasData, m.data = true, true
}

// value is part of the event's data.
func (m *meter) value(p []byte) {
	if m.dataLen < len(m.head) {
		copy(m.head[m.dataLen:], p)
	}
	m.dataLen += len(p)
	m.scan.write(p)
}

// endLine is a whole line's end: a blank one dispatches the event; a data line with no
// ':' has an empty value.
func (m *meter) endLine() {
	switch {
	case m.empty:
		if m.hasData {
			m.event()
		}
		m.scan.reset()
		m.hasData, m.dataLen = false, 0
	case !m.named && string(m.field) == "data":
		m.dataLine()
	}
}

// end is the answer's end: a JSON answer is read now; a stream's undispatched event is
// dropped.
func (m *meter) end() {
	if m.sse || !m.scan.end() {
		return
	}
	c, ok := m.scan.carrier()
	if !ok {
		return
	}
	for _, u := range []*usageFields{c.Usage, holderUsage(c.Message), holderUsage(c.Response)} {
		m.add(u)
	}
	m.final = m.seen
}

type usageFields struct {
	PromptTokens             *int64 `json:"prompt_tokens"`
	CompletionTokens         *int64 `json:"completion_tokens"`
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens int64  `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64  `json:"cache_read_input_tokens"`
}

// usageCarrier is what the meter reads of a JSON answer or event: the members the scan
// keeps.
type usageCarrier struct {
	Type     string
	Usage    *usageFields
	Message  *usageHolder
	Response *usageHolder
	Choices  json.RawMessage
}

type usageHolder struct {
	Usage *usageFields
}

func holderUsage(h *usageHolder) *usageFields {
	if h == nil {
		return nil
	}
	return h.Usage
}

// event is one dispatched event, its data read by the scan.
func (m *meter) event() {
	if m.dataLen == len("[DONE]") && string(m.head[:m.dataLen]) == "[DONE]" {
		m.done = true
		return
	}
	if !m.scan.end() {
		return
	}
	c, ok := m.scan.carrier()
	if !ok {
		return
	}
	switch c.Type {
	case "message_stop", "response.completed", "response.incomplete", "response.failed":
		m.done = true
	}
	// message_start's usage is the input and a token of output; the rest is to come.
	m.add(holderUsage(c.Message))
	// response.completed (incomplete, failed) carries the response's whole usage; earlier
	// response events carry none.
	if m.add(holderUsage(c.Response)) {
		m.final = true
	}
	// OpenAI's usage chunk ends a chat or completions stream with an empty choices list
	// (a chunk with choices and usage is a running count); Anthropic's message_delta
	// carries the answer's whole output.
	if m.add(c.Usage) && (c.Type == "message_delta" || string(bytes.TrimSpace(c.Choices)) == "[]") {
		m.final = true
	}
}

// add takes one report of usage, and says whether it held any.
func (m *meter) add(u *usageFields) bool {
	if u == nil {
		return false
	}
	in, out := int64(-1), int64(-1)
	switch {
	case u.PromptTokens != nil:
		in = *u.PromptTokens
	case u.InputTokens != nil:
		// Each part is held to the ledger's bound before they are added, so no sum overflows.
		write, read := min(max(u.CacheCreationInputTokens, 0), ledger.MaxTokens), min(max(u.CacheReadInputTokens, 0), ledger.MaxTokens)
		in = min(*u.InputTokens, ledger.MaxTokens) + write + read
		m.cacheRead, m.cacheWrite = max(m.cacheRead, read), max(m.cacheWrite, write)
	}
	switch {
	case u.CompletionTokens != nil:
		out = *u.CompletionTokens
	case u.OutputTokens != nil:
		out = *u.OutputTokens
	}
	if in < 0 && out < 0 {
		return false
	}
	// An upstream reporting nonsense (negative, absurd) is held to what the ledger takes.
	m.seen = true
	m.input, m.output = min(max(m.input, in), ledger.MaxTokens), min(max(m.output, out), ledger.MaxTokens)
	return true
}
