// Package directory answers which roostd nodes are in the fleet, how each is reached and what
// each can take, and which node holds each session: every node of the fleet registers an
// entry in etcd (its mTLS listener's address, the containment classes it delivers, its
// capacity, its version) under a lease it keeps alive, and publishes an entry for each of its
// sessions; anyone reading the fleet's etcd lists them, each node reachable or not.
//
// The keys, under a prefix (DefaultPrefix unless configured):
//
//	nodes/<node>    the node's Entry, bound to its lease: present while the node is heard
//	known/<node>    the same Entry, without a lease, written in the same Txn
//	sessions/<id>   a session's Session: its node, state, capsule; no lease, written only
//	                by its node (a Publisher), or marked lost by MarkLost once the node is
//	                forgotten
//
// The known/ key is the tombstone: when the lease lapses (the node cut off, its host down,
// a pause longer than the TTL) nodes/<node> goes and known/<node> stays, so the node is
// listed unreachable with what it last said, never dropped. A lapsed lease says only that
// the node cannot be heard, not that it stopped, as in the ledger. Only Forget (roostctl
// fleet node forget) deletes a node's keys. A node stopped cleanly writes State "stopped"
// into known/ and revokes its lease: it is listed stopped, at once, rather than unreachable
// a TTL later, and placement need not wonder whether it is merely cut off.
package directory

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/fleet"
)

// DefaultPrefix is where the directory's keys are unless configured.
const DefaultPrefix = "/roost/v1/"

// Schema is the version of Entry's JSON this package writes. Fields are only ever added
// under one schema; a reader meets an entry of a schema it does not know and says so rather
// than misread it.
const Schema = 1

// Entry states.
const (
	// StateUp: the node runs and keeps its entry up to date.
	StateUp = "up"
	// StateStopped: the node stopped cleanly (roostd shut down); it registers again when it
	// starts.
	StateStopped = "stopped"
)

// Entry is what a node says of itself, as JSON in etcd.
type Entry struct {
	Schema int    `json:"schema"`
	Node   string `json:"node"`
	// Address is the host:port of the node's mTLS listener as configured (roostd
	// --listen-tcp, remote.listen); empty when it has none.
	Address string `json:"address,omitempty"`
	// Classes are the containment classes the node delivers, weakest first (roostctl
	// doctor's "available").
	Classes  []string `json:"classes"`
	Capacity Capacity `json:"capacity"`
	// Version is the node's roost version (pkg/version).
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
	State     string    `json:"state"`
	// WrittenAt is when the node last wrote the entry: it writes only when something else in
	// it changed, so this is when what it says last changed.
	WrittenAt time.Time `json:"written_at"`
}

// Capacity is what a node can take and what it holds.
type Capacity struct {
	CPUs        int   `json:"cpus"`
	MemoryBytes int64 `json:"memory_bytes"`
	// SessionsRunning counts the node's sessions that have not exited.
	SessionsRunning int `json:"sessions_running"`
	// MaxSessions is how many sessions the node takes at once (its sessions.ids.slots less
	// the one rehearsals hold); 0 when it says nothing, which placement reads as no bound
	// but its CPUs.
	MaxSessions int `json:"max_sessions,omitempty"`
	// SlotsUsed is how many of those MaxSessions are taken: the id ranges held by sessions
	// not removed (ended ones keep theirs until rm) and by warm sandboxes, and those
	// awaiting their sweep. It, not SessionsRunning, is what the node refuses a stage by.
	SlotsUsed int `json:"slots_used,omitempty"`
	// Warm counts sandboxes made ahead and waiting for a session, per shape (roostd
	// --warm-pool, --warm-pool-capsule); absent without a warm pool.
	Warm map[string]int `json:"warm,omitempty"`
}

// Node is a listed node: its entry, and whether it is heard now.
type Node struct {
	Entry
	// Reachable: its lease is live (nodes/<node> is present).
	Reachable bool
}

type keys struct{ prefix string }

func keysOf(prefix string) keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return keys{prefix}
}

func (k keys) live(node string) string  { return k.prefix + "nodes/" + node }
func (k keys) known(node string) string { return k.prefix + "known/" + node }

// CheckAddress refuses an address that is not host:port with a port number, naming it.
// An empty one is a node without a remote listener.
func CheckAddress(addr string) error {
	if addr == "" {
		return nil
	}
	if strings.Contains(addr, "://") {
		return fmt.Errorf("node address %q: want host:port, no scheme: %w", addr, errdefs.ErrInvalidArgument)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("node address %q: want host:port: %w: %w", addr, errdefs.ErrInvalidArgument, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("node address %q: port %q: want a number from 1 to 65535: %w", addr, port, errdefs.ErrInvalidArgument)
	}
	return nil
}

func decode(kv fleet.KV) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(kv.Value, &e); err != nil {
		return e, fmt.Errorf("directory entry %s: %w: %w", kv.Key, errdefs.ErrDataLoss, err)
	}
	if e.Schema != Schema {
		return e, fmt.Errorf("directory entry %s: schema %d, this roost reads %d: %w", kv.Key, e.Schema, Schema, errdefs.ErrNotImplemented)
	}
	return e, nil
}

// List reads every node the directory knows of, by name. A node with a
// live entry is listed from it, reachable; one with only its known/ entry, unreachable (or
// stopped, as its entry says).
func List(ctx context.Context, st fleet.Store, prefix string) ([]Node, error) {
	k := keysOf(prefix)
	// The tombstones first, then the live entries: a node whose lease lapses between the
	// two reads is listed unreachable, one registering between them reachable. Not the
	// whole prefix, which holds every session's entry too.
	var kvs []fleet.KV
	for _, kind := range []string{"known/", "nodes/"} {
		got, _, err := st.Get(ctx, k.prefix+kind, true)
		if err != nil {
			return nil, fmt.Errorf("reading the node directory: %w", err)
		}
		kvs = append(kvs, got...)
	}
	byName := map[string]*Node{}
	for _, kv := range kvs {
		rest := strings.TrimPrefix(kv.Key, k.prefix)
		kind, name, ok := strings.Cut(rest, "/")
		if !ok || (kind != "nodes" && kind != "known") {
			continue
		}
		e, err := decode(kv)
		if err != nil {
			return nil, err
		}
		n := byName[name]
		if n == nil {
			n = &Node{}
			byName[name] = n
		}
		switch {
		case kind == "nodes":
			n.Entry, n.Reachable = e, true
		case !n.Reachable:
			n.Entry = e
		}
	}
	out := make([]Node, 0, len(byName))
	for _, n := range byName {
		out = append(out, *n)
	}
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.Node, b.Node) })
	return out, nil
}

// Lookup reads one node's entry: its live one when its lease holds (Reachable), else its
// known/ one; errdefs.ErrNotFound when the directory has neither. Two key reads, where List
// reads every node.
func Lookup(ctx context.Context, st fleet.Store, prefix, node string) (Node, error) {
	k := keysOf(prefix)
	for _, key := range []string{k.live(node), k.known(node)} {
		kvs, _, err := st.Get(ctx, key, false)
		if err != nil {
			return Node{}, fmt.Errorf("reading node %s's directory entry: %w", node, err)
		}
		if len(kvs) == 0 {
			continue
		}
		e, err := decode(kvs[0])
		if err != nil {
			return Node{}, err
		}
		return Node{Entry: e, Reachable: key == k.live(node)}, nil
	}
	return Node{}, fmt.Errorf("node %q is not in the fleet's directory: %w", node, errdefs.ErrNotFound)
}

// Forget deletes a node's entries, live and known, and says whether there were any. A node
// still running registers again at its next write (its lease gone, it grants another).
func Forget(ctx context.Context, st fleet.Store, prefix, node string) (bool, error) {
	if err := fleet.ValidNodeName(node); err != nil {
		return false, err
	}
	k := keysOf(prefix)
	var found bool
	for _, key := range []string{k.live(node), k.known(node)} {
		kvs, _, err := st.Get(ctx, key, false)
		if err != nil {
			return false, fmt.Errorf("reading node %s's directory entry: %w", node, err)
		}
		found = found || len(kvs) > 0
	}
	if !found {
		return false, nil
	}
	if _, err := st.Txn(ctx, nil, []fleet.Op{{Key: k.live(node), Delete: true}, {Key: k.known(node), Delete: true}}); err != nil {
		return false, fmt.Errorf("deleting node %s's directory entry: %w", node, err)
	}
	return true, nil
}
