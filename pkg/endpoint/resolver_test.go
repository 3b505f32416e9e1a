package endpoint_test

import (
	"errors"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/endpoint"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/resolver"
)

// lookupInNetNS asks the resolver of the namespace at path one question from inside it,
// returning the rcode and the answers' addresses.
func lookupInNetNS(t *testing.T, path, name string, typ dnsmessage.Type) (dnsmessage.RCode, []string) {
	t.Helper()
	var c net.Conn
	if err := inNetNS(path, func() (err error) {
		c, err = net.Dial("udp", resolver.Addr)
		return err
	}); err != nil {
		t.Fatalf("a socket to %s inside %s: %v", resolver.Addr, path, err)
	}
	defer c.Close()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 42, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
	msg, _ := b.Finish()
	// The deadline only keeps a missing resolver from hanging the test: each case is
	// answered, and one that is not fails on the error below, whatever the time.
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("%s: reading the answer: %v", name, err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil || m.ID != 42 {
		t.Fatalf("%s: answer id %d: %v", name, m.ID, err)
	}
	var addrs []string
	for _, a := range m.Answers {
		switch b := a.Body.(type) {
		case *dnsmessage.AResource:
			addrs = append(addrs, net.IP(b.A[:]).String())
		case *dnsmessage.AAAAResource:
			addrs = append(addrs, net.IP(b.AAAA[:]).String())
		}
	}
	return m.RCode, addrs
}

// bindInNetNS binds resolver.Addr inside the namespace at path and lets it go at once.
func bindInNetNS(path string) error {
	return inNetNS(path, func() error {
		pc, err := net.ListenPacket("udp", resolver.Addr)
		if err == nil {
			pc.Close()
		}
		return err
	})
}

// serving says whether a goroutine serves a resolver now.
func serving() bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "resolver.(*Responder).serve")
}

// A namespace's endpoint brings the session's resolver: from inside, a name its
// network.allow covers is loopback, another NXDOMAIN. Closing the endpoint closes the
// socket (its address is free in the namespace again; taken while it serves, the positive
// control) and ends the goroutine serving it; reopening, as a restarted roostd does, serves
// it again in the same namespace.
func TestNetNSEndpointResolver(t *testing.T) {
	testenv.NeedRoot(t, "making and pinning a network namespace needs root")
	var rules []manifest.NetRule
	for _, a := range []string{"dest.test:8080", "*.wild.test"} {
		r, err := manifest.ParseNetRule(a)
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, r)
	}
	session := egress.New(egress.Config{}, nil, nil).Session(sessionID, rules, egress.Limits{})
	defer session.Close()
	eps, err := endpoint.New(newKeys(t), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eps.Release(sessionID) })
	if serving() {
		t.Fatal("a resolver serves before any endpoint opened")
	}
	ep, err := eps.Open(sessionID, true, 0, 0, newFake(sessionID), session)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	pin := ep.NetNS()

	check := func(when string) {
		t.Helper()
		for _, c := range []struct {
			name  string
			typ   dnsmessage.Type
			rcode dnsmessage.RCode
			addrs string
		}{
			{"dest.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, "127.0.0.1"},
			{"x.wild.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, "::1"},
			{"other.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, ""},
			{"wild.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeNameError, ""},
		} {
			rcode, addrs := lookupInNetNS(t, pin, c.name, c.typ)
			if rcode != c.rcode || strings.Join(addrs, ",") != c.addrs {
				t.Errorf("%s: %s %s: %v %v; want %v %q", when, c.name, c.typ, rcode, addrs, c.rcode, c.addrs)
			}
		}
	}
	check("open")
	if err := bindInNetNS(pin); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("binding %s in the namespace while the resolver serves: %v; want EADDRINUSE", resolver.Addr, err)
	}

	ep.Close()
	if err := bindInNetNS(pin); err != nil {
		t.Fatalf("binding %s in the namespace after Close: %v; the resolver's socket is still open", resolver.Addr, err)
	}
	// Close waits for the serving goroutine to be done; it may still be unwinding.
	for deadline := time.Now().Add(10 * time.Second); serving(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a goroutine still serves the resolver after Close")
		}
	}

	again, err := eps.Open(sessionID, true, 0, 0, newFake(sessionID), session)
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	defer again.Close()
	check("reopened")
}

// Without a proxy (roostd with no egress) the resolver still answers, NXDOMAIN for all.
func TestNetNSEndpointResolverWithoutProxy(t *testing.T) {
	testenv.NeedRoot(t, "making and pinning a network namespace needs root")
	eps, err := endpoint.New(newKeys(t), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eps.Release(sessionID) })
	ep, err := eps.Open(sessionID, true, 0, 0, newFake(sessionID), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	if rcode, addrs := lookupInNetNS(t, ep.NetNS(), "dest.test.", dnsmessage.TypeA); rcode != dnsmessage.RCodeNameError || len(addrs) != 0 {
		t.Fatalf("dest.test: %v %v; want NXDOMAIN", rcode, addrs)
	}
}
