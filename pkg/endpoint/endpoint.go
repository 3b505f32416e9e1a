// Package endpoint is each session's own HTTP listener: what a running capsule reaches roost
// through. A sealed or scoped session's listener is at 127.0.0.1:7700 inside the session's
// network namespace, so only that session can connect to it and the caller is known from
// which listener accepted; there it also carries the session's egress proxy (HTTP forward
// requests, CONNECT and SOCKS5), which needs no credential for that reason. A session without
// a namespace gets a port of its own on host loopback, where its credential alone says who
// calls, and no proxy. Beside a namespace's listener roostd serves the session's resolver
// (pkg/resolver) on resolver.Addr, opened in the same namespace and closed with the listener.
package endpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/fdbudget"
	"roost.dev/roost/pkg/resolver"
	"roost.dev/roost/pkg/spawn"
)

// SealedAddr is where a session with a network namespace of its own finds its endpoint.
const SealedAddr = "127.0.0.1:7700"

// maxBody bounds what a request may carry (a task text included); maxInferenceBody a
// model call forwarded by the gateway.
const (
	maxBody          = 1 << 20
	maxInferenceBody = 32 << 20
)

// What every endpoint's HTTP server allows a connection. A request's headers must arrive
// within ReadHeaderTimeout of its first byte (of the accept, for a connection's first
// request), its whole body within ReadTimeout of its start; an idle connection is closed
// after IdleTimeout. No write deadline: waits long-poll and model calls stream. Reading a
// body to its end clears the read deadline (net/http's background read for a client that
// goes away), so a reply may take as long as it needs.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	// DefaultMaxConnections is a session's cap when Open is given none
	// (resources.endpoint_max_connections' default).
	DefaultMaxConnections = 64
	// DefaultReportInterval is the least time between two reports of one session's
	// refused connections.
	DefaultReportInterval = time.Second
)

// Endpoints opens and closes sessions' listeners.
type Endpoints struct {
	keys *spawn.Keys
	// netns holds the bind mounts that pin each session's network namespace.
	netns string
	log   *slog.Logger

	readHeaderTimeout, readTimeout, idleTimeout time.Duration
	maxHeaderBytes                              int
	reportEvery                                 time.Duration
	// budget is roostd's descriptor budget, which every endpoint connection takes a slot
	// of; nil for no bound.
	budget *fdbudget.Budget
}

// Option tunes Endpoints.
type Option func(*Endpoints)

// WithBudget takes every endpoint connection's descriptor from b, the budget roostd's other
// holders of descriptors for sessions share. Without it (or WithMaxConnections) the
// endpoints have a budget of their own from the process's open-file limit when New runs.
func WithBudget(b *fdbudget.Budget) Option {
	return func(e *Endpoints) { e.budget = b }
}

// WithMaxConnections bounds all endpoints' connections together at n, with a budget of
// their own; 0 or less lifts the bound.
func WithMaxConnections(n int) Option {
	return func(e *Endpoints) {
		e.budget = nil
		if n > 0 {
			e.budget = fdbudget.Sized(int64(n), 0)
		}
	}
}

// New returns endpoints that check credentials with keys and pin namespaces under netnsDir.
func New(keys *spawn.Keys, netnsDir string, log *slog.Logger, opts ...Option) (*Endpoints, error) {
	if err := os.MkdirAll(netnsDir, 0o700); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Endpoints{keys: keys, netns: netnsDir, log: log,
		readHeaderTimeout: DefaultReadHeaderTimeout,
		readTimeout:       DefaultReadTimeout,
		idleTimeout:       DefaultIdleTimeout,
		maxHeaderBytes:    DefaultMaxHeaderBytes,
		reportEvery:       DefaultReportInterval,
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil && lim.Cur != unix.RLIM_INFINITY {
		e.budget = fdbudget.New(lim.Cur, 0)
	}
	for _, o := range opts {
		o(e)
	}
	return e, nil
}

// MaxConnections is the cap on all endpoints' connections together; 0 for none.
func (e *Endpoints) MaxConnections() int {
	if e.budget == nil {
		return 0
	}
	return int(e.budget.Total())
}

// Connections is how many connections all endpoints together hold now.
func (e *Endpoints) Connections() int {
	if e.budget == nil {
		return 0
	}
	return int(e.budget.InUse(fdbudget.Endpoint))
}

// Endpoint is one session's listener.
type Endpoint struct {
	url   string
	netns string
	port  int
	srv   *http.Server
	// dns is the session's resolver; nil without a namespace.
	dns  *resolver.Responder
	once sync.Once
	// conns counts the connections the endpoint holds.
	conns *gate
}

var _ spawn.Endpoint = (*Endpoint)(nil)

// URL is what the session's ROOST_ENDPOINT says.
func (ep *Endpoint) URL() string { return ep.url }

// NetNS is the pinned network namespace the session joins; empty for a loopback endpoint.
func (ep *Endpoint) NetNS() string { return ep.netns }

// Port is the host loopback port of an endpoint without a namespace.
func (ep *Endpoint) Port() int { return ep.port }

// Connections is how many connections the endpoint holds now.
func (ep *Endpoint) Connections() int { return int(ep.conns.Held()) }

// Credential is the session's ROOST_CREDENTIAL.
func (e *Endpoints) Credential(sessionID string) string { return e.keys.Mint(sessionID) }

// NetNSPath is where a session's network namespace is pinned.
func (e *Endpoints) NetNSPath(sessionID string) string { return filepath.Join(e.netns, sessionID) }

// Open starts a session's endpoint. With netns it makes (or, after a restart, re-enters)
// the session's network namespace, pinned at NetNSPath, listens on SealedAddr inside it
// and serves the session's resolver at resolver.Addr there, answering the names proxy's
// network.allow covers (none when proxy is nil); otherwise it listens on host loopback at port (0: any free port). The endpoint holds
// at most maxConns connections at once (DefaultMaxConnections when 0 or less); one past
// that, or past the cap of all endpoints together, is closed unread and reported to d as
// LimitConnections, at most once per report interval. In a namespace the endpoint carries
// proxy, the session's egress, when it is not nil.
func (e *Endpoints) Open(sessionID string, netns bool, port, maxConns int, d spawn.Backend, proxy *egress.Session) (spawn.Endpoint, error) {
	ep := &Endpoint{}
	var ln net.Listener
	var err error
	if netns {
		ep.netns = e.NetNSPath(sessionID)
		var dns net.PacketConn
		ln, dns, err = listenInNetNS(ep.netns, SealedAddr, resolver.Addr)
		ep.url = "http://" + SealedAddr
		if err == nil {
			var covers func(string) bool
			if proxy != nil {
				covers = proxy.Covers
			}
			ep.dns = resolver.Serve(dns, resolver.Config{Covers: covers})
		}
	} else {
		ln, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			ep.port = ln.Addr().(*net.TCPAddr).Port
			ep.url = "http://" + ln.Addr().String()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("session endpoint: %w", err)
	}
	if maxConns <= 0 {
		maxConns = DefaultMaxConnections
	}
	refused := &refusals{every: e.reportEvery, sessionMax: int64(maxConns), globalMax: int64(e.MaxConnections()),
		report: func(detail string) {
			e.log.Warn("session endpoint: connections refused", "session", sessionID, "detail", detail)
			d.LimitHit(sessionID, LimitConnections, detail)
		}}
	ep.conns = &gate{max: int64(maxConns)}
	ln = &limitListener{Listener: ln, id: sessionID, session: ep.conns, budget: e.budget, refused: refused}
	h := &handler{id: sessionID, keys: e.keys, d: d, log: e.log}
	if netns && proxy != nil {
		// A connection opening with SOCKS5's version byte goes to the proxy; the rest are
		// HTTP, forward requests and CONNECT among them.
		ln = egress.Split(ln, proxy.ServeSOCKS)
		h.proxy = proxy
	}
	ep.srv = &http.Server{
		Handler:           h.routes(),
		ReadHeaderTimeout: e.readHeaderTimeout,
		ReadTimeout:       e.readTimeout,
		// No WriteTimeout: waits long-poll and model calls stream.
		IdleTimeout:    e.idleTimeout,
		MaxHeaderBytes: e.maxHeaderBytes,
	}
	go func() { _ = ep.srv.Serve(ln) }()
	return ep, nil
}

// Close stops the listener and the resolver; Release also unpins the namespace.
func (ep *Endpoint) Close() {
	ep.once.Do(func() {
		if ep.dns != nil {
			ep.dns.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := ep.srv.Shutdown(ctx); err != nil {
			ep.srv.Close()
		}
	})
}

// Release unpins a session's network namespace (it goes with its last user). Safe to call
// for a session that has none.
func (e *Endpoints) Release(sessionID string) error {
	path := e.NetNSPath(sessionID)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unpinning %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Pin makes a network namespace (loopback up) for a sandbox made ahead of its session and
// pins it at NetNSPath(id); Move gives it to the session that claims the sandbox.
func (e *Endpoints) Pin(id string) (string, error) {
	path := e.NetNSPath(id)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer host.Close()
		err = makeNetNS(path)
		if serr := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); serr != nil {
			// The thread stays in the new namespace: it ends with this goroutine.
			done <- fmt.Errorf("returning to the host network namespace: %w", serr)
			return
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	if err := <-done; err != nil {
		_ = e.Release(id)
		return "", err
	}
	return path, nil
}

// Move pins the network namespace pinned for from at to's path, and unpins it from from.
func (e *Endpoints) Move(from, to string) error {
	src, dst := e.NetNSPath(from), e.NetNSPath(to)
	// The pin file itself moves, unmounted for the rename and mounted again from a
	// descriptor that holds the namespace meanwhile: a claim allocates no inode for it, which
	// on a filesystem without a journal (ext4 skips every recently deleted inode looking for
	// a free one) costs more than all the rest of the move.
	ns, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("the network namespace of %s: %w", from, err)
	}
	defer ns.Close()
	if err := unix.Unmount(src, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unpinning %s: %w", src, err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
		_ = unix.Mount(fdPath(ns), src, "", unix.MS_BIND, "")
		return fmt.Errorf("pinning the network namespace of %s for %s: %w", from, to, err)
	}
	if err := unix.Mount(fdPath(ns), dst, "", unix.MS_BIND, ""); err != nil {
		// Pinned for from again, as it was: what discards the sandbox finds it there.
		if unix.Rename(dst, src) == nil {
			_ = unix.Mount(fdPath(ns), src, "", unix.MS_BIND, "")
		}
		return fmt.Errorf("pinning the network namespace of %s for %s: %w", from, to, err)
	}
	return nil
}

// fdPath names an open file by its descriptor, for a bind mount of what it is.
func fdPath(f *os.File) string { return fmt.Sprintf("/proc/thread-self/fd/%d", f.Fd()) }

// Pinned lists the sessions whose network namespace is pinned.
func (e *Endpoints) Pinned() ([]string, error) {
	entries, err := os.ReadDir(e.netns)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, en := range entries {
		ids = append(ids, en.Name())
	}
	return ids, nil
}

// listenInNetNS listens on addr (TCP) and dnsAddr (UDP) inside the network namespace pinned
// at path, making and pinning a new one (loopback up) when there is none. The sockets keep
// their namespace after the thread returns to the host's. The work runs on a goroutine of its own, locked to its
// thread: should the way back to the host's namespace fail, that thread ends with the
// goroutine instead of serving anything else from the session's namespace.
func listenInNetNS(path, addr, dnsAddr string) (net.Listener, net.PacketConn, error) {
	type result struct {
		ln  net.Listener
		dns net.PacketConn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		ln, dns, err, back := enterAndListen(path, addr, dnsAddr)
		if back {
			runtime.UnlockOSThread()
		}
		done <- result{ln, dns, err}
	}()
	r := <-done
	return r.ln, r.dns, r.err
}

// enterAndListen does listenInNetNS's work on a locked thread; back says the thread is in
// the host's namespace again.
func enterAndListen(path, addr, dnsAddr string) (_ net.Listener, _ net.PacketConn, _ error, back bool) {
	host, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, nil, err, true
	}
	defer host.Close()
	var dns net.PacketConn
	ln, err := func() (net.Listener, error) {
		if existing, err := os.Open(path); err == nil {
			err = unix.Setns(int(existing.Fd()), unix.CLONE_NEWNET)
			existing.Close()
			if err != nil {
				return nil, fmt.Errorf("entering %s: %w", path, err)
			}
		} else if err := makeNetNS(path); err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, err
		}
		if dns, err = net.ListenPacket("udp", dnsAddr); err != nil {
			ln.Close()
			return nil, fmt.Errorf("the session's resolver: %w", err)
		}
		return ln, nil
	}()
	if serr := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); serr != nil {
		if ln != nil {
			ln.Close()
			dns.Close()
		}
		return nil, nil, fmt.Errorf("returning to the host network namespace: %w", serr), false
	}
	return ln, dns, err, true
}

// makeNetNS moves this thread into a new network namespace, brings its loopback up and
// pins it at path.
func makeNetNS(path string) error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("new network namespace: %w", err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	return pin(path)
}

// pin keeps this thread's network namespace alive after its last process leaves, by
// bind-mounting it at path.
func pin(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		return fmt.Errorf("pinning the network namespace: %w", err)
	}
	return nil
}

// handler serves one session's routes.
type handler struct {
	id   string
	keys *spawn.Keys
	d    spawn.Backend
	log  *slog.Logger
	// proxy is the session's egress; nil when the endpoint carries none.
	proxy *egress.Session
}

// denied is the one answer to every identity failure, byte for byte, so no endpoint tells
// which sessions exist.
var denied = []byte(`{"error":"not authorised"}` + "\n")

func (h *handler) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/self", h.self)
	mux.HandleFunc("POST /v1/spawn", h.spawn)
	mux.HandleFunc("GET /v1/children", h.children)
	mux.HandleFunc("GET /v1/children/{id}", h.child)
	mux.HandleFunc("POST /v1/children/{id}/wait", h.wait)
	mux.HandleFunc("POST /v1/children/{id}/stop", h.stop)
	mux.HandleFunc("POST /v1/spend/admit", h.admit)
	mux.HandleFunc("POST /v1/spend/settle", h.settle)
	mux.HandleFunc("GET /v1/spend", h.spend)
	mux.HandleFunc("/v1/inference/{upstream}/{path...}", func(w http.ResponseWriter, r *http.Request) {
		h.d.Inference(w, r, h.id, r.PathValue("upstream"), r.PathValue("path"))
	})
	// The base URL itself, without its slash: what a client probes (claude's HEAD).
	mux.HandleFunc("/v1/inference/{upstream}", func(w http.ResponseWriter, r *http.Request) {
		h.d.Inference(w, r, h.id, r.PathValue("upstream"), "")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if egress.IsProxyRequest(r) {
			h.egress(w, r)
			return
		}
		if !h.authorised(r) {
			deny(w)
			return
		}
		limit := int64(maxBody)
		if strings.HasPrefix(r.URL.Path, "/v1/inference/") {
			// Model calls carry whole conversations.
			limit = maxInferenceBody
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		if _, pattern := mux.Handler(r); pattern == "" {
			reply(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no route %s %s; the routes are GET /v1/self, POST /v1/spawn, GET /v1/children, GET /v1/children/{id}, POST /v1/children/{id}/wait, POST /v1/children/{id}/stop, POST /v1/spend/admit, POST /v1/spend/settle, GET /v1/spend, /v1/inference/{upstream}/...", r.Method, r.URL.Path)})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// authorised: the credential names this listener's session, and it runs. It comes as a
// bearer token, or — from an Anthropic SDK pointed at the gateway with the credential as its
// key — in X-Api-Key.
func (h *handler) authorised(r *http.Request) bool {
	cred, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		cred = r.Header.Get("X-Api-Key")
	}
	id, ok := h.keys.Verify(strings.TrimSpace(cred))
	return ok && id == h.id && h.d.Live(id)
}

// egress serves a proxy request: through the session's proxy when the endpoint carries one,
// which only a namespace's listener does (who calls is known from where it listens).
func (h *handler) egress(w http.ResponseWriter, r *http.Request) {
	if h.proxy != nil {
		h.proxy.ServeHTTP(w, r)
		return
	}
	w.Header().Set(egress.DeniedHeader, "no_proxy")
	reply(w, http.StatusForbidden, map[string]string{"error": "this session's endpoint carries no egress proxy: only sealed and scoped sessions (in a network namespace of their own) reach the outside through roost", "reason": "no_proxy"})
}

func deny(w http.ResponseWriter) {
	hdr := w.Header()
	for k := range hdr {
		delete(hdr, k)
	}
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(denied)))
	// No Date: two refusals must not differ even by the second they were made.
	hdr["Date"] = nil
	w.WriteHeader(http.StatusForbidden)
	_, _ = w.Write(denied)
}

func reply(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status, data = http.StatusInternalServerError, []byte(`{"error":"encoding the reply failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

// fail answers an error as JSON {"error": "..."} with the status its class calls for.
func (h *handler) fail(w http.ResponseWriter, err error) {
	if spawn.WriteError(w, err) == http.StatusInternalServerError {
		h.log.Error("session endpoint", "session", h.id, "err", err)
	}
}

func (h *handler) self(w http.ResponseWriter, r *http.Request) {
	s, err := h.d.Self(h.id)
	if err != nil {
		h.fail(w, err)
		return
	}
	reply(w, http.StatusOK, s)
}

func (h *handler) spawn(w http.ResponseWriter, r *http.Request) {
	var req spawn.Request
	if err := decode(r, &req, "a spawn request {capsule, version, task, wait}"); err != nil {
		h.fail(w, err)
		return
	}
	res, err := h.d.Spawn(r.Context(), h.id, req)
	if err != nil {
		h.fail(w, err)
		return
	}
	reply(w, http.StatusCreated, res)
}

func (h *handler) children(w http.ResponseWriter, r *http.Request) {
	list, err := h.d.Children(h.id)
	if err != nil {
		h.fail(w, err)
		return
	}
	if list == nil {
		list = []spawn.ChildInfo{}
	}
	reply(w, http.StatusOK, list)
}

func (h *handler) child(w http.ResponseWriter, r *http.Request) {
	c, err := h.d.Child(h.id, r.PathValue("id"))
	if err != nil {
		h.fail(w, err)
		return
	}
	reply(w, http.StatusOK, c)
}

func (h *handler) wait(w http.ResponseWriter, r *http.Request) {
	c, err := h.d.WaitChild(r.Context(), h.id, r.PathValue("id"))
	if err != nil {
		h.fail(w, err)
		return
	}
	reply(w, http.StatusOK, c)
}

func (h *handler) stop(w http.ResponseWriter, r *http.Request) {
	c, err := h.d.StopChild(r.Context(), h.id, r.PathValue("id"))
	if err != nil {
		h.fail(w, err)
		return
	}
	reply(w, http.StatusOK, c)
}

// decode reads exactly one JSON value of the request body into v, refusing unknown fields.
func decode(r *http.Request, v any, what string) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return err
		}
		return fmt.Errorf("the request body is not %s: %v: %w", what, err, errdefs.ErrInvalidArgument)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("the request body holds more than one JSON value: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

func (h *handler) admit(w http.ResponseWriter, r *http.Request) {
	var req spawn.AdmitRequest
	if err := decode(r, &req, "an admission {tokens, request_id}"); err != nil {
		h.fail(w, err)
		return
	}
	res, err := h.d.Admit(h.id, req)
	if err != nil {
		h.fail(w, err)
		return
	}
	reply(w, http.StatusOK, res)
}

func (h *handler) settle(w http.ResponseWriter, r *http.Request) {
	var req spawn.SettleRequest
	if err := decode(r, &req, "a settlement {reservation, input_tokens, output_tokens}"); err != nil {
		h.fail(w, err)
		return
	}
	res, err := h.d.Settle(h.id, req)
	if err != nil {
		h.fail(w, err)
		return
	}
	reply(w, http.StatusOK, res)
}

func (h *handler) spend(w http.ResponseWriter, r *http.Request) {
	res, err := h.d.Spend(h.id)
	if err != nil {
		h.fail(w, err)
		return
	}
	reply(w, http.StatusOK, res)
}
