package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/remote/certs"
)

// sessions is a SessionService that records who reached it.
type sessions struct {
	roostv1.UnimplementedSessionServiceServer
	mu     sync.Mutex
	killed []string
	// callers are the remote callers the handlers saw, by method.
	callers []string
	// release, when set, holds List until it is closed.
	release chan struct{}
}

func (s *sessions) saw(ctx context.Context, method string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := CallerFrom(ctx)
	if !ok {
		s.callers = append(s.callers, method+" by nobody")
		return
	}
	by := method + " by " + c.CommonName + " as " + string(c.Role)
	if c.Via != "" {
		by += " via " + c.Via
	}
	s.callers = append(s.callers, by)
}

func (s *sessions) List(ctx context.Context, _ *roostv1.ListRequest) (*roostv1.ListResponse, error) {
	s.saw(ctx, "List")
	if s.release != nil {
		<-s.release
	}
	return &roostv1.ListResponse{Sessions: []*roostv1.Session{{Id: "s-1"}}}, nil
}

func (s *sessions) Kill(ctx context.Context, req *roostv1.KillRequest) (*roostv1.KillResponse, error) {
	s.saw(ctx, "Kill")
	s.mu.Lock()
	s.killed = append(s.killed, req.GetId())
	s.mu.Unlock()
	return &roostv1.KillResponse{}, nil
}

func (s *sessions) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.callers...)
}

// fixture is a remote listener on loopback in front of a gRPC server with sessions, and
// the certificates of its CA and of another.
type fixture struct {
	dir, other string
	srv        *Server
	svc        *sessions
	grpc       *grpc.Server
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{dir: filepath.Join(t.TempDir(), "tls"), other: filepath.Join(t.TempDir(), "other"), svc: &sessions{}}
	clients := []certs.Client{
		{CommonName: "ci-bot", Cert: "client.pem", Key: "client-key.pem"},
		{CommonName: "dashboard", Cert: "dashboard.pem", Key: "dashboard-key.pem"},
		{CommonName: "stranger", Cert: "stranger.pem", Key: "stranger-key.pem"},
		{CommonName: "node-a", Cert: "node-a.pem", Key: "node-a-key.pem"},
	}
	for _, dir := range []string{f.dir, f.other} {
		if err := certs.Init(certs.Plan{Dir: dir, ServerNames: []string{"localhost", "127.0.0.1"}, Clients: clients}); err != nil {
			t.Fatal(err)
		}
	}
	f.grpc = grpc.NewServer()
	roostv1.RegisterSessionServiceServer(f.grpc, f.svc)
	roles, err := NewRoles("remote.clients", []Client{{"ci-bot", Operator}, {"dashboard", Reader}, {"node-a", Node}})
	if err != nil {
		t.Fatal(err)
	}
	f.srv, err = New(f.settings("127.0.0.1:0", roles), f.grpc, Options{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- f.srv.Serve() }()
	t.Cleanup(func() {
		f.srv.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return f
}

func (f *fixture) settings(listen string, roles Roles) Settings {
	at := func(key, v string) Setting { return Setting{Value: v, From: "roostd.yaml: remote." + key} }
	return Settings{
		Listen:    at("listen", listen),
		Cert:      at("tls_cert", filepath.Join(f.dir, certs.ServerFile)),
		Key:       at("tls_key", filepath.Join(f.dir, certs.ServerKeyFile)),
		ClientCA:  at("client_ca", filepath.Join(f.dir, certs.CAFile)),
		Roles:     roles,
		RolesFrom: "roostd.yaml: remote.clients",
	}
}

// clientTLS is the TLS of a client trusting f's CA, with the certificate named (none for "").
func (f *fixture) clientTLS(t testing.TB, dir, name string) *tls.Config {
	t.Helper()
	pool, _, err := LoadCA(filepath.Join(f.dir, certs.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS13}
	if name != "" {
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

func (f *fixture) grpcClient(t testing.TB, dir, name string) roostv1.SessionServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+f.srv.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(f.clientTLS(t, dir, name))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return roostv1.NewSessionServiceClient(conn)
}

// connect POSTs body as Connect's unary JSON over HTTP/1.1 and returns the status and body.
func (f *fixture) connect(t testing.TB, dir, name, method, body string) (int, string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: f.clientTLS(t, dir, name)}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Post("https://"+f.srv.Addr().String()+method, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", method, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.ProtoMajor != 1 {
		t.Errorf("POST %s went over HTTP/%d, not HTTP/1.1", method, resp.ProtoMajor)
	}
	return resp.StatusCode, string(out)
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestHandshakeRefused(t *testing.T) {
	f := newFixture(t)
	// The server's alert may reach the client, or the connection may close before
	// the client reads it: the names of what went wrong are its wording when it does.
	for _, tc := range []struct{ name, dir, cert, want string }{
		{"no certificate", f.dir, "", "certificate required|broken pipe|connection reset"},
		{"another CA's", f.other, "client", "unknown certificate authority|broken pipe|connection reset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.grpcClient(t, tc.dir, tc.cert).List(ctx(t), &roostv1.ListRequest{})
			if status.Code(err) != codes.Unavailable || !containsAny(err.Error(), tc.want) {
				t.Errorf("gRPC List: got %v, want Unavailable: %s", err, tc.want)
			}
			c := &http.Client{Transport: &http.Transport{TLSClientConfig: f.clientTLS(t, tc.dir, tc.cert)}}
			resp, err := c.Post("https://"+f.srv.Addr().String()+"/roost.v1.SessionService/List", "application/json", strings.NewReader("{}"))
			if err == nil {
				resp.Body.Close()
				t.Fatalf("Connect List: served (%s) without a certificate of the client CA", resp.Status)
			}
			if !containsAny(err.Error(), tc.want) {
				t.Errorf("Connect List: %v, want %s", err, tc.want)
			}
		})
	}
	if seen := f.svc.seen(); len(seen) != 0 {
		t.Errorf("handlers reached: %v", seen)
	}
}

func TestUnknownCommonName(t *testing.T) {
	f := newFixture(t)
	_, err := f.grpcClient(t, f.dir, "stranger").List(ctx(t), &roostv1.ListRequest{})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `"stranger"`) {
		t.Errorf("gRPC: got %v, want PermissionDenied naming stranger", err)
	}
	code, body := f.connect(t, f.dir, "stranger", "/roost.v1.SessionService/List", "{}")
	if code != http.StatusForbidden || !strings.Contains(body, `"permission_denied"`) || !strings.Contains(body, `stranger`) {
		t.Errorf("Connect: %d %s, want 403 permission_denied naming stranger", code, body)
	}
	if seen := f.svc.seen(); len(seen) != 0 {
		t.Errorf("handlers reached: %v", seen)
	}
}

func TestReader(t *testing.T) {
	f := newFixture(t)
	c := f.grpcClient(t, f.dir, "dashboard")
	_, err := c.Kill(ctx(t), &roostv1.KillRequest{Id: "s-1"})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "/roost.v1.SessionService/Kill") {
		t.Errorf("gRPC Kill: got %v, want PermissionDenied", err)
	}
	code, body := f.connect(t, f.dir, "dashboard", "/roost.v1.SessionService/Kill", `{"id":"s-1"}`)
	var cerr struct{ Code, Message string }
	if err := json.Unmarshal([]byte(body), &cerr); err != nil || code != http.StatusForbidden || cerr.Code != "permission_denied" {
		t.Errorf("Connect Kill: %d %s, want 403 with a Connect permission_denied error", code, body)
	}
	if len(f.svc.killed) != 0 {
		t.Fatalf("a reader killed %v", f.svc.killed)
	}

	list, err := c.List(ctx(t), &roostv1.ListRequest{})
	if err != nil || len(list.GetSessions()) != 1 {
		t.Fatalf("gRPC List: %v, %v", list, err)
	}
	code, body = f.connect(t, f.dir, "dashboard", "/roost.v1.SessionService/List", "{}")
	var out struct{ Sessions []struct{ ID string } }
	if err := json.Unmarshal([]byte(body), &out); err != nil || code != http.StatusOK || len(out.Sessions) != 1 || out.Sessions[0].ID != "s-1" {
		t.Errorf("Connect List: %d %s", code, body)
	}
	want := []string{"List by dashboard as reader", "List by dashboard as reader"}
	if seen := f.svc.seen(); strings.Join(seen, ",") != strings.Join(want, ",") {
		t.Errorf("handlers saw %v, want %v", seen, want)
	}
}

func TestOperatorKill(t *testing.T) {
	f := newFixture(t)
	if _, err := f.grpcClient(t, f.dir, "client").Kill(ctx(t), &roostv1.KillRequest{Id: "s-1"}); err != nil {
		t.Fatalf("gRPC Kill: %v", err)
	}
	if code, body := f.connect(t, f.dir, "client", "/roost.v1.SessionService/Kill", `{"id":"s-2"}`); code != http.StatusOK {
		t.Fatalf("Connect Kill: %d %s", code, body)
	}
	if strings.Join(f.svc.killed, ",") != "s-1,s-2" {
		t.Errorf("killed %v, want s-1,s-2", f.svc.killed)
	}
	want := "Kill by ci-bot as operator,Kill by ci-bot as operator"
	if seen := strings.Join(f.svc.seen(), ","); seen != want {
		t.Errorf("handlers saw %s, want %s", seen, want)
	}
}

// A request that reaches the handler without a verified certificate (served without TLS
// by mistake) is Unauthenticated: 401 for Connect.
func TestNoTLSUnauthenticated(t *testing.T) {
	f := newFixture(t)
	h, err := newHandler(Roles{"ci-bot": Operator}, f.grpc, Options{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/roost.v1.SessionService/List", strings.NewReader("{}")))
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), `"unauthenticated"`) {
		t.Errorf("got %d %s, want 401 unauthenticated", rec.Code, rec.Body)
	}
}

// Drain waits for a unary call in flight and lets nothing new in.
func TestDrain(t *testing.T) {
	f := newFixture(t)
	f.svc.release = make(chan struct{})
	c := f.grpcClient(t, f.dir, "client")
	done := make(chan error, 1)
	go func() {
		_, err := c.List(ctx(t), &roostv1.ListRequest{})
		done <- err
	}()
	for len(f.svc.seen()) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	drained := make(chan struct{})
	go func() { f.srv.Drain(5 * time.Second); close(drained) }()
	select {
	case <-drained:
		t.Fatal("Drain returned with a call in flight")
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := c.Kill(ctx(t), &roostv1.KillRequest{Id: "late"}); status.Code(err) != codes.Unavailable {
		t.Errorf("a call while draining: %v, want Unavailable", err)
	}
	close(f.svc.release)
	if err := <-done; err != nil {
		t.Errorf("the call in flight: %v", err)
	}
	<-drained
}

func TestRoles(t *testing.T) {
	for _, tc := range []struct {
		clients []Client
		want    string
	}{
		{[]Client{{"a", Operator}, {"a", Reader}}, `remote.clients[1].common_name: "a" is listed twice`},
		{[]Client{{"a", "admin"}}, `remote.clients[0].role: "admin": expected operator, reader or node`},
		{[]Client{{" ", Reader}}, `remote.clients[0].common_name: a client needs`},
	} {
		if _, err := NewRoles("remote.clients", tc.clients); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %s", tc.clients, err, tc.want)
		}
	}
	for _, m := range []string{"/roost.v1.SessionService/Kill", "/roost.v1.SessionService/Stage", "/roost.v1.SessionService/Exec",
		"/roost.v1.SystemService/Doctor", "/roost.v1.SpendService/SetMachineLimit", "/roost.v1.SessionService/List/../Kill", "/roost.v1.NewService/Anything"} {
		if Allowed(Reader, m) {
			t.Errorf("a reader may call %s", m)
		}
		if !Allowed(Operator, m) {
			t.Errorf("an operator may not call %s", m)
		}
	}
	for _, m := range ReaderMethods() {
		if !Allowed(Reader, m) {
			t.Errorf("a reader may not call %s", m)
		}
	}
}

func TestSettingsErrors(t *testing.T) {
	f := &fixture{dir: t.TempDir()}
	if err := certs.Init(certs.Plan{Dir: f.dir, ServerNames: []string{"localhost"}}); err != nil {
		t.Fatal(err)
	}
	roles := Roles{"ci-bot": Operator}
	notPEM := filepath.Join(f.dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		change func(*Settings)
		want   string
	}{
		{"missing key", func(s *Settings) { s.Key.Value = "/nonexistent/key.pem" }, "roostd.yaml: remote.tls_key /nonexistent/key.pem: no such file or directory"},
		{"no cert", func(s *Settings) { s.Cert.Value = "" }, "roostd.yaml: remote.listen 127.0.0.1:0 needs roostd.yaml: remote.tls_cert too"},
		{"no listen", func(s *Settings) { s.Listen.Value = "" }, "roostd.yaml: remote.tls_cert is set, but not where to listen"},
		{"unreadable CA", func(s *Settings) { s.ClientCA.Value = filepath.Join(f.dir, "nope.pem") }, "remote.client_ca " + filepath.Join(f.dir, "nope.pem") + ": no such file or directory"},
		{"CA not PEM", func(s *Settings) { s.ClientCA.Value = notPEM }, "remote.client_ca " + notPEM + ": holds no PEM CERTIFICATE block"},
		{"key and cert apart", func(s *Settings) { s.Key.Value = filepath.Join(f.dir, certs.CAKeyFile) }, "private key does not match public key"},
		{"no clients", func(s *Settings) { s.Roles = nil }, "roostd.yaml: remote.clients lists no client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := f.settings("127.0.0.1:0", roles)
			tc.change(&s)
			if _, _, err := s.TLS(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want %s", err, tc.want)
			}
		})
	}
	key := filepath.Join(f.dir, certs.ServerKeyFile)
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	s := f.settings("127.0.0.1:0", roles)
	if _, _, err := s.TLS(); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a key others may read: %v", err)
	}
}

// The certificates certs.Init makes are what the issue asks: ECDSA P-256, a year, the
// server's names as SANs, keys 0600.
func TestCertsInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	if err := certs.Init(certs.Plan{Dir: dir, ServerNames: []string{"localhost", "127.0.0.1"}, Clients: []certs.Client{{CommonName: "ci-bot", Cert: "client.pem", Key: "client-key.pem"}}}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{certs.CAKeyFile, certs.ServerKeyFile, "client-key.pem"} {
		if info, err := os.Stat(filepath.Join(dir, k)); err != nil || info.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want mode 0600", k, info.Mode(), err)
		}
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, certs.ServerFile), filepath.Join(dir, certs.ServerKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	srv := pair.Leaf
	if srv.PublicKeyAlgorithm != x509.ECDSA || srv.NotAfter.Sub(srv.NotBefore) < certs.Validity || len(srv.IPAddresses) != 1 || !srv.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) || len(srv.DNSNames) != 1 || srv.DNSNames[0] != "localhost" {
		t.Errorf("server certificate: %v %v %v %v", srv.PublicKeyAlgorithm, srv.NotAfter.Sub(srv.NotBefore), srv.IPAddresses, srv.DNSNames)
	}
	pool, _, err := LoadCA(filepath.Join(dir, certs.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Verify(x509.VerifyOptions{Roots: pool, DNSName: "localhost"}); err != nil {
		t.Errorf("server certificate does not verify for localhost: %v", err)
	}
	if err := certs.Init(certs.Plan{Dir: dir, ServerNames: []string{"localhost"}}); err == nil || !strings.Contains(err.Error(), "ca.pem exists") {
		t.Errorf("a second init in the same directory: %v", err)
	}
}

func containsAny(s, alternatives string) bool {
	for _, a := range strings.Split(alternatives, "|") {
		if strings.Contains(s, a) {
			return true
		}
	}
	return false
}
