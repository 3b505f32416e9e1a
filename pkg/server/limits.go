package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/peer"

	"roost.dev/roost/pkg/remote"
)

// A client, for the per-client bound on streams, is a process: the peer credentials of
// its connections (the pid SO_PEERCRED gave when it connected, held by a pidfd while it
// was judged). Not a connection: a client that opens a connection per follower — one
// grpc.ClientConn each, as a careless dashboard does — is still one client. A process
// that ends takes its connections and streams with it, so a recycled pid inherits nothing.
//
// A remote client is its certificate's Common Name, however many connections it opens; a
// caller a node forwards for is that name by way of that node.
type clientID struct {
	pid    int // 0 for a caller roostd has not judged (no peer check: tests)
	remote string
	via    string
}

func (c clientID) String() string {
	if c.remote != "" && c.via != "" {
		return fmt.Sprintf("remote client %q via node %s", c.remote, c.via)
	}
	if c.remote != "" {
		return fmt.Sprintf("remote client %q", c.remote)
	}
	if c.pid == 0 {
		return "callers without peer credentials"
	}
	return fmt.Sprintf("pid %d", c.pid)
}

// clientOf is the client of an RPC's context.
func clientOf(ctx context.Context) clientID {
	if c, ok := remote.CallerFrom(ctx); ok {
		return clientID{remote: c.CommonName, via: c.Via}
	}
	if pr, ok := peer.FromContext(ctx); ok {
		if info, ok := pr.AuthInfo.(*peerInfo); ok {
			return clientID{pid: info.PID}
		}
	}
	return clientID{}
}

// streamBounds are the stream set's bounds: all clients together, and one client's.
type streamBounds struct {
	total, perClient int
}

// refusal is why a stream of c is refused by a bound; the message names the bound and its
// setting, so the operator knows what to raise and the client what to end.
func (b streamBounds) refusal(c clientID, total, mine int) error {
	if mine >= b.perClient {
		return fmt.Errorf("roostd is serving %d streams to %s, the most control.max_streams_per_client (%d) allows: end one (a follower of logs or events) or raise the setting: %w",
			mine, c, b.perClient, errdefs.ErrResourceExhausted)
	}
	return fmt.Errorf("roostd is serving %d streams, the most control.max_streams (%d) allows: end one (a follower of logs or events) or raise the setting: %w",
		total, b.total, errdefs.ErrResourceExhausted)
}

// errUnread is the cause a stream is ended with when its client leaves a message unread
// past the send timeout.
var errUnread = errors.New("unread")

// sendDepth is how many messages may wait for a stream's sender: enough that a burst
// (a log chunk per stream, a few events) does not wait on the network, few enough that
// what a slow client costs is bounded by it and gRPC's own window.
const sendDepth = 8

// boundedSender sends a stream's messages from a goroutine of its own so that its handler
// never blocks on a client that does not read: a message that waits longer than timeout
// for its place ends the stream instead. gRPC's Send already blocks, rather than buffers,
// once the client's flow-control window is full; what it cannot do is give up.
type boundedSender[T any] struct {
	ch      chan *T
	timeout time.Duration
	// progress has a token after every message sent; done is closed once the sender
	// has stopped, err being why (nil when every message went).
	progress chan struct{}
	done     chan struct{}
	err      error
}

func newBoundedSender[T any](timeout time.Duration, send func(*T) error) *boundedSender[T] {
	b := &boundedSender[T]{ch: make(chan *T, sendDepth), timeout: timeout, progress: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		for m := range b.ch {
			if err := send(m); err != nil {
				b.err = err
				// The handler sees done and stops queueing; what it queued is dropped.
				for range b.ch {
				}
				return
			}
			select {
			case b.progress <- struct{}{}:
			default:
			}
		}
	}()
	return b
}

// Send queues m, waiting up to the timeout for room.
func (b *boundedSender[T]) Send(m *T) error {
	select {
	case b.ch <- m:
		return nil
	case <-b.done:
		return b.err
	default:
	}
	t := time.NewTimer(b.timeout)
	defer t.Stop()
	select {
	case b.ch <- m:
		return nil
	case <-b.done:
		return b.err
	case <-t.C:
		return b.unread()
	}
}

// Close waits for what is queued to be sent, for as long as each message goes within the
// timeout, and says whether it all went. After an unread timeout it returns at once: the
// handler is ending the stream, and the sender ends when gRPC does.
func (b *boundedSender[T]) Close(unread bool) error {
	close(b.ch)
	if unread {
		return nil
	}
	t := time.NewTimer(b.timeout)
	defer t.Stop()
	for {
		select {
		case <-b.done:
			return b.err
		case <-b.progress:
			t.Reset(b.timeout)
		case <-t.C:
			return b.unread()
		}
	}
}

func (b *boundedSender[T]) unread() error {
	return fmt.Errorf("the client left a message unread for %s (control.stream_send_timeout_seconds): roostd ended the stream rather than hold it for a reader that does not read (%w): %w",
		b.timeout, errUnread, errdefs.ErrResourceExhausted)
}

// sendBounded runs produce (a session manager's Logs or Events) with its messages sent
// through a boundedSender.
func sendBounded[T any](timeout time.Duration, send func(*T) error, produce func(send func(*T) error) error) error {
	b := newBoundedSender(timeout, send)
	err := produce(b.Send)
	if cerr := b.Close(errors.Is(err, errUnread)); err == nil {
		err = cerr
	}
	return err
}
