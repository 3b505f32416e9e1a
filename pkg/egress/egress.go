// Package egress is a session's way out: an HTTP forward proxy, CONNECT tunnels and SOCKS5
// on the session's own endpoint listener, deciding every connection against the session's
// capabilities.network.allow.
//
// roostd runs the proxy in its own network namespace; the session's namespace has only
// loopback, so the proxy is the one path out and the listener that accepted a connection
// says which session it is (requests carry no credentials). Every destination is resolved
// by roostd (Config.Hosts first, then the resolver), checked, and dialled by address:
// what was checked is what is reached, and a second lookup (DNS rebinding) cannot switch
// it. Special-purpose addresses (loopback, private, link-local and cloud metadata, …) are
// refused unless an IP-literal rule names exactly that address or the operator's
// PermitCIDRs holds it.
//
// Each connection (a CONNECT tunnel, a SOCKS5 connection) or forwarded HTTP request ends
// in exactly one Record to the Auditor: denied ones at once, allowed ones when they end,
// with the bytes each way as they crossed (headers and handshakes included). Bodies are
// never logged or audited.
//
// A session's bytes are bounded twice: in total (resources.egress_max_bytes, counted on
// the wire, see wire.go) and in rate (resources.egress_bytes_per_sec, a token bucket each
// way shared by the session's connections), so one session cannot take the whole link
// from the others.
package egress

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"roost.dev/roost/pkg/fdbudget"
	"roost.dev/roost/pkg/manifest"
)

// Defaults and bounds.
const (
	// DefaultMaxConnections is a session's concurrent egress connections and requests when
	// Config.MaxConnectionsPerSession is 0.
	DefaultMaxConnections = 64
	// DefaultDialTimeout bounds one dial of the default Dialer.
	DefaultDialTimeout = 10 * time.Second
	// ResolveTimeout bounds the resolution of one destination.
	ResolveTimeout = 10 * time.Second
	// HandshakeTimeout bounds a SOCKS5 greeting and request: a client that opens a
	// connection and stalls holds a connection slot of its own endpoint for no longer.
	HandshakeTimeout = 10 * time.Second
	// PeekTimeout is how long Split waits for a connection's first byte.
	PeekTimeout = 10 * time.Second
	// bufSize is one copy buffer: the most a tunnel can carry past the point where it is
	// cut is nothing (budget is reserved before bytes are written), and one buffer is what
	// one read brings in.
	bufSize = 32 << 10
)

// Protocols, as Record.Proto names them.
const (
	ProtoHTTP    = "http"
	ProtoConnect = "connect"
	ProtoSOCKS   = "socks"
)

// Decisions, as Record.Decision names them.
const (
	Allowed = "allowed"
	Denied  = "denied"
)

// Reasons, as Record.Reason and the X-Roost-Denied header name them.
const (
	ReasonNotAllowed       = "not_allowed"
	ReasonPortNotAllowed   = "port_not_allowed"
	ReasonSchemeNotAllowed = "scheme_not_allowed"
	ReasonSpecialAddress   = "special_address"
	ReasonUnresolvable     = "unresolvable"
	ReasonMaxConnections   = "max_connections"
	ReasonEgressMaxBytes   = "egress_max_bytes"
	ReasonDialFailed       = "dial_failed"
	ReasonBadRequest       = "bad_request"
	// ReasonSessionClosed: the session was closed (it is ending) when the request came.
	ReasonSessionClosed = "session_closed"
	// ReasonConnections: roostd's descriptor budget had no slot for the upstream socket
	// (the session held its share, or all sessions the daemon's total).
	ReasonConnections = "connections"
)

// DeniedHeader names the reason on a refused HTTP request or CONNECT.
const DeniedHeader = "X-Roost-Denied"

// Resolver answers what addresses a name has. *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// HostAddrs says whether an address is configured on one of the host's interfaces.
// *hostaddr.Set is one.
type HostAddrs interface {
	Contains(netip.Addr) bool
}

// Dialer opens a connection; it is only ever given an IP address and port. *net.Dialer is
// one.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config is what the operator sets for every session's egress.
type Config struct {
	// Hosts are names answered before DNS (the operator's egress.hosts): a name here
	// resolves to its address only. The address is still checked as any other.
	Hosts map[string]netip.Addr
	// PermitCIDRs are special-purpose ranges the operator opens to every session whose
	// rules name a host that resolves there.
	PermitCIDRs []netip.Prefix
	// MaxConnectionsPerSession bounds a session's concurrent tunnels and forwarded
	// requests; 0 means DefaultMaxConnections.
	MaxConnectionsPerSession int
	// HostAddrs are the addresses of roostd's own network namespace's interfaces
	// (pkg/hostaddr follows them). They are the host's own, as loopback is: refused unless
	// PermitCIDRs holds them, even to an IP-literal rule. Nil means none but the fixed ones.
	HostAddrs HostAddrs
	// MaxBytesPerSecPerSession is the most a session's bandwidth share may be, each way,
	// whatever its resources.egress_bytes_per_sec says; 0 for no ceiling.
	MaxBytesPerSecPerSession int64
	// Resolver resolves names not in Hosts; nil means net.DefaultResolver.
	Resolver Resolver
	// Dialer dials the decided addresses; nil means a net.Dialer with DefaultDialTimeout.
	Dialer Dialer
	// Descriptors is roostd's descriptor budget: every upstream socket takes a slot of it
	// for its session, for as long as it is open (idle in the pool too). Nil for none.
	Descriptors *fdbudget.Budget
}

// Record is one audit record: a CONNECT tunnel, a SOCKS5 connection or a forwarded HTTP
// request.
type Record struct {
	Time  time.Time // when the connection or request began
	Proto string    // ProtoHTTP, ProtoConnect or ProtoSOCKS
	Host  string    // the destination as normalised: lowercase name or canonical address
	Port  int
	// Addr is the address dialled (the last one tried when every dial failed); "" if none.
	Addr     string
	Decision string // Allowed or Denied
	// Rule is the network.allow entry that matched, in its canonical spelling; "" if none.
	Rule string
	// Reason is a Reason* code: why it was denied, or, on an allowed one, why it was cut
	// short (ReasonEgressMaxBytes when the budget ran out mid-way); "" otherwise.
	Reason string
	// Detail is a sentence naming host, port and why, for the session's log and the client.
	Detail string
	// BytesUp and BytesDown are the bytes that crossed each way: for a forwarded request
	// everything written to and read from the destination's socket (request line,
	// headers, chunk framing, bodies; status line, headers, bodies), for a tunnel its
	// CONNECT head and 200 or its SOCKS5 handshake and everything it carried.
	BytesUp, BytesDown int64
	Duration           time.Duration
}

// Auditor receives every Record. It is called on the connection's goroutine; it should
// not block.
type Auditor interface {
	Egress(sessionID string, r Record)
}

// AuditorFunc adapts a function to Auditor.
type AuditorFunc func(sessionID string, r Record)

// Egress calls f.
func (f AuditorFunc) Egress(sessionID string, r Record) { f(sessionID, r) }

// Proxy holds what every session's egress shares.
type Proxy struct {
	hosts    map[string]netip.Addr
	permit   []netip.Prefix
	special  []specialRange
	maxConns int
	// hostAddrs are the addresses of roostd's interfaces, followed; never nil.
	hostAddrs HostAddrs
	maxRate   int64
	resolver  Resolver
	dialer    Dialer
	fds       *fdbudget.Budget
	audit     Auditor
	log       *slog.Logger
}

// New returns a proxy; audit and log may be nil.
func New(cfg Config, audit Auditor, log *slog.Logger) *Proxy {
	p := &Proxy{
		hosts:     make(map[string]netip.Addr, len(cfg.Hosts)),
		special:   specialRanges(),
		maxConns:  cfg.MaxConnectionsPerSession,
		hostAddrs: cfg.HostAddrs,
		maxRate:   max(cfg.MaxBytesPerSecPerSession, 0),
		resolver:  cfg.Resolver,
		dialer:    cfg.Dialer,
		fds:       cfg.Descriptors,
		audit:     audit,
		log:       log,
	}
	// A copy with names as the normaliser spells them: the caller's map may change later.
	for name, a := range cfg.Hosts {
		p.hosts[strings.TrimSuffix(strings.ToLower(name), ".")] = a.Unmap()
	}
	for _, pr := range cfg.PermitCIDRs {
		// Addresses are checked unmapped: an IPv4-mapped prefix means its IPv4 range.
		if pr.Addr().Is4In6() && pr.Bits() >= 96 {
			pr = netip.PrefixFrom(pr.Addr().Unmap(), pr.Bits()-96)
		}
		p.permit = append(p.permit, pr.Masked())
	}
	if p.maxConns <= 0 {
		p.maxConns = DefaultMaxConnections
	}
	if p.hostAddrs == nil {
		p.hostAddrs = noHostAddrs{}
	}
	if p.resolver == nil {
		p.resolver = net.DefaultResolver
	}
	if p.dialer == nil {
		p.dialer = &net.Dialer{Timeout: DefaultDialTimeout}
	}
	if p.audit == nil {
		p.audit = AuditorFunc(func(string, Record) {})
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	return p
}

// Session is one session's egress: its rules, its budget, its open connections.
type Session struct {
	p        *Proxy
	id       string
	rules    []manifest.NetRule
	maxBytes int64
	maxConns int
	// upRate and downRate are the session's bandwidth share, one bucket each way.
	upRate, downRate *rate.Limiter

	// used is up+down bytes including what the session used before a restart; it is what
	// the budget is checked against.
	used      atomic.Int64
	up, down  atomic.Int64
	allowed   atomic.Int64
	denied    atomic.Int64
	ctx       context.Context
	cancel    context.CancelFunc
	transport *http.Transport
	rp        *httputil.ReverseProxy

	mu     sync.Mutex
	active int
	closed bool
	conns  map[io.Closer]struct{}
}

// Limits are what bound one session's bytes.
type Limits struct {
	// MaxBytes is resources.egress_max_bytes: the bytes up and down together the session
	// may move, counted on the wire; 0 for no bound.
	MaxBytes int64
	// UsedBytes is what the session already moved under earlier daemons.
	UsedBytes int64
	// BytesPerSec is resources.egress_bytes_per_sec, the session's share each way; 0
	// means manifest.DefaultEgressBytesPerSec. Config.MaxBytesPerSecPerSession caps it.
	BytesPerSec int64
}

// Session returns the egress of session id with its network.allow rules and its limits.
func (p *Proxy) Session(id string, rules []manifest.NetRule, lim Limits) *Session {
	ctx, cancel := context.WithCancel(context.Background())
	share := p.shareOf(lim.BytesPerSec)
	s := &Session{
		p:        p,
		id:       id,
		rules:    append([]manifest.NetRule(nil), rules...),
		maxBytes: max(lim.MaxBytes, 0),
		maxConns: p.maxConns,
		upRate:   newLimiter(share),
		downRate: newLimiter(share),
		ctx:      ctx,
		cancel:   cancel,
		conns:    make(map[io.Closer]struct{}),
	}
	s.used.Store(max(lim.UsedBytes, 0))
	s.initForward()
	return s
}

// Totals is a session's egress so far (since this Session was made).
type Totals struct {
	// Connections counts allowed connections and requests that have ended; Denied the
	// refused ones.
	Connections, Denied int64
	// BytesUp and BytesDown are the bytes this Session moved each way, as they crossed
	// (Record.BytesUp and BytesDown summed, headers and handshakes included).
	BytesUp, BytesDown int64
	// Used is what counts against resources.egress_max_bytes: the bytes carried plus the
	// usedBytes the Session began with. It is what to keep across a restart.
	Used int64
	// Active is how many connections and requests are open now.
	Active int
}

// Totals returns the session's counts.
func (s *Session) Totals() Totals {
	s.mu.Lock()
	active := s.active
	s.mu.Unlock()
	return Totals{
		Connections: s.allowed.Load(),
		Denied:      s.denied.Load(),
		BytesUp:     s.up.Load(),
		BytesDown:   s.down.Load(),
		Used:        s.used.Load(),
		Active:      active,
	}
}

// Close ends every open tunnel and request of the session and refuses new ones. Each
// still produces its Record.
func (s *Session) Close() {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = make(map[io.Closer]struct{})
	s.mu.Unlock()
	s.cancel()
	for c := range conns {
		_ = c.Close()
	}
	s.transport.CloseIdleConnections()
}

// track registers a connection for Close; it returns false (and closes c) when the
// session is already closed.
func (s *Session) track(c io.Closer) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = c.Close()
		return false
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	return true
}

func (s *Session) untrack(c io.Closer) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// acquire takes one of the session's connection slots.
func (s *Session) acquire() (ok, closed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return false, true
	case s.active >= s.maxConns:
		return false, false
	}
	s.active++
	return true, false
}

func (s *Session) release() {
	s.mu.Lock()
	s.active--
	s.mu.Unlock()
}

// take reserves up to n bytes of the budget and says how many may pass: fewer than n
// once the budget runs out, so a session gets exactly its budget, never a buffer more.
func (s *Session) take(n int) int {
	if n <= 0 {
		return 0
	}
	if s.maxBytes == 0 {
		s.used.Add(int64(n))
		return n
	}
	for {
		u := s.used.Load()
		left := s.maxBytes - u
		if left <= 0 {
			return 0
		}
		k := min(int64(n), left)
		if s.used.CompareAndSwap(u, u+k) {
			return int(k)
		}
	}
}

// exhausted says whether the budget is spent.
func (s *Session) exhausted() bool {
	return s.maxBytes > 0 && s.used.Load() >= s.maxBytes
}

// flow is one connection or request on its way to its Record.
type flow struct {
	s        *Session
	start    time.Time
	up, down atomic.Int64
	slot     bool
	once     sync.Once

	mu  sync.Mutex
	rec Record
}

func (s *Session) newFlow(proto string) *flow {
	now := time.Now()
	return &flow{s: s, start: now, rec: Record{Time: now, Proto: proto}}
}

func (f *flow) setDest(host string, port int) {
	f.mu.Lock()
	f.rec.Host, f.rec.Port = host, port
	f.mu.Unlock()
}

func (f *flow) setAddr(addr string) {
	f.mu.Lock()
	f.rec.Addr = addr
	f.mu.Unlock()
}

// cut marks an allowed flow as ended early, for why.
func (f *flow) cut(reason, detail string) {
	f.mu.Lock()
	if f.rec.Reason == "" {
		f.rec.Reason, f.rec.Detail = reason, detail
	}
	f.mu.Unlock()
}

// fail turns a flow denied (after it was admitted: its dial failed).
func (f *flow) fail(reason, detail string) {
	f.mu.Lock()
	f.rec.Decision, f.rec.Reason, f.rec.Detail = Denied, reason, detail
	f.mu.Unlock()
}

// count adds n bytes one way to the flow and the session.
func (f *flow) count(n int, up bool) {
	if n <= 0 {
		return
	}
	if up {
		f.up.Add(int64(n))
		f.s.up.Add(int64(n))
	} else {
		f.down.Add(int64(n))
		f.s.down.Add(int64(n))
	}
}

// budgetDetail says the budget ran out.
func (f *flow) budgetDetail() string {
	f.mu.Lock()
	h, p := f.rec.Host, f.rec.Port
	f.mu.Unlock()
	return fmt.Sprintf("egress to %s refused: the session has used its %d egress bytes (resources.egress_max_bytes)", hostPort(h, p), f.s.maxBytes)
}

// finish gives the flow's slot back and sends its one Record.
func (f *flow) finish() {
	f.once.Do(func() {
		if f.slot {
			f.s.release()
		}
		f.mu.Lock()
		r := f.rec
		f.mu.Unlock()
		if r.Decision == "" {
			r.Decision = Allowed
		}
		r.BytesUp, r.BytesDown = f.up.Load(), f.down.Load()
		r.Duration = time.Since(f.start)
		// Debug: the Auditor is the record; a hostile session's flood of refusals must not
		// flood the daemon's log too.
		log := f.s.p.log.With("session", f.s.id, "proto", r.Proto, "host", r.Host, "port", r.Port)
		if r.Decision == Denied {
			f.s.denied.Add(1)
			log.Debug("egress denied", "reason", r.Reason, "detail", r.Detail)
		} else {
			f.s.allowed.Add(1)
			log.Debug("egress ended", "addr", r.Addr, "rule", r.Rule, "up", r.BytesUp, "down", r.BytesDown, "duration", r.Duration, "reason", r.Reason)
		}
		f.s.p.audit.Egress(f.s.id, r)
	})
}

// deny ends a flow denied, at once.
func (f *flow) deny(reason, detail string) {
	f.fail(reason, detail)
	f.finish()
}

// hostPort joins a normalised host and a port, bracketing IPv6.
func hostPort(host string, port int) string {
	if host == "" {
		return "?"
	}
	return net.JoinHostPort(host, fmt.Sprint(port))
}
