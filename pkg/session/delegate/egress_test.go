package delegate

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
)

// Nothing here leaves loopback: the proxy's dialer refuses any other address before it
// dials, and the only names it knows are the test's, pointing at 127.0.0.1.
type loopbackDialer struct{ d net.Dialer }

func (l *loopbackDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Unmap().IsLoopback() {
		return nil, fmt.Errorf("test guard: %q is not a loopback address", addr)
	}
	return l.d.DialContext(ctx, network, addr)
}

// noDNS answers nothing: every name the tests use is in the proxy's hosts.
type noDNS struct{}

func (noDNS) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// proxyEnv is a session's proxy as roostd serves it, on a loopback listener, with an
// upstream web.test on loopback.
type proxyEnv struct {
	t       *testing.T
	a       *Egress
	dir     string
	proxy   string // the session's proxy listener
	webPort int
	srv     *http.Server
}

func newProxyEnv(t *testing.T) *proxyEnv {
	t.Helper()
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/bytes/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.PathValue("n"))
		_, _ = w.Write(make([]byte, n))
	})
	web := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = web.Serve(up) }()
	t.Cleanup(func() { _ = web.Close() })
	e := &proxyEnv{t: t, dir: t.TempDir(), webPort: up.Addr().(*net.TCPAddr).Port}
	e.a = e.daemon()
	return e
}

// daemon is a roostd's Egress over the env's records directory: a second call is the next
// daemon after a restart.
func (e *proxyEnv) daemon() *Egress {
	cfg := &egress.Config{
		Hosts:       map[string]netip.Addr{"web.test": netip.MustParseAddr("127.0.0.1")},
		PermitCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Resolver:    noDNS{},
		Dialer:      &loopbackDialer{},
	}
	return NewEgress(cfg, nil, func(string) string { return e.dir }, slog.New(slog.DiscardHandler))
}

// policy allows web.test on the upstream's port.
func (e *proxyEnv) policy(logMax, egressMax int64) *manifest.Policy {
	r, err := manifest.ParseNetRule("web.test:" + strconv.Itoa(e.webPort))
	if err != nil {
		e.t.Fatal(err)
	}
	p := &manifest.Policy{}
	p.Network.Allow = []manifest.NetRule{r}
	p.Resources.LogMaxBytes.Value = logMax
	p.Resources.EgressMaxBytes.Value = egressMax
	return p
}

// serve listens for the session's proxy as its endpoint does.
func (e *proxyEnv) serve(s *egress.Session) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	e.proxy = ln.Addr().String()
	e.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = e.srv.Serve(egress.Split(ln, s.ServeSOCKS)) }()
	e.t.Cleanup(func() { _ = e.srv.Close() })
}

// exchange sends one request to the proxy and returns the status and the body's length.
func (e *proxyEnv) exchange(req string) (int, int) {
	e.t.Helper()
	c, err := net.Dial("tcp", e.proxy)
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		e.t.Fatal(err)
	}
	method := strings.Fields(req)[0]
	res, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		e.t.Fatalf("the answer to %q: %v", req, err)
	}
	defer res.Body.Close()
	if method == http.MethodConnect {
		return res.StatusCode, 0
	}
	n, _ := io.Copy(io.Discard, res.Body)
	return res.StatusCode, int(n)
}

func (e *proxyEnv) get(n int) (int, int) {
	return e.exchange(fmt.Sprintf("GET http://web.test:%d/bytes/%d HTTP/1.1\r\nHost: web.test:%d\r\nConnection: close\r\n\r\n", e.webPort, n, e.webPort))
}

func (e *proxyEnv) refused(host string) int {
	code, _ := e.exchange(fmt.Sprintf("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", host, host))
	return code
}

// traceLine is what the tests read of a trace line.
type traceLine struct {
	EventType string `json:"event_type"`
	Host      string `json:"host"`
	Port      int    `json:"port"`
	Decision  string `json:"decision"`
	Reason    string `json:"reason"`
	Count     int64  `json:"count"`
	BytesDown int64  `json:"bytes_down"`
}

func (e *proxyEnv) trace() ([]traceLine, int64) {
	e.t.Helper()
	data, err := os.ReadFile(filepath.Join(e.dir, records.TraceFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		e.t.Fatal(err)
	}
	var out []traceLine
	for line := range strings.Lines(string(data)) {
		var l traceLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			e.t.Fatalf("a trace line that is not JSON: %q: %v", line, err)
		}
		out = append(out, l)
	}
	return out, int64(len(data))
}

// A session's own refusals cannot evict its allowed connections from the trace: 10,000
// refused CONNECTs (to 500 names, past the refusal keys kept) interleaved with 10 allowed
// requests leave every allowed request in the trace, every refusal counted (in the trace's
// egress_refused records while their part of the cap holds them, in the record always),
// and the trace within resources.log_max_bytes. On a trace cap too small for the refusal
// records, the allowed requests are still all there. (Before the counters, the refusals
// took the whole cap and 1 of the 10 allowed requests was recorded.)
func TestAllowedStayInTraceAfterRefusals(t *testing.T) {
	for _, c := range []struct {
		name   string
		logMax int64
		// whole says the refusal records fit their part of the cap.
		whole bool
	}{
		{"room for the refusal records", 1 << 20, true},
		{"a cap the refusal records fill", 16 << 10, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newProxyEnv(t)
			const refusals, allowed = 10000, 10
			s := e.open("s1", e.policy(c.logMax, 0))
			e.serve(s)
			for i := range refusals {
				if i%(refusals/allowed) == 0 {
					if code, n := e.get(100); code != http.StatusOK || n != 100 {
						t.Fatalf("allowed request %d: %d, %d bytes", i, code, n)
					}
				}
				if code := e.refused(fmt.Sprintf("h%d.test", i%500)); code != http.StatusForbidden {
					t.Fatalf("refusal %d: %d, want 403", i, code)
				}
			}
			rec := e.closeSession("s1")
			lines, size := e.trace()
			var gotAllowed, gotRefused int64
			var refusedCapped, overflow bool
			for _, l := range lines {
				switch l.EventType {
				case records.TraceEgress:
					if l.Decision == egress.Allowed && l.Host == "web.test" && l.BytesDown >= 100 { // wire bytes: the status line and headers too
						gotAllowed++
					}
					if l.Decision == egress.Denied {
						gotRefused++
					}
				case records.TraceEgressRefused:
					if l.Reason != egress.ReasonNotAllowed {
						t.Errorf("a refusal record with reason %q", l.Reason)
					}
					overflow = overflow || l.Host == records.EgressOverflowHost
					gotRefused += l.Count
				case records.TraceEgressRefusedCapped:
					refusedCapped = true
				}
			}
			if gotAllowed != allowed {
				t.Errorf("the trace holds %d of the %d allowed requests", gotAllowed, allowed)
			}
			if c.whole && (gotRefused != refusals || !overflow || refusedCapped) {
				t.Errorf("the trace accounts for %d of the %d refusals (overflow key %v, capped %v)", gotRefused, refusals, overflow, refusedCapped)
			}
			if !c.whole && (!refusedCapped || gotRefused == 0 || gotRefused >= refusals) {
				t.Errorf("the refusal records did not stop at their part of the cap with a note: %d of %d, capped %v", gotRefused, refusals, refusedCapped)
			}
			if size > c.logMax {
				t.Errorf("the trace grew to %d bytes past resources.log_max_bytes %d", size, c.logMax)
			}
			if rec.Egress == nil || rec.Egress.Connections != allowed || rec.Egress.Denied != refusals || rec.Egress.BytesDown <= allowed*100 {
				t.Fatalf("the record's totals: %+v", rec.Egress)
			}
			// The top keys: 20 names at 20 refusals each, and the overflow key (244 names
			// at 20) first.
			if top := rec.Egress.Refused; len(top) != store.MaxEgressRefusals || top[0].Host != records.EgressOverflowHost ||
				top[0].Count != (500-maxRefusalKeys)*20 || top[1].Count != 20 || top[1].Port != 443 || top[1].Reason != egress.ReasonNotAllowed ||
				!strings.Contains(top[1].Detail, top[1].Host) || top[1].First.IsZero() || top[1].Last.Before(top[1].First) {
				t.Errorf("the record's refusals by host: %+v", top)
			}
		})
	}
}

// open gives session id its proxy as a launch does.
func (e *proxyEnv) open(id string, p *manifest.Policy) *egress.Session {
	s := e.a.Open(id, p, Carried{})
	e.t.Cleanup(s.Close)
	return s
}

// closeSession ends session id as its end does, and returns its record.
func (e *proxyEnv) closeSession(id string) *store.Record {
	rec := &store.Record{ID: id, RecordsDir: e.dir}
	e.a.Close(rec)
	return rec
}

// resources.egress_max_bytes holds across a restart after the trace's cap: the count is
// read back from the checkpoint, not from the capped trace, and the next daemon's proxy
// refuses from where the last one stopped. Positive control: what the trace alone holds
// is far less than what was carried.
func TestBudgetSurvivesRestartPastTraceCap(t *testing.T) {
	e := newProxyEnv(t)
	const budget = 300000
	p := e.policy(4096, budget)
	s := e.open("s1", p)
	e.serve(s)
	// Fill the allowed part of the trace (3 KiB less the note's room) with small requests,
	// then carry most of the budget past the cap.
	for range 20 {
		if code, _ := e.get(10); code != http.StatusOK {
			t.Fatalf("a small request: %d", code)
		}
	}
	if code, n := e.get(200000); code != http.StatusOK || n != 200000 {
		t.Fatalf("the download within the budget: %d, %d bytes", code, n)
	}
	// A connection counts once the proxy has ended it, which may be just after the client
	// read its last byte: the checkpoint below is of 21 ended ones.
	for deadline := time.Now().Add(10 * time.Second); s.Totals().Connections < 21; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the proxy ended %d of the 21 connections", s.Totals().Connections)
		}
	}
	used := s.Totals().Used
	lines, _ := e.trace()
	var traced int64
	capped := false
	for _, l := range lines {
		traced += l.BytesDown
		capped = capped || l.EventType == records.TraceEgressCapped
	}
	if !capped || traced >= 100000 {
		t.Fatalf("the trace is not past its cap (capped %v, it holds %d bytes down)", capped, traced)
	}
	// The interval's checkpoint, then the daemon dies: nothing more is written.
	e.a.Flush()
	_ = e.srv.Close()
	s.Close()

	e.a = e.daemon()
	carried := ReadCarried(e.dir, slog.New(slog.DiscardHandler))
	if carried.Totals.Used != used || carried.Totals.Connections != 21 || !carried.AllowedCapped {
		t.Fatalf("read back %+v (capped %v); the session had used %d bytes over 21 requests", carried.Totals, carried.AllowedCapped, used)
	}
	s2 := e.a.Open("s1", p, carried)
	t.Cleanup(s2.Close)
	e.serve(s2)
	if got := s2.Totals().Used; got != used {
		t.Fatalf("the next daemon's proxy begins at %d bytes used, want %d", got, used)
	}
	// 100000 bytes of the budget are left, less what the small requests carried: the next
	// download is cut there, and then nothing more passes.
	left := budget - used
	if _, n := e.get(200000); int64(n) > left {
		t.Errorf("the download after the restart carried %d bytes; %d were left", n, left)
	}
	if code, _ := e.get(10); code != http.StatusForbidden {
		t.Errorf("a request past the budget after the restart: %d, want 403", code)
	}
	if got := s2.Totals().Used; got > budget {
		t.Errorf("the session used %d bytes of a budget of %d", got, budget)
	}
	// Its end keeps the count in the record; so does an end recorded by a daemon that never
	// opened its proxy (it ended while none ran), from the checkpoint.
	final := s2.Totals().Used
	if rec := e.closeSession("s1"); rec.Egress == nil || rec.Egress.Used != final || rec.Egress.Connections != 22 {
		t.Errorf("the record at the end: %+v, want %d used over 22 requests", rec.Egress, final)
	}
	rec := &store.Record{ID: "s1", RecordsDir: e.dir}
	e.daemon().Close(rec)
	if rec.Egress == nil || rec.Egress.Used != final {
		t.Errorf("the record of an end no daemon saw: %+v, want %d used", rec.Egress, final)
	}
}

// A checkpoint that is not one (corrupt, truncated, out of range, a link) is warned
// about and the trace alone is used; one that is whole is used.
func TestCarriedCheckpointUnreadable(t *testing.T) {
	good := checkpoint{Version: checkpointVersion, Connections: 3, BytesDown: 5000, Used: 9000,
		Refused: []checkpointRefusal{{EgressRefusal: store.EgressRefusal{Host: "x.test", Port: 443, Reason: "not_allowed", Count: 7}, Traced: 1}}}
	whole, err := json.Marshal(good)
	if err != nil {
		t.Fatal(err)
	}
	trace := `{"event_type":"egress","session_id":"s1","proto":"http","host":"web.test","port":80,"decision":"allowed","bytes_up":10,"bytes_down":1000,"duration_ms":1}
{"event_type":"egress_refused","session_id":"s1","host":"x.test","port":443,"reason":"not_allowed","count":2,"total":2}
`
	for _, c := range []struct {
		name  string
		write func(dir string)
		// used and denied are what must be read back; warned says a warning is due.
		used, denied int64
		warned       bool
	}{
		{"whole", func(dir string) { writeFile(t, dir, records.EgressFile, whole) }, 9000, 7, false},
		{"none", func(string) {}, 1010, 2, false},
		{"truncated", func(dir string) { writeFile(t, dir, records.EgressFile, whole[:len(whole)/2]) }, 1010, 2, true},
		{"not JSON", func(dir string) { writeFile(t, dir, records.EgressFile, []byte("\x00\xff garbage")) }, 1010, 2, true},
		{"negative", func(dir string) {
			writeFile(t, dir, records.EgressFile, []byte(`{"version":1,"used":-5000000}`))
		}, 1010, 2, true},
		{"traced past count", func(dir string) {
			writeFile(t, dir, records.EgressFile, []byte(`{"version":1,"used":1,"refused":[{"host":"a","reason":"r","count":1,"traced":2}]}`))
		}, 1010, 2, true},
		{"another version", func(dir string) { writeFile(t, dir, records.EgressFile, []byte(`{"version":99,"used":9000}`)) }, 1010, 2, true},
		{"too long", func(dir string) {
			writeFile(t, dir, records.EgressFile, append([]byte(`{"version":1,"used":9000,"x":"`), append(make([]byte, maxCheckpointBytes), '"', '}')...))
		}, 1010, 2, true},
		{"a link", func(dir string) {
			writeFile(t, dir, "elsewhere.json", whole)
			if err := os.Symlink(filepath.Join(dir, "elsewhere.json"), filepath.Join(dir, records.EgressFile)); err != nil {
				t.Fatal(err)
			}
		}, 1010, 2, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, records.TraceFile, []byte(trace))
			c.write(dir)
			var logged strings.Builder
			got := ReadCarried(dir, slog.New(slog.NewTextHandler(&logged, nil)))
			if got.Totals.Used != c.used || got.Totals.Denied != c.denied {
				t.Errorf("read back used %d, denied %d; want %d, %d", got.Totals.Used, got.Totals.Denied, c.used, c.denied)
			}
			if warned := strings.Contains(logged.String(), "level=WARN"); warned != c.warned {
				t.Errorf("warned %v, want %v: %s", warned, c.warned, logged.String())
			}
		})
	}
}

func writeFile(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// The checkpoint reader takes any bytes without a panic, and what it accepts holds no
// negative count and no more counters than are kept.
func FuzzParseCheckpoint(f *testing.F) {
	f.Add([]byte(`{"version":1,"connections":3,"used":9000,"refused":[{"host":"x.test","port":443,"reason":"not_allowed","count":7,"traced":1}]}`))
	f.Add([]byte(`{"version":1,"used":-1}`))
	f.Add([]byte(`{"version":1,"refused":null}`))
	f.Add([]byte(`{"version":1,"refused":[{"count":1,"traced":2}]}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c checkpoint
		if parseCheckpoint(data, &c) != nil {
			return
		}
		if c.Used < 0 || c.Denied < 0 || c.Connections < 0 || c.BytesUp < 0 || c.BytesDown < 0 || len(c.Refused) > maxRefusalKeys+maxOverflowKeys {
			t.Fatalf("accepted %+v", c)
		}
		rs := newRefusals()
		for _, r := range c.Refused {
			rs.merge(r.EgressRefusal, r.Traced)
		}
		if len(rs.keys) > maxRefusalKeys+maxOverflowKeys+1 {
			t.Fatalf("%d counters from %d entries", len(rs.keys), len(c.Refused))
		}
	})
}

// BenchmarkAuditRefusal is what one refused connection costs the auditor once its key is
// known: a counter, no write.
func BenchmarkAuditRefusal(b *testing.B) {
	a, _ := benchEgress(b)
	r := egress.Record{Time: time.Now(), Proto: egress.ProtoConnect, Host: "h.test", Port: 443, Decision: egress.Denied,
		Reason: egress.ReasonNotAllowed, Detail: "egress to h.test:443 refused: no network.allow rule names it"}
	for b.Loop() {
		a.Egress("s1", r)
	}
}

// BenchmarkAuditAllowed is what one allowed connection's record costs: a trace line.
func BenchmarkAuditAllowed(b *testing.B) {
	a, _ := benchEgress(b)
	r := egress.Record{Time: time.Now(), Proto: egress.ProtoHTTP, Host: "web.test", Port: 80, Addr: "127.0.0.1:80", Decision: egress.Allowed,
		Rule: "web.test", BytesDown: 100}
	for b.Loop() {
		a.Egress("s1", r)
	}
}

// BenchmarkCheckpoint is one interval's checkpoint of a session with its counters full.
func BenchmarkCheckpoint(b *testing.B) {
	a, dir := benchEgress(b)
	for i := range maxRefusalKeys + 10 {
		a.Egress("s1", egress.Record{Time: time.Now(), Proto: egress.ProtoConnect, Host: fmt.Sprintf("h%d.test", i), Port: 443,
			Decision: egress.Denied, Reason: egress.ReasonNotAllowed, Detail: "egress refused: no network.allow rule names it"})
	}
	e := a.lookup("s1")
	cp := e.snapshot()
	for b.Loop() {
		if err := writeCheckpoint(dir, cp); err != nil {
			b.Fatal(err)
		}
	}
}

func benchEgress(b *testing.B) (*Egress, string) {
	dir := b.TempDir()
	a := NewEgress(&egress.Config{Resolver: noDNS{}, Dialer: &loopbackDialer{}}, nil, func(string) string { return dir }, slog.New(slog.DiscardHandler))
	p := &manifest.Policy{}
	p.Resources.LogMaxBytes.Value = 1 << 40
	s := a.Open("s1", p, Carried{})
	b.Cleanup(s.Close)
	return a, dir
}
