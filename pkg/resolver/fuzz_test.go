package resolver

import (
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Whatever a session sends, the resolver answers it with a well-formed response to that
// query's id, or with nothing; it answers with an address only a covered name of a
// well-formed IN query, and only loopback. Seeded with queries of each kind.
func FuzzAnswer(f *testing.F) {
	seed := func(h dnsmessage.Header, qs ...dnsmessage.Question) []byte {
		b := dnsmessage.NewBuilder(nil, h)
		b.StartQuestions()
		for _, q := range qs {
			b.Question(q)
		}
		msg, _ := b.Finish()
		return msg
	}
	q := func(name string, typ dnsmessage.Type, class dnsmessage.Class) dnsmessage.Question {
		return dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: class}
	}
	good := seed(dnsmessage.Header{ID: 1, RecursionDesired: true}, q("api.allowed.test.", dnsmessage.TypeA, dnsmessage.ClassINET))
	for _, s := range [][]byte{
		good,
		seed(dnsmessage.Header{ID: 2}, q("x.sub.allowed.test.", dnsmessage.TypeAAAA, dnsmessage.ClassINET)),
		seed(dnsmessage.Header{ID: 3}, q("elsewhere.test.", dnsmessage.TypeA, dnsmessage.ClassINET)),
		seed(dnsmessage.Header{ID: 4}, q("api.allowed.test.", dnsmessage.TypeA, dnsmessage.ClassCHAOS)),
		seed(dnsmessage.Header{ID: 5, OpCode: 4}, q("api.allowed.test.", dnsmessage.TypeA, dnsmessage.ClassINET)),
		seed(dnsmessage.Header{ID: 6}, q("a.test.", dnsmessage.TypeA, dnsmessage.ClassINET), q("b.test.", dnsmessage.TypeA, dnsmessage.ClassINET)),
		seed(dnsmessage.Header{ID: 7, Response: true}, q("a.test.", dnsmessage.TypeA, dnsmessage.ClassINET)),
		good[:len(good)-2],
		{},
		append(append([]byte{}, good[:12]...), 0xc0, 12, 0, 1, 0, 1),
	} {
		f.Add(s)
	}
	covers := func(name string) bool {
		name = strings.ToLower(name)
		return name == "api.allowed.test" || strings.HasSuffix(name, ".sub.allowed.test")
	}
	f.Fuzz(func(t *testing.T, query []byte) {
		reply, ok := answer(query, covers, make([]byte, 0, 512))
		var p dnsmessage.Parser
		qh, qerr := p.Start(query)
		if !ok {
			if qerr == nil && !qh.Response {
				t.Fatalf("no reply to a query with a header (%+v)", qh)
			}
			return
		}
		if qerr != nil || qh.Response {
			t.Fatalf("a reply to %x, which has no query header", query)
		}
		var m dnsmessage.Message
		if err := m.Unpack(reply); err != nil {
			t.Fatalf("the reply does not parse: %v", err)
		}
		if !m.Response || m.ID != qh.ID || m.OpCode != qh.OpCode {
			t.Fatalf("reply header %+v to query header %+v", m.Header, qh)
		}
		if len(m.Questions) > 1 || len(m.Authorities) > 0 || len(m.Additionals) > 0 || len(m.Answers) > 1 {
			t.Fatalf("reply %+v", m)
		}
		for _, a := range m.Answers {
			if m.RCode != dnsmessage.RCodeSuccess || len(m.Questions) != 1 || !covers(strings.TrimSuffix(m.Questions[0].Name.String(), ".")) {
				t.Fatalf("an answer %+v to %+v", a, m)
			}
			switch b := a.Body.(type) {
			case *dnsmessage.AResource:
				if b.A != [4]byte{127, 0, 0, 1} {
					t.Fatalf("answer %v", b.A)
				}
			case *dnsmessage.AAAAResource:
				if b.AAAA != [16]byte{15: 1} {
					t.Fatalf("answer %v", b.AAAA)
				}
			default:
				t.Fatalf("answer of type %T", b)
			}
		}
	})
}
