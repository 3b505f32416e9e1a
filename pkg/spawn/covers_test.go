package spawn

import (
	"testing"

	"roost.dev/roost/pkg/manifest"
)

func TestCoversWildcard(t *testing.T) {
	rule := func(s string) manifest.NetRule {
		t.Helper()
		r, err := manifest.ParseNetRule(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	cases := []struct {
		parent, child string
		want          bool
	}{
		// A wildcard covers names beneath it at any depth and narrower or equal wildcards.
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "x.a.example.com", true},
		{"*.example.com", "*.a.example.com", true},
		{"*.example.com", "*.x.a.example.com", true},
		{"*.example.com", "*.example.com", true},
		{"*.EXAMPLE.com", "A.example.COM:443", true},
		// Never the apex, a sibling, a broader wildcard or an address.
		{"*.example.com", "example.com", false},
		{"*.example.com", "*.com.example", false},
		{"*.a.example.com", "*.example.com", false},
		{"*.a.example.com", "a.example.com", false},
		{"*.a.example.com", "b.example.com", false},
		{"*.example.com", "aexample.com", false},
		{"*.example.com", "example.com.evil.test", false},
		{"*.example.com", "1.2.3.4", false},
		{"*.example.com", "[::1]", false},
		// An exact host never covers a wildcard, even one beneath it.
		{"example.com", "*.example.com", false},
		{"a.example.com", "*.a.example.com", false},
		{"a.example.com", "*.example.com", false},
		// Scheme and port as for exact hosts.
		{"*.example.com", "https://a.example.com:8443", true},
		{"*.example.com:443", "a.example.com:443", true},
		{"*.example.com:443", "https://a.example.com:443", true},
		{"*.example.com:443", "*.a.example.com:443", true},
		{"*.example.com:443", "a.example.com", false},
		{"*.example.com:443", "a.example.com:444", false},
		{"https://*.example.com", "https://a.example.com", true},
		{"https://*.example.com", "https://*.a.example.com", true},
		{"https://*.example.com", "http://a.example.com", false},
		{"https://*.example.com", "a.example.com", false},
		{"https://*.example.com", "a.example.com:443", false},
		{"https://*.example.com", "https://a.example.com:443", false},
		{"https://*.example.com:8443", "https://a.example.com:8443", true},
		{"https://*.example.com:8443", "https://a.example.com", false},
		// Addresses compare by value.
		{"[::ffff:10.0.0.1]", "10.0.0.1:22", true},
		{"10.0.0.1", "[::ffff:10.0.0.1]", true},
		{"[2001:db8::1]", "[2001:db8:0::1]:443", true},
		{"10.0.0.1", "10.0.0.2", false},
	}
	for _, tc := range cases {
		if got := Covers(rule(tc.parent), rule(tc.child)); got != tc.want {
			t.Errorf("Covers(%q, %q) = %v; want %v", tc.parent, tc.child, got, tc.want)
		}
	}
}
