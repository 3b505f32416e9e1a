package etcdstore

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Leaser is what a writer of keys that must lapse when it can no longer be heard needs of
// the store: a lease granted, kept alive, revoked, and puts bound to it (fleet.Op.Lease).
// The ledger needs none; the node directory does.
type Leaser interface {
	// Grant makes a lease that lapses ttl after it was last kept alive.
	Grant(ctx context.Context, ttl time.Duration) (lease int64, err error)
	// KeepAlive keeps the lease alive until ctx ends. The channel closes when it ends, or
	// when the lease is lost: revoked, expired, or not kept alive for its TTL (the store
	// cut off). A lost lease is gone for good; the writer grants another.
	KeepAlive(ctx context.Context, lease int64) (<-chan struct{}, error)
	// Revoke ends the lease now, deleting every key bound to it.
	Revoke(ctx context.Context, lease int64) error
}

var _ Leaser = (*Store)(nil)

// Grant asks the cluster for a lease of ttl, rounded up to whole seconds (etcd's unit).
func (s *Store) Grant(ctx context.Context, ttl time.Duration) (int64, error) {
	if ttl < time.Second {
		return 0, fmt.Errorf("etcd lease: TTL %s under etcd's least, 1s: %w", ttl, errdefs.ErrInvalidArgument)
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	resp, err := s.cli.Grant(leaderOnly(ctx), secs)
	if err != nil {
		return 0, classify(fmt.Sprintf("etcd lease grant of %ds", secs), err)
	}
	return int64(resp.ID), nil
}

// KeepAlive keeps the lease alive through the client's own keep-alive stream, which sends a
// keep-alive every third of the TTL and gives up (closing the channel) when none was
// answered for a whole TTL, or the cluster says the lease is gone.
func (s *Store) KeepAlive(ctx context.Context, lease int64) (<-chan struct{}, error) {
	ch, err := s.cli.KeepAlive(leaderOnly(ctx), clientv3.LeaseID(lease))
	if err != nil {
		return nil, classify(fmt.Sprintf("etcd lease %x keep-alive", lease), err)
	}
	lost := make(chan struct{})
	go func() {
		defer close(lost)
		for range ch {
		}
	}()
	return lost, nil
}

// Revoke revokes the lease; one already gone is not an error.
func (s *Store) Revoke(ctx context.Context, lease int64) error {
	_, err := s.cli.Revoke(leaderOnly(ctx), clientv3.LeaseID(lease))
	if err != nil {
		err = classify(fmt.Sprintf("etcd lease %x revoke", lease), err)
		if errdefs.IsNotFound(err) {
			return nil
		}
		return err
	}
	return nil
}
