// Package fleet keeps one daily token ceiling across many roostd nodes by escrow: a shared,
// linearizable store (etcd) holds each UTC day's ceiling and the sum of the token blocks it has
// granted, a node takes a block with a compare-and-swap transaction and admits locally against
// the blocks it holds, and gives back what it did not spend. Σ spent ≤ Σ granted ≤ ceiling at
// every instant, whatever the store, the network or the nodes do.
package fleet

import "context"

// Store is the fleet's shared state: a linearizable key-value store with compare-and-swap
// transactions, shaped on etcd's (a Cmp on ModRevision, a Txn of puts and deletes). The
// protocol needs no locks and no leases from it.
type Store interface {
	// Get reads key, or every key beginning with key when prefix is set, at one revision,
	// which it returns (the store's revision when the read was served).
	Get(ctx context.Context, key string, prefix bool) (kvs []KV, revision int64, err error)
	// Txn applies then when every compare holds, else nothing, atomically, and reports
	// whether it applied. An error is ambiguous: the transaction may or may not have been
	// applied (a leader change, a timeout after sending). The caller finds out by reading.
	Txn(ctx context.Context, cmps []Cmp, then []Op) (applied bool, err error)
	// Watch reports, until ctx ends, changes to key (or under it, with prefix) made after
	// revision (0: from now). The channel closes when ctx ends or the watch fails; a
	// watcher re-reads with Get and watches again.
	Watch(ctx context.Context, key string, prefix bool, revision int64) <-chan []KV
}

// KV is a key's value at a revision. A deleted key comes through Watch with Value nil and
// Deleted set.
type KV struct {
	Key         string
	Value       []byte
	ModRevision int64
	Deleted     bool
}

// Cmp holds when key's ModRevision equals ModRevision; ModRevision 0 holds when the key is
// absent.
type Cmp struct {
	Key         string
	ModRevision int64
}

// Op is a Txn's write: a put of Value at Key, or its deletion.
type Op struct {
	Key    string
	Value  []byte
	Delete bool
	// Lease binds the put to a lease of the store (etcdstore.Leaser): the key goes when the
	// lease does. 0 for none, which is all the ledger ever writes; only a store that grants
	// leases honours one.
	Lease int64
}
