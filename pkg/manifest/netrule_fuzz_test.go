package manifest

import (
	"strings"
	"testing"
)

// FuzzParseNetRule: ParseNetRule never panics, and what it accepts is well formed, prints
// as an entry that parses back to the same rule, and matches its own host (or, for a
// wildcard, a name beneath it and never the apex).
func FuzzParseNetRule(f *testing.F) {
	for _, s := range []string{
		"example.com", "*.example.com", "https://*.example.com:443", "http://a.b:80", "[::1]:8080",
		"[::ffff:127.0.0.1]", "10.0.0.1", "127.1", "0x7f.1", "*.com", "a.*.com", "*", "[fe80::1%eth0]",
		"https://[2001:db8::1]", "*.1.2.3.4", "x.com:080", "user@x.com",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, entry string) {
		r, err := ParseNetRule(entry)
		if err != nil {
			return
		}
		if r.Host == "" || r.Host != strings.ToLower(r.Host) || r.Port < 0 || r.Port > 65535 {
			t.Fatalf("%q parsed to malformed %+v", entry, r)
		}
		if r.Scheme != "" && r.Scheme != "http" && r.Scheme != "https" {
			t.Fatalf("%q: scheme %q", entry, r.Scheme)
		}
		again, err := ParseNetRule(r.String())
		if err != nil || again != r {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", entry, r, r.String(), again, err)
		}
		if base, ok := strings.CutPrefix(r.Host, "*."); ok {
			if strings.Contains(base, "*") || !strings.Contains(base, ".") {
				t.Fatalf("%q: wildcard %q", entry, r.Host)
			}
			if r.Matches(base) || !r.Matches("a."+base) || !r.Matches("b.a."+base) {
				t.Fatalf("%q: wildcard %q matches wrongly", entry, r.Host)
			}
			return
		}
		if strings.Contains(r.Host, "*") || !r.Matches(r.Host) {
			t.Fatalf("%q: %q does not match itself", entry, r.Host)
		}
	})
}
