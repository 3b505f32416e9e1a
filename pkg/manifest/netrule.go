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
type NetRule struct {
	Scheme string
	Host   string
	Port   int
}

var labelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ParseNetRule reads an entry in one of the three forms: host, host:port, scheme://host[:port].
func ParseNetRule(entry string) (NetRule, error) {
	var r NetRule
	fail := func(why string) (NetRule, error) {
		return NetRule{}, fmt.Errorf("%q is not a network.allow entry (host, host:port or scheme://host[:port]): %s", entry, why)
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
	if strings.HasPrefix(rest, "[") {
		end := strings.Index(rest, "]")
		if end < 0 {
			return fail("unclosed '[' around an IPv6 address")
		}
		host, port = rest[1:end], rest[end+1:]
		if port != "" && !strings.HasPrefix(port, ":") {
			return fail("expected ':port' after the IPv6 address")
		}
		port = strings.TrimPrefix(port, ":")
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() {
			return fail(fmt.Sprintf("%q is not an IPv6 address", host))
		}
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
	if !strings.HasPrefix(rest, "[") {
		if _, err := netip.ParseAddr(host); err != nil {
			if err := checkHostname(host); err != nil {
				return fail(err.Error())
			}
		}
	}
	r.Host = strings.ToLower(host)
	return r, nil
}

func checkHostname(h string) error {
	if len(h) > 253 {
		return fmt.Errorf("host name is %d characters; at most 253", len(h))
	}
	lower := strings.ToLower(h)
	for _, label := range strings.Split(lower, ".") {
		if !labelRE.MatchString(label) {
			return fmt.Errorf("%q is not a host name", h)
		}
	}
	return nil
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
