package gateway

import (
	"bytes"
	"encoding/json"

	"roost.dev/roost/pkg/ledger"
)

// refMeter is the meter as it was before it scanned answers as they pass: it kept a JSON
// answer whole, and each event's data, and decoded them with encoding/json. FuzzUsage
// holds the scanning meter to it wherever it decoded what it kept.
const refMaxResponse = 64 << 20

type refMeter struct {
	sse bool
	// buf is a JSON answer so far, or a stream's line in progress; long is set when it
	// passed refMaxResponse and is being skipped.
	buf  []byte
	long bool
	// data is the stream's event being gathered; hasData that it has a data: line.
	data    []byte
	hasData bool
	// afterCR: the last byte was a CR, so a LF next ends no further line.
	afterCR bool

	input, output int64
	// seen: some usage was reported; final: the answer's whole usage was (a JSON answer's,
	// a stream's last).
	seen, final bool
	// done: the stream said it ended ([DONE], message_stop, response.completed).
	done bool
	// failed: an event or the answer did not decode.
	failed bool
}

// usage is what the answer reported and whether that is its whole usage.
func (m *refMeter) usage() (*ledger.Usage, bool) {
	if !m.seen {
		return nil, false
	}
	return &ledger.Usage{Input: m.input, Output: m.output}, m.final || m.done
}

// Write takes the next bytes of the answer; it never fails.
func (m *refMeter) Write(p []byte) (int, error) {
	n := len(p)
	if !m.sse {
		if !m.long && len(m.buf)+len(p) > refMaxResponse {
			m.long, m.buf = true, nil
		}
		if !m.long {
			m.buf = append(m.buf, p...)
		}
		return n, nil
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
			m.keep(p)
			break
		}
		m.keep(p[:i])
		m.afterCR = p[i] == '\r'
		p = p[i+1:]
		if !m.long {
			m.line(m.buf)
		}
		m.buf, m.long = m.buf[:0], false
	}
	return n, nil
}

// keep adds part of a line to the one in progress, dropping a line past refMaxResponse.
func (m *refMeter) keep(p []byte) {
	if m.long {
		return
	}
	if len(m.buf)+len(p) > refMaxResponse {
		m.long, m.buf = true, nil
		return
	}
	m.buf = append(m.buf, p...)
}

// line is one whole line of a stream.
func (m *refMeter) line(l []byte) {
	if len(l) == 0 {
		if m.hasData {
			m.event(bytes.TrimSuffix(m.data, []byte("\n")))
		}
		m.data, m.hasData = m.data[:0], false
		return
	}
	if l[0] == ':' {
		return
	}
	field, value, found := bytes.Cut(l, []byte(":"))
	if !found {
		value = nil
	}
	value = bytes.TrimPrefix(value, []byte(" "))
	if string(field) != "data" {
		return
	}
	if len(m.data)+len(value)+1 > refMaxResponse {
		// Too big to read: the event is dropped whole.
		m.data, m.hasData = m.data[:0], false
		return
	}
	m.data = append(append(m.data, value...), '\n')
	m.hasData = true
}

// end is the answer's end: a JSON answer is read now; a stream's undispatched event is
// dropped.
func (m *refMeter) end() {
	if !m.sse && !m.long {
		var c refCarrier
		if json.Unmarshal(m.buf, &c) != nil {
			m.failed = true
		} else {
			for _, u := range []*refUsageFields{c.Usage, refHolderUsage(c.Message), refHolderUsage(c.Response)} {
				m.add(u)
			}
			m.final = m.seen
		}
	}
	m.buf = nil
}

type refUsageFields struct {
	PromptTokens             *int64 `json:"prompt_tokens"`
	CompletionTokens         *int64 `json:"completion_tokens"`
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens int64  `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64  `json:"cache_read_input_tokens"`
}

type refCarrier struct {
	Type     string          `json:"type"`
	Usage    *refUsageFields `json:"usage"`
	Message  *refHolder      `json:"message"`
	Response *refHolder      `json:"response"`
	Choices  json.RawMessage `json:"choices"`
}

type refHolder struct {
	Usage *refUsageFields `json:"usage"`
}

func refHolderUsage(h *refHolder) *refUsageFields {
	if h == nil {
		return nil
	}
	return h.Usage
}

// event is one dispatched event's data.
func (m *refMeter) event(data []byte) {
	if string(data) == "[DONE]" {
		m.done = true
		return
	}
	var c refCarrier
	if json.Unmarshal(data, &c) != nil {
		m.failed = true
		return
	}
	switch c.Type {
	case "message_stop", "response.completed", "response.incomplete", "response.failed":
		m.done = true
	}
	// message_start's usage is the input and a token of output; the rest is to come.
	m.add(refHolderUsage(c.Message))
	// response.completed (incomplete, failed) carries the response's whole usage; earlier
	// response events carry none.
	if m.add(refHolderUsage(c.Response)) {
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
func (m *refMeter) add(u *refUsageFields) bool {
	if u == nil {
		return false
	}
	in, out := int64(-1), int64(-1)
	switch {
	case u.PromptTokens != nil:
		in = *u.PromptTokens
	case u.InputTokens != nil:
		// Each part is held to the ledger's bound before they are added, so no sum overflows.
		in = min(*u.InputTokens, ledger.MaxTokens) + min(max(u.CacheCreationInputTokens, 0), ledger.MaxTokens) +
			min(max(u.CacheReadInputTokens, 0), ledger.MaxTokens)
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
