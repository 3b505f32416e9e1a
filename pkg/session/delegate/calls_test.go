package delegate

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"roost.dev/roost/pkg/gateway"
	"roost.dev/roost/pkg/records"
)

// Calls are traced one record each until they reach their quarter of log_max_bytes, then
// one note and nothing more — across a restart too, which reads back what was traced.
func TestCallTraceCapped(t *testing.T) {
	dir := t.TempDir()
	const logMax = 16 << 10
	call := gateway.CallRecord{At: time.Now(), Upstream: "anthropic", Route: "POST v1/messages", Model: "claude-x", Status: 200,
		InputTokens: 20000, OutputTokens: 300, Reserved: 30000, Charged: 20300, Latency: 1500 * time.Millisecond, Streamed: true,
		LoweredFrom: 64000, LoweredTo: 10000}
	b := New(nil, Config{})
	for range 100 {
		b.traceCall("s1", dir, logMax, call)
	}
	lines := func() (calls, notes int, size int64) {
		f, err := os.Open(filepath.Join(dir, records.TraceFile))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			size += int64(len(sc.Bytes())) + 1
			var r records.CallTrace
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatal(err)
			}
			switch r.EventType {
			case records.TraceInferenceCall:
				if r.LoweredTo != 10000 || r.Charged != 20300 || r.LatencyMS != 1500 || !r.Streamed || r.SessionID != "s1" {
					t.Errorf("record %+v", r)
				}
				calls++
			case records.TraceInferenceCallCapped:
				notes++
			}
		}
		return
	}
	calls, notes, size := lines()
	if calls == 0 || calls >= 100 || notes != 1 || size > logMax/4 {
		t.Fatalf("%d calls and %d notes in %d bytes (cap %d)", calls, notes, size, logMax/4)
	}
	again := New(nil, Config{})
	again.traceCall("s1", dir, logMax, call)
	if c, n, _ := lines(); c != calls || n != 1 {
		t.Errorf("after a restart: %d calls, %d notes", c, n)
	}
}
