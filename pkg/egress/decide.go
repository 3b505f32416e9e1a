package egress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"roost.dev/roost/pkg/manifest"
)

// errBadRequest marks a destination the proxy will not interpret.
var errBadRequest = errors.New("bad egress request")

var labelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// normaliseHost turns a destination host (no brackets) into the one spelling decisions
// use: an IP address in canonical form (an IPv4-mapped IPv6 address as its IPv4
// address), or a lowercase host name without its trailing dot. Anything else is refused
// rather than handed to a resolver that might read it its own way: names that are not
// letters, digits and hyphens, and names ending in a number, which C's inet_aton reads as
// an address ("127.1", "0x7f.1", "2130706433", "0177.0.0.1").
func normaliseHost(h string) (string, netip.Addr, error) {
	for i := 0; i < len(h); i++ {
		if h[i] < 0x21 || h[i] > 0x7e {
			return "", netip.Addr{}, fmt.Errorf("%w: host %q has a byte that is not printable ASCII (write an international name in its xn-- form)", errBadRequest, h)
		}
	}
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if h == "" {
		return "", netip.Addr{}, fmt.Errorf("%w: empty host", errBadRequest)
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return "", netip.Addr{}, fmt.Errorf("%w: %q: an address with a zone is not a destination", errBadRequest, h)
		}
		a = a.Unmap()
		return a.String(), a, nil
	}
	if len(h) > 253 {
		return "", netip.Addr{}, fmt.Errorf("%w: host name is %d characters; at most 253", errBadRequest, len(h))
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if !labelRE.MatchString(l) {
			return "", netip.Addr{}, fmt.Errorf("%w: %q is not a host name or IP address", errBadRequest, h)
		}
	}
	if numericLabel(labels[len(labels)-1]) {
		return "", netip.Addr{}, fmt.Errorf("%w: %q is not a host name (it ends in a number, which resolvers may read as an IPv4 address); write an address as a dotted quad", errBadRequest, h)
	}
	return h, netip.Addr{}, nil
}

// numericLabel says whether a label reads as a number to inet_aton: decimal digits, or 0x
// and hex digits.
func numericLabel(l string) bool {
	if hex, ok := strings.CutPrefix(l, "0x"); ok {
		return strings.Trim(hex, "0123456789abcdef") == ""
	}
	return l != "" && strings.Trim(l, "0123456789") == ""
}

// parsePort reads a decimal port from 1 to 65535.
func parsePort(p string) (int, error) {
	if p == "" || len(p) > 5 || strings.Trim(p, "0123456789") != "" {
		return 0, fmt.Errorf("%w: port %q is not a number from 1 to 65535", errBadRequest, p)
	}
	n, _ := strconv.Atoi(p)
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("%w: port %q is not a number from 1 to 65535", errBadRequest, p)
	}
	return n, nil
}

// target is a normalised destination.
type target struct {
	host string
	port int
	ip   netip.Addr // valid when host is an IP literal
}

// parseAuthority reads host[:port] as a CONNECT request or a URL carries it: an IPv6
// address in brackets, no user information. defaultPort 0 means a port is required.
func parseAuthority(s string, defaultPort int) (target, error) {
	if s == "" {
		return target{}, fmt.Errorf("%w: empty host", errBadRequest)
	}
	if strings.Contains(s, "@") {
		return target{}, fmt.Errorf("%w: %q has user information; the proxy takes none", errBadRequest, s)
	}
	var t target
	var port string
	var hasPort bool
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return target{}, fmt.Errorf("%w: %q: unclosed '['", errBadRequest, s)
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil || !a.Is6() || a.Zone() != "" {
			return target{}, fmt.Errorf("%w: %q: only an IPv6 address goes in brackets", errBadRequest, s)
		}
		rest := s[end+1:]
		if rest != "" {
			if rest[0] != ':' {
				return target{}, fmt.Errorf("%w: %q: expected ':port' after ']'", errBadRequest, s)
			}
			port, hasPort = rest[1:], true
		}
		t.ip = a.Unmap()
		t.host = t.ip.String()
	} else {
		var h string
		h, port, hasPort = strings.Cut(s, ":")
		if strings.Contains(port, ":") {
			return target{}, fmt.Errorf("%w: %q: an IPv6 address must be in brackets", errBadRequest, s)
		}
		var err error
		if t.host, t.ip, err = normaliseHost(h); err != nil {
			return target{}, err
		}
	}
	switch {
	case hasPort:
		n, err := parsePort(port)
		if err != nil {
			return target{}, err
		}
		t.port = n
	case defaultPort == 0:
		return target{}, fmt.Errorf("%w: %q has no port", errBadRequest, s)
	default:
		t.port = defaultPort
	}
	return t, nil
}

// authority spells a target as a URL's host[:port] (port left out when it is def).
func (t target) authority(def int) string {
	h := t.host
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if t.port == def {
		return h
	}
	return h + ":" + strconv.Itoa(t.port)
}

// denial is a refusal: its reason code and a sentence naming host, port and why.
type denial struct {
	reason, detail string
	// socks is the SOCKS5 reply code for it; 0 means the reason's usual one.
	socks byte
}

func (d *denial) Error() string { return d.detail }

// ruleAdmits says on which port (0 for any) a rule admits proto, and whether it admits
// proto at all. A bare host or host:port rule admits every protocol. For a forwarded
// request (plain http) a scheme rule must be http; CONNECT and SOCKS5 carry no scheme, so
// a scheme rule admits them on its port, or its scheme's default (https://h is h:443,
// http://h is h:80): a tunnel there is what a client of that URL opens.
func ruleAdmits(r manifest.NetRule, proto string) (port int, ok bool) {
	def := 443
	if r.Scheme == "http" {
		def = 80
	}
	switch {
	case r.Scheme == "":
		return r.Port, true
	case proto == ProtoHTTP && r.Scheme != "http":
		return 0, false
	case r.Port != 0:
		return r.Port, true
	default:
		return def, true
	}
}

// Covers says whether a rule of the session's network.allow names host, a name as a
// resolver is asked it, on any port or scheme: the names the session's resolver answers
// (pkg/resolver). An address, or a name the proxy would refuse to read, covers nothing.
func (s *Session) Covers(host string) bool {
	h, ip, err := normaliseHost(host)
	if err != nil || ip.IsValid() {
		return false
	}
	return slices.ContainsFunc(s.rules, func(r manifest.NetRule) bool { return r.Matches(h) })
}

// match finds the first rule admitting proto to t.
func (s *Session) match(proto string, t target) (manifest.NetRule, *denial) {
	var ports []int
	schemeOnly := false
	for _, r := range s.rules {
		if !r.Matches(t.host) {
			continue
		}
		port, ok := ruleAdmits(r, proto)
		if !ok {
			schemeOnly = true
			continue
		}
		if port != 0 && port != t.port {
			if !slices.Contains(ports, port) {
				ports = append(ports, port)
			}
			continue
		}
		return r, nil
	}
	dest := hostPort(t.host, t.port)
	switch {
	case len(ports) > 0:
		ps := make([]string, len(ports))
		for i, p := range ports {
			ps[i] = strconv.Itoa(p)
		}
		slices.Sort(ps)
		return manifest.NetRule{}, &denial{ReasonPortNotAllowed, fmt.Sprintf("egress to %s refused: network.allow admits %s only on port %s", dest, t.host, strings.Join(ps, ", ")), 0}
	case schemeOnly:
		return manifest.NetRule{}, &denial{ReasonSchemeNotAllowed, fmt.Sprintf("egress to %s refused: network.allow admits %s only over https (a CONNECT tunnel), not as a plain http request", dest, t.host), 0}
	case t.ip.IsValid():
		return manifest.NetRule{}, &denial{ReasonNotAllowed, fmt.Sprintf("egress to %s refused: no network.allow entry names the address %s (an address is reached only when an entry names it)", dest, t.host), 0}
	default:
		return manifest.NetRule{}, &denial{ReasonNotAllowed, fmt.Sprintf("egress to %s refused: no network.allow entry admits %s", dest, t.host), 0}
	}
}

// decision is an admitted connection: the rule that admitted it and the checked
// addresses to dial, in order.
type decision struct {
	rule  manifest.NetRule
	addrs []netip.AddrPort
}

// admit decides proto's connection to t. Admitted, the flow holds a connection slot; a
// refusal is returned for the caller to answer and the flow is left unfinished.
func (s *Session) admit(ctx context.Context, f *flow, proto string, t target) (decision, *denial) {
	f.setDest(t.host, t.port)
	dest := hostPort(t.host, t.port)
	rule, d := s.match(proto, t)
	if d != nil {
		return decision{}, d
	}
	f.mu.Lock()
	f.rec.Rule = rule.String()
	f.mu.Unlock()
	if s.exhausted() {
		return decision{}, &denial{ReasonEgressMaxBytes, f.budgetDetail(), 0}
	}
	switch ok, closed := s.acquire(); {
	case closed:
		return decision{}, &denial{ReasonSessionClosed, fmt.Sprintf("egress to %s refused: the session is ending", dest), 0}
	case !ok:
		return decision{}, &denial{ReasonMaxConnections, fmt.Sprintf("egress to %s refused: the session already has %d egress connections open, the most it may", dest, s.maxConns), 0}
	}
	f.slot = true
	if t.ip.IsValid() {
		// Only a rule naming this very address matches an address (Matches compares
		// addresses by value and a wildcard never matches one), so a special-purpose
		// address here is one the rules open on purpose — except the host's own, which
		// only the operator opens: a capsule's manifest must not reach roostd's loopback
		// services or the cloud's metadata service.
		a := t.ip.Unmap()
		if what, own := s.p.hostOwn(a); own && !s.p.permitted(a) {
			return decision{}, &denial{ReasonSpecialAddress, fmt.Sprintf("egress to %s refused: %s is the host's own (%s); a network.allow entry cannot open it, only roostd's egress.permit_cidrs naming it (%s)", dest, a, what, netip.PrefixFrom(a, a.BitLen())), 0}
		}
		return decision{rule: rule, addrs: []netip.AddrPort{netip.AddrPortFrom(t.ip, uint16(t.port))}}, nil
	}
	addrs, err := s.p.resolve(ctx, t.host)
	if err != nil {
		return decision{}, &denial{ReasonUnresolvable, fmt.Sprintf("egress to %s refused: %s does not resolve: %v", dest, t.host, err), 0}
	}
	var keep []netip.AddrPort
	var dropped []string
	hostsOwn := false
	for _, a := range addrs {
		a = a.Unmap()
		what, special := s.p.classify(a)
		if !special && s.p.hostAddrs.Contains(a) {
			// A public address of the host's own interface is the host's all the same.
			what, special, hostsOwn = hostAddrWhat, true, true
		}
		if special && !s.p.permitted(a) {
			dropped = append(dropped, fmt.Sprintf("%s (%s)", a, what))
			continue
		}
		ap := netip.AddrPortFrom(a, uint16(t.port))
		if !slices.Contains(keep, ap) {
			keep = append(keep, ap)
		}
	}
	if len(keep) == 0 {
		why := t.host + " resolves only to special-purpose addresses: " + strings.Join(dropped, ", ")
		if len(dropped) == 1 {
			why = strings.Replace(dropped[0], " (", " is a special-purpose address (", 1)
		}
		opens := "only an IP-literal rule or roostd's egress.permit_cidrs opens it"
		if hostsOwn {
			opens = "only roostd's egress.permit_cidrs opens the host's own addresses"
		}
		return decision{}, &denial{ReasonSpecialAddress, fmt.Sprintf("egress to %s refused: %s; %s", dest, why, opens), 0}
	}
	return decision{rule: rule, addrs: keep}, nil
}

// resolve answers a name from Hosts, else the resolver.
func (p *Proxy) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, ok := p.hosts[host]; ok {
		return []netip.Addr{a}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, ResolveTimeout)
	defer cancel()
	addrs, err := p.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		// The resolver's error names the host and the lookup already.
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, errors.New("no addresses")
	}
	return addrs, nil
}

// specialRange is a special-purpose block and what it is.
type specialRange struct {
	prefix netip.Prefix
	what   string
}

// specialRanges lists the blocks no session reaches by name: the host's own and its
// neighbours' (loopback, private, CGNAT, link-local with the clouds' metadata services,
// ULA), addresses that are not one destination (multicast, unspecified, broadcast), and
// those reserved or meant for documentation, benchmarks and translation (NAT64 reaches
// IPv4 through a translator, so it would reach the IPv4 specials). More specific first:
// the first match names it.
func specialRanges() []specialRange {
	list := []struct{ p, what string }{
		{"0.0.0.0/8", "unspecified, \"this network\""},
		{"10.0.0.0/8", "private, RFC 1918"},
		{"100.64.0.0/10", "shared address space, CGNAT"},
		{"127.0.0.0/8", "loopback"},
		{"169.254.0.0/16", "link-local; cloud metadata services live here"},
		{"172.16.0.0/12", "private, RFC 1918"},
		{"192.0.0.0/24", "IETF protocol assignments"},
		{"192.0.2.0/24", "documentation, TEST-NET-1"},
		{"192.168.0.0/16", "private, RFC 1918"},
		{"198.18.0.0/15", "benchmarking"},
		{"198.51.100.0/24", "documentation, TEST-NET-2"},
		{"203.0.113.0/24", "documentation, TEST-NET-3"},
		{"224.0.0.0/4", "multicast"},
		{"255.255.255.255/32", "broadcast"},
		{"240.0.0.0/4", "reserved"},
		{"::/128", "unspecified"},
		{"::1/128", "loopback"},
		{"::ffff:0:0/96", "IPv4-mapped"},
		{"::/96", "IPv4-compatible, deprecated"},
		{"64:ff9b::/96", "NAT64; reaches IPv4 addresses through a translator"},
		{"64:ff9b:1::/48", "local-use NAT64"},
		{"100::/64", "discard-only"},
		{"2001:db8::/32", "documentation"},
		{"fc00::/7", "unique local, ULA; fd00:ec2::254 is a cloud metadata service"},
		{"fe80::/10", "link-local"},
		{"fec0::/10", "site-local, deprecated"},
		{"ff00::/8", "multicast"},
	}
	out := make([]specialRange, len(list))
	for i, e := range list {
		out[i] = specialRange{netip.MustParsePrefix(e.p), e.what}
	}
	return out
}

// hostOwnRanges are the addresses that reach the host roostd runs on, or its cloud's
// metadata service, rather than a destination of the session's choosing.
var hostOwnRanges = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified, which reaches its loopback"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local, where cloud metadata services live"},
	{netip.MustParsePrefix("::/128"), "unspecified, which reaches its loopback"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "a cloud metadata service"},
}

// hostAddrWhat is what an address configured on one of roostd's interfaces is.
const hostAddrWhat = "an address of roostd's host, configured on one of its network interfaces, where services bound to 0.0.0.0 answer"

// hostOwn says whether a is one of the host's own addresses, and what it is: a fixed
// range, or an address an interface of roostd's network namespace holds now.
func (p *Proxy) hostOwn(a netip.Addr) (string, bool) {
	a = a.Unmap().WithZone("")
	for _, r := range hostOwnRanges {
		if r.prefix.Contains(a) {
			return r.what, true
		}
	}
	if p.hostAddrs.Contains(a) {
		return hostAddrWhat, true
	}
	return "", false
}

// noHostAddrs is HostAddrs when the operator's Config has none.
type noHostAddrs struct{}

func (noHostAddrs) Contains(netip.Addr) bool { return false }

// classify says whether a is special-purpose, and what it is.
func (p *Proxy) classify(a netip.Addr) (string, bool) {
	a = a.Unmap().WithZone("")
	for _, r := range p.special {
		if r.prefix.Contains(a) {
			return r.what, true
		}
	}
	return "", false
}

// permitted says whether the operator opened a.
func (p *Proxy) permitted(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	for _, pr := range p.permit {
		if pr.Contains(a) {
			return true
		}
	}
	return false
}
