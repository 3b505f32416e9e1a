package gateway

import (
	"strings"
	"testing"
)

// largeBody is a chat call of about size bytes, most of them one message's content, that
// the gateway must rewrite (no model named, streamed without include_usage).
func largeBody(size int) []byte {
	return []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("a", size) + `"}],"max_tokens":100,"stream":true}`)
}

// BenchmarkPrepare reads and rewrites a 31 MiB call, as the largest a session sends.
func BenchmarkPrepare(b *testing.B) {
	body := largeBody(31 << 20)
	routes := builtinRoutes["openai"]
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		c := call{route: &routes[0], body: body}
		if err := c.prepare(Caller{Model: "m"}, 4096); err != nil {
			b.Fatal(err)
		}
	}
}
