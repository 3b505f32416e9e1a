// Package config reads roostd's configuration file (roostd --config): settings too long for
// flags. It is strict: an unknown key or a bad value stops the daemon with its line.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"roost.dev/roost/pkg/manifest"
)

// Config is the whole file.
type Config struct {
	Inference Inference `yaml:"inference"`
	Sessions  Sessions  `yaml:"sessions"`
	Env       Env       `yaml:"env"`
	Egress    Egress    `yaml:"egress"`
	Control   Control   `yaml:"control"`
	Remote    Remote    `yaml:"remote"`
	Fleet     Fleet     `yaml:"fleet"`
	// Hooks are the operator's WASM hooks (pkg/hooks runs them), in the order they run.
	Hooks []Hook `yaml:"hooks"`
}

// Hook is one operator-defined WASM hook: a WASI preview 1 module roost-wasm runs with
// the event's JSON on its stdin, no files and no environment.
type Hook struct {
	// Name names it in errors, events and metrics: [a-z0-9][a-z0-9-]*, unique.
	Name string `yaml:"name"`
	// On is its event: HookStage (before a session is staged; it may refuse it) or
	// HookSessionEnd (after a session's end is recorded; it is told, never asked).
	On string `yaml:"on"`
	// Module is the absolute path of its .wasm, a regular file when the file is loaded.
	Module string `yaml:"module"`
	// DeadlineSeconds bounds each run; DefaultHookDeadlineSeconds when 0, at most
	// MaxHookDeadlineSeconds.
	DeadlineSeconds int `yaml:"deadline_seconds"`
	// MemoryBytes bounds the module's linear memory; DefaultHookMemoryBytes when 0, at
	// most MaxHookMemoryBytes (all a 32-bit module can address).
	MemoryBytes int64 `yaml:"memory_bytes"`
	// OnOverflow is what a session_end hook does when its queue is full: HookOverflowDrop
	// (the default) or HookOverflowBlock. A stage hook has no queue and takes none.
	OnOverflow string `yaml:"on_overflow"`
}

// A hook's events and overflow behaviours.
const (
	HookStage         = "stage"
	HookSessionEnd    = "session_end"
	HookOverflowDrop  = "drop"
	HookOverflowBlock = "block"
)

// A hook's bounds.
const (
	DefaultHookDeadlineSeconds = 30
	MaxHookDeadlineSeconds     = 600
	DefaultHookMemoryBytes     = 64 << 20
	MaxHookMemoryBytes         = 4 << 30
)

// Deadline is the hook's deadline_seconds as a duration.
func (h *Hook) Deadline() time.Duration { return time.Duration(h.DeadlineSeconds) * time.Second }

func checkHooks(file string, hooks []Hook) error {
	seen := map[string]bool{}
	for i := range hooks {
		h := &hooks[i]
		at := fmt.Sprintf("%s: hooks[%d]", file, i)
		switch {
		case !capsuleNameRE.MatchString(h.Name):
			return fmt.Errorf("%s.name: %q is not a hook name ([a-z0-9][a-z0-9-]*)", at, h.Name)
		case seen[h.Name]:
			return fmt.Errorf("%s.name: %q is declared twice", at, h.Name)
		}
		seen[h.Name] = true
		if h.On != HookStage && h.On != HookSessionEnd {
			return fmt.Errorf("%s.on: %q: expected stage or session_end", at, h.On)
		}
		if !filepath.IsAbs(h.Module) {
			return fmt.Errorf("%s.module: %q: expected an absolute path", at, h.Module)
		}
		switch info, err := os.Stat(h.Module); {
		case err != nil:
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return fmt.Errorf("%s.module: %q: %w", at, h.Module, err)
		case !info.Mode().IsRegular():
			return fmt.Errorf("%s.module: %s is not a regular file", at, h.Module)
		}
		switch {
		case h.DeadlineSeconds < 0 || h.DeadlineSeconds > MaxHookDeadlineSeconds:
			return fmt.Errorf("%s.deadline_seconds: %d: expected 1 to %d", at, h.DeadlineSeconds, MaxHookDeadlineSeconds)
		case h.DeadlineSeconds == 0:
			h.DeadlineSeconds = DefaultHookDeadlineSeconds
		}
		switch {
		case h.MemoryBytes < 0 || h.MemoryBytes > MaxHookMemoryBytes:
			return fmt.Errorf("%s.memory_bytes: %d: expected 1 to %d (4 GiB)", at, h.MemoryBytes, int64(MaxHookMemoryBytes))
		case h.MemoryBytes == 0:
			h.MemoryBytes = DefaultHookMemoryBytes
		}
		switch {
		case h.On == HookStage && h.OnOverflow != "":
			return fmt.Errorf("%s.on_overflow: a stage hook runs while its caller waits and has no queue; on_overflow is for session_end hooks", at)
		case h.On == HookSessionEnd && h.OnOverflow == "":
			h.OnOverflow = HookOverflowDrop
		case h.On == HookSessionEnd && h.OnOverflow != HookOverflowDrop && h.OnOverflow != HookOverflowBlock:
			return fmt.Errorf("%s.on_overflow: %q: expected drop or block", at, h.OnOverflow)
		}
	}
	return nil
}

// Egress is how sessions' proxies reach the outside (network.allow).
type Egress struct {
	// Hosts are names answered before DNS: air-gapped sites, tests.
	Hosts map[string]string `yaml:"hosts"`
	// PermitCIDRs are special-purpose ranges (private, loopback, link-local, …) the operator
	// opens to every session's network.allow names.
	PermitCIDRs []string `yaml:"permit_cidrs"`
	// MaxConnectionsPerSession bounds each session's open egress connections together;
	// DefaultEgressConnections when 0.
	MaxConnectionsPerSession int `yaml:"max_connections_per_session"`
	// MaxBytesPerSecPerSession is the most bandwidth share (each way) any session gets,
	// whatever its resources.egress_bytes_per_sec declares; 0 for no ceiling.
	MaxBytesPerSecPerSession int64 `yaml:"max_bytes_per_sec_per_session"`
}

// DefaultEgressConnections is egress.max_connections_per_session's default.
const DefaultEgressConnections = 64

// HostAddrs is egress.hosts parsed (Parse has checked every entry).
func (e *Egress) HostAddrs() map[string]netip.Addr {
	out := map[string]netip.Addr{}
	for name, addr := range e.Hosts {
		out[strings.TrimSuffix(strings.ToLower(name), ".")] = netip.MustParseAddr(addr).Unmap()
	}
	return out
}

// Prefixes is egress.permit_cidrs parsed (Parse has checked every entry).
func (e *Egress) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, c := range e.PermitCIDRs {
		out = append(out, netip.MustParsePrefix(c).Masked())
	}
	return out
}

func (e *Egress) check(file string) error {
	for name, addr := range e.Hosts {
		host := strings.TrimSuffix(strings.ToLower(name), ".")
		_, notIP := netip.ParseAddr(host)
		if _, err := manifest.ParseNetRule(host); err != nil || notIP == nil || strings.ContainsAny(host, ":*") {
			return fmt.Errorf("%s: egress.hosts: %q is not a host name", file, name)
		}
		if _, err := netip.ParseAddr(addr); err != nil {
			return fmt.Errorf("%s: egress.hosts.%s: %q is not an IP address", file, name, addr)
		}
	}
	for i, c := range e.PermitCIDRs {
		if _, err := netip.ParsePrefix(c); err != nil {
			return fmt.Errorf("%s: egress.permit_cidrs[%d]: %q is not a CIDR prefix (10.213.0.0/24, fd00::/8)", file, i, c)
		}
	}
	switch {
	case e.MaxConnectionsPerSession < 0:
		return fmt.Errorf("%s: egress.max_connections_per_session: %d: must be more than 0", file, e.MaxConnectionsPerSession)
	case e.MaxConnectionsPerSession == 0:
		e.MaxConnectionsPerSession = DefaultEgressConnections
	}
	if e.MaxBytesPerSecPerSession < 0 {
		return fmt.Errorf("%s: egress.max_bytes_per_sec_per_session: %d: must be 0 (no ceiling) or more", file, e.MaxBytesPerSecPerSession)
	}
	return nil
}

// Control bounds roostd's control API (the gRPC service on its socket), so that no
// client — a dashboard following every session, a script that forgets its followers —
// can take the daemon's goroutines and memory; the operator's ps, stop and rm are unary
// calls, which no stream bound holds back.
type Control struct {
	// MaxStreams bounds the streams (followers of logs and events, exec, health watches)
	// open at once, all clients together; DefaultControlMaxStreams when 0.
	MaxStreams int `yaml:"max_streams"`
	// MaxStreamsPerClient bounds one client's: a process, by the peer credentials of its
	// connections, however many it opens; DefaultControlMaxStreamsPerClient when 0.
	MaxStreamsPerClient int `yaml:"max_streams_per_client"`
	// MaxRecvMessageBytes bounds a message roostd receives; DefaultControlMaxRecvMessageBytes
	// when 0.
	MaxRecvMessageBytes int `yaml:"max_recv_message_bytes"`
	// MaxSendMessageBytes bounds a message roostd sends; DefaultControlMaxSendMessageBytes
	// when 0.
	MaxSendMessageBytes int `yaml:"max_send_message_bytes"`
	// StreamSendTimeoutSeconds is how long a stream's client may leave a message unread
	// before roostd ends the stream (ResourceExhausted) rather than hold it;
	// DefaultControlStreamSendTimeoutSeconds when 0.
	StreamSendTimeoutSeconds int `yaml:"stream_send_timeout_seconds"`
}

// Control's defaults. A follower costs about 45 KiB of roostd's memory (20,000 took
// 0.9 GB), so the total bounds that to some 45 MiB; the per-client bound leaves a busy
// dashboard room and others the rest. Messages: roost's requests are small, and a client's
// default receive bound (gRPC's 4 MiB) is what roostd sends at most.
const (
	DefaultControlMaxStreams               = 1024
	DefaultControlMaxStreamsPerClient      = 256
	DefaultControlMaxRecvMessageBytes      = 1 << 20
	DefaultControlMaxSendMessageBytes      = 4 << 20
	DefaultControlStreamSendTimeoutSeconds = 30
	// maxControlMessageBytes is gRPC's own ceiling (a message's length is 32 bits).
	maxControlMessageBytes = 1<<31 - 1
)

// StreamSendTimeout is stream_send_timeout_seconds as a duration.
func (c *Control) StreamSendTimeout() time.Duration {
	return time.Duration(c.StreamSendTimeoutSeconds) * time.Second
}

// WithDefaults is c with every unset bound at its default.
func (c Control) WithDefaults() Control {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.MaxStreams, DefaultControlMaxStreams)
	def(&c.MaxStreamsPerClient, DefaultControlMaxStreamsPerClient)
	def(&c.MaxRecvMessageBytes, DefaultControlMaxRecvMessageBytes)
	def(&c.MaxSendMessageBytes, DefaultControlMaxSendMessageBytes)
	def(&c.StreamSendTimeoutSeconds, DefaultControlStreamSendTimeoutSeconds)
	return c
}

func (c *Control) check(file string) error {
	for _, f := range []struct {
		name string
		v    int
		max  int
	}{
		{"max_streams", c.MaxStreams, 1 << 20},
		{"max_streams_per_client", c.MaxStreamsPerClient, 1 << 20},
		{"max_recv_message_bytes", c.MaxRecvMessageBytes, maxControlMessageBytes},
		{"max_send_message_bytes", c.MaxSendMessageBytes, maxControlMessageBytes},
		{"stream_send_timeout_seconds", c.StreamSendTimeoutSeconds, 3600},
	} {
		if f.v < 0 || f.v > f.max {
			return fmt.Errorf("%s: control.%s: %d: expected 1 to %d (0 or unset for the default)", file, f.name, f.v, f.max)
		}
	}
	*c = c.WithDefaults()
	if c.MaxStreamsPerClient > c.MaxStreams {
		return fmt.Errorf("%s: control.max_streams_per_client: %d: must be at most control.max_streams (%d)", file, c.MaxStreamsPerClient, c.MaxStreams)
	}
	return nil
}

// Remote is the remote listener (pkg/remote, docs/remote.md): the control API over TCP with
// TLS 1.3 and client certificates, off unless listen is set (here or by --listen-tcp; each
// flag overrides its key).
type Remote struct {
	// Listen is HOST:PORT.
	Listen string `yaml:"listen"`
	// TLSCert and TLSKey are the server's certificate and key (PEM files).
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
	// ClientCA is the PEM file of the CA clients' certificates must chain to.
	ClientCA string `yaml:"client_ca"`
	// Clients give a certificate's Common Name its role; others are refused.
	Clients []RemoteClient `yaml:"clients"`
}

// RemoteClient is one remote client: its certificate's Common Name and its role.
type RemoteClient struct {
	CommonName string `yaml:"common_name"`
	// Role is RoleOperator (every call), RoleReader (the read calls only) or RoleNode
	// (another node of the fleet).
	Role string `yaml:"role"`
}

// The remote clients' roles.
const (
	RoleOperator = "operator"
	RoleReader   = "reader"
	// RoleNode is another roostd of the fleet, which forwards its callers' calls about
	// sessions this one holds (docs/fleet.md, "Routed calls").
	RoleNode = "node"
)

func (r *Remote) check(file string) error {
	if r.Listen != "" {
		host, port, err := net.SplitHostPort(r.Listen)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
			return fmt.Errorf("%s: remote.listen: %q: expected HOST:PORT (127.0.0.1:7443, [::1]:7443)", file, r.Listen)
		}
		if host == "" {
			return fmt.Errorf("%s: remote.listen: %q: name the address to listen on (0.0.0.0:%s for every IPv4 address)", file, r.Listen, port)
		}
	}
	for _, f := range []struct{ key, path string }{{"tls_cert", r.TLSCert}, {"tls_key", r.TLSKey}, {"client_ca", r.ClientCA}} {
		if f.path != "" && !filepath.IsAbs(f.path) {
			return fmt.Errorf("%s: remote.%s: %q: expected an absolute path", file, f.key, f.path)
		}
	}
	seen := map[string]bool{}
	for i, c := range r.Clients {
		at := fmt.Sprintf("%s: remote.clients[%d]", file, i)
		switch {
		case strings.TrimSpace(c.CommonName) == "":
			return fmt.Errorf("%s.common_name: required: the Common Name of the client's certificate", at)
		case seen[c.CommonName]:
			return fmt.Errorf("%s.common_name: %q is listed twice", at, c.CommonName)
		case c.Role != RoleOperator && c.Role != RoleReader && c.Role != RoleNode:
			return fmt.Errorf("%s.role: %q: expected operator, reader or node", at, c.Role)
		}
		seen[c.CommonName] = true
	}
	return nil
}

// Fleet makes roostd a node of a fleet ledger (pkg/fleet, docs/fleet.md): one daily token
// ceiling across many roostd nodes, kept in etcd. Off unless etcd is set (here or by
// --fleet-etcd; each flag overrides its key).
type Fleet struct {
	// Etcd are the etcd members' client URLs (http://host:port or https://host:port).
	Etcd []string `yaml:"etcd"`
	// NodeName is this roostd's name in the fleet, unique in it and kept across restarts.
	NodeName string `yaml:"node_name"`
	// EtcdCA, EtcdCert and EtcdKey are the PEM files of the CA the members' certificates
	// chain to, and of this client's certificate and key (both or neither).
	EtcdCA   string `yaml:"etcd_ca"`
	EtcdCert string `yaml:"etcd_cert"`
	EtcdKey  string `yaml:"etcd_key"`
	// NodeTLS is what the node presents to the other nodes' remote listeners when it
	// forwards a call about a session one of them holds.
	NodeTLS NodeTLS `yaml:"node_tls"`
}

// NodeTLS is a node's side of the fleet's node-to-node mTLS (docs/fleet.md, "Routed
// calls"): its client certificate, whose Common Name is its node name, and the CA the other
// nodes' listeners' certificates chain to (remote.client_ca when unset).
type NodeTLS struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	CA   string `yaml:"ca"`
}

func (f *Fleet) check(file string) error {
	for i, ep := range f.Etcd {
		if !strings.HasPrefix(ep, "http://") && !strings.HasPrefix(ep, "https://") {
			return fmt.Errorf("%s: fleet.etcd[%d]: %q: expected a client URL, http://host:port or https://host:port", file, i, ep)
		}
	}
	for _, p := range []struct{ key, path string }{{"etcd_ca", f.EtcdCA}, {"etcd_cert", f.EtcdCert}, {"etcd_key", f.EtcdKey}} {
		if p.path != "" && !filepath.IsAbs(p.path) {
			return fmt.Errorf("%s: fleet.%s: %q: expected an absolute path", file, p.key, p.path)
		}
	}
	if (f.EtcdCert == "") != (f.EtcdKey == "") {
		return fmt.Errorf("%s: fleet.etcd_cert and fleet.etcd_key: give both or neither", file)
	}
	for _, p := range []struct{ key, path string }{{"cert", f.NodeTLS.Cert}, {"key", f.NodeTLS.Key}, {"ca", f.NodeTLS.CA}} {
		if p.path != "" && !filepath.IsAbs(p.path) {
			return fmt.Errorf("%s: fleet.node_tls.%s: %q: expected an absolute path", file, p.key, p.path)
		}
	}
	if (f.NodeTLS.Cert == "") != (f.NodeTLS.Key == "") {
		return fmt.Errorf("%s: fleet.node_tls.cert and fleet.node_tls.key: give both or neither", file)
	}
	if f.NodeTLS.CA != "" && f.NodeTLS.Cert == "" {
		return fmt.Errorf("%s: fleet.node_tls.ca: set fleet.node_tls.cert and key too: the CA is of the listeners this node forwards calls to", file)
	}
	if f.NodeTLS.Cert != "" && len(f.Etcd) == 0 {
		return fmt.Errorf("%s: fleet.node_tls: set fleet.etcd too (a node of which fleet?)", file)
	}
	if f.NodeName != "" && len(f.Etcd) == 0 {
		return fmt.Errorf("%s: fleet.node_name: %q: set fleet.etcd too (a node of which fleet?)", file, f.NodeName)
	}
	return nil
}

// Sessions is how roostd runs sessions' processes.
type Sessions struct {
	// AllowRoot names capsules whose sessions may run as host root when they are not
	// sealed (a sealed session's root is always a user namespace's). Everything else runs
	// as an unprivileged uid of its own.
	AllowRoot []string `yaml:"allow_root"`
	// IDs is the host uid/gid range sessions' ids are allocated from.
	IDs IDRange `yaml:"ids"`
	// HostPaths are host trees (toolchains outside /usr: /opt/…, rustup's, nvm's) a capsule
	// may ask to read with filesystem.host_read: bound read-only into a sealed root,
	// readable by a scoped session's Landlock rules.
	HostPaths []string `yaml:"host_paths"`
	// DescriptorsPerSession is the most descriptors roostd holds for one session besides
	// its endpoint connections (which resources.endpoint_max_connections bounds): its
	// egress sockets, pooled ones included, and its model calls. 0 derives it from roostd's
	// open-file limit at start: a sixteenth of what the limit leaves sessions after the
	// operator's reserve (fdbudget.DefaultShare), so one runaway session leaves the others
	// fifteen-sixteenths.
	DescriptorsPerSession int64 `yaml:"descriptors_per_session"`
}

// IDRange is a block of host uids (and the same gids) that roostd owns: no user of the host
// may hold one. It is cut into Slots ranges of IDsPerSession ids, one per session.
type IDRange struct {
	// First is the range's first id; DefaultFirstID when 0.
	First uint32 `yaml:"first"`
	// Slots is how many sessions can hold a range at once; DefaultIDSlots when 0.
	Slots uint32 `yaml:"slots"`
	// PerTree bounds the ranges one delegation tree holds at once: its top-level session
	// and every session below it, live or ended, until removed. DefaultRangesPerTree (at
	// most Spawns+1) when 0.
	PerTree uint32 `yaml:"per_tree"`
	// Spawns bounds the ranges all spawned sessions hold together, so that what is left of
	// the block stays the operator's; the block's sessions' ranges less an eighth (at least
	// one) when 0.
	Spawns uint32 `yaml:"spawns"`
}

// DefaultRangesPerTree is sessions.ids.per_tree when unset.
const DefaultRangesPerTree = 256

// IDsPerSession is how many ids a session's range holds: a sealed session maps them to
// 0..65535 in its user namespace; a session of another class runs as the first.
const IDsPerSession = 65536

// DefaultFirstID and DefaultIDSlots place sessions in 0x70000000…0x7FFDFFFF, which the
// systemd UID/GID allocation table leaves unused: above nspawn's container ranges
// (0x00080000…0x6FFFFFFF), below the foreign range (0x7FFE0000…) and the ids that
// 32-bit-signed tools mishandle.
const (
	DefaultFirstID uint32 = 0x70000000
	DefaultIDSlots uint32 = (0x7FFE0000 - 0x70000000) / IDsPerSession
)

// Env is what reaches sessions from roostd's own environment.
type Env struct {
	// Passthrough lists the host variables a capsule's env.allow may draw; nothing else of
	// roostd's environment reaches a session, whatever the capsule asks.
	Passthrough []string `yaml:"passthrough"`
}

// Inference declares the model upstreams the inference gateway may forward to.
type Inference struct {
	Upstreams []Upstream `yaml:"upstreams"`
	// MaxBodyBytesInFlight bounds the request-body bytes the gateway holds for all sessions
	// at once (DefaultMaxBodyBytesInFlight when 0): a call whose body would pass it is
	// refused (503, retryable) before its body is read.
	MaxBodyBytesInFlight int64 `yaml:"max_body_bytes_in_flight"`
	// MaxCallsPerSession bounds one session's calls through the gateway at once
	// (DefaultMaxCallsPerSession when 0): the next is refused (429, retryable).
	MaxCallsPerSession int `yaml:"max_calls_per_session"`
}

// The gateway's bounds as shipped: room for eight of the largest calls (32 MiB, the
// endpoint's bound) at once, four a session — so two sessions at their most leave room.
const (
	DefaultMaxBodyBytesInFlight = 256 << 20
	DefaultMaxCallsPerSession   = 4
)

// Upstream is one model API.
type Upstream struct {
	Name       string `yaml:"name"`
	Format     string `yaml:"format"`
	URL        string `yaml:"url"`
	APIKeyFile string `yaml:"api_key_file"`
	// DefaultMaxOutputTokens is what a request that sets no output limit is admitted for
	// (DefaultMaxOutputTokens when 0).
	DefaultMaxOutputTokens int64 `yaml:"default_max_output_tokens"`
	// Models are the model names the spend metrics keep as their model label, besides a
	// capsule's own inference.model; a call naming any other model counts as "other".
	Models []string `yaml:"models"`
	// Routes are forwarded besides the built-in routes of the upstream's format.
	Routes []Route `yaml:"routes"`
}

// Route is one API route the operator lets sessions call on an upstream besides the built-in
// ones of its format (pkg/gateway lists those).
type Route struct {
	// Method is GET, POST, PUT, PATCH or DELETE.
	Method string `yaml:"method"`
	// Path is the route as a client names it under $ROOST_ENDPOINT/v1/inference/<upstream>/
	// and as it is sent after the upstream's url ("v1/audio/speech"). A segment {name}
	// stands for any one segment ("v1/files/{id}/content").
	Path string `yaml:"path"`
	// Metered must be said: false forwards the route without admission and never charges
	// it; true admits each call for Tokens and settles it from the usage the answer reports
	// in a shape the gateway reads, else charges Tokens.
	Metered *bool `yaml:"metered"`
	// Tokens is what a call of a metered route is admitted for: its worst case.
	Tokens int64 `yaml:"tokens"`
	// Query names the query parameters forwarded; a call carrying any other is refused.
	Query []string `yaml:"query"`
}

// RouteMethods are the methods a declared route may have.
var RouteMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}

// builtinRoutes are the routes pkg/gateway forwards for each format on its own, with {}
// for a wildcard segment; a declared route may not repeat one (pkg/gateway's tests hold
// the two lists together).
var builtinRoutes = map[string][]string{
	FormatOpenAI: {"POST v1/chat/completions", "POST v1/responses", "POST v1/completions", "POST v1/embeddings",
		"GET v1/models", "GET v1/models/{}"},
	FormatAnthropic: {"POST v1/messages", "POST v1/messages/count_tokens", "GET v1/models", "GET v1/models/{}"},
}

// maxRouteTokens bounds a metered route's admission as the ledger does (ledger.MaxTokens).
const maxRouteTokens = 1 << 40

var (
	routeSegmentRE  = regexp.MustCompile(`^[A-Za-z0-9_~:@-][A-Za-z0-9._~:@-]*$`)
	routeWildcardRE = regexp.MustCompile(`^\{[A-Za-z_][A-Za-z0-9_]*\}$`)
	queryNameRE     = regexp.MustCompile(`^[A-Za-z0-9_.\[\]-]+$`)
)

// RouteKey is a route's method and path with every wildcard segment written {}: two routes
// with the same key match the same calls.
func RouteKey(method, path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if routeWildcardRE.MatchString(s) {
			segs[i] = "{}"
		}
	}
	return method + " " + strings.Join(segs, "/")
}

// checkRoutes validates an upstream's models and declared routes.
func (u *Upstream) checkRoutes(at string) error {
	models := map[string]bool{}
	for j, m := range u.Models {
		switch {
		case m == "" || len(m) > 256 || strings.ContainsFunc(m, func(r rune) bool { return r < 0x20 || r == 0x7f }):
			return fmt.Errorf("%s.models[%d]: %q: expected a model name (1 to 256 printable characters)", at, j, m)
		case m == "other":
			return fmt.Errorf("%s.models[%d]: \"other\" is the label of every model not listed", at, j)
		case models[m]:
			return fmt.Errorf("%s.models[%d]: %q is listed twice", at, j, m)
		}
		models[m] = true
	}
	seen := map[string]bool{}
	for _, b := range builtinRoutes[u.Format] {
		seen[b] = true
	}
	for j := range u.Routes {
		r := &u.Routes[j]
		rat := fmt.Sprintf("%s.routes[%d]", at, j)
		if !slices.Contains(RouteMethods, r.Method) {
			return fmt.Errorf("%s.method: %q: expected one of %s", rat, r.Method, strings.Join(RouteMethods, ", "))
		}
		r.Path = strings.TrimPrefix(r.Path, "/")
		if r.Path == "" {
			return fmt.Errorf("%s.path: a route's path is required (e.g. v1/audio/speech)", rat)
		}
		for _, seg := range strings.Split(r.Path, "/") {
			if !routeSegmentRE.MatchString(seg) && !routeWildcardRE.MatchString(seg) {
				return fmt.Errorf("%s.path: %q: segment %q: expected letters, digits and _~:@-. (not leading with '.'), or a {name} wildcard", rat, r.Path, seg)
			}
		}
		key := RouteKey(r.Method, r.Path)
		if seen[key] {
			return fmt.Errorf("%s: %s %s is built in or declared before", rat, r.Method, r.Path)
		}
		seen[key] = true
		switch {
		case r.Metered == nil:
			return fmt.Errorf("%s.metered: say whether the gateway meters %s %s: metered: false forwards it uncharged; metered: true with tokens: N admits each call for N", rat, r.Method, r.Path)
		case *r.Metered && (r.Tokens <= 0 || r.Tokens > maxRouteTokens):
			return fmt.Errorf("%s.tokens: %d: a metered route needs what a call is admitted for, 1 to %d", rat, r.Tokens, int64(maxRouteTokens))
		case !*r.Metered && r.Tokens != 0:
			return fmt.Errorf("%s.tokens: %d: an unmetered route is never charged; drop tokens or say metered: true", rat, r.Tokens)
		}
		for k, q := range r.Query {
			if !queryNameRE.MatchString(q) {
				return fmt.Errorf("%s.query[%d]: %q is not a query parameter name", rat, k, q)
			}
		}
	}
	return nil
}

// DefaultMaxOutputTokens is the output a call without its own limit is admitted for.
const DefaultMaxOutputTokens = 4096

// The upstream formats.
const (
	FormatOpenAI    = "openai"
	FormatAnthropic = "anthropic"
)

var (
	nameRE        = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	capsuleNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
	envNameRE     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

func (s *Sessions) check(file string) error {
	if s.DescriptorsPerSession < 0 {
		return fmt.Errorf("%s: sessions.descriptors_per_session: %d: must be more than 0 (or 0 for a sixteenth of what roostd's open-file limit leaves sessions)", file, s.DescriptorsPerSession)
	}
	for i, n := range s.AllowRoot {
		if !capsuleNameRE.MatchString(n) {
			return fmt.Errorf("%s: sessions.allow_root[%d]: %q is not a capsule name ([a-z0-9][a-z0-9-]*)", file, i, n)
		}
	}
	for i, p := range s.HostPaths {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("%s: sessions.host_paths[%d]: %q: give a clean absolute path other than /", file, i, p)
		}
	}
	if s.IDs.First == 0 {
		s.IDs.First = DefaultFirstID
	}
	if s.IDs.Slots == 0 {
		s.IDs.Slots = DefaultIDSlots
	}
	// The first range is roostd's own; of the others an eighth (at least one) is kept
	// from spawns.
	forSessions := s.IDs.Slots - 1
	if s.IDs.Spawns == 0 && forSessions > 1 {
		s.IDs.Spawns = forSessions - max(1, forSessions/8)
	}
	if s.IDs.PerTree == 0 {
		s.IDs.PerTree = min(DefaultRangesPerTree, s.IDs.Spawns+1)
	}
	switch {
	case forSessions > 1 && s.IDs.Spawns >= forSessions:
		return fmt.Errorf("%s: sessions.ids.spawns: %d: must be below the %d ranges sessions.ids.slots leaves sessions, so that spawns cannot take them all", file, s.IDs.Spawns, forSessions)
	}
	// Below 65536 live the host's own users; the last id must stay below (uid_t)-1, which
	// means "no id", and 65534-style overflow ids.
	end := uint64(s.IDs.First) + uint64(s.IDs.Slots)*IDsPerSession
	switch {
	case s.IDs.First < IDsPerSession:
		return fmt.Errorf("%s: sessions.ids.first: %d: must be at least %d (the host's own users live below)", file, s.IDs.First, IDsPerSession)
	case end > 1<<32-1:
		return fmt.Errorf("%s: sessions.ids: %d slots of %d ids from %d pass the last uid (%d)", file, s.IDs.Slots, IDsPerSession, s.IDs.First, uint64(1<<32-2))
	}
	return nil
}

// Defaults is the configuration of a roostd started without --config.
func Defaults() *Config {
	c, _ := Parse(nil, "defaults")
	return c
}

// CheckSecrets refuses api_key_files other users may read or write: sessions run as
// unprivileged uids, and a key they can read is theirs.
func (c *Config) CheckSecrets() error {
	for i, u := range c.Inference.Upstreams {
		info, err := os.Stat(u.APIKeyFile)
		if err != nil {
			// A key missing now may be written later; calls fail until it is.
			continue
		}
		if perm := info.Mode().Perm(); perm&0o007 != 0 {
			return fmt.Errorf("inference.upstreams[%d].api_key_file %s: mode %04o lets other users (sessions among them) use the key: chmod 600 it", i, u.APIKeyFile, perm)
		}
	}
	return nil
}

// Load reads and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path)
}

// Parse reads and validates a configuration; file names it in errors.
func Parse(data []byte, file string) (*Config, error) {
	var c Config
	if err := decodeFile(data, file, &c); err != nil {
		return nil, err
	}
	if err := c.Sessions.check(file); err != nil {
		return nil, err
	}
	if err := c.Egress.check(file); err != nil {
		return nil, err
	}
	if err := c.Control.check(file); err != nil {
		return nil, err
	}
	if err := c.Remote.check(file); err != nil {
		return nil, err
	}
	if err := c.Fleet.check(file); err != nil {
		return nil, err
	}
	if err := checkHooks(file, c.Hooks); err != nil {
		return nil, err
	}
	for i, v := range c.Env.Passthrough {
		if !envNameRE.MatchString(v) {
			return nil, fmt.Errorf("%s: env.passthrough[%d]: %q is not a variable name", file, i, v)
		}
	}
	switch inf := &c.Inference; {
	case inf.MaxBodyBytesInFlight < 0:
		return nil, fmt.Errorf("%s: inference.max_body_bytes_in_flight: %d: must be more than 0", file, inf.MaxBodyBytesInFlight)
	case inf.MaxBodyBytesInFlight == 0:
		inf.MaxBodyBytesInFlight = DefaultMaxBodyBytesInFlight
	}
	switch inf := &c.Inference; {
	case inf.MaxCallsPerSession < 0:
		return nil, fmt.Errorf("%s: inference.max_calls_per_session: %d: must be more than 0", file, inf.MaxCallsPerSession)
	case inf.MaxCallsPerSession == 0:
		inf.MaxCallsPerSession = DefaultMaxCallsPerSession
	}
	seen := map[string]bool{}
	for i, u := range c.Inference.Upstreams {
		at := fmt.Sprintf("%s: inference.upstreams[%d]", file, i)
		if !nameRE.MatchString(u.Name) {
			return nil, fmt.Errorf("%s.name: %q is not a name (letters, digits, '.', '_', '-')", at, u.Name)
		}
		if seen[u.Name] {
			return nil, fmt.Errorf("%s.name: %q is declared twice", at, u.Name)
		}
		seen[u.Name] = true
		if u.Format != FormatOpenAI && u.Format != FormatAnthropic {
			return nil, fmt.Errorf("%s.format: %q: expected openai or anthropic", at, u.Format)
		}
		if parsed, err := url.Parse(u.URL); err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
			return nil, fmt.Errorf("%s.url: %q: expected an http:// or https:// URL", at, u.URL)
		}
		if !filepath.IsAbs(u.APIKeyFile) {
			return nil, fmt.Errorf("%s.api_key_file: %q: expected an absolute path", at, u.APIKeyFile)
		}
		switch {
		case u.DefaultMaxOutputTokens < 0:
			return nil, fmt.Errorf("%s.default_max_output_tokens: %d: must be more than 0", at, u.DefaultMaxOutputTokens)
		case u.DefaultMaxOutputTokens == 0:
			c.Inference.Upstreams[i].DefaultMaxOutputTokens = DefaultMaxOutputTokens
		}
		if err := c.Inference.Upstreams[i].checkRoutes(at); err != nil {
			return nil, err
		}
	}
	return &c, nil
}
