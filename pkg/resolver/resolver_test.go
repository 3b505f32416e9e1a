package resolver_test

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/time/rate"

	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/resolver"
)

// coversOf is a session's network.allow as roostd gives it to the resolver: its egress
// proxy's Covers.
func coversOf(t testing.TB, allow ...string) func(string) bool {
	t.Helper()
	var rules []manifest.NetRule
	for _, a := range allow {
		r, err := manifest.ParseNetRule(a)
		if err != nil {
			t.Fatalf("rule %q: %v", a, err)
		}
		rules = append(rules, r)
	}
	s := egress.New(egress.Config{}, nil, nil).Session("ses_test", rules, egress.Limits{})
	t.Cleanup(s.Close)
	return s.Covers
}

// serve starts a resolver on a loopback port of its own and returns it and a client socket
// connected to it.
func serve(t testing.TB, cfg resolver.Config) (*resolver.Responder, *net.UDPConn) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := resolver.Serve(pc, cfg)
	t.Cleanup(r.Close)
	c, err := net.DialUDP("udp", nil, pc.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return r, c
}

func query(t testing.TB, id uint16, op dnsmessage.OpCode, name string, typ dnsmessage.Type, class dnsmessage.Class) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, OpCode: op, RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		t.Fatal(err)
	}
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: class}); err != nil {
		t.Fatal(err)
	}
	msg, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// exchange sends msg and reads the one reply. The deadline only keeps a broken resolver
// from hanging the test; every case here is answered.
func exchange(t testing.TB, c *net.UDPConn, msg []byte) dnsmessage.Message {
	t.Helper()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatalf("the reply does not parse: %v", err)
	}
	return m
}

func TestAnswers(t *testing.T) {
	_, c := serve(t, resolver.Config{Covers: coversOf(t, "api.example.test", "*.wild.test", "https://web.test:8443", "10.1.2.3")})
	A, AAAA, IN := dnsmessage.TypeA, dnsmessage.TypeAAAA, dnsmessage.ClassINET
	for _, tc := range []struct {
		name  string
		typ   dnsmessage.Type
		class dnsmessage.Class
		op    dnsmessage.OpCode
		rcode dnsmessage.RCode
		// answer is the one record's address; "" for none.
		answer string
	}{
		{"api.example.test.", A, IN, 0, dnsmessage.RCodeSuccess, "127.0.0.1"},
		{"API.Example.TEST.", A, IN, 0, dnsmessage.RCodeSuccess, "127.0.0.1"},
		{"api.example.test.", AAAA, IN, 0, dnsmessage.RCodeSuccess, "::1"},
		// A covered name has no records of other types, and is still a name (not NXDOMAIN).
		{"api.example.test.", dnsmessage.TypeMX, IN, 0, dnsmessage.RCodeSuccess, ""},
		{"api.example.test.", dnsmessage.TypeTXT, IN, 0, dnsmessage.RCodeSuccess, ""},
		{"a.wild.test.", A, IN, 0, dnsmessage.RCodeSuccess, "127.0.0.1"},
		{"a.b.wild.test.", AAAA, IN, 0, dnsmessage.RCodeSuccess, "::1"},
		{"web.test.", A, IN, 0, dnsmessage.RCodeSuccess, "127.0.0.1"},
		// Not covered: the wildcard's base itself, a neighbour, a suffix trick, the IP rule
		// spelled as a name, a name the proxy refuses to read.
		{"wild.test.", A, IN, 0, dnsmessage.RCodeNameError, ""},
		{"other.example.test.", A, IN, 0, dnsmessage.RCodeNameError, ""},
		{"api.example.test.evil.test.", A, IN, 0, dnsmessage.RCodeNameError, ""},
		{"10.1.2.3.", A, IN, 0, dnsmessage.RCodeNameError, ""},
		{"example.com.", AAAA, IN, 0, dnsmessage.RCodeNameError, ""},
		{"localhost.", A, IN, 0, dnsmessage.RCodeNameError, ""},
		// Other classes and opcodes are refused, whatever the name.
		{"api.example.test.", A, dnsmessage.ClassCHAOS, 0, dnsmessage.RCodeRefused, ""},
		{"api.example.test.", A, dnsmessage.ClassANY, 0, dnsmessage.RCodeRefused, ""},
		{"api.example.test.", A, IN, 2, dnsmessage.RCodeRefused, ""}, // STATUS
		{"api.example.test.", A, IN, 5, dnsmessage.RCodeRefused, ""}, // UPDATE
	} {
		id := uint16(len(tc.name)*31 + int(tc.typ) + int(tc.op))
		m := exchange(t, c, query(t, id, tc.op, tc.name, tc.typ, tc.class))
		what := tc.name + " " + tc.typ.String() + " " + tc.class.String()
		if !m.Response || m.ID != id || m.OpCode != tc.op || !m.RecursionDesired {
			t.Errorf("%s: header %+v; want a response to id %d, opcode %d, RD echoed", what, m.Header, id, tc.op)
		}
		if m.RCode != tc.rcode {
			t.Errorf("%s: rcode %v, want %v", what, m.RCode, tc.rcode)
		}
		if tc.op == 0 && (len(m.Questions) != 1 || !strings.EqualFold(m.Questions[0].Name.String(), tc.name)) {
			t.Errorf("%s: question not echoed: %+v", what, m.Questions)
		}
		var got string
		for _, a := range m.Answers {
			switch b := a.Body.(type) {
			case *dnsmessage.AResource:
				got = net.IP(b.A[:]).String()
			case *dnsmessage.AAAAResource:
				got = net.IP(b.AAAA[:]).String()
			}
			if a.Header.TTL != resolver.TTL {
				t.Errorf("%s: ttl %d", what, a.Header.TTL)
			}
		}
		if got != tc.answer || len(m.Answers) > 1 {
			t.Errorf("%s: answers %+v, want %q", what, m.Answers, tc.answer)
		}
	}
}

// A query whose question cannot be read, or with other than one question, is FORMERR; a
// datagram with no header or a response gets nothing, which the next query's answer (the
// positive control) shows: it is the first reply to arrive.
func TestMalformed(t *testing.T) {
	r, c := serve(t, resolver.Config{})
	good := query(t, 7, 0, "x.test.", dnsmessage.TypeA, dnsmessage.ClassINET)
	two := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 9})
	two.StartQuestions()
	two.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("a.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	two.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("b.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	twoMsg, _ := two.Finish()
	noQuestion := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 10})
	none, _ := noQuestion.Finish()
	for name, msg := range map[string][]byte{
		"cut question":   good[:len(good)-3],
		"two questions":  twoMsg,
		"no question":    none,
		"pointer loop":   append(append([]byte{}, good[:12]...), 0xc0, 12, 0, 1, 0, 1),
		"label too long": append(append([]byte{}, good[:12]...), 64),
	} {
		m := exchange(t, c, msg)
		if m.RCode != dnsmessage.RCodeFormatError || !m.Response || m.ID != uint16(msg[0])<<8|uint16(msg[1]) {
			t.Errorf("%s: %+v; want FORMERR to its id", name, m.Header)
		}
	}
	resp := query(t, 11, 0, "x.test.", dnsmessage.TypeA, dnsmessage.ClassINET)
	resp[2] |= 0x80 // QR: a response
	for _, junk := range [][]byte{{}, {1, 2, 3}, good[:11], resp} {
		if _, err := c.Write(junk); err != nil {
			t.Fatal(err)
		}
	}
	if m := exchange(t, c, good); m.ID != 7 || m.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("the first reply after the junk: %+v; want the good query's NXDOMAIN", m.Header)
	}
	// A reply is counted once sent, which may be after the client has read it.
	for st := r.Stats(); st.Answered+st.Ignored < 10; st = r.Stats() {
		time.Sleep(time.Millisecond)
	}
	if st := r.Stats(); st.Ignored != 4 || st.Answered != 6 {
		t.Errorf("stats %+v; want 4 ignored, 6 answered", st)
	}
}

// Past its token bucket the resolver drops queries unanswered: with a burst of 5 and
// (practically) no refill, 5 of 12 are answered and 7 dropped; the next is dropped too.
func TestRateBound(t *testing.T) {
	r, c := serve(t, resolver.Config{Rate: rate.Every(time.Hour), Burst: 5})
	for i := range 12 {
		if _, err := c.Write(query(t, uint16(i), 0, "x.test.", dnsmessage.TypeA, dnsmessage.ClassINET)); err != nil {
			t.Fatal(err)
		}
	}
	for r.Stats().Answered+r.Stats().Limited < 12 {
		time.Sleep(time.Millisecond)
	}
	if st := r.Stats(); st.Answered != 5 || st.Limited != 7 {
		t.Fatalf("stats %+v; want 5 answered, 7 limited", st)
	}
	buf := make([]byte, 512)
	for i := range 5 {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(buf)
		var m dnsmessage.Header
		if err == nil {
			var p dnsmessage.Parser
			m, err = p.Start(buf[:n])
		}
		if err != nil || m.ID != uint16(i) {
			t.Fatalf("reply %d: id %d, %v", i, m.ID, err)
		}
	}
}

// Close closes the socket (its port is free again) and ends the goroutine serving it.
func TestCloseReleasesSocket(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	r := resolver.Serve(pc, resolver.Config{})
	// Positive control: the port is taken while it serves.
	if _, err := net.ListenPacket("udp", addr); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("binding %s while the resolver serves: %v; want EADDRINUSE", addr, err)
	}
	r.Close()
	again, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatalf("binding %s after Close: %v", addr, err)
	}
	again.Close()
	r.Close() // twice is fine
}

// The resolv.conf sessions get names the resolver's address and nothing else.
func TestResolvConf(t *testing.T) {
	host, _, _ := net.SplitHostPort(resolver.Addr)
	var servers []string
	for _, l := range strings.Split(resolver.ResolvConf, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] != "#" && !strings.HasPrefix(f[0], "#") {
			if f[0] != "nameserver" {
				t.Errorf("resolv.conf line %q: only nameserver lines", l)
			}
			servers = append(servers, f[1:]...)
		}
	}
	if len(servers) != 1 || servers[0] != host {
		t.Fatalf("resolv.conf names %v; want %s", servers, host)
	}
}
