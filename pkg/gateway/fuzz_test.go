package gateway

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/ledger"
)

// FuzzUsage feeds the meter whatever an upstream might answer, as JSON and as an event
// stream: it never panics, passes a stream through byte for byte, and reports only usage the
// ledger accepts.
func FuzzUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":12,"completion_tokens":30}}`))
	f.Add([]byte(`{"type":"message_start","message":{"usage":{"input_tokens":7,"cache_read_input_tokens":3}}}`))
	f.Add([]byte("event: response.completed\ndata: {\"response\":{\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}}\n\n"))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":-5,\"completion_tokens\":99999999999999999}}\n\ndata: [DONE]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var m usageMeter
		m.json(data)
		check(t, m.usage())
		var s usageMeter
		w := httptest.NewRecorder()
		s.stream(w, bytes.NewReader(data))
		if !bytes.Equal(w.Body.Bytes(), data) {
			t.Fatalf("the stream came through changed")
		}
		check(t, s.usage())
	})
}

func check(t *testing.T, u *ledger.Usage) {
	if u != nil && (u.Input < 0 || u.Output < 0 || u.Input > ledger.MaxTokens || u.Output > ledger.MaxTokens) {
		t.Fatalf("usage %+v", *u)
	}
}

// FuzzPrepare feeds a call's preparation any request body: it never panics, and what it
// admits is positive and bounded.
func FuzzPrepare(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[],"max_tokens":50,"stream":true}`))
	f.Add([]byte(`{"max_completion_tokens":-1}`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		c := call{upstream: config.Upstream{Format: config.FormatOpenAI, DefaultMaxOutputTokens: 4096}, path: "v1/chat/completions", body: body}
		if err := c.prepare(Caller{Model: "m"}); err != nil {
			return
		}
		if c.maxOutput <= 0 || c.inputEstimate < 0 {
			t.Fatalf("admits %d + %d", c.inputEstimate, c.maxOutput)
		}
	})
}
