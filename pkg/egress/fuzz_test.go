package egress

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"roost.dev/roost/pkg/manifest"
)

// FuzzSOCKSRequest: the SOCKS5 parser never panics; what it accepts is a CONNECT to a
// normalised host and a port from 1 to 65535; what it refuses carries a reply code a
// client understands.
func FuzzSOCKSRequest(f *testing.F) {
	f.Add([]byte{5, 1, 0, 5, 1, 0, 3, 8, 'w', 'e', 'b', '.', 't', 'e', 's', 't', 0, 80})
	f.Add([]byte{5, 2, 2, 0, 5, 1, 0, 1, 127, 0, 0, 1, 1, 187})
	f.Add(append([]byte{5, 1, 0, 5, 1, 0, 4}, append(make([]byte, 15), 1, 0, 80)...))
	f.Add([]byte{5, 1, 0, 5, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1, 0, 80})
	f.Add([]byte{5, 1, 0, 5, 2, 0, 1, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{5, 1, 0, 5, 1, 0, 3, 6, '0', 'x', '7', 'f', '.', '1', 0, 80})
	f.Add([]byte{5, 1, 0, 5, 1, 0, 3, 0, 0, 80})
	f.Add([]byte{4, 1, 0, 80, 127, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		if _, err := readSOCKSGreeting(r); err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("greeting error not a bad request: %v", err)
			}
			return
		}
		req, code, err := readSOCKSRequest(r)
		if err != nil {
			if !errors.Is(err, errBadRequest) || (code != socksFailure && code != socksCmdUnsupported && code != socksAddrTypUnsupported) {
				t.Fatalf("refusal %#x %v", code, err)
			}
			return
		}
		if code != socksSucceeded || req.cmd != socksCmdConnect || req.t.port < 1 || req.t.port > 65535 {
			t.Fatalf("accepted %+v %#x", req, code)
		}
		checkTarget(t, req.t)
	})
}

// FuzzAuthority: the CONNECT/URL authority normaliser never panics; what it accepts is
// one canonical spelling that parses back to itself, is a network.allow entry that
// matches it, and is never a name a resolver could read as an address.
func FuzzAuthority(f *testing.F) {
	for _, s := range []string{
		"web.test:443", "WEB.test.:80", "[::1]:8080", "[::ffff:127.0.0.1]:80", "0x7f.1:80", "127.1:80",
		"2130706433:80", "0177.0.0.1:80", "user@web.test:443", "[fe80::1%25eth0]:80", "a..b:1", "1.2.3.4:65535",
		"web.test:65536", "web.test:0", "[1.2.3.4]:80", "::1:80", "xn--bcher-kva.example:443", "é.test:80",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := parseAuthority(s, 0)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("%q: error not a bad request: %v", s, err)
			}
			return
		}
		checkTarget(t, tg)
		again, err := parseAuthority(tg.authority(0), 0)
		if err != nil || again != tg {
			t.Fatalf("%q -> %+v -> %q -> %+v %v", s, tg, tg.authority(0), again, err)
		}
		rule, err := manifest.ParseNetRule(tg.authority(0))
		if err != nil || rule.Host != tg.host || rule.Port != tg.port || !rule.Matches(tg.host) {
			t.Fatalf("%q: as a rule %+v %v", s, rule, err)
		}
	})
}

func checkTarget(t *testing.T, tg target) {
	t.Helper()
	h := tg.host
	if h == "" || h != strings.ToLower(h) || strings.HasSuffix(h, ".") || tg.port < 1 || tg.port > 65535 {
		t.Fatalf("malformed %+v", tg)
	}
	if tg.ip.IsValid() {
		if tg.ip.Is4In6() || tg.ip.Zone() != "" || h != tg.ip.String() {
			t.Fatalf("address %+v not canonical", tg)
		}
		return
	}
	if _, err := netip.ParseAddr(h); err == nil {
		t.Fatalf("%q is an address but was taken as a name", h)
	}
	labels := strings.Split(h, ".")
	if numericLabel(labels[len(labels)-1]) || strings.ContainsAny(h, "*_%[]:@") {
		t.Fatalf("%q accepted as a name", h)
	}
}
