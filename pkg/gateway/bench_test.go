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

// BenchmarkMeterJSON meters a 31 MiB JSON answer, its usage at the end, as it passes in
// 32 KiB reads (what the proxy's copy reads).
func BenchmarkMeterJSON(b *testing.B) {
	answer := []byte(`{"id":"x","choices":[{"message":{"content":"` + strings.Repeat("a\\\"", 31<<19) + `"}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`)
	b.SetBytes(int64(len(answer)))
	b.ReportAllocs()
	for b.Loop() {
		m := &meter{}
		for p := answer; len(p) > 0; {
			n := min(len(p), 32<<10)
			m.Write(p[:n])
			p = p[n:]
		}
		m.end()
		if u, final := m.usage(); u == nil || !final || u.Output != 2 {
			b.Fatalf("%+v %v", u, final)
		}
	}
}

// BenchmarkMeterPathological meters an answer of a million tiny usage members.
func BenchmarkMeterPathological(b *testing.B) {
	answer := []byte(`{` + strings.Repeat(`"usage":{},`, 1<<20) + `"usage":{"prompt_tokens":1}}`)
	b.SetBytes(int64(len(answer)))
	b.ReportAllocs()
	for b.Loop() {
		m := &meter{}
		m.Write(answer)
		m.end()
	}
}
