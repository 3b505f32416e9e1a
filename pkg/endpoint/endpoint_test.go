package endpoint_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/endpoint"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/spawn"
)

// call is one delegator method invocation as the endpoint made it.
type call struct {
	method  string
	session string
	child   string
	req     spawn.Request
	admit   spawn.AdmitRequest
	settle  spawn.SettleRequest
	path    string
}

// fakeDelegator stands in for the session manager: it answers from its fields and records
// every call other than Live.
type fakeDelegator struct {
	mu       sync.Mutex
	live     map[string]bool
	calls    []call
	self     spawn.Self
	result   spawn.SpawnResult
	children []spawn.ChildInfo
	info     spawn.ChildInfo
	comp     spawn.Completion
	err      error
	// block, when set, makes WaitChild hold until its context ends, then report it here.
	block  bool
	waited chan error
	// hold, when set, makes WaitChild answer only after it (or its context ending first).
	hold time.Duration
	// limits are the LimitHit reports, as "limit: detail".
	limits []string
}

func newFake(live ...string) *fakeDelegator {
	d := &fakeDelegator{live: map[string]bool{}}
	for _, id := range live {
		d.live[id] = true
	}
	return d
}

func (d *fakeDelegator) setLive(id string, live bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.live[id] = live
}

func (d *fakeDelegator) record(c call) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, c)
}

func (d *fakeDelegator) recorded() []call {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

func (d *fakeDelegator) Live(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.live[id]
}

func (d *fakeDelegator) Self(id string) (spawn.Self, error) {
	d.record(call{method: "Self", session: id})
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.self, d.err
}

func (d *fakeDelegator) Spawn(_ context.Context, id string, req spawn.Request) (spawn.SpawnResult, error) {
	d.record(call{method: "Spawn", session: id, req: req})
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.result, d.err
}

func (d *fakeDelegator) Children(id string) ([]spawn.ChildInfo, error) {
	d.record(call{method: "Children", session: id})
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.children, d.err
}

func (d *fakeDelegator) Child(id, child string) (spawn.ChildInfo, error) {
	d.record(call{method: "Child", session: id, child: child})
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.info, d.err
}

func (d *fakeDelegator) WaitChild(ctx context.Context, id, child string) (spawn.Completion, error) {
	d.record(call{method: "WaitChild", session: id, child: child})
	d.mu.Lock()
	block, hold := d.block, d.hold
	d.mu.Unlock()
	if hold > 0 {
		select {
		case <-time.After(hold):
		case <-ctx.Done():
			return spawn.Completion{}, ctx.Err()
		}
	}
	if block {
		<-ctx.Done()
		d.waited <- ctx.Err()
		return spawn.Completion{}, ctx.Err()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.comp, d.err
}

func (d *fakeDelegator) StopChild(_ context.Context, id, child string) (spawn.Completion, error) {
	d.record(call{method: "StopChild", session: id, child: child})
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.comp, d.err
}

func (d *fakeDelegator) Admit(id string, req spawn.AdmitRequest) (ledger.Reservation, error) {
	d.record(call{method: "Admit", session: id, admit: req})
	d.mu.Lock()
	defer d.mu.Unlock()
	return ledger.Reservation{ID: "rsv_1", SessionID: id, RequestID: req.RequestID, Tokens: req.Tokens}, d.err
}

func (d *fakeDelegator) Settle(id string, req spawn.SettleRequest) (ledger.Settlement, error) {
	d.record(call{method: "Settle", session: id, settle: req})
	d.mu.Lock()
	defer d.mu.Unlock()
	return ledger.Settlement{ReservationID: req.Reservation, SessionID: id, InputTokens: req.InputTokens, OutputTokens: req.OutputTokens}, d.err
}

func (d *fakeDelegator) Spend(id string) (ledger.Spend, error) {
	d.record(call{method: "Spend", session: id})
	d.mu.Lock()
	defer d.mu.Unlock()
	return ledger.Spend{SessionID: id, Charged: 42}, d.err
}

func (d *fakeDelegator) LimitHit(id, limit, detail string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.limits = append(d.limits, limit+": "+detail)
}

func (d *fakeDelegator) limitHits() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.limits)
}

func (d *fakeDelegator) Inference(w http.ResponseWriter, r *http.Request, id, upstream, path string) {
	d.record(call{method: "Inference", session: id, child: upstream, path: path})
	d.mu.Lock()
	hold := d.hold
	d.mu.Unlock()
	if hold > 0 {
		// As the gateway does: the whole request, then a reply streamed over hold.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, "data: got %d bytes\n\n", len(body))
		http.NewResponseController(w).Flush()
		select {
		case <-time.After(hold):
		case <-r.Context().Done():
			return
		}
		fmt.Fprintf(w, "data: [DONE]\n\n")
		return
	}
	w.WriteHeader(http.StatusTeapot)
}

const sessionID = "sess-0123456789abcdef"

type fixture struct {
	eps  *endpoint.Endpoints
	keys *spawn.Keys
	ep   spawn.Endpoint
	d    *fakeDelegator
	cred string
}

func newKeys(t *testing.T) *spawn.Keys {
	t.Helper()
	k, err := spawn.LoadKeys(filepath.Join(t.TempDir(), spawn.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// open starts a loopback endpoint for sessionID, which d reports live.
func open(t *testing.T, d *fakeDelegator) *fixture {
	t.Helper()
	keys := newKeys(t)
	eps, err := endpoint.New(keys, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := eps.Open(sessionID, false, 0, 0, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ep.Close)
	return &fixture{eps: eps, keys: keys, ep: ep, d: d, cred: eps.Credential(sessionID)}
}

func (f *fixture) addr() string { return strings.TrimPrefix(f.ep.URL(), "http://") }

type response struct {
	status int
	header http.Header
	body   []byte
}

func (f *fixture) do(t *testing.T, method, path, cred string, body io.Reader) response {
	t.Helper()
	req, err := http.NewRequest(method, f.ep.URL()+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{res.StatusCode, res.Header, data}
}

// errorText decodes a JSON {"error": ...} reply, failing on anything else.
func errorText(t *testing.T, r response) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json; body %s", ct, r.body)
	}
	var e map[string]string
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("body is not JSON: %v: %s", err, r.body)
	}
	msg, ok := e["error"]
	if !ok || len(e) != 1 {
		t.Fatalf("body is not {\"error\": ...}: %s", r.body)
	}
	return msg
}

// raw sends req over a fresh TCP connection and returns every byte of the reply.
func raw(t *testing.T, addr, req string) []byte {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestLoopbackEndpoint(t *testing.T) {
	f := open(t, newFake(sessionID))
	if f.ep.NetNS() != "" {
		t.Fatalf("a loopback endpoint reports namespace %q", f.ep.NetNS())
	}
	if f.ep.Port() == 0 || f.ep.URL() != fmt.Sprintf("http://127.0.0.1:%d", f.ep.Port()) {
		t.Fatalf("URL %q, port %d", f.ep.URL(), f.ep.Port())
	}
	if id, ok := f.keys.Verify(f.cred); !ok || id != sessionID {
		t.Fatalf("Credential does not verify as the session: %q, %v", id, ok)
	}
}

func TestSelf(t *testing.T) {
	d := newFake(sessionID)
	d.self = spawn.Self{SessionID: sessionID, Capsule: "boss@1.0.0", Containment: "scoped", DepthRemaining: 2, LiveChildren: 1,
		DeadlineAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	f := open(t, d)

	r := f.do(t, "GET", "/v1/self", f.cred, nil)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var got spawn.Self
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	if !reflect.DeepEqual(got, d.self) {
		t.Fatalf("self %+v, want %+v", got, d.self)
	}
	if calls := d.recorded(); !reflect.DeepEqual(calls, []call{{method: "Self", session: sessionID}}) {
		t.Fatalf("calls %+v", calls)
	}
}

// TestIdentityFailuresIdentical: whatever is wrong with who calls, the reply is the same
// to the byte, so a caller learns nothing about which sessions exist or live.
func TestIdentityFailuresIdentical(t *testing.T) {
	const other = "sess-other"
	d := newFake(sessionID, other)
	f := open(t, d)
	forger := newKeys(t)

	get := func(path, auth string) string {
		return "GET " + path + " HTTP/1.1\r\nHost: " + f.addr() + "\r\n" + auth + "Connection: close\r\n\r\n"
	}
	bearer := func(cred string) string { return "Authorization: Bearer " + cred + "\r\n" }
	const spawnBody = `{"capsule":"worker","version":"1.0.0"}`

	reference := raw(t, f.addr(), get("/v1/self", ""))
	res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(reference)), nil)
	if err != nil {
		t.Fatalf("%v: %q", err, reference)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("status %d, want 403: %q", res.StatusCode, reference)
	}
	if _, ok := res.Header["Date"]; ok {
		t.Fatalf("a refusal carries a Date header: %q", reference)
	}
	if string(body) != `{"error":"not authorised"}`+"\n" {
		t.Fatalf("body %q", body)
	}

	cases := []struct{ name, req string }{
		{"empty Authorization", get("/v1/self", "Authorization: \r\n")},
		{"Basic scheme", get("/v1/self", "Authorization: Basic dXNlcjpwYXNz\r\n")},
		{"Bearer without a credential", get("/v1/self", "Authorization: Bearer\r\n")},
		{"malformed bearer", get("/v1/self", bearer("not-a-credential"))},
		{"credential without its MAC", get("/v1/self", bearer(f.cred[:strings.LastIndex(f.cred, ".")+1]))},
		{"forged credential", get("/v1/self", bearer(forger.Mint(sessionID)))},
		{"another live session's credential", get("/v1/self", bearer(f.eps.Credential(other)))},
		{"unknown route, no credential", get("/v1/nope", "")},
		{"spawn with a body, forged", "POST /v1/spawn HTTP/1.1\r\nHost: " + f.addr() + "\r\n" + bearer(forger.Mint(sessionID)) +
			fmt.Sprintf("Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(spawnBody), spawnBody)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := raw(t, f.addr(), tc.req); !bytes.Equal(got, reference) {
				t.Fatalf("reply differs from the reference refusal:\ngot  %q\nwant %q", got, reference)
			}
		})
	}

	// The session's own credential works while it is live, and stops when it is not.
	ok := raw(t, f.addr(), get("/v1/self", bearer(f.cred)))
	if !bytes.HasPrefix(ok, []byte("HTTP/1.1 200 ")) {
		t.Fatalf("the session's own credential: %q", ok)
	}
	d.setLive(sessionID, false)
	if got := raw(t, f.addr(), get("/v1/self", bearer(f.cred))); !bytes.Equal(got, reference) {
		t.Fatalf("credential of a session no longer live:\ngot  %q\nwant %q", got, reference)
	}

	if calls := d.recorded(); len(calls) != 1 || calls[0].method != "Self" {
		t.Fatalf("refused callers reached the delegator: %+v", calls)
	}
}

func TestSpawnPassesRequest(t *testing.T) {
	d := newFake(sessionID)
	code := 0
	d.result = spawn.SpawnResult{
		ChildInfo:  spawn.ChildInfo{SessionID: "child-1", Capsule: "worker@1.0.0", State: "running", Workdir: ".roost/children/worker-00"},
		Completion: &spawn.Completion{SessionID: "child-1", Capsule: "worker@1.0.0", Status: "exited", ExitCode: &code, DurationMS: 12, EndedAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	f := open(t, d)

	want := spawn.Request{Capsule: "worker", Version: "1.0.0", Task: "line one\nline two", Wait: true}
	body, _ := json.Marshal(want)
	r := f.do(t, "POST", "/v1/spawn", f.cred, bytes.NewReader(body))
	if r.status != http.StatusCreated {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var got spawn.SpawnResult
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	if !reflect.DeepEqual(got, d.result) {
		t.Fatalf("result %+v, want %+v", got, d.result)
	}
	if calls := d.recorded(); !reflect.DeepEqual(calls, []call{{method: "Spawn", session: sessionID, req: want}}) {
		t.Fatalf("calls %+v", calls)
	}
}

func TestSpawnBadBodies(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		status int
		msg    string
	}{
		{"unknown field", `{"capsule":"worker","version":"1.0.0","image":"x"}`, http.StatusBadRequest, `"image"`},
		{"two JSON values", `{"capsule":"worker","version":"1.0.0"} {"capsule":"rogue","version":"1.0.0"}`, http.StatusBadRequest, "more than one JSON value"},
		{"trailing garbage", `{"capsule":"worker","version":"1.0.0"} x`, http.StatusBadRequest, ""},
		{"empty body", ``, http.StatusBadRequest, ""},
		{"not an object", `["worker"]`, http.StatusBadRequest, ""},
		{"wrong type", `{"capsule":"worker","version":"1.0.0","wait":"yes"}`, http.StatusBadRequest, ""},
		{"over 1 MiB", `{"capsule":"worker","version":"1.0.0","task":"` + strings.Repeat("a", 1<<20) + `"}`, http.StatusRequestEntityTooLarge, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newFake(sessionID)
			f := open(t, d)
			r := f.do(t, "POST", "/v1/spawn", f.cred, strings.NewReader(tc.body))
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			msg := errorText(t, r)
			if msg == "" || !strings.Contains(msg, tc.msg) {
				t.Fatalf("error %q, want it to mention %q", msg, tc.msg)
			}
			if strings.HasSuffix(msg, "invalid argument") {
				t.Fatalf("error keeps the errdefs class: %q", msg)
			}
			if calls := d.recorded(); len(calls) != 0 {
				t.Fatalf("a bad body reached the delegator: %+v", calls)
			}
		})
	}
}

func TestSpawnExactlyMaxBody(t *testing.T) {
	d := newFake(sessionID)
	f := open(t, d)
	prefix, suffix := `{"capsule":"worker","version":"1.0.0","task":"`, `"}`
	body := prefix + strings.Repeat("a", 1<<20-len(prefix)-len(suffix)) + suffix
	r := f.do(t, "POST", "/v1/spawn", f.cred, strings.NewReader(body))
	if r.status != http.StatusCreated {
		t.Fatalf("a body of exactly 1 MiB: status %d: %.200s", r.status, r.body)
	}
	if calls := d.recorded(); len(calls) != 1 || len(calls[0].req.Task) != 1<<20-len(prefix)-len(suffix) {
		t.Fatalf("the delegator did not get the whole task")
	}
}

func TestDelegatorErrors(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		status int
		msg    string
	}{
		{"permission denied", fmt.Errorf("child %q is not yours: %w", "c1", errdefs.ErrPermissionDenied), http.StatusForbidden, `child "c1" is not yours`},
		{"permission denied, own message", errdefs.ErrPermissionDenied.WithMessage("spawning is off"), http.StatusForbidden, "spawning is off"},
		{"refusal", fmt.Errorf("spawn: %w", &spawn.Refusal{Reason: spawn.ReasonSpawnAllow, Key: "capabilities.spawn.allow", Msg: `"rogue" is not among the capsules this session may spawn (worker)`}),
			http.StatusForbidden, `spawn: capabilities.spawn.allow: "rogue" is not among the capsules this session may spawn (worker)`},
		{"not found", fmt.Errorf("no capsule worker@9.9.9: %w", errdefs.ErrNotFound), http.StatusNotFound, "no capsule worker@9.9.9"},
		{"not found twice in the text", fmt.Errorf("not found: worker: %w", errdefs.ErrNotFound), http.StatusNotFound, "not found: worker"},
		{"invalid argument", fmt.Errorf("task: too long: %w", errdefs.ErrInvalidArgument), http.StatusBadRequest, "task: too long"},
		{"resource exhausted", fmt.Errorf("the daemon is at capacity: %w", errdefs.ErrResourceExhausted), http.StatusTooManyRequests, "the daemon is at capacity"},
		{"failed precondition", fmt.Errorf("containment scoped is not available: %w", errdefs.ErrFailedPrecondition), http.StatusConflict, "containment scoped is not available"},
		{"already exists", fmt.Errorf("child exists: %w", errdefs.ErrAlreadyExists), http.StatusConflict, "child exists"},
		{"unclassified", errors.New("disk on fire"), http.StatusInternalServerError, "disk on fire"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newFake(sessionID)
			d.err = tc.err
			f := open(t, d)
			r := f.do(t, "POST", "/v1/spawn", f.cred, strings.NewReader(`{"capsule":"worker","version":"1.0.0"}`))
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if msg := errorText(t, r); msg != tc.msg {
				t.Fatalf("error %q, want %q", msg, tc.msg)
			}
		})
	}
}

func TestUnknownRoute(t *testing.T) {
	for _, tc := range []struct{ method, path string }{
		{"GET", "/v1/nope"},
		{"GET", "/"},
		{"DELETE", "/v1/self"},
		{"GET", "/v1/spawn"},
		{"POST", "/v1/children/c1/kill"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			d := newFake(sessionID)
			f := open(t, d)
			r := f.do(t, tc.method, tc.path, f.cred, nil)
			if r.status != http.StatusNotFound {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if msg := errorText(t, r); !strings.Contains(msg, "no route "+tc.method+" "+tc.path+";") {
				t.Fatalf("error %q does not name the request", msg)
			}
			if calls := d.recorded(); len(calls) != 0 {
				t.Fatalf("an unknown route reached the delegator: %+v", calls)
			}
		})
	}
}

func TestChildRoutes(t *testing.T) {
	code := 3
	d := newFake(sessionID)
	d.info = spawn.ChildInfo{SessionID: "c-42", Capsule: "worker@1.0.0", State: "running", Workdir: ".roost/children/worker-42"}
	d.comp = spawn.Completion{SessionID: "c-42", Capsule: "worker@1.0.0", Status: "exited", ExitCode: &code, DurationMS: 7, EndedAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	f := open(t, d)

	t.Run("list, none", func(t *testing.T) {
		r := f.do(t, "GET", "/v1/children", f.cred, nil)
		if r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != "[]" {
			t.Fatalf("status %d, body %q; want 200 []", r.status, r.body)
		}
	})
	t.Run("one", func(t *testing.T) {
		r := f.do(t, "GET", "/v1/children/c-42", f.cred, nil)
		var got spawn.ChildInfo
		if r.status != http.StatusOK || json.Unmarshal(r.body, &got) != nil || !reflect.DeepEqual(got, d.info) {
			t.Fatalf("status %d, body %s", r.status, r.body)
		}
	})
	for _, op := range []string{"wait", "stop"} {
		t.Run(op, func(t *testing.T) {
			r := f.do(t, "POST", "/v1/children/c-42/"+op, f.cred, nil)
			var got spawn.Completion
			if r.status != http.StatusOK || json.Unmarshal(r.body, &got) != nil || !reflect.DeepEqual(got, d.comp) {
				t.Fatalf("status %d, body %s", r.status, r.body)
			}
		})
	}
	want := []call{
		{method: "Children", session: sessionID},
		{method: "Child", session: sessionID, child: "c-42"},
		{method: "WaitChild", session: sessionID, child: "c-42"},
		{method: "StopChild", session: sessionID, child: "c-42"},
	}
	if calls := d.recorded(); !reflect.DeepEqual(calls, want) {
		t.Fatalf("calls\n%+v\nwant\n%+v", calls, want)
	}

	d.mu.Lock()
	d.children = []spawn.ChildInfo{d.info}
	d.mu.Unlock()
	r := f.do(t, "GET", "/v1/children", f.cred, nil)
	var list []spawn.ChildInfo
	if r.status != http.StatusOK || json.Unmarshal(r.body, &list) != nil || !reflect.DeepEqual(list, d.children) {
		t.Fatalf("status %d, body %s", r.status, r.body)
	}
}

// TestWaitEndsWithCaller: a long-poll wait is tied to the caller's request, so a caller
// that goes away does not leave the delegator waiting.
func TestWaitEndsWithCaller(t *testing.T) {
	d := newFake(sessionID)
	d.block = true
	d.waited = make(chan error, 1)
	f := open(t, d)

	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "POST", f.ep.URL()+"/v1/children/c-1/wait", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+f.cred)
	done := make(chan error, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for len(d.recorded()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the wait never reached the delegator")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-d.waited:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the delegator's wait ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the delegator kept waiting after its caller left")
	}
	<-done
}

func TestClose(t *testing.T) {
	d := newFake(sessionID)
	f := open(t, d)
	if r := f.do(t, "GET", "/v1/self", f.cred, nil); r.status != http.StatusOK {
		t.Fatalf("before Close: status %d", r.status)
	}
	f.ep.Close()
	if conn, err := net.DialTimeout("tcp", f.addr(), time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Close", f.addr())
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dialing a closed endpoint: %v; want connection refused", err)
	}
	// Close is idempotent: the session manager may close on several paths.
	f.ep.Close()
}

// inNetNS runs fn on a thread that has joined the network namespace at path, then returns
// the thread to the host's namespace; a thread that cannot get back is never reused.
func inNetNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer host.Close()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		err = unix.Setns(int(target.Fd()), unix.CLONE_NEWNET)
		target.Close()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("back to the host namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// selfInNetNS asks for /v1/self over a connection made inside the namespace at path,
// returning the status and the namespace's inode as seen from inside.
func selfInNetNS(t *testing.T, path, cred string) (int, uint64) {
	t.Helper()
	var conn net.Conn
	var ino uint64
	err := inNetNS(path, func() error {
		var st unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
			return err
		}
		ino = st.Ino
		var err error
		conn, err = net.DialTimeout("tcp", endpoint.SealedAddr, 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("dialing %s inside %s: %v", endpoint.SealedAddr, path, err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /v1/self HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", endpoint.SealedAddr, cred)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode, ino
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

func TestNetNSEndpoint(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making and pinning a network namespace needs root")
	}
	hostBusy := false
	if conn, err := net.DialTimeout("tcp", endpoint.SealedAddr, time.Second); err == nil {
		conn.Close()
		hostBusy = true
	}

	d := newFake(sessionID)
	keys := newKeys(t)
	eps, err := endpoint.New(keys, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	pin := eps.NetNSPath(sessionID)
	// Registered after TempDir, so it runs first: the directory cannot go while mounted on.
	t.Cleanup(func() {
		if err := eps.Release(sessionID); err != nil {
			t.Errorf("Release in cleanup: %v", err)
		}
		// Should Release be broken, the pin must still not outlive the test.
		if mounted(t, pin) {
			t.Errorf("%s still mounted after Release", pin)
			if err := unix.Unmount(pin, unix.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s: %v", pin, err)
			}
		}
	})
	ep, err := eps.Open(sessionID, true, 0, 0, d, nil)
	if err != nil {
		t.Fatalf("Open in a namespace: %v", err)
	}
	t.Cleanup(ep.Close)

	if ep.URL() != "http://"+endpoint.SealedAddr || ep.NetNS() != pin || ep.Port() != 0 {
		t.Fatalf("URL %q, NetNS %q, Port %d", ep.URL(), ep.NetNS(), ep.Port())
	}
	if !mounted(t, pin) {
		t.Fatalf("%s is not a mount point", pin)
	}
	hostIno := nsInode(t, "/proc/thread-self/ns/net")
	pinIno := nsInode(t, pin)
	if pinIno == hostIno {
		t.Fatal("the pinned namespace is the host's")
	}

	cred := eps.Credential(sessionID)
	status, ino := selfInNetNS(t, pin, cred)
	if status != http.StatusOK {
		t.Fatalf("/v1/self from inside the namespace: status %d", status)
	}
	if ino != pinIno {
		t.Fatalf("inside, the namespace is inode %d; the pin is %d", ino, pinIno)
	}
	if nsInode(t, "/proc/thread-self/ns/net") != hostIno {
		t.Fatal("this thread was left in another namespace")
	}
	if !hostBusy {
		if conn, err := net.DialTimeout("tcp", endpoint.SealedAddr, time.Second); err == nil {
			conn.Close()
			t.Fatalf("the session's endpoint is reachable on the host's %s", endpoint.SealedAddr)
		}
	}

	ids, err := eps.Pinned()
	if err != nil || !slices.Equal(ids, []string{sessionID}) {
		t.Fatalf("Pinned = %v, %v", ids, err)
	}

	// While the first listener runs, a second Open must land in the same namespace, where
	// the address is taken.
	if second, err := eps.Open(sessionID, true, 0, 0, d, nil); err == nil {
		second.Close()
		t.Fatal("a second listener opened beside the first: Open did not re-enter the pinned namespace")
	} else if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("second Open: %v; want address in use", err)
	}

	// As after a daemon restart: the listener gone, the pin kept.
	ep.Close()
	again, err := eps.Open(sessionID, true, 0, 0, d, nil)
	if err != nil {
		t.Fatalf("reopening with the pin present: %v", err)
	}
	t.Cleanup(again.Close)
	if nsInode(t, pin) != pinIno {
		t.Fatal("reopening replaced the pinned namespace")
	}
	if status, ino := selfInNetNS(t, pin, cred); status != http.StatusOK || ino != pinIno {
		t.Fatalf("after reopening: status %d in namespace %d (pin %d)", status, ino, pinIno)
	}

	if err := eps.Release(sessionID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if mounted(t, pin) {
		t.Fatalf("%s is still mounted after Release", pin)
	}
	if _, err := os.Lstat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the pin survives Release: %v", err)
	}
	if ids, err := eps.Pinned(); err != nil || len(ids) != 0 {
		t.Fatalf("Pinned after Release = %v, %v", ids, err)
	}
	if err := eps.Release(sessionID); err != nil {
		t.Fatalf("a second Release: %v", err)
	}
	if err := eps.Release("never-opened"); err != nil {
		t.Fatalf("Release of a session without a namespace: %v", err)
	}
}

func TestSpendRoutes(t *testing.T) {
	d := newFake(sessionID)
	f := open(t, d)
	r := f.do(t, "POST", "/v1/spend/admit", f.cred, strings.NewReader(`{"tokens": 600, "request_id": "call-1"}`))
	var res ledger.Reservation
	if r.status != http.StatusOK || json.Unmarshal(r.body, &res) != nil || res.ID != "rsv_1" || res.Tokens != 600 {
		t.Fatalf("admit: %d %s", r.status, r.body)
	}
	r = f.do(t, "POST", "/v1/spend/settle", f.cred, strings.NewReader(`{"reservation": "rsv_1", "input_tokens": 12, "output_tokens": 30}`))
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `"input_tokens":12`) {
		t.Fatalf("settle: %d %s", r.status, r.body)
	}
	if r = f.do(t, "GET", "/v1/spend", f.cred, nil); r.status != http.StatusOK || !strings.Contains(string(r.body), `"charged":42`) {
		t.Fatalf("spend: %d %s", r.status, r.body)
	}
	if r = f.do(t, "POST", "/v1/spend/admit", f.cred, strings.NewReader(`{"tokens": "many"}`)); r.status != http.StatusBadRequest || !strings.Contains(errorText(t, r), "not an admission") {
		t.Fatalf("a bad admission: %d %s", r.status, r.body)
	}
	if r = f.do(t, "POST", "/v1/inference/openai/v1/chat/completions", f.cred, strings.NewReader(`{}`)); r.status != http.StatusTeapot {
		t.Fatalf("inference: %d %s", r.status, r.body)
	}
	// The base URL without its slash reaches the gateway too, as the empty path.
	if r = f.do(t, "HEAD", "/v1/inference/openai", f.cred, nil); r.status != http.StatusTeapot {
		t.Fatalf("a probe of the base URL: %d %s", r.status, r.body)
	}
	want := []call{
		{method: "Admit", session: sessionID, admit: spawn.AdmitRequest{Tokens: 600, RequestID: "call-1"}},
		{method: "Settle", session: sessionID, settle: spawn.SettleRequest{Reservation: "rsv_1", InputTokens: 12, OutputTokens: 30}},
		{method: "Spend", session: sessionID},
		{method: "Inference", session: sessionID, child: "openai", path: "v1/chat/completions"},
		{method: "Inference", session: sessionID, child: "openai", path: ""},
	}
	if calls := d.recorded(); !reflect.DeepEqual(calls, want) {
		t.Fatalf("calls\n%+v\nwant\n%+v", calls, want)
	}

	// A refusal is 429 with the ceiling it met, in numbers.
	d.mu.Lock()
	d.err = &ledger.Refusal{Limit: "machine", Ceiling: 1000, Used: 600, Requested: 600}
	d.mu.Unlock()
	r = f.do(t, "POST", "/v1/spend/admit", f.cred, strings.NewReader(`{"tokens": 600}`))
	var body map[string]any
	if err := json.Unmarshal(r.body, &body); err != nil || r.status != http.StatusTooManyRequests {
		t.Fatalf("refusal: %d %s", r.status, r.body)
	}
	if body["limit"] != "machine" || body["ceiling"] != 1000.0 || body["used"] != 600.0 || body["requested"] != 600.0 || !strings.Contains(body["error"].(string), "tokens per day") {
		t.Fatalf("refusal body: %s", r.body)
	}
}
