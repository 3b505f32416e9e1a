package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"roost.dev/roost/pkg/config"
)

// holder is an upstream that holds every call, its body read, until it is released, then
// answers a chat completion with usage: calls held so are in flight together.
type holder struct {
	arrived chan int64
	release chan struct{}
	once    sync.Once
	url     string
}

func newHolder(t *testing.T) *holder {
	t.Helper()
	h := &holder{arrived: make(chan int64, 64), release: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		h.arrived <- n
		<-h.release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { h.free(); srv.Close() })
	h.url = "http://" + ln.Addr().String()
	return h
}

func (h *holder) free() { h.once.Do(func() { close(h.release) }) }

// wait takes n arrivals.
func (h *holder) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		<-h.arrived
	}
}

// answer is one call's answer.
type answer struct {
	status int
	header http.Header
	body   string
	err    error
}

// send posts body to path, its length told unless chunked, and answers on the channel.
func (r *rig) send(path string, body []byte, chunked bool) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		var rd io.Reader = bytes.NewReader(body)
		if chunked {
			// A reader net/http cannot measure: the body goes chunked.
			rd = io.MultiReader(rd)
		}
		req, _ := http.NewRequest("POST", r.url+path, rd)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		out <- answer{status: resp.StatusCode, header: resp.Header, body: string(data), err: err}
	}()
	return out
}

func chatOf(size int) []byte {
	return []byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("x", size) + `"}]}`)
}

// The session's calls at once are bounded: with two held upstream, the third is refused
// with a 429 naming the bound, retryable after a second, and never reaches the upstream;
// when the two end, the next passes.
func TestCallsPerSessionBounded(t *testing.T) {
	r := newRig(t, config.FormatOpenAI, 0, Caller{}, func(c *rigConfig) { c.limits.CallsPerSession = 2 })
	h := newHolder(t)
	setUpstreamURL(r, h.url)
	first, second := r.send("/v1/chat/completions", chatOf(10), false), r.send("/v1/chat/completions", chatOf(10), false)
	h.wait(t, 2)
	a := <-r.send("/v1/chat/completions", chatOf(10), false)
	if a.err != nil || a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") != "1" || a.header.Get("X-Should-Retry") == "false" {
		t.Fatalf("the third call: %+v", a)
	}
	msg, roost := envelope(t, config.FormatOpenAI, a.body, "requests")
	if roost["code"] != "session_calls_in_flight" || !strings.Contains(msg, "session s1 has 2 calls") || !strings.Contains(msg, "inference.max_calls_per_session") {
		t.Fatalf("the refusal: %s", a.body)
	}
	// A client that sends its whole body before it reads (as Python's do) is answered the
	// refusal too, not a reset connection: the gateway reads the body it refused to its end.
	if status, _, out := r.raw("POST", "v1/chat/completions", string(chatOf(4<<20)), "Content-Type", "application/json"); status != http.StatusTooManyRequests || !strings.Contains(out, "session_calls_in_flight") {
		t.Fatalf("the third call, sent whole before reading: %d %s", status, out)
	}
	if bytes, calls := r.gw.InFlight(); calls != 2 || bytes <= 0 {
		t.Fatalf("in flight while two are held: %d bytes, %d calls", bytes, calls)
	}
	h.free()
	for _, c := range []<-chan answer{first, second} {
		if a := <-c; a.err != nil || a.status != 200 {
			t.Fatalf("a held call: %+v", a)
		}
	}
	if a := <-r.send("/v1/chat/completions", chatOf(10), false); a.err != nil || a.status != 200 {
		t.Fatalf("after they ended: %+v", a)
	}
	if bytes, calls := r.gw.InFlight(); bytes != 0 || calls != 0 {
		t.Fatalf("in flight after every call ended: %d bytes, %d calls", bytes, calls)
	}
	if len(h.arrived) != 1 {
		t.Fatalf("the upstream saw %d calls after the two held", len(h.arrived))
	}
}

// The body bytes the gateway holds are bounded across calls: with a 600 KiB body held, a
// second is refused with a 503 naming the bound — its length told or not (then read
// chunk by chunk) — in the upstream's own error shape, before anything leaves; a small
// one still fits, and once the first ends the second passes.
func TestBodyBytesInFlightBounded(t *testing.T) {
	r := newRig(t, config.FormatAnthropic, 0, Caller{}, func(c *rigConfig) {
		c.limits.BodyBytesInFlight, c.limits.CallsPerSession = 1<<20, 8
	})
	h := newHolder(t)
	setUpstreamURL(r, h.url)
	big := chatOf(600 << 10)
	held := r.send("/v1/messages", big, false)
	h.wait(t, 1)
	for _, chunked := range []bool{false, true} {
		a := <-r.send("/v1/messages", big, chunked)
		if a.err != nil || a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") != "1" {
			t.Fatalf("chunked %v: %+v", chunked, a)
		}
		msg, roost := envelope(t, config.FormatAnthropic, a.body, "api_error")
		if roost["code"] != "gateway_body_bytes_in_flight" || !strings.Contains(msg, "inference.max_body_bytes_in_flight") {
			t.Fatalf("chunked %v: the refusal: %s", chunked, a.body)
		}
	}
	small := r.send("/v1/messages", chatOf(10<<10), false)
	h.wait(t, 1)
	h.free()
	for _, c := range []<-chan answer{held, small} {
		if a := <-c; a.err != nil || a.status != 200 {
			t.Fatalf("a call within the bound: %+v", a)
		}
	}
	for _, chunked := range []bool{false, true} {
		if a := <-r.send("/v1/messages", big, chunked); a.err != nil || a.status != 200 {
			t.Fatalf("chunked %v, after the first ended: %+v", chunked, a)
		}
	}
	if n := len(h.arrived); n != 2 {
		t.Fatalf("the upstream saw %d calls after the first two", n)
	}
	if bytes, calls := r.gw.InFlight(); bytes != 0 || calls != 0 {
		t.Fatalf("in flight after every call ended: %d bytes, %d calls", bytes, calls)
	}
}

// A body past the gateway's largest is a 413, its length told (refused before a byte is
// read or a buffer made for it) or not; one at the bound passes.
func TestBodyPastMaxRefused(t *testing.T) {
	r := newRig(t, config.FormatOpenAI, 0, Caller{}, func(c *rigConfig) { c.limits.MaxBody = 256 << 10 })
	over := chatOf(300 << 10)
	for _, chunked := range []bool{false, true} {
		a := <-r.send("/v1/chat/completions", over, chunked)
		if a.err != nil || a.status != http.StatusRequestEntityTooLarge || !strings.Contains(a.body, fmt.Sprintf("larger than the gateway takes, %d bytes", 256<<10)) {
			t.Fatalf("chunked %v: %+v", chunked, a)
		}
	}
	r.nothingUpstream()
	at := chatOf(256<<10 - len(chatOf(0)))
	for _, chunked := range []bool{false, true} {
		if a := <-r.send("/v1/chat/completions", at, chunked); a.err != nil || a.status != 200 {
			t.Fatalf("chunked %v, at the bound: %+v", chunked, a)
		}
	}
}
