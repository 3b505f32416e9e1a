package manifest

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// NetRule is one network.allow entry. Scheme and Port are empty/zero when the entry left
// them out: a bare host covers every scheme and port of it.
//
// Host is lowercase. It is a host name, an IP address in its canonical form (an
// IPv4-mapped IPv6 address is stored as the IPv4 address it maps, so one address has one
// spelling), or a wildcard "*.example.com". A wildcard matches every subdomain of
// example.com at any depth (a.example.com, x.a.example.com) but never example.com itself:
// the apex needs an entry of its own.
type NetRule struct {
	Scheme string
	Host   string
	Port   int
}

var labelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// wildcardPrefix starts a wildcard rule's host.
const wildcardPrefix = "*."

// ParseNetRule reads an entry in one of the three forms: host, host:port,
// scheme://host[:port]. The host is a host name, an IPv4 address, an IPv6 address in
// brackets, or "*." followed by a host name of at least two labels (a wildcard: any
// subdomain, not the apex).
func ParseNetRule(entry string) (NetRule, error) {
	var r NetRule
	fail := func(why string) (NetRule, error) {
		return NetRule{}, fmt.Errorf("%q is not a network.allow entry (host, host:port, scheme://host[:port]; host may be *.domain): %s", entry, why)
	}
	rest := entry
	if scheme, after, ok := strings.Cut(rest, "://"); ok {
		if scheme != "http" && scheme != "https" {
			return fail(fmt.Sprintf("scheme %q is not http or https", scheme))
		}
		r.Scheme, rest = scheme, after
	}
	if strings.ContainsAny(rest, "/?#@ \t") {
		return fail("only a host and a port may follow the scheme")
	}
	host, port := rest, ""
	bracketed := strings.HasPrefix(rest, "[")
	if bracketed {
		end := strings.Index(rest, "]")
		if end < 0 {
			return fail("unclosed '[' around an IPv6 address")
		}
		host, port = rest[1:end], rest[end+1:]
		if port != "" && !strings.HasPrefix(port, ":") {
			return fail("expected ':port' after the IPv6 address")
		}
		port = strings.TrimPrefix(port, ":")
		if port == "" && strings.HasSuffix(rest, ":") {
			return fail("empty port")
		}
	} else if h, p, ok := strings.Cut(rest, ":"); ok {
		host, port = h, p
		if port == "" {
			return fail("empty port")
		}
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return fail(fmt.Sprintf("port %q is not a number from 1 to 65535", port))
		}
		r.Port = n
	}
	if host == "" {
		return fail("empty host")
	}
	if bracketed {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return fail(fmt.Sprintf("%q is not an IPv6 address", host))
		}
		// An IPv4-mapped address reaches the IPv4 address it maps: store that, so the rule
		// matches however a client spells the destination.
		r.Host = a.Unmap().String()
		return r, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !a.Is4() {
			return fail(fmt.Sprintf("IPv6 address %q must be in brackets", host))
		}
		r.Host = a.String()
		return r, nil
	}
	lower := strings.ToLower(host)
	if base, ok := strings.CutPrefix(lower, wildcardPrefix); ok {
		if err := checkWildcardBase(base); err != nil {
			return fail(err.Error())
		}
		r.Host = lower
		return r, nil
	}
	if err := checkHostname(lower); err != nil {
		return fail(err.Error())
	}
	r.Host = lower
	return r, nil
}

// checkWildcardBase checks what follows "*." in a wildcard: a host name of at least two
// labels, so that "*.com" (a whole top-level domain) and "*.1.2.3.4" (an address) are
// refused, as is a second "*" anywhere.
func checkWildcardBase(base string) error {
	if strings.Contains(base, "*") {
		return fmt.Errorf("'*' may only stand as the whole first label")
	}
	if _, err := netip.ParseAddr(base); err == nil {
		return fmt.Errorf("a wildcard cannot cover an IP address")
	}
	if err := checkHostname(base); err != nil {
		return err
	}
	if !strings.Contains(base, ".") {
		return fmt.Errorf("a wildcard must be followed by at least two labels (*.example.com, not *.%s)", base)
	}
	return nil
}

// checkHostname checks a lowercase host name: letters, digits and hyphens in labels of
// 1 to 63 characters, at most 253 in all, and a last label that is not a number. A name
// ending in a number ("127.1", "0x7f.1", "2130706433", "0177.0.0.1") is what C's
// inet_aton reads as an IPv4 address; such names are refused rather than left for a
// resolver to interpret, and an address must be written as a dotted quad.
func checkHostname(h string) error {
	if len(h) > 253 {
		return fmt.Errorf("host name is %d characters; at most 253", len(h))
	}
	if strings.Contains(h, "*") {
		return fmt.Errorf("'*' may only stand as the whole first label, followed by at least two labels (*.example.com)")
	}
	labels := strings.Split(h, ".")
	for _, label := range labels {
		if !labelRE.MatchString(label) {
			return fmt.Errorf("%q is not a host name", h)
		}
	}
	if numericLabel(labels[len(labels)-1]) {
		return fmt.Errorf("%q ends in a number, which resolvers may read as an IPv4 address; write an address as a dotted quad", h)
	}
	return nil
}

// numericLabel says whether a label reads as a number in inet_aton's (and the WHATWG URL
// standard's) sense: decimal digits, or 0x followed by hex digits (or nothing).
func numericLabel(l string) bool {
	if l == "" {
		return false
	}
	if hex, ok := strings.CutPrefix(l, "0x"); ok {
		for _, c := range hex {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
		return true
	}
	for _, c := range l {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// IsWildcard says whether the rule's host is a wildcard (*.example.com).
func (r NetRule) IsWildcard() bool {
	return strings.HasPrefix(r.Host, wildcardPrefix)
}

// Matches says whether the rule's host admits host, a lowercase name without a trailing
// dot or an IP address (compared by value: "::ffff:1.2.3.4" is 1.2.3.4). A wildcard
// admits any name strictly beneath its base, never the base itself and never an address.
// Scheme and port are not considered.
func (r NetRule) Matches(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "" {
		return false
	}
	if base, ok := strings.CutPrefix(r.Host, wildcardPrefix); ok {
		if _, err := netip.ParseAddr(host); err == nil {
			return false
		}
		sub, ok := strings.CutSuffix(host, "."+base)
		return ok && sub != "" && !strings.HasSuffix(sub, ".")
	}
	if a, err := netip.ParseAddr(r.Host); err == nil {
		b, err := netip.ParseAddr(strings.Trim(host, "[]"))
		return err == nil && a.Unmap() == b.Unmap() && a.Zone() == b.Zone()
	}
	return host == strings.ToLower(r.Host)
}

func (r NetRule) String() string {
	host := r.Host
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	s := host
	if r.Port != 0 {
		s += ":" + strconv.Itoa(r.Port)
	}
	if r.Scheme != "" {
		s = r.Scheme + "://" + s
	}
	return s
}
