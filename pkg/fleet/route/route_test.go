package route

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/remote"
)

func wantStatus(t *testing.T, what string, err error, code codes.Code, words ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: got %v, want %s", what, err, code)
	}
	for _, w := range words {
		if !strings.Contains(status.Convert(err).Message(), w) {
			t.Errorf("%s: %q does not say %q", what, status.Convert(err).Message(), w)
		}
	}
}

// A unary call about a session on another node is answered by that node, which sees the
// caller who called the first, by way of it; its headers, trailers and status come back.
func TestForwardUnary(t *testing.T) {
	c := newCluster(t, "node-a", "node-b")
	c.place("s-a", "node-a")
	c.place("s-b", "node-b")
	c.place("s-b-gone", "node-b")
	client := c.sessionClient(t, "node-a", "ci-bot")

	ctx := metadata.AppendToOutgoingContext(testCtx(t), "x-request-id", "42")
	var header, trailer metadata.MD
	got, err := client.Get(ctx, &roostv1.GetRequest{Id: "s-b"}, grpc.Header(&header), grpc.Trailer(&trailer))
	if err != nil {
		t.Fatalf("Get s-b at node-a: %v", err)
	}
	if got.GetSession().GetDetail() != "served by node-b" {
		t.Errorf("Get s-b: %v, want it served by node-b", got)
	}
	if h, tr := header.Get("served-by"), trailer.Get("served-by-trailer"); len(h) != 1 || h[0] != "node-b" || len(tr) != 1 || tr[0] != "node-b" {
		t.Errorf("the owner's header %v and trailer %v did not come back", header, trailer)
	}
	calls := c.nodes["node-b"].svc.seen()
	if len(calls) != 1 {
		t.Fatalf("node-b served %v, want one Get", calls)
	}
	want := remote.Caller{CommonName: "ci-bot", Role: remote.Operator, Via: "node-a"}
	if s := calls[0]; s.caller != want || s.ref != "s-b" {
		t.Errorf("node-b saw %+v, want Get s-b by %v", s, want)
	}
	md := calls[0].md
	for k, v := range map[string]string{"x-request-id": "42", remote.HeaderForwardedFor: "ci-bot", remote.HeaderForwardedRole: "operator", remote.HeaderForwardedBy: "node-a"} {
		if got := md.Get(k); len(got) != 1 || got[0] != v {
			t.Errorf("node-b saw %s %v, want %q", k, got, v)
		}
	}
	if calls[0].deadline != true {
		t.Errorf("the caller's deadline did not reach node-b")
	}
	if n := len(c.nodes["node-a"].svc.seen()); n != 0 {
		t.Errorf("node-a served %d calls about a session it does not hold", n)
	}

	// Served where it is, by whom it is.
	got, err = client.Get(testCtx(t), &roostv1.GetRequest{Id: "s-a"})
	if err != nil || got.GetSession().GetDetail() != "served by node-a" {
		t.Fatalf("Get s-a at node-a: %v, %v", got, err)
	}
	if calls := c.nodes["node-a"].svc.seen(); len(calls) != 1 || calls[0].caller != (remote.Caller{CommonName: "ci-bot", Role: remote.Operator}) {
		t.Errorf("node-a saw %+v", calls)
	}

	// The owner's refusal comes back as it said it.
	_, err = client.Get(testCtx(t), &roostv1.GetRequest{Id: "s-b-gone"})
	wantStatus(t, "Get s-b-gone", err, codes.FailedPrecondition, "session s-b-gone ended on node node-b")
	if msg := status.Convert(err).Message(); msg != "session s-b-gone ended on node node-b" {
		t.Errorf("the owner's status was rewritten: %q", msg)
	}

	// An operator's Stop goes to the owner too.
	stopped, err := client.Stop(testCtx(t), &roostv1.StopRequest{Id: "s-b"})
	if err != nil || stopped.GetSession().GetDetail() != "stopped by node-b" {
		t.Fatalf("Stop s-b at node-a: %v, %v", stopped, err)
	}
}

// The owner holds a forwarded call to the forwarded caller's role, whatever the node that
// forwarded it let through.
func TestOwnerHoldsForwardedRole(t *testing.T) {
	c := newCluster(t, "node-a", "node-b")
	c.place("s-b", "node-b")
	// node-a lets an operator's call in, but says it forwards a reader's.
	c.nodes["node-a"].caller = func(context.Context) (string, remote.Role, error) { return "dashboard", remote.Reader, nil }
	client := c.sessionClient(t, "node-a", "ci-bot")
	_, err := client.Stop(testCtx(t), &roostv1.StopRequest{Id: "s-b"})
	wantStatus(t, "a reader's Stop forwarded", err, codes.PermissionDenied, `"dashboard" (reader) via node node-a`, "/roost.v1.SessionService/Stop")
	if calls := c.nodes["node-b"].svc.seen(); len(calls) != 0 {
		t.Fatalf("node-b served %+v", calls)
	}
	// Its reads go through, as the reader's.
	if _, err := client.Get(testCtx(t), &roostv1.GetRequest{Id: "s-b"}); err != nil {
		t.Fatalf("a reader's Get forwarded: %v", err)
	}
	if calls := c.nodes["node-b"].svc.seen(); len(calls) != 1 || calls[0].caller != (remote.Caller{CommonName: "dashboard", Role: remote.Reader, Via: "node-a"}) {
		t.Errorf("node-b saw %+v", calls)
	}
	// A reader at node-a is refused Stop there, before anything is forwarded.
	_, err = c.sessionClient(t, "node-a", "dashboard").Stop(testCtx(t), &roostv1.StopRequest{Id: "s-b"})
	wantStatus(t, "a reader's Stop", err, codes.PermissionDenied, `"dashboard" (reader)`)
	if calls := c.nodes["node-b"].svc.seen(); len(calls) != 1 {
		t.Errorf("node-b served %+v", calls)
	}
}

// A forwarded call is never forwarded again: the node it reached serves it, or says the
// session is not there.
func TestNoSecondHop(t *testing.T) {
	c := newCluster(t, "node-a", "node-b", "node-c")
	c.place("s-c", "node-c")
	// node-a, as a node, forwards to node-b a call about a session on node-c.
	conn := c.dial(t, "node-b", "node-a")
	ctx := metadata.AppendToOutgoingContext(testCtx(t), remote.HeaderForwardedFor, "ci-bot", remote.HeaderForwardedRole, "operator", remote.HeaderForwardedBy, "node-a")
	_, err := roostv1.NewSessionServiceClient(conn).Get(ctx, &roostv1.GetRequest{Id: "s-c"})
	wantStatus(t, "Get s-c forwarded to node-b", err, codes.NotFound, `session "s-c" is not on node node-b`)
	// Through node-a's router, with a directory that is behind: the session it sends to
	// node-b is not there, and node-b says so rather than look further.
	c.place("s-stale", "node-a-gone")
	c.mu.Lock()
	c.addrs["node-a-gone"] = c.addrs["node-b"]
	c.mu.Unlock()
	_, err = c.sessionClient(t, "node-a", "ci-bot").Get(testCtx(t), &roostv1.GetRequest{Id: "s-stale"})
	wantStatus(t, "Get s-stale after it left node-b", err, codes.NotFound, `session "s-stale" is not on node node-b`)
	if calls := c.nodes["node-c"].svc.seen(); len(calls) != 0 {
		t.Fatalf("node-c was reached by a second hop: %+v", calls)
	}
}

// What the router says when it cannot forward: each names the node, or the directory.
func TestForwardErrors(t *testing.T) {
	c := newCluster(t, "node-a", "node-b")
	c.place("s-b", "node-b")
	c.place("s-b-stopping", "node-b")
	client := c.sessionClient(t, "node-a", "ci-bot")

	_, err := client.Get(testCtx(t), &roostv1.GetRequest{Id: "s-nowhere"})
	wantStatus(t, "an unknown session", err, codes.NotFound, `session "s-nowhere" is neither on node node-a nor in the fleet's directory`)

	// An owner answering Unavailable itself is not taken for one that does not answer.
	_, err = client.Get(testCtx(t), &roostv1.GetRequest{Id: "s-b-stopping"})
	wantStatus(t, "the owner shutting down", err, codes.Unavailable, "roostd is shutting down; resume once it is back")
	if strings.Contains(err.Error(), "does not answer") {
		t.Errorf("the owner's own Unavailable was rewritten: %v", err)
	}

	c.mu.Lock()
	c.locateErr = fmt.Errorf("etcd: context deadline exceeded: %w", errdefs.ErrUnavailable)
	c.mu.Unlock()
	_, err = client.Get(testCtx(t), &roostv1.GetRequest{Id: "s-b"})
	wantStatus(t, "the directory unreadable", err, codes.Unavailable, `session "s-b" is not on node node-a, and the fleet's directory cannot be read: etcd: context deadline exceeded`)
	c.mu.Lock()
	c.locateErr = nil
	addr := c.addrs["node-b"]
	c.addrs["node-b"] = ""
	c.mu.Unlock()
	_, err = client.Get(testCtx(t), &roostv1.GetRequest{Id: "s-b"})
	wantStatus(t, "an owner without an address", err, codes.Unavailable, `session "s-b" is on node node-b, which has no listener address`)
	c.mu.Lock()
	c.addrs["node-b"] = addr
	c.mu.Unlock()

	c.nodes["node-b"].stop(t)
	_, err = client.Get(testCtx(t), &roostv1.GetRequest{Id: "s-b"})
	wantStatus(t, "the owner down", err, codes.Unavailable, fmt.Sprintf(`session "s-b" is on node node-b (%s), which does not answer: `, addr))
}

// A follower of logs on another node: every chunk comes through, and the client going away
// while the follower is idle ends the owner's stream at once, and leaves no goroutine behind.
func TestForwardLogs(t *testing.T) {
	c := newCluster(t, "node-a", "node-b")
	c.place("s-b", "node-b")
	client := c.sessionClient(t, "node-a", "ci-bot")

	// Not following: three chunks and the stream's clean end.
	stream, err := client.Logs(testCtx(t), &roostv1.LogsRequest{Id: "s-b"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Logs: %v", err)
		}
		got = append(got, string(m.GetData()))
	}
	if strings.Join(got, "") != "node-b line 0\nnode-b line 1\nnode-b line 2\n" {
		t.Errorf("Logs: %q", got)
	}

	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(testCtx(t))
	stream, err = client.Logs(ctx, &roostv1.LogsRequest{Id: "s-b", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		m, err := stream.Recv()
		if err != nil || m.GetOffset() != int64(i) {
			t.Fatalf("Logs -f: chunk %d: %v, %v", i, m, err)
		}
	}
	cancel()
	select {
	case m := <-c.nodes["node-b"].svc.ended:
		if m != "Logs" {
			t.Fatalf("ended %s", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the owner's follower did not end when the client went away")
	}
	waitGoroutines(t, before)
}

// Exec on another node: stdin goes to it, its output comes back, both ends close cleanly.
func TestForwardExec(t *testing.T) {
	c := newCluster(t, "node-a", "node-b")
	c.place("s-b", "node-b")
	client := c.sessionClient(t, "node-a", "ci-bot")
	// Every connection is made before the goroutines are counted.
	if _, err := client.Get(testCtx(t), &roostv1.GetRequest{Id: "s-b"}); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	x, err := client.Exec(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *roostv1.ExecRequest) {
		t.Helper()
		if err := x.Send(m); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	recv := func() *roostv1.ExecResponse {
		t.Helper()
		m, err := x.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		return m
	}
	send(&roostv1.ExecRequest{Msg: &roostv1.ExecRequest_Start{Start: &roostv1.ExecStart{Id: "s-b", Command: []string{"cat"}, Stdin: true}}})
	if m := recv(); m.GetStarted().GetExecId() != "x-1" {
		t.Fatalf("first: %v, want started", m)
	}
	for _, in := range []string{"hello", "world"} {
		send(&roostv1.ExecRequest{Msg: &roostv1.ExecRequest_Stdin{Stdin: []byte(in)}})
		if m := recv(); string(m.GetStdout()) != "node-b: "+strings.ToUpper(in) {
			t.Fatalf("stdout: %v", m)
		}
	}
	send(&roostv1.ExecRequest{Msg: &roostv1.ExecRequest_CloseStdin{CloseStdin: true}})
	if err := x.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if m := recv(); m.GetExit().GetExitCode() != 7 || m.GetExit().GetDetail() != "on node-b" {
		t.Fatalf("exit: %v", m)
	}
	if _, err := x.Recv(); err != io.EOF {
		t.Fatalf("after the exit: %v, want the stream's end", err)
	}
	if calls := c.nodes["node-b"].svc.seen(); len(calls) != 2 || calls[1].method != "Exec" || calls[1].caller.Via != "node-a" {
		t.Errorf("node-b saw %+v", calls)
	}
	waitGoroutines(t, before)

	// A client that goes away mid-exec ends the owner's.
	ctx, cancel := context.WithCancel(testCtx(t))
	x, err = client.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send(&roostv1.ExecRequest{Msg: &roostv1.ExecRequest_Start{Start: &roostv1.ExecStart{Id: "s-b", Command: []string{"cat"}}}})
	recv()
	cancel()
	select {
	case <-c.nodes["node-b"].svc.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the owner's exec did not end when the client went away")
	}
	waitGoroutines(t, before)
}

// WriteFile on another node: the header and every chunk reach it, its answer comes back.
func TestForwardWriteFile(t *testing.T) {
	c := newCluster(t, "node-a", "node-b")
	c.place("s-b", "node-b")
	w, err := roostv1.NewFilesServiceClient(c.dial(t, "node-a", "ci-bot")).WriteFile(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Send(&roostv1.WriteFileRequest{Part: &roostv1.WriteFileRequest_Header{Header: &roostv1.WriteFileHeader{Session: "s-b", Path: "notes.txt"}}}); err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []string{"one ", "two ", "three"} {
		if err := w.Send(&roostv1.WriteFileRequest{Part: &roostv1.WriteFileRequest_Data{Data: []byte(chunk)}}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := w.CloseAndRecv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetInfo().GetName() != "notes.txt: one two three on node-b" || resp.GetInfo().GetSize() != 13 {
		t.Errorf("WriteFile: %v", resp)
	}
}

// The caller's deadline goes with the call, and its end ends the owner's.
func TestForwardDeadline(t *testing.T) {
	c := newCluster(t, "node-a", "node-b")
	c.place("s-b", "node-b")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.sessionClient(t, "node-a", "ci-bot").Wait(ctx, &roostv1.WaitRequest{Id: "s-b"})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Wait: %v, want DeadlineExceeded", err)
	}
	select {
	case <-c.nodes["node-b"].svc.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the owner's Wait outlived its caller's deadline")
	}
	if calls := c.nodes["node-b"].svc.seen(); len(calls) != 1 || !calls[0].deadline {
		t.Errorf("node-b saw %+v, want a Wait with a deadline", calls)
	}
}

func TestNewRefuses(t *testing.T) {
	ok := Config{Self: "node-a", Local: func(string) bool { return false }, Locate: func(context.Context, string) (string, string, error) { return "", "", nil }}
	for _, tc := range []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.Self = "" }, "this node's name"},
		{func(c *Config) { c.Local = nil }, "no registry"},
		{func(c *Config) { c.Locate = nil }, "no way to locate"},
		{func(*Config) {}, "node node-a has no certificate"},
	} {
		cfg := ok
		tc.change(&cfg)
		if _, err := New(cfg); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want InvalidArgument saying %q", err, tc.want)
		}
	}
}

// waitGoroutines waits for the goroutines to come back to n (those of connections made
// meanwhile aside: the test's client and the router's cached connection were made before).
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Events naming another node are that node's, forwarded as the caller; naming this node or
// none, this node's; naming a node the directory does not know, not found.
func TestForwardEventsByNode(t *testing.T) {
	c := newCluster(t, "node-a", "node-b")
	client := c.sessionClient(t, "node-a", "dashboard")
	read := func(node string) ([]*roostv1.Event, error) {
		stream, err := client.Events(testCtx(t), &roostv1.EventsRequest{Node: node})
		if err != nil {
			return nil, err
		}
		var evs []*roostv1.Event
		for {
			m, err := stream.Recv()
			if err == io.EOF {
				return evs, nil
			}
			if err != nil {
				return evs, err
			}
			evs = append(evs, m.GetEvent())
		}
	}
	for _, tc := range []struct{ ask, want string }{{"node-b", "node-b"}, {"node-a", "node-a"}, {"", "node-a"}} {
		evs, err := read(tc.ask)
		if err != nil || len(evs) != 2 || evs[0].GetNode() != tc.want || evs[1].GetSeq() != 2 {
			t.Fatalf("Events of %q through node-a: %v %v; want node %s's two", tc.ask, evs, err, tc.want)
		}
	}
	got := c.nodes["node-b"].svc.seen()
	if len(got) != 1 || got[0].caller.CommonName != "dashboard" || got[0].caller.Via != "node-a" || got[0].caller.Role != remote.Reader {
		t.Fatalf("node-b saw %+v; want dashboard's call as a reader, via node-a", got)
	}
	if _, err := read("node-z"); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "node-z") {
		t.Fatalf("Events of an unknown node: %v, want not found naming it", err)
	}
	c.nodes["node-b"].stop(t)
	if _, err := read("node-b"); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "node node-b") {
		t.Fatalf("Events of a node that is down: %v, want unavailable naming it", err)
	}
}

// A stage placed on another node goes to it as the caller, and its answer comes back.
func TestForwardStage(t *testing.T) {
	c := newCluster(t, "node-a", "node-b")
	ctx := metadata.NewIncomingContext(testCtx(t), nil)
	r := c.nodes["node-a"].router
	c.nodes["node-a"].caller = func(context.Context) (string, remote.Role, error) { return "ci-bot", remote.Operator, nil }
	resp, err := r.Stage(ctx, "node-b", c.addrs["node-b"], &roostv1.StageRequest{Capsule: "/srv/c", Node: "node-b"})
	if err != nil || resp.GetSession().GetNode() != "node-b" || resp.GetSession().GetDetail() != "/srv/c" {
		t.Fatalf("Stage placed on node-b: %v %v", resp, err)
	}
	got := c.nodes["node-b"].svc.seen()
	if len(got) != 1 || got[0].caller.CommonName != "ci-bot" || got[0].caller.Via != "node-a" || got[0].caller.Role != remote.Operator {
		t.Fatalf("node-b saw %+v; want ci-bot's stage as an operator, via node-a", got)
	}
	c.nodes["node-b"].stop(t)
	if _, err := r.Stage(ctx, "node-b", c.addrs["node-b"], &roostv1.StageRequest{Capsule: "/srv/c", Node: "node-b"}); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "placed on node node-b") {
		t.Fatalf("Stage on a node that is down: %v, want unavailable naming it", err)
	}
}

// A client that stops reading a forwarded stream does not hold it, nor the owner's, nor
// the goroutines between: the entry node ends the stream once a message waits unread for
// its send timeout, and the owner's ends with it.
func TestForwardedStreamUnreadEnds(t *testing.T) {
	c := newCluster(t, "node-a", "node-b")
	c.place("s-b-flood", "node-b")
	client := c.sessionClient(t, "node-a", "ci-bot")
	// The connection to node-b, kept once made, is made first.
	if _, err := client.Get(testCtx(t), &roostv1.GetRequest{Id: "s-b-flood"}); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	stream, err := client.Logs(testCtx(t), &roostv1.LogsRequest{Id: "s-b-flood", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	// Not another Recv: the windows fill, and the entry's send waits.
	select {
	case m := <-c.nodes["node-b"].svc.ended:
		if m != "Logs" {
			t.Fatalf("node-b ended %s, want Logs", m)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a forwarded stream its client stopped reading was held open")
	}
	var err2 error
	for err2 == nil {
		_, err2 = stream.Recv()
	}
	if status.Code(err2) != codes.ResourceExhausted || !strings.Contains(err2.Error(), "unread") {
		t.Fatalf("the unread stream ended with %v, want resource exhausted saying it was unread", err2)
	}
	waitGoroutines(t, before)
}
