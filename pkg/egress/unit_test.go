package egress

import (
	"net/netip"
	"testing"

	"roost.dev/roost/pkg/manifest"
)

func TestParseAuthority(t *testing.T) {
	good := map[string]target{
		"Web.Test.:443":               {host: "web.test", port: 443},
		"web.test":                    {host: "web.test", port: 80},
		"[::1]:8080":                  {host: "::1", port: 8080, ip: netip.MustParseAddr("::1")},
		"[::FFFF:127.0.0.1]:80":       {host: "127.0.0.1", port: 80, ip: netip.MustParseAddr("127.0.0.1")},
		"[::ffff:a9fe:a9fe]":          {host: "169.254.169.254", port: 80, ip: netip.MustParseAddr("169.254.169.254")},
		"10.0.0.1:1":                  {host: "10.0.0.1", port: 1, ip: netip.MustParseAddr("10.0.0.1")},
		"10.0.0.1.:1":                 {host: "10.0.0.1", port: 1, ip: netip.MustParseAddr("10.0.0.1")},
		"xn--bcher-kva.example:65535": {host: "xn--bcher-kva.example", port: 65535},
		"0x7f.example:80":             {host: "0x7f.example", port: 80},
	}
	for in, want := range good {
		got, err := parseAuthority(in, 80)
		if err != nil || got != want {
			t.Errorf("parseAuthority(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{
		"", ":80", "web.test:", "web.test:0", "web.test:65536", "web.test:-1", "web.test:+1", "web.test:1e3", "web.test:080800",
		"u@web.test:80", "@web.test", "::1", "::1:80", "[::1", "[::1]x", "[1.2.3.4]:80", "[web.test]:80", "[fe80::1%eth0]:80",
		"0x7f.1", "0x7f.1:80", "2130706433", "127.1", "0177.0.0.1", "0x7f000001", "1.2.3.4.5", "01.2.3.4", "a..b", ".", "..",
		"under_score.test", "-a.test", "a-.test", "é.test", "a b.test", "a\x00.test", "*.web.test", "web.test/x",
	} {
		if got, err := parseAuthority(bad, 80); err == nil {
			t.Errorf("parseAuthority(%q) accepted: %+v", bad, got)
		}
	}
	if _, err := parseAuthority("web.test", 0); err == nil {
		t.Error("a CONNECT authority without a port was accepted")
	}
}

func TestClassify(t *testing.T) {
	p := New(Config{PermitCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}, nil, nil)
	special := []string{
		"127.0.0.1", "127.255.255.254", "::1", "10.0.0.1", "172.16.0.1", "172.31.255.255", "192.168.0.1", "100.64.0.1",
		"100.127.255.255", "169.254.169.254", "fe80::1", "fd00:ec2::254", "fc00::1", "224.0.0.1", "239.255.255.255", "ff02::1",
		"0.0.0.0", "0.1.2.3", "::", "255.255.255.255", "192.0.0.1", "192.0.2.1", "198.18.0.1", "198.19.255.255",
		"198.51.100.1", "203.0.113.1", "240.0.0.1", "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "2001:db8::1", "100::1",
		"::ffff:127.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1", "fec0::1", "64:ff9b:1::1",
	}
	for _, s := range special {
		if what, ok := p.classify(netip.MustParseAddr(s)); !ok || what == "" {
			t.Errorf("%s is not special", s)
		}
	}
	public := []string{"1.1.1.1", "8.8.8.8", "93.184.216.34", "172.15.255.255", "172.32.0.0", "100.63.255.255", "100.128.0.0",
		"198.17.255.255", "198.20.0.0", "2606:4700::1111", "2001:4860:4860::8888", "64:ff9c::1", "223.255.255.255"}
	for _, s := range public {
		if what, ok := p.classify(netip.MustParseAddr(s)); ok {
			t.Errorf("%s classified %q", s, what)
		}
	}
	if what, _ := p.classify(netip.MustParseAddr("::ffff:127.0.0.1")); what != "loopback" {
		t.Errorf("mapped loopback is %q", what)
	}
	if !p.permitted(netip.MustParseAddr("10.1.2.3")) || !p.permitted(netip.MustParseAddr("::ffff:10.1.2.3")) || p.permitted(netip.MustParseAddr("10.2.0.1")) {
		t.Error("PermitCIDRs")
	}
}

func TestRuleAdmits(t *testing.T) {
	cases := []struct {
		rule, proto string
		port        int
		ok          bool
	}{
		{"h.test", ProtoHTTP, 0, true},
		{"h.test", ProtoConnect, 0, true},
		{"h.test:8080", ProtoSOCKS, 8080, true},
		{"http://h.test", ProtoHTTP, 80, true},
		{"http://h.test:8080", ProtoHTTP, 8080, true},
		{"https://h.test", ProtoHTTP, 0, false},
		{"https://h.test", ProtoConnect, 443, true},
		{"https://h.test", ProtoSOCKS, 443, true},
		{"https://h.test:8443", ProtoConnect, 8443, true},
		{"http://h.test", ProtoConnect, 80, true},
		{"http://h.test", ProtoSOCKS, 80, true},
	}
	for _, tc := range cases {
		r, err := manifest.ParseNetRule(tc.rule)
		if err != nil {
			t.Fatal(err)
		}
		if port, ok := ruleAdmits(r, tc.proto); port != tc.port || ok != tc.ok {
			t.Errorf("ruleAdmits(%q, %s) = %d %v; want %d %v", tc.rule, tc.proto, port, ok, tc.port, tc.ok)
		}
	}
}
