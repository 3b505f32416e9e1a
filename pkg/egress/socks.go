package egress

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
)

// SOCKS5 (RFC 1928) as the proxy speaks it: the "no authentication" method only (the
// listener says who the session is), the CONNECT command only, and destinations as an
// IPv4 address, an IPv6 address or a domain name the proxy resolves (socks5h://).
const (
	socksVersion = 0x05

	socksMethodNone         = 0x00
	socksMethodNoAcceptable = 0xff

	socksCmdConnect   = 0x01
	socksCmdBind      = 0x02
	socksCmdAssociate = 0x03

	socksAtypIPv4   = 0x01
	socksAtypDomain = 0x03
	socksAtypIPv6   = 0x04

	socksSucceeded          = 0x00
	socksFailure            = 0x01
	socksNotAllowed         = 0x02
	socksNetUnreachable     = 0x03
	socksHostUnreachable    = 0x04
	socksRefused            = 0x05
	socksCmdUnsupported     = 0x07
	socksAddrTypUnsupported = 0x08
)

// readSOCKSGreeting reads the version and method offer; it says whether "no
// authentication" is among the methods.
func readSOCKSGreeting(r io.Reader) (noAuth bool, err error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return false, fmt.Errorf("%w: reading the SOCKS5 greeting: %w", errBadRequest, err)
	}
	if hdr[0] != socksVersion {
		return false, fmt.Errorf("%w: SOCKS version %d; only 5 is spoken", errBadRequest, hdr[0])
	}
	if hdr[1] == 0 {
		return false, fmt.Errorf("%w: the SOCKS5 greeting offers no methods", errBadRequest)
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(r, methods); err != nil {
		return false, fmt.Errorf("%w: reading the SOCKS5 methods: %w", errBadRequest, err)
	}
	for _, m := range methods {
		if m == socksMethodNone {
			return true, nil
		}
	}
	return false, nil
}

// socksRequest is a parsed SOCKS5 request.
type socksRequest struct {
	cmd byte
	t   target
}

// readSOCKSRequest reads a request. On failure it returns the reply code to send and an
// error; the target is filled in when the address was read.
func readSOCKSRequest(r io.Reader) (socksRequest, byte, error) {
	var req socksRequest
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return req, socksFailure, fmt.Errorf("%w: reading the SOCKS5 request: %w", errBadRequest, err)
	}
	if hdr[0] != socksVersion {
		return req, socksFailure, fmt.Errorf("%w: SOCKS version %d in the request; only 5 is spoken", errBadRequest, hdr[0])
	}
	req.cmd = hdr[1]
	var host string
	switch hdr[3] {
	case socksAtypIPv4:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return req, socksFailure, fmt.Errorf("%w: reading the SOCKS5 address: %w", errBadRequest, err)
		}
		host = netip.AddrFrom4(b).String()
	case socksAtypIPv6:
		var b [16]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return req, socksFailure, fmt.Errorf("%w: reading the SOCKS5 address: %w", errBadRequest, err)
		}
		host = netip.AddrFrom16(b).String()
	case socksAtypDomain:
		var n [1]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return req, socksFailure, fmt.Errorf("%w: reading the SOCKS5 name: %w", errBadRequest, err)
		}
		b := make([]byte, n[0])
		if _, err := io.ReadFull(r, b); err != nil {
			return req, socksFailure, fmt.Errorf("%w: reading the SOCKS5 name: %w", errBadRequest, err)
		}
		host = string(b)
	default:
		return req, socksAddrTypUnsupported, fmt.Errorf("%w: SOCKS5 address type %d is not IPv4 (1), a name (3) or IPv6 (4)", errBadRequest, hdr[3])
	}
	var p [2]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		return req, socksFailure, fmt.Errorf("%w: reading the SOCKS5 port: %w", errBadRequest, err)
	}
	h, ip, hostErr := normaliseHost(host)
	if hostErr == nil {
		req.t = target{host: h, ip: ip, port: int(binary.BigEndian.Uint16(p[:]))}
	}
	switch {
	// The command first: a UDP ASSOCIATE's address is commonly 0.0.0.0:0, and the
	// answer it needs is "not supported".
	case req.cmd != socksCmdConnect:
		return req, socksCmdUnsupported, fmt.Errorf("%w: SOCKS5 command %s is not supported; only CONNECT is", errBadRequest, socksCmdName(req.cmd))
	case hdr[2] != 0:
		return req, socksFailure, fmt.Errorf("%w: the SOCKS5 request's reserved byte is %d, not 0", errBadRequest, hdr[2])
	case hostErr != nil:
		return req, socksFailure, hostErr
	case req.t.port == 0:
		return req, socksFailure, fmt.Errorf("%w: port 0 is not a destination", errBadRequest)
	}
	return req, socksSucceeded, nil
}

func socksCmdName(c byte) string {
	switch c {
	case socksCmdBind:
		return "BIND"
	case socksCmdAssociate:
		return "UDP ASSOCIATE"
	default:
		return fmt.Sprintf("%d", c)
	}
}

// socksReply is a reply with the given code. The bound address is always 0.0.0.0:0:
// roostd's own outbound address is none of the session's business.
func socksReply(code byte) []byte {
	return []byte{socksVersion, code, 0, socksAtypIPv4, 0, 0, 0, 0, 0, 0}
}

// socksCode is the reply for a denial.
func socksCode(d *denial) byte {
	switch {
	case d.socks != 0:
		return d.socks
	case d.reason == ReasonUnresolvable:
		return socksHostUnreachable
	case d.reason == ReasonBadRequest || d.reason == ReasonSessionClosed || d.reason == ReasonDialFailed:
		return socksFailure
	default:
		return socksNotAllowed
	}
}

// ServeSOCKS serves one SOCKS5 connection (its first byte, 0x05, not yet read) and closes
// it when done.
func (s *Session) ServeSOCKS(conn net.Conn) {
	f := s.newFlow(ProtoSOCKS)
	fail := func(reply []byte, d *denial) {
		f.deny(d.reason, d.detail)
		if reply != nil {
			_ = conn.SetWriteDeadline(time.Now().Add(HandshakeTimeout))
			_, _ = conn.Write(reply)
		}
		_ = conn.Close()
	}
	_ = conn.SetDeadline(time.Now().Add(HandshakeTimeout))
	// The handshake is bytes too: counted as read, charged once the request is admitted.
	hand := &countingReader{r: conn}
	noAuth, err := readSOCKSGreeting(hand)
	if err != nil {
		fail(nil, badRequest(err))
		return
	}
	if !noAuth {
		fail([]byte{socksVersion, socksMethodNoAcceptable}, &denial{ReasonBadRequest, "egress request refused: the SOCKS5 client offers no method the proxy takes; it takes \"no authentication\" only (the session is known from its listener)", 0})
		return
	}
	if _, err := conn.Write([]byte{socksVersion, socksMethodNone}); err != nil {
		fail(nil, badRequest(fmt.Errorf("%w: answering the SOCKS5 greeting: %w", errBadRequest, err)))
		return
	}
	req, code, err := readSOCKSRequest(hand)
	if err != nil {
		if req.t.host != "" {
			f.setDest(req.t.host, req.t.port)
		}
		d := badRequest(err)
		if req.t.host != "" && code == socksCmdUnsupported {
			d.detail = fmt.Sprintf("egress to %s refused: %s", hostPort(req.t.host, req.t.port), d.detail[len("egress request refused: "):])
		}
		fail(socksReply(code), d)
		return
	}
	// The handshake is done; deciding and dialling have timeouts of their own.
	_ = conn.SetDeadline(time.Time{})
	ctx, stop := s.requestContext(context.Background())
	defer stop()
	d, den := s.admit(ctx, f, ProtoSOCKS, req.t)
	if den != nil {
		fail(socksReply(socksCode(den)), den)
		return
	}
	// Up: what was read; down: the method reply and the reply to come.
	reply := socksReply(socksSucceeded)
	handDown := 2 + len(reply)
	if !s.charge(hand.n, handDown) {
		fail(socksReply(socksNotAllowed), &denial{ReasonEgressMaxBytes, f.budgetDetail() + fmt.Sprintf("; the %d-byte SOCKS5 handshake does not fit what is left", hand.n+handDown), 0})
		return
	}
	upstream, addr, err := s.dial(ctx, d)
	f.setAddr(addr)
	if err != nil {
		s.refund(hand.n + handDown)
		if den := refusedSlot(req.t, err); den != nil {
			fail(socksReply(socksCode(den)), den)
			return
		}
		fail(socksReply(socksDialReply(err)), &denial{ReasonDialFailed, dialDetail(req.t, addr, err), 0})
		return
	}
	f.count(hand.n, true)
	f.count(handDown, false)
	if _, err := conn.Write(reply); err != nil {
		_ = upstream.Close()
		_ = conn.Close()
		f.cut("", fmt.Sprintf("egress to %s ended: the client went away before the reply: %v", hostPort(req.t.host, req.t.port), err))
		f.finish()
		return
	}
	f.tunnel(conn, conn, upstream)
}
