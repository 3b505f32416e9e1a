package gateway

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"roost.dev/roost/pkg/config"
)

// Limits bound what the gateway holds for sessions at once.
type Limits struct {
	// BodyBytesInFlight is the most request-body bytes the gateway holds across all
	// sessions; a call whose body would pass it is refused (503) before its body is read.
	BodyBytesInFlight int64
	// CallsPerSession is the most calls one session has through the gateway at once; the
	// next is refused (429) until one ends.
	CallsPerSession int
	// MaxBody is the largest body a call may carry (the endpoint's own bound, 32 MiB).
	MaxBody int64
}

// Defaults of Limits: the configuration's, and the endpoint's bound on a model call's body.
const (
	DefaultBodyBytesInFlight = config.DefaultMaxBodyBytesInFlight
	DefaultCallsPerSession   = config.DefaultMaxCallsPerSession
	DefaultMaxBody           = 32 << 20
)

// retryAfter is what a call refused at a bound of Limits is told to wait: calls end in
// seconds, and the SDKs retry 429 and 503 by themselves.
const retryAfter = time.Second

// Option sets up a gateway.
type Option func(*Gateway)

// WithLimits sets the gateway's bounds; a zero field keeps its default.
func WithLimits(l Limits) Option {
	return func(g *Gateway) {
		if l.BodyBytesInFlight > 0 {
			g.limits.BodyBytesInFlight = l.BodyBytesInFlight
		}
		if l.CallsPerSession > 0 {
			g.limits.CallsPerSession = l.CallsPerSession
		}
		if l.MaxBody > 0 {
			g.limits.MaxBody = l.MaxBody
		}
	}
}

// Limits are the bounds the gateway keeps.
func (g *Gateway) Limits() Limits { return g.limits }

// inflight counts what the gateway holds: body bytes across sessions and calls per
// session.
type inflight struct {
	mu    sync.Mutex
	bytes int64
	calls map[string]int
}

// enter takes one of session's calls, or says none is left.
func (g *Gateway) enter(session string) (func(), error) {
	f := &g.inflight
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.calls[session]; n >= g.limits.CallsPerSession {
		return nil, &apiError{status: http.StatusTooManyRequests, code: "session_calls_in_flight", retry: true, retryAfter: retryAfter,
			msg: fmt.Sprintf("roost: session %s has %d calls through the gateway already, its most (inference.max_calls_per_session in roostd's --config); retry when one ends", session, n)}
	}
	f.calls[session]++
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.calls[session]--; f.calls[session] <= 0 {
			delete(f.calls, session)
		}
	}, nil
}

// reserve takes n body bytes of the daemon-wide budget, or says they are not there.
func (g *Gateway) reserve(n int64) error {
	f := &g.inflight
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bytes+n > g.limits.BodyBytesInFlight {
		return &apiError{status: http.StatusServiceUnavailable, code: "gateway_body_bytes_in_flight", retry: true, retryAfter: retryAfter,
			msg: fmt.Sprintf("roost: the gateway holds %d bytes of request bodies for sessions, and %d more would pass its most, %d (inference.max_body_bytes_in_flight in roostd's --config); retry shortly",
				f.bytes, n, g.limits.BodyBytesInFlight)}
	}
	f.bytes += n
	return nil
}

func (g *Gateway) unreserve(n int64) {
	f := &g.inflight
	f.mu.Lock()
	f.bytes -= n
	f.mu.Unlock()
}

// InFlight is what the gateway holds now: body bytes, and calls of every session.
func (g *Gateway) InFlight() (bodyBytes int64, calls int) {
	f := &g.inflight
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range f.calls {
		calls += n
	}
	return f.bytes, calls
}

// chunk is what a body of unknown length is read, and reserved, by.
const chunk = 1 << 20

// readBody reads a call's body into one buffer, its bytes reserved from the budget before
// they are read: all at once when the length is told, chunk by chunk when it is not. It
// returns the body and what it holds reserved (which the caller gives back when the call
// ends), even on failure.
func (g *Gateway) readBody(r *http.Request) ([]byte, int64, error) {
	tooBig := func() error {
		return &apiError{status: http.StatusRequestEntityTooLarge, code: "request_too_large",
			msg: fmt.Sprintf("the request body is larger than the gateway takes, %d bytes", g.limits.MaxBody)}
	}
	if n := r.ContentLength; n >= 0 {
		if n > g.limits.MaxBody {
			return nil, 0, tooBig()
		}
		if err := g.reserve(n); err != nil {
			return nil, 0, err
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, n, err
		}
		return body, n, nil
	}
	// Unknown length: chunks, each reserved before it is read, joined at the end (when
	// the join's copy is reserved too, for the moment both are held).
	var parts [][]byte
	var held, size int64
	for {
		if size > g.limits.MaxBody {
			return nil, held, tooBig()
		}
		if err := g.reserve(chunk); err != nil {
			return nil, held, err
		}
		held += chunk
		part := make([]byte, chunk)
		n, err := io.ReadFull(r.Body, part)
		size += int64(n)
		if n > 0 {
			parts = append(parts, part[:n])
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return nil, held, err
		}
	}
	if size > g.limits.MaxBody {
		return nil, held, tooBig()
	}
	switch len(parts) {
	case 0:
		return nil, held, nil
	case 1:
		// One chunk, held as it was read (a join would copy it).
		return parts[0], held, nil
	}
	if err := g.reserve(size); err != nil {
		return nil, held, err
	}
	body := make([]byte, 0, size)
	for _, p := range parts {
		body = append(body, p...)
	}
	g.unreserve(held)
	return body, size, nil
}
