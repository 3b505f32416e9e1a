package gateway

import (
	"encoding/json"
	"net/http"
	"testing"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/fdbudget"
)

// A model call holds a descriptor slot of its session's share while it lasts. With the
// share held (here by the session's other sockets) the call is refused before anything
// leaves: 503 in the upstream's own error envelope, code "connections"; once a slot frees
// the call goes through, and gives its slot back.
func TestCallPastDescriptorShare(t *testing.T) {
	for _, format := range []string{config.FormatOpenAI, config.FormatAnthropic} {
		t.Run(format, func(t *testing.T) {
			r := newRig(t, format, 0, Caller{})
			fds := fdbudget.Sized(10, 1)
			r.gw.fds = fds
			path, body := "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":40}`
			if format == config.FormatAnthropic {
				path = "/v1/messages"
			}
			tunnel, err := fds.Acquire("s1", fdbudget.Upstream)
			if err != nil {
				t.Fatal(err)
			}
			status, h, out := r.post(path, body)
			var env struct {
				Type  string `json:"type"`
				Error struct {
					Type, Code, Message string
				} `json:"error"`
				Roost struct {
					Code string `json:"code"`
				} `json:"roost"`
			}
			if err := json.Unmarshal([]byte(out), &env); err != nil {
				t.Fatalf("%d %s: %v", status, out, err)
			}
			want := "server_error"
			if format == config.FormatAnthropic {
				want = "api_error"
			}
			if status != http.StatusServiceUnavailable || env.Roost.Code != "connections" || env.Error.Type != want || h.Get("Content-Type") != "application/json" {
				t.Fatalf("a call past the share: %d %s", status, out)
			}
			if n := len(r.fake.Requests()); n != 0 {
				t.Fatalf("the upstream saw %d requests of a refused call", n)
			}
			if s := r.spent(); s.Reserved != 0 || s.Charged != 0 {
				t.Fatalf("a refused call reserved or charged: %+v", s)
			}
			tunnel.Release()
			if status, _, out := r.post(path, body); status != 200 {
				t.Fatalf("a call with its slot free: %d %s", status, out)
			}
			if st := fds.Stats(); st.Held != 0 || st.ByUse["gateway"] != 0 {
				t.Fatalf("a call that ended left its slot held: %+v", st)
			}
		})
	}
}
