package manifest

import (
	"strings"
	"testing"
)

func TestNetRuleWildcard(t *testing.T) {
	good := map[string]NetRule{
		"*.example.com":               {Host: "*.example.com"},
		"*.EXAMPLE.com":               {Host: "*.example.com"},
		"*.example.com:443":           {Host: "*.example.com", Port: 443},
		"https://*.example.com":       {Scheme: "https", Host: "*.example.com"},
		"http://*.a.example.com:8080": {Scheme: "http", Host: "*.a.example.com", Port: 8080},
		"*.xn--bcher-kva.example":     {Host: "*.xn--bcher-kva.example"},
		"*.a-b.co":                    {Host: "*.a-b.co"},
	}
	for in, want := range good {
		got, err := ParseNetRule(in)
		if err != nil || got != want {
			t.Errorf("ParseNetRule(%q) = %+v, %v; want %+v", in, got, err, want)
			continue
		}
		if !got.IsWildcard() {
			t.Errorf("%q: IsWildcard false", in)
		}
		again, err := ParseNetRule(got.String())
		if err != nil || again != got {
			t.Errorf("String round trip of %q: %q -> %+v %v", in, got.String(), again, err)
		}
	}
	for _, bad := range []string{
		"*", "*:443", "https://*", "*.", "*.com", "*.com:443", "https://*.com",
		"a.*.com", "*foo.com", "foo*.com", "*.*.example.com", "**.example.com", "*example.com",
		"*.1.2.3.4", "*.1.2.3", "*.example.com.", ".example.com", "*..example.com",
		"[*.example.com]", "*.exa_mple.com", "*.-a.com", "*.a-.com",
	} {
		if r, err := ParseNetRule(bad); err == nil {
			t.Errorf("ParseNetRule(%q) accepted: %+v", bad, r)
		}
	}
}

func TestNetRuleCanonical(t *testing.T) {
	good := map[string]NetRule{
		"[2001:DB8:0:0::1]":             {Host: "2001:db8::1"},
		"[::ffff:127.0.0.1]:80":         {Host: "127.0.0.1", Port: 80},
		"https://[::FFFF:a00:1]":        {Scheme: "https", Host: "10.0.0.1"},
		"[::1]":                         {Host: "::1"},
		"xn--bcher-kva.example":         {Host: "xn--bcher-kva.example"},
		"a1.b2.c3":                      {Host: "a1.b2.c3"},
		"example.0x":                    {},
		"localhost":                     {Host: "localhost"},
		"123.example.com:65535":         {Host: "123.example.com", Port: 65535},
		"0x7f.example.com":              {Host: "0x7f.example.com"},
		"http://web.test":               {Scheme: "http", Host: "web.test"},
		"Web.Test:8080":                 {Host: "web.test", Port: 8080},
		"https://1.2.3.4:443":           {Scheme: "https", Host: "1.2.3.4", Port: 443},
		"a.b-c.d":                       {Host: "a.b-c.d"},
		strings.Repeat("a.", 126) + "b": {Host: strings.Repeat("a.", 126) + "b"},
	}
	delete(good, "example.0x") // 0x alone is a number to inet_aton: refused below
	for in, want := range good {
		got, err := ParseNetRule(in)
		if err != nil || got != want {
			t.Errorf("ParseNetRule(%q) = %+v, %v; want %+v", in, got, err, want)
			continue
		}
		again, err := ParseNetRule(got.String())
		if err != nil || again != got {
			t.Errorf("String round trip of %q: %q -> %+v %v", in, got.String(), again, err)
		}
	}
	// Names C's inet_aton reads as addresses, zones, bare IPv6 and other near misses.
	for _, bad := range []string{
		"127.1", "0x7f.1", "2130706433", "0177.0.0.1", "0x7f000001", "example.0x", "example.0xff",
		"1.2.3.4.5", "01.2.3.4", "10.0.0.1.", "[fe80::1%eth0]", "[fe80::1%25eth0]", "::1", "2001:db8::1",
		"[::1]:", "[::1]:0", "exa_mple.com", "-a.com", "a-.com", strings.Repeat("a", 64) + ".com",
		strings.Repeat("a.", 127) + "b", "ftp://a.com", "HTTP://a.com", "https://a.com/", "a.com:+80",
		"a.com:-1", "a.com:65536", "a.com: 80",
	} {
		if r, err := ParseNetRule(bad); err == nil {
			t.Errorf("ParseNetRule(%q) accepted: %+v", bad, r)
		}
	}
}

func TestNetRuleMatches(t *testing.T) {
	cases := []struct {
		rule, host string
		want       bool
	}{
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "x.a.example.com", true},
		{"*.example.com", "A.Example.COM", true},
		{"*.example.com", "a.example.com.", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "example.com.", false},
		{"*.example.com", ".example.com", false},
		{"*.example.com", "a..example.com", false},
		{"*.example.com", "aexample.com", false},
		{"*.example.com", "a.example.com.evil.test", false},
		{"*.example.com", "example.com.a", false},
		{"*.example.com", "com", false},
		{"*.example.com", "", false},
		{"*.example.com:443", "a.example.com", true},
		{"https://*.example.com", "b.example.com", true},
		{"example.com", "example.com", true},
		{"example.com", "EXAMPLE.com", true},
		{"example.com", "a.example.com", false},
		{"example.com", "example.co", false},
		{"10.0.0.1", "10.0.0.1", true},
		{"10.0.0.1", "::ffff:10.0.0.1", true},
		{"10.0.0.1", "[::ffff:10.0.0.1]", true},
		{"10.0.0.1", "10.0.0.01", false},
		{"10.0.0.1", "10.0.0.2", false},
		{"[::ffff:10.0.0.1]", "10.0.0.1", true},
		{"[2001:db8::1]", "2001:DB8:0::1", true},
		{"[2001:db8::1]", "2001:db8::2", false},
		{"[::1]", "::1", true},
		{"[::1]", "127.0.0.1", false},
	}
	for _, tc := range cases {
		r, err := ParseNetRule(tc.rule)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Matches(tc.host); got != tc.want {
			t.Errorf("%q.Matches(%q) = %v; want %v", tc.rule, tc.host, got, tc.want)
		}
	}
}
