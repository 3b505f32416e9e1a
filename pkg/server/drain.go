package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errShuttingDown is the cause a stream's context is cancelled with when the daemon stops.
var errShuttingDown = errors.New("roostd is shutting down")

// shuttingDown is what a stream ended by the daemon's stop answers: Unavailable, the code
// a follower (roostctl logs -f, events -f) takes as "resume once roostd is back".
var shuttingDown = status.Error(codes.Unavailable, "roostd is shutting down; resume once it is back")

// streamSet is a server's streaming RPCs in flight. A follower of logs or events never
// ends on its own, so GracefulStop would wait for it forever; Shutdown ends them first.
//
// It also holds the streams to their bounds: all clients together, and each client's.
type streamSet struct {
	mu       sync.Mutex
	draining bool
	live     map[*streamEntry]struct{}
	bounds   streamBounds
	byClient map[clientID]int
}

type streamEntry struct {
	cancel context.CancelCauseFunc
	client clientID
	// health marks a health watcher: it is ended last, once it has had a moment to send
	// the NOT_SERVING that SetNotServing queued for it (a watcher hears it before its end).
	health bool
}

// healthWatch is the standard health service's streaming method.
const healthWatch = "/grpc.health.v1.Health/Watch"

// healthWatchGrace is how long health watchers are left to send NOT_SERVING.
const healthWatchGrace = 100 * time.Millisecond

func newStreamSet(bounds streamBounds) *streamSet {
	return &streamSet{live: map[*streamEntry]struct{}{}, bounds: bounds, byClient: map[clientID]int{}}
}

// track registers a stream of client's; it returns the context its handler runs under and
// a release. When the set is draining already the stream is refused with shuttingDown,
// and past a bound with a ResourceExhausted error naming it.
func (s *streamSet) track(parent context.Context, method string, client clientID) (ctx context.Context, release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return parent, func() {}, shuttingDown
	}
	if mine := s.byClient[client]; len(s.live) >= s.bounds.total || mine >= s.bounds.perClient {
		return parent, func() {}, s.bounds.refusal(client, len(s.live), mine)
	}
	ctx, cancel := context.WithCancelCause(parent)
	e := &streamEntry{cancel: cancel, client: client, health: method == healthWatch}
	s.live[e] = struct{}{}
	s.byClient[client]++
	return ctx, func() {
		s.mu.Lock()
		delete(s.live, e)
		if s.byClient[client]--; s.byClient[client] == 0 {
			delete(s.byClient, client)
		}
		s.mu.Unlock()
		cancel(nil)
	}, nil
}

// drain ends every stream in flight but health watchers, and every one that starts from
// now on; drainHealth then ends the watchers.
// It reports whether any health watcher is left.
func (s *streamSet) drain() (watchers bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draining = true
	for e := range s.live {
		if e.health {
			watchers = true
		} else {
			e.cancel(errShuttingDown)
		}
	}
	return watchers
}

func (s *streamSet) drainHealth() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for e := range s.live {
		e.cancel(errShuttingDown)
	}
}

// drainedStream is a stream whose context ends when the daemon stops.
type drainedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *drainedStream) Context() context.Context { return s.ctx }

// Shutdown stops the server for good: health says NOT_SERVING, followers of logs and
// events end at once with Unavailable, and RPCs in flight get up to grace to finish before
// their connections are closed (which their clients also see as Unavailable).
func (s *Server) Shutdown(grace time.Duration) {
	s.SetNotServing()
	if s.streams.drain() {
		time.Sleep(healthWatchGrace)
		s.streams.drainHealth()
	}
	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(grace):
		s.Stop()
		<-stopped
	}
}
