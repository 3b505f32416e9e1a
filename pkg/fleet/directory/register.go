package directory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/etcdstore"
)

// Defaults of Config.
const (
	// DefaultTTL is the lease's: a node not heard for this long is listed unreachable.
	DefaultTTL = 10 * time.Second
	// DefaultInterval is how often a node looks whether what its entry says changed, and so
	// the least time between two of its writes: a node starting a thousand sessions a
	// second still writes its entry at most once in it.
	DefaultInterval = 2 * time.Second
	// settleEvery is how soon a write settles placements' reservations (Config.Settle).
	settleEvery = 100 * time.Millisecond
)

// Store is what registering needs of the fleet's etcd: its keys, and leases for them.
type Store interface {
	fleet.Store
	etcdstore.Leaser
}

var _ Store = (*etcdstore.Store)(nil)

// Config is what a node registers with.
type Config struct {
	Store  Store
	Prefix string
	// Node is the node's name in the fleet (its --node-name).
	Node string
	// Address is its mTLS listener's host:port; empty when it has none.
	Address string
	// Classes are the containment classes it delivers.
	Classes []string
	// StartedAt is when the node started.
	StartedAt time.Time
	Version   string
	// Capacity says what the node can take and holds now; called every Interval.
	Capacity func() Capacity
	// Settle, when set, gives keys the entry about to be written accounts for (placements'
	// reservations of sessions the node now counts), called before Capacity: the write
	// deletes them in its own Txn, so that a reservation and the count it turned into are
	// never both seen, nor neither. done(true) once written; done(false) gives them back
	// for the next write. Keys to settle make a write even when nothing else changed.
	Settle func() (keys []string, done func(written bool))
	// TTL is the lease's (DefaultTTL when 0); Interval the least time between writes
	// (DefaultInterval when 0).
	TTL, Interval time.Duration
	Logger        *slog.Logger
}

// Registrant keeps a node's entry in the directory: registered under a lease it keeps
// alive, registered again under a new one whenever that one is lost, and rewritten when
// what it says changes.
type Registrant struct {
	cfg    Config
	k      keys
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	lease   int64 // the last lease registered under; 0 before one
	stopped bool
}

// Register checks cfg and starts keeping the node's entry. It does not wait for etcd: a node
// cut off from it registers once it can, and serves meanwhile.
func Register(cfg Config) (*Registrant, error) {
	if err := fleet.ValidNodeName(cfg.Node); err != nil {
		return nil, fmt.Errorf("node directory: %w", err)
	}
	if err := CheckAddress(cfg.Address); err != nil {
		return nil, fmt.Errorf("node directory, node %s: %w", cfg.Node, err)
	}
	if cfg.Store == nil || cfg.Capacity == nil {
		return nil, fmt.Errorf("node directory, node %s: a store and a capacity are needed: %w", cfg.Node, errdefs.ErrInvalidArgument)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("node directory, node %s: lease TTL %s: at least 1s (etcd's unit): %w", cfg.Node, cfg.TTL, errdefs.ErrInvalidArgument)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	r := &Registrant{cfg: cfg, k: keysOf(cfg.Prefix), log: cfg.Logger, done: make(chan struct{})}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		r.run(ctx)
	}()
	return r, nil
}

// entry is what the node says now, but for WrittenAt.
func (r *Registrant) entry(state string) Entry {
	return r.entryOf(state, r.cfg.Capacity())
}

func (r *Registrant) entryOf(state string, c Capacity) Entry {
	return Entry{Schema: Schema, Node: r.cfg.Node, Address: r.cfg.Address, Classes: r.cfg.Classes, Capacity: c,
		Version: r.cfg.Version, StartedAt: r.cfg.StartedAt.UTC(), State: state}
}

// callTimeout bounds each call to etcd: a lease's TTL, after which it is lost anyway.
func (r *Registrant) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.TTL)
}

// write puts the entry under the lease and as the node's tombstone, in one Txn: one
// revision of etcd per write.
func (r *Registrant) write(ctx context.Context, lease int64, e Entry, settle ...string) error {
	e.WrittenAt = time.Now().UTC()
	raw, err := jsonOf(e)
	if err != nil {
		return err
	}
	cctx, cancel := r.call(ctx)
	defer cancel()
	ops := []fleet.Op{{Key: r.k.known(r.cfg.Node), Value: raw}}
	if lease != 0 {
		ops = append(ops, fleet.Op{Key: r.k.live(r.cfg.Node), Value: raw, Lease: lease})
	}
	for _, k := range settle {
		ops = append(ops, fleet.Op{Key: k, Delete: true})
	}
	if _, err := r.cfg.Store.Txn(cctx, nil, ops); err != nil {
		return fmt.Errorf("writing node %s's directory entry: %w", r.cfg.Node, err)
	}
	return nil
}

func (r *Registrant) run(ctx context.Context) {
	const least = 200 * time.Millisecond
	backoff := least
	for ctx.Err() == nil {
		err := r.registerOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.log.Warn("the node directory: not registered; trying again", "node", r.cfg.Node, "in", backoff.String(), "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, r.cfg.TTL)
			continue
		}
		backoff = least
	}
}

// registerOnce registers under a new lease and keeps the entry until the lease is lost or
// ctx ends. nil: the lease was lost after registering (register again at once).
func (r *Registrant) registerOnce(ctx context.Context) error {
	cctx, cancel := r.call(ctx)
	lease, err := r.cfg.Store.Grant(cctx, r.cfg.TTL)
	cancel()
	if err != nil {
		return err
	}
	kctx, stop := context.WithCancel(ctx)
	defer stop()
	lost, err := r.cfg.Store.KeepAlive(kctx, lease)
	if err != nil {
		r.revoke(lease)
		return err
	}
	last := r.entry(StateUp)
	if err := r.write(ctx, lease, last); err != nil {
		r.revoke(lease)
		return err
	}
	r.setLease(lease)
	r.log.Info("the node directory: registered", "node", r.cfg.Node, "lease", fmt.Sprintf("%x", lease), "address", r.cfg.Address)
	// Reservations to settle are written within settleEvery, not at the next Interval: until
	// they are, a placed session counts twice and a node looks full early.
	every := r.cfg.Interval
	if r.cfg.Settle != nil {
		every = min(every, settleEvery)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	written := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-lost:
			r.log.Warn("the node directory: lease lost (cut off from etcd for its TTL, or revoked); registering again", "node", r.cfg.Node, "ttl", r.cfg.TTL.String())
			return nil
		case <-tick.C:
		}
		var settle []string
		done := func(bool) {}
		if r.cfg.Settle != nil {
			settle, done = r.cfg.Settle()
		}
		if len(settle) == 0 && time.Since(written) < r.cfg.Interval {
			// Nothing to settle, and written within Interval: not even the capacity is read.
			continue
		}
		e := r.entry(StateUp)
		if len(settle) == 0 && same(e, last) {
			done(false)
			continue
		}
		err := r.write(ctx, lease, e, settle...)
		done(err == nil)
		switch {
		case err == nil:
			last, written = e, time.Now()
		case errdefs.IsNotFound(err):
			// The lease lapsed before its keep-alive said so.
			r.log.Warn("the node directory: lease gone; registering again", "node", r.cfg.Node, "err", err)
			return nil
		default:
			// Left unwritten: the next tick tries again.
			r.log.Warn("the node directory: update not written", "node", r.cfg.Node, "err", err)
		}
	}
}

func (r *Registrant) setLease(lease int64) {
	r.mu.Lock()
	r.lease = lease
	r.mu.Unlock()
}

func (r *Registrant) revoke(lease int64) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.TTL)
	defer cancel()
	if err := r.cfg.Store.Revoke(ctx, lease); err != nil {
		r.log.Debug("the node directory: lease not revoked; it lapses", "lease", fmt.Sprintf("%x", lease), "err", err)
	}
}

// Stop stops keeping the entry. The node is marked stopped in its tombstone, and its lease
// revoked so that it is listed stopped at once; cut off from etcd, it is listed unreachable
// once its lease lapses, as for a crash. The error says what was not written.
// Stopping again does nothing.
func (r *Registrant) Stop(ctx context.Context) error {
	r.cancel()
	<-r.done
	r.mu.Lock()
	lease, stopped := r.lease, r.stopped
	r.stopped = true
	r.mu.Unlock()
	if stopped {
		return nil
	}
	e := r.entry(StateStopped)
	// A stopping roostd discards its warm sandboxes.
	e.Capacity.Warm = nil
	var errs []error
	if err := r.write(ctx, 0, e); err != nil {
		errs = append(errs, err)
	}
	if lease != 0 {
		if err := r.cfg.Store.Revoke(ctx, lease); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func jsonOf(e Entry) ([]byte, error) {
	raw, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("node %s's directory entry: %w", e.Node, err)
	}
	return raw, nil
}

func same(a, b Entry) bool {
	ra, errA := jsonOf(a)
	rb, errB := jsonOf(b)
	return errA == nil && errB == nil && bytes.Equal(ra, rb)
}
