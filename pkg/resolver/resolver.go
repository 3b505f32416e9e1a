// Package resolver is the DNS responder of every session with a network namespace of its
// own (sealed and scoped). roostd opens its UDP socket at Addr inside the session's
// namespace, beside the session's endpoint, and serves it; the session's /etc/resolv.conf
// names it.
//
// Why there is one: the namespace holds loopback only, so without it a lookup goes to
// 127.0.0.1:53 where nothing listens. glibc, which connects its UDP socket, sees the ICMP
// port-unreachable as ECONNREFUSED and fails at once; musl (and anything else sending on an
// unconnected socket) never sees it and waits out its timeout, 5 s a lookup. A session's
// way out is its egress proxy, which resolves names itself in roostd: programs that use
// the proxy never need this resolver, but every program must get an answer at once.
//
// What it answers. A name the session's network.allow covers (Config.Covers, the egress
// proxy's own matcher) is 127.0.0.1 (A) and ::1 (AAAA), with no records of any other type:
// a program that ignores the proxy variables and connects to what it resolved gets
// ECONNREFUSED at once from its own loopback, and one that hands that address to the proxy
// by IP is refused by it as loopback (special_address), naming why — either way it fails
// fast and says where, rather than "could not resolve", which would send someone looking
// for a DNS problem. Every other name is NXDOMAIN. A query of a class other than IN, or an
// opcode other than QUERY, is REFUSED; one whose question cannot be read, or that holds
// other than one question, FORMERR; a datagram without a DNS header, or a response, gets
// nothing. There is no upstream at all: no query ever leaves the host, and what a session
// can learn from DNS is only which of its own allowed names it asked for.
//
// What it costs: one socket and one goroutine per session, serving queries one at a time,
// and a token bucket (Config.Rate, Config.Burst) checked before a datagram is even parsed:
// past it queries are dropped unanswered, so a session flooding its resolver spends its own
// retries and at most one goroutine of roostd's, never its neighbours' answers. The socket
// is not a slot of pkg/fdbudget: like the endpoint's listener it is one per session, fixed
// at its start, where the budget bounds what a session can make roostd open as it runs.
package resolver

import (
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/time/rate"
)

// Addr is where a session's resolver listens inside its network namespace.
const Addr = "127.0.0.1:53"

// ResolvConf is the /etc/resolv.conf of a session with a network namespace: its resolver
// alone, and no search domains (the host's would only multiply the lookups of every name).
const ResolvConf = "# roost: the session's own resolver (its egress proxy resolves what network.allow covers)\nnameserver 127.0.0.1\n"

// Defaults of Config's bound.
const (
	// DefaultRate is the queries per second a session's resolver answers when Config.Rate
	// is 0: far more than any program's lookups, which end at once here.
	DefaultRate = 1000
	// DefaultBurst is how many queries it answers at once past the rate: a build's
	// parallel lookups.
	DefaultBurst = 200
)

// TTL is the seconds an answer may be cached: a session's network.allow is fixed for its
// life, so its answers are too.
const TTL = 300

// maxQuery is the most of a datagram read: a query is one question, far less; a longer
// datagram is read cut short, and so FORMERR.
const maxQuery = 1500

// Config is one session's resolver.
type Config struct {
	// Covers says whether the session's network.allow covers a name (lowercase or not,
	// without its trailing dot); nil covers none.
	Covers func(name string) bool
	// Rate and Burst are the token bucket of queries answered; 0 means DefaultRate and
	// DefaultBurst.
	Rate  rate.Limit
	Burst int
}

// Stats counts a resolver's datagrams.
type Stats struct {
	// Answered are the replies sent.
	Answered int64
	// Limited are the queries dropped past the token bucket.
	Limited int64
	// Ignored are datagrams answered with nothing: no DNS header, a response, a reply that
	// could not be sent.
	Ignored int64
}

// Responder serves one session's resolver socket.
type Responder struct {
	conn   net.PacketConn
	covers func(string) bool
	lim    *rate.Limiter
	done   chan struct{}
	once   sync.Once

	answered, limited, ignored atomic.Int64
}

// Serve answers the queries that reach conn until Close. The Responder owns conn.
func Serve(conn net.PacketConn, cfg Config) *Responder {
	if cfg.Rate <= 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.Covers == nil {
		cfg.Covers = func(string) bool { return false }
	}
	r := &Responder{conn: conn, covers: cfg.Covers, lim: rate.NewLimiter(cfg.Rate, cfg.Burst), done: make(chan struct{})}
	go r.serve()
	return r
}

// Close closes the socket and returns once nothing serves it.
func (r *Responder) Close() {
	r.once.Do(func() { _ = r.conn.Close() })
	<-r.done
}

// Stats returns the counts so far.
func (r *Responder) Stats() Stats {
	return Stats{Answered: r.answered.Load(), Limited: r.limited.Load(), Ignored: r.ignored.Load()}
}

func (r *Responder) serve() {
	defer close(r.done)
	in := make([]byte, maxQuery)
	out := make([]byte, 0, 512)
	for {
		n, from, err := r.conn.ReadFrom(in)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			r.ignored.Add(1)
			continue
		}
		if !r.lim.Allow() {
			r.limited.Add(1)
			continue
		}
		reply, ok := answer(in[:n], r.covers, out[:0])
		if !ok {
			r.ignored.Add(1)
			continue
		}
		if _, err := r.conn.WriteTo(reply, from); err != nil {
			r.ignored.Add(1)
			continue
		}
		r.answered.Add(1)
	}
}

var (
	loopback4 = dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}}
	loopback6 = dnsmessage.AAAAResource{AAAA: [16]byte{15: 1}}
)

// answer builds the reply to query into buf; ok is false when there is none to send.
func answer(query []byte, covers func(string) bool, buf []byte) (_ []byte, ok bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		// Nothing to answer to: no ID to echo, or a response, which a reply would only
		// bounce back.
		return nil, false
	}
	hdr := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, Authoritative: true,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if h.OpCode != 0 {
		hdr.RCode = dnsmessage.RCodeRefused
		return build(buf, hdr, nil, nil)
	}
	q, err := p.Question()
	if err != nil {
		hdr.RCode = dnsmessage.RCodeFormatError
		return build(buf, hdr, nil, nil)
	}
	if _, err := p.Question(); !errors.Is(err, dnsmessage.ErrSectionDone) {
		hdr.RCode = dnsmessage.RCodeFormatError
		return build(buf, hdr, nil, nil)
	}
	if q.Class != dnsmessage.ClassINET {
		hdr.RCode = dnsmessage.RCodeRefused
		return build(buf, hdr, &q, nil)
	}
	if !covers(strings.TrimSuffix(q.Name.String(), ".")) {
		hdr.RCode = dnsmessage.RCodeNameError
		return build(buf, hdr, &q, nil)
	}
	var rr dnsmessage.ResourceBody
	switch q.Type {
	case dnsmessage.TypeA:
		rr = &loopback4
	case dnsmessage.TypeAAAA:
		rr = &loopback6
	}
	return build(buf, hdr, &q, rr)
}

// build writes a reply: hdr, the question q when there is one, and the one answer rr when
// there is one.
func build(buf []byte, hdr dnsmessage.Header, q *dnsmessage.Question, rr dnsmessage.ResourceBody) ([]byte, bool) {
	b := dnsmessage.NewBuilder(buf, hdr)
	b.EnableCompression()
	if q != nil {
		if err := b.StartQuestions(); err != nil {
			return nil, false
		}
		if err := b.Question(*q); err != nil {
			return nil, false
		}
	}
	if rr != nil {
		if err := b.StartAnswers(); err != nil {
			return nil, false
		}
		rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: TTL}
		var err error
		switch rr := rr.(type) {
		case *dnsmessage.AResource:
			err = b.AResource(rh, *rr)
		case *dnsmessage.AAAAResource:
			err = b.AAAAResource(rh, *rr)
		}
		if err != nil {
			return nil, false
		}
	}
	msg, err := b.Finish()
	if err != nil {
		return nil, false
	}
	return msg, true
}
