package endpoint_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/pkg/endpoint"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/spawn"
)

// The endpoint's names for its bound are the session manager's and the manifest's.
func TestLimitNames(t *testing.T) {
	if endpoint.LimitConnections != store.LimitEndpointConnections {
		t.Errorf("endpoint.LimitConnections %q, store.LimitEndpointConnections %q", endpoint.LimitConnections, store.LimitEndpointConnections)
	}
	if endpoint.DefaultMaxConnections != manifest.DefaultEndpointMaxConns {
		t.Errorf("endpoint.DefaultMaxConnections %d, manifest.DefaultEndpointMaxConns %d", endpoint.DefaultMaxConnections, manifest.DefaultEndpointMaxConns)
	}
}

// openWith starts a loopback endpoint for id on eps, holding at most maxConns (0: the
// default) connections.
func openWith(t *testing.T, eps *endpoint.Endpoints, id string, maxConns int, d *fakeDelegator) *fixture {
	t.Helper()
	ep, err := eps.Open(id, false, 0, maxConns, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ep.Close)
	return &fixture{eps: eps, ep: ep, d: d, cred: eps.Credential(id)}
}

func newEndpoints(t *testing.T, opts ...endpoint.Option) *endpoint.Endpoints {
	t.Helper()
	eps, err := endpoint.New(newKeys(t), t.TempDir(), nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return eps
}

// dialN opens n connections to addr one after the other, sending nothing. One the server
// reset before the connect returned is nil.
func dialN(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if errors.Is(err, syscall.ECONNRESET) {
			conns = append(conns, nil)
			continue
		}
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	return conns
}

// dialOne opens one connection the server must not reset at once.
func dialOne(t *testing.T, addr string) net.Conn {
	t.Helper()
	c := dialN(t, addr, 1)[0]
	if c == nil {
		t.Fatal("the connection was reset before it was made")
	}
	return c
}

// closedWithin says whether the server closed c (EOF or a reset) within d; it discards
// anything the server wrote first. A nil c was reset at connect.
func closedWithin(c net.Conn, d time.Duration) bool {
	if c == nil {
		return true
	}
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
}

// sortConns splits conns into those the server closed within d and those it keeps.
func sortConns(conns []net.Conn, d time.Duration) (closed, open []int) {
	results := make([]bool, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() { results[i] = closedWithin(c, d) })
	}
	wg.Wait()
	for i, shut := range results {
		if shut {
			closed = append(closed, i)
		} else {
			open = append(open, i)
		}
	}
	return closed, open
}

var refusedCount = regexp.MustCompile(`(\d+) connection\(s\) refused: ([^;]*)`)

// refusals sums what d heard of refused connections, by whether the daemon's global cap or
// the session's own refused them, and counts the reports.
func refusals(t *testing.T, d *fakeDelegator) (bySession, byGlobal, reports int) {
	t.Helper()
	for _, hit := range d.limitHits() {
		if !strings.HasPrefix(hit, endpoint.LimitConnections+": ") {
			t.Errorf("a limit hit that is not %s: %q", endpoint.LimitConnections, hit)
		}
		reports++
		for _, m := range refusedCount.FindAllStringSubmatch(hit, -1) {
			n, _ := strconv.Atoi(m[1])
			if strings.Contains(m[2], "global") {
				byGlobal += n
			} else {
				bySession += n
			}
		}
	}
	return bySession, byGlobal, reports
}

// waitRefusals waits until d has heard of want refused connections.
func waitRefusals(t *testing.T, d *fakeDelegator, want int) (bySession, byGlobal, reports int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		bySession, byGlobal, reports = refusals(t, d)
		if bySession+byGlobal >= want || time.Now().After(deadline) {
			return bySession, byGlobal, reports
		}
	}
}

// rawGet sends GET /v1/self on c and reads the status line.
func rawGet(t *testing.T, c net.Conn, cred string) string {
	t.Helper()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c, "GET /v1/self HTTP/1.1\r\nHost: roost\r\nAuthorization: Bearer %s\r\n\r\n", cred); err != nil {
		return err.Error()
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err.Error()
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.Status
}

// A session holds at most its cap of connections (the default, 64): the ones past it are
// closed at once, unread; those it holds are served; a place freed is taken again; and the
// refusals are reported as endpoint_connections.
func TestSessionConnectionCap(t *testing.T) {
	d := newFake(sessionID)
	eps := newEndpoints(t)
	f := openWith(t, eps, sessionID, 0, d)
	const capacity = endpoint.DefaultMaxConnections

	conns := dialN(t, f.addr(), capacity+10)
	start := time.Now()
	closed, _ := sortConns(conns[capacity:], time.Second)
	if len(closed) != 10 {
		t.Fatalf("%d of the 10 connections past the cap were closed within 1s", len(closed))
	}
	t.Logf("the 10 past the cap were closed within %s", time.Since(start))
	if closed, open := sortConns(conns[:capacity], 200*time.Millisecond); len(closed) != 0 || len(open) != capacity {
		t.Fatalf("of the first %d connections, %v were closed", capacity, closed)
	}
	if n := f.ep.(*endpoint.Endpoint).Connections(); n != capacity {
		t.Errorf("the endpoint counts %d connections, want %d", n, capacity)
	}
	// Every connection it holds is served.
	for _, i := range []int{0, capacity / 2, capacity - 1} {
		if status := rawGet(t, conns[i], f.cred); status != "200 OK" {
			t.Errorf("connection %d within the cap: %s", i, status)
		}
	}
	// One more is refused while all are held; once one is let go, a new one is served.
	if extra := dialN(t, f.addr(), 1)[0]; !closedWithin(extra, time.Second) {
		t.Error("a connection past the cap was kept")
	}
	conns[0].Close()
	var served bool
	for deadline := time.Now().Add(2 * time.Second); !served && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if c := dialN(t, f.addr(), 1)[0]; c != nil {
			served = rawGet(t, c, f.cred) == "200 OK"
			c.Close()
		}
	}
	if !served {
		t.Error("a place freed by a closed connection was not taken again")
	}

	bySession, byGlobal, reports := waitRefusals(t, d, 11)
	if bySession < 11 || byGlobal != 0 {
		t.Errorf("reported %d refusals at the session's cap and %d at the global one; want at least 11 and 0 (%q)", bySession, byGlobal, d.limitHits())
	}
	if reports > 3 {
		t.Errorf("%d reports for a few refusals within a couple of seconds: %q", reports, d.limitHits())
	}
}

// A flood of connections makes few reports, at most one per interval, and together they
// count every refused connection.
func TestRefusalReportsRateLimited(t *testing.T) {
	d := newFake(sessionID)
	eps := newEndpoints(t, endpoint.WithReportInterval(300*time.Millisecond))
	f := openWith(t, eps, sessionID, 2, d)
	dialOne(t, f.addr())
	dialOne(t, f.addr())
	const flood = 400
	start := time.Now()
	for range flood {
		c, err := net.Dial("tcp", f.addr())
		if errors.Is(err, syscall.ECONNRESET) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	took := time.Since(start)
	bySession, _, reports := waitRefusals(t, d, flood)
	if bySession != flood {
		t.Errorf("reported %d refused connections, want %d", bySession, flood)
	}
	if most := int(took/(300*time.Millisecond)) + 2; reports > most {
		t.Errorf("%d reports for a flood of %s; at most %d: %q", reports, took, most, d.limitHits())
	}
	t.Logf("%d refusals over %s: %d reports", flood, took, reports)
}

// All sessions' endpoints together hold at most the daemon's cap; past it a connection is
// refused whichever session it is for, and said to be refused by the global cap.
func TestGlobalConnectionCap(t *testing.T) {
	const other = "sess-fedcba9876543210"
	d := newFake(sessionID, other)
	eps := newEndpoints(t, endpoint.WithMaxConnections(10))
	if eps.MaxConnections() != 10 {
		t.Fatalf("MaxConnections %d", eps.MaxConnections())
	}
	a := openWith(t, eps, sessionID, 0, d)
	b := openWith(t, eps, other, 0, d)

	held := dialN(t, a.addr(), 8)
	// The first session's connections are all accepted before the second's are dialled:
	// which of two racing accepts takes the last place is the kernel's to decide.
	for deadline := time.Now().Add(2 * time.Second); eps.Connections() < 8; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("all endpoints count %d of 8 connections", eps.Connections())
		}
	}
	more := dialN(t, b.addr(), 5)
	if closed, _ := sortConns(held, 200*time.Millisecond); len(closed) != 0 {
		t.Fatalf("connections within every cap were closed: %v", closed)
	}
	closed, open := sortConns(more, time.Second)
	if len(open) != 2 || len(closed) != 3 {
		t.Fatalf("of 5 connections to the second session with 8 held by the first and a global cap of 10: %d kept, %d closed", len(open), len(closed))
	}
	if n := eps.Connections(); n != 10 {
		t.Errorf("all endpoints count %d connections, want 10", n)
	}
	if status := rawGet(t, more[open[0]], b.cred); status != "200 OK" {
		t.Errorf("a connection within the global cap: %s", status)
	}
	_, byGlobal, _ := waitRefusals(t, d, 3)
	if byGlobal != 3 {
		t.Errorf("reported %d refusals at the global cap, want 3: %q", byGlobal, d.limitHits())
	}
	// The first session lets go of its connections: the second may connect again.
	for _, c := range held {
		c.Close()
	}
	for deadline := time.Now().Add(2 * time.Second); eps.Connections() > 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("all endpoints still count %d connections after 8 closed", eps.Connections())
		}
	}
	if c := dialOne(t, b.addr()); rawGet(t, c, b.cred) != "200 OK" {
		t.Error("a place freed under the global cap was not taken again")
	}
}

// A client that trickles a header, a byte at a time, is cut at the header timeout.
func TestSlowlorisCut(t *testing.T) {
	d := newFake(sessionID)
	eps := newEndpoints(t, endpoint.WithTimeouts(300*time.Millisecond, time.Second, 0))
	f := openWith(t, eps, sessionID, 0, d)
	c := dialOne(t, f.addr())
	if _, err := io.WriteString(c, "GET /v1/self HTTP/1.1\r\nHost: roost\r\nX-Slow: "); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				if _, err := c.Write([]byte("a")); err != nil {
					return
				}
			}
		}
	}()
	start := time.Now()
	if !closedWithin(c, 3*time.Second) {
		t.Fatal("a trickled header held its connection for 3s; the header timeout is 300ms")
	}
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Errorf("cut after %s, before the header timeout", took)
	}
	if len(d.recorded()) != 0 {
		t.Errorf("a request that never finished its header reached the delegator: %+v", d.recorded())
	}
}

// A connection that sends nothing at all is closed at the header timeout too, giving its
// place back.
func TestIdleConnectionCut(t *testing.T) {
	d := newFake(sessionID)
	eps := newEndpoints(t, endpoint.WithTimeouts(300*time.Millisecond, time.Second, 0))
	f := openWith(t, eps, sessionID, 0, d)
	c := dialOne(t, f.addr())
	if !closedWithin(c, 3*time.Second) {
		t.Fatal("a silent connection was held 3s; the header timeout is 300ms")
	}
	for deadline := time.Now().Add(time.Second); f.ep.(*endpoint.Endpoint).Connections() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the cut connection still counts against the cap")
		}
	}
}

// A body that never arrives in full is cut at the request timeout.
func TestSlowBodyCut(t *testing.T) {
	d := newFake(sessionID)
	eps := newEndpoints(t, endpoint.WithTimeouts(300*time.Millisecond, 600*time.Millisecond, 0))
	f := openWith(t, eps, sessionID, 0, d)
	c := dialOne(t, f.addr())
	fmt.Fprintf(c, "POST /v1/spend/admit HTTP/1.1\r\nHost: roost\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{\"tok", f.cred)
	start := time.Now()
	if !closedWithin(c, 3*time.Second) {
		t.Fatal("a body that stalled held its connection for 3s; the request timeout is 600ms")
	}
	t.Logf("cut after %s", time.Since(start))
}

// Headers are bounded at 64 KiB.
func TestHeaderBytesBounded(t *testing.T) {
	d := newFake(sessionID)
	f := openWith(t, newEndpoints(t), sessionID, 0, d)
	req, _ := http.NewRequest("GET", f.ep.URL()+"/v1/self", nil)
	req.Header.Set("Authorization", "Bearer "+f.cred)
	req.Header.Set("X-Big", strings.Repeat("a", 100<<10))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("100 KiB of headers: %s", res.Status)
	}
	// Within the bound, a large header is fine.
	req.Header.Set("X-Big", strings.Repeat("a", 32<<10))
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("32 KiB of headers: %s", res.Status)
	}
}

// A wait that answers long after the request timeout still answers, with or without a
// request body, and so does a model call streaming its reply; the connection serves
// another request afterwards.
func TestLongPollOutlivesReadTimeout(t *testing.T) {
	d := newFake(sessionID)
	d.hold = 1200 * time.Millisecond
	d.comp = spawn.Completion{SessionID: "c-1", Status: "ok"}
	eps := newEndpoints(t, endpoint.WithTimeouts(200*time.Millisecond, 300*time.Millisecond, 0))
	f := openWith(t, eps, sessionID, 0, d)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		name, path, body string
		want             string
	}{
		{"wait, no body", "/v1/children/c-1/wait", "", `"status":"ok"`},
		{"wait, a body", "/v1/children/c-1/wait", "{}", `"status":"ok"`},
		{"stream", "/v1/inference/llm/v1/messages", `{"model":"m","stream":true}`, "data: [DONE]"},
	} {
		start := time.Now()
		req, _ := http.NewRequest("POST", f.ep.URL()+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+f.cred)
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		data, err := io.ReadAll(res.Body)
		res.Body.Close()
		took := time.Since(start)
		if err != nil || res.StatusCode != http.StatusOK || !strings.Contains(string(data), tc.want) {
			t.Errorf("%s: %s after %s, %v: %q", tc.name, res.Status, took, err, data)
		}
		if took < d.hold {
			t.Errorf("%s answered after %s, before the delegator did", tc.name, took)
		}
	}
	if r := f.do(t, "GET", "/v1/self", f.cred, nil); r.status != http.StatusOK {
		t.Errorf("after the long polls: %d", r.status)
	}
}
