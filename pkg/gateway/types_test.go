package gateway

import (
	"net/http"
	"strings"
	"testing"

	"roost.dev/roost/pkg/config"
)

// An optional member the gateway reads given as null where it must write into it, or as
// the wrong JSON type, is a 400 naming the member — never a panic (a handler that panics
// answers the client nothing) — and nothing reaches the upstream. The same members well
// typed pass.
func TestOptionalMembersTyped(t *testing.T) {
	for _, tc := range []struct {
		name, path, body, want string
	}{
		{"stream_options null", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":null}`, "stream_options: expected an object, got null"},
		{"stream_options a number", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":5}`, "stream_options: expected an object, got 5"},
		{"stream_options a list", "/v1/completions", `{"model":"m","prompt":"x","stream":true,"stream_options":[{"include_usage":true}]}`, "stream_options: expected an object, got ["},
		{"stream_options a string, not streamed", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":"x"}`, `stream_options: expected an object, got \"x\"`},
		{"stream a string", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":"true"}`, `stream: expected a boolean, got \"true\"`},
		{"stream an object", "/v1/completions", `{"model":"m","prompt":"x","stream":{}}`, "stream: expected a boolean, got {}"},
		{"prompt an object", "/v1/completions", `{"model":"m","prompt":{"a":1},"max_tokens":5}`, "prompt: expected a string or a list, got {"},
		{"prompt a number", "/v1/completions", `{"model":"m","prompt":7,"max_tokens":5}`, "prompt: expected a string or a list, got 7"},
		{"model a list", "/v1/chat/completions", `{"model":["m"],"messages":[{"role":"user","content":"hi"}]}`, `model: expected a string, got [\"m\"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, config.FormatOpenAI, 0, Caller{})
			status, _, out := r.post(tc.path, tc.body)
			if status != http.StatusBadRequest || !strings.Contains(out, tc.want) {
				t.Fatalf("%d %s, want 400 naming %q", status, out, tc.want)
			}
			envelope(t, config.FormatOpenAI, out, "invalid_request_error")
			r.nothingUpstream()
		})
	}
	// The positive controls: the same members well typed, or null where the gateway writes
	// nothing into them, reach the upstream, streamed ones asking for usage.
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{}}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":false,"include_usage":false}}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":null,"stream_options":null}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false,"stream_options":null}`},
		{"/v1/completions", `{"model":"m","prompt":["a","b"],"stream":true}`},
		{"/v1/completions", `{"model":"m","prompt":[[1,2],[3]],"max_tokens":5}`},
	} {
		r := newRig(t, config.FormatOpenAI, 0, Caller{})
		if status, _, out := r.post(tc.path, tc.body); status != 200 {
			t.Fatalf("%s: %d %s", tc.body, status, out)
		}
		sent := string(r.fake.Requests()[0].Body)
		if strings.Contains(tc.body, `"stream":true`) && (strings.Count(sent, `"include_usage"`) != 1 || !strings.Contains(sent, `"include_usage":true`)) {
			t.Errorf("%s reached the upstream as %s", tc.body, sent)
		}
	}
}
