package gateway

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/pkg/config"
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

// BenchmarkStreamedCallLatency is what the gateway adds to a streamed call: each
// iteration makes one streamed Anthropic call through the gateway (admission, splice,
// metering, settlement into a real ledger on disk) and one straight to the fake, read to
// their ends, and reports the p50 and p99 of each and of the difference.
func BenchmarkStreamedCallLatency(b *testing.B) {
	r := newRig(b, config.FormatAnthropic, 0, Caller{})
	body := `{"model":"c","max_tokens":64000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	call := func(url string, key bool) time.Duration {
		req, _ := http.NewRequest("POST", url+"/v1/messages", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Anthropic-Version", "2023-06-01")
		req.Header.Set("X-Api-Key", map[bool]string{true: operatorKey, false: "roost-placeholder"}[key])
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	var via, direct []time.Duration
	for b.Loop() {
		via = append(via, call(r.url, false))
		direct = append(direct, call(r.fake.URL(), true))
	}
	pct := func(d []time.Duration, p float64) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[min(len(s)-1, int(p*float64(len(s))))].Microseconds())
	}
	b.ReportMetric(pct(via, 0.5), "gateway-p50-µs")
	b.ReportMetric(pct(via, 0.99), "gateway-p99-µs")
	b.ReportMetric(pct(direct, 0.5), "direct-p50-µs")
	b.ReportMetric(pct(direct, 0.99), "direct-p99-µs")
	b.ReportMetric(pct(via, 0.5)-pct(direct, 0.5), "added-p50-µs")
	b.ReportMetric(pct(via, 0.99)-pct(direct, 0.99), "added-p99-µs")
}
