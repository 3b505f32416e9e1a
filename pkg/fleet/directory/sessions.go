package directory

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/fleet"
)

// StateLost is the State MarkLost gives a forgotten node's sessions: their node is gone for
// good, and with it whatever they were doing. LastState keeps what the node last said.
const StateLost = "lost"

// Session is what a node says of one of its sessions, as JSON in etcd at sessions/<id>.
// The key has no lease: a node cut off from etcd still owns its sessions, and they are
// listed as it last wrote them until it writes again or is forgotten.
type Session struct {
	Schema int    `json:"schema"`
	ID     string `json:"id"`
	// Name is unique on its node only; the id is unique in the fleet.
	Name string `json:"name,omitempty"`
	Node string `json:"node"`
	// State is the session's state on its node (staged, running, exited, ...), or
	// StateLost.
	State string `json:"state"`
	// Capsule is the capsule it was staged from, as name@version.
	Capsule string `json:"capsule"`
	// Class is the containment class it runs under.
	Class     string    `json:"class,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// EndedAt is zero while it is live.
	EndedAt time.Time `json:"ended_at,omitzero"`
	// UpdatedAt is when its node last wrote the entry.
	UpdatedAt time.Time `json:"updated_at"`
	// LastState is the State before MarkLost; set only when State is StateLost.
	LastState string `json:"last_state,omitempty"`
}

// maxTxnOps bounds one Txn's writes (and so its compares): well under etcd's default
// --max-txn-ops of 128, and a request far under its size limit.
const maxTxnOps = 64

func (k keys) sessions() string         { return k.prefix + "sessions/" }
func (k keys) session(id string) string { return k.sessions() + id }

// checkSessionID refuses what cannot be a key's last segment, naming it.
func checkSessionID(id string) error {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/\x00") {
		return fmt.Errorf("session id %q: want 1 to 128 characters, no '/': %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

func decodeSession(kv fleet.KV, k keys) (Session, error) {
	var s Session
	if err := json.Unmarshal(kv.Value, &s); err != nil {
		return s, fmt.Errorf("session directory entry %s: %w: %w", kv.Key, errdefs.ErrDataLoss, err)
	}
	if s.Schema != Schema {
		return s, fmt.Errorf("session directory entry %s: schema %d, this roost reads %d: %w", kv.Key, s.Schema, Schema, errdefs.ErrNotImplemented)
	}
	if k.session(s.ID) != kv.Key || s.Node == "" {
		return s, fmt.Errorf("session directory entry %s: names session %q of node %q: %w", kv.Key, s.ID, s.Node, errdefs.ErrDataLoss)
	}
	return s, nil
}

func readSessions(ctx context.Context, st fleet.Store, k keys) ([]Session, []fleet.KV, error) {
	kvs, _, err := st.Get(ctx, k.sessions(), true)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the session directory: %w", err)
	}
	out := make([]Session, 0, len(kvs))
	for _, kv := range kvs {
		s, err := decodeSession(kv, k)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, s)
	}
	return out, kvs, nil
}

// ListSessions reads every session of the fleet, at one revision, by node, then creation,
// then id.
func ListSessions(ctx context.Context, st fleet.Store, prefix string) ([]Session, error) {
	out, _, err := readSessions(ctx, st, keysOf(prefix))
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Session) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

// LocateSession finds a session of the fleet by its id (one key read) or its name (a
// scan). A lost session is returned as found: its caller says what that means to it.
// Names are unique per node only: a name on several nodes is refused, naming them.
func LocateSession(ctx context.Context, st fleet.Store, prefix, ref string) (Session, error) {
	k := keysOf(prefix)
	if strings.HasPrefix(ref, "ses_") {
		if err := checkSessionID(ref); err != nil {
			return Session{}, err
		}
		kvs, _, err := st.Get(ctx, k.session(ref), false)
		if err != nil {
			return Session{}, fmt.Errorf("reading session %s's directory entry: %w", ref, err)
		}
		if len(kvs) == 0 {
			return Session{}, fmt.Errorf("no session %q in the fleet's directory: %w", ref, errdefs.ErrNotFound)
		}
		return decodeSession(kvs[0], k)
	}
	if ref == "" {
		return Session{}, fmt.Errorf("no session given: want a session id or name: %w", errdefs.ErrInvalidArgument)
	}
	all, _, err := readSessions(ctx, st, k)
	if err != nil {
		return Session{}, err
	}
	var found []Session
	for _, s := range all {
		if s.Name == ref {
			found = append(found, s)
		}
	}
	switch len(found) {
	case 0:
		return Session{}, fmt.Errorf("no session %q in the fleet's directory: %w", ref, errdefs.ErrNotFound)
	case 1:
		return found[0], nil
	}
	slices.SortFunc(found, func(a, b Session) int { return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.ID, b.ID)) })
	var where []string
	for _, s := range found {
		where = append(where, s.ID+" on "+s.Node)
	}
	return Session{}, fmt.Errorf("session name %q is on several nodes (%s): give the session's id: %w", ref, strings.Join(where, ", "), errdefs.ErrFailedPrecondition)
}

// markLostAttempts bounds MarkLost's reads: each attempt after the first follows a compare
// that failed because an entry changed under it, which a node that is really gone does
// not do.
const markLostAttempts = 4

// MarkLost gives every session entry of node State lost, keeping what it was in LastState,
// each written only if it is as read (a compare per key) and in Txns of at most maxTxnOps.
// It returns how many entries it marked; marking again marks none. A node that is still
// running writes its sessions' states again over the mark.
func MarkLost(ctx context.Context, st fleet.Store, prefix, node string) (int, error) {
	if err := fleet.ValidNodeName(node); err != nil {
		return 0, err
	}
	k := keysOf(prefix)
	marked := 0
	for range markLostAttempts {
		all, kvs, err := readSessions(ctx, st, k)
		if err != nil {
			return marked, fmt.Errorf("marking node %s's sessions lost: %w", node, err)
		}
		var cmps []fleet.Cmp
		var ops []fleet.Op
		now := time.Now().UTC()
		for i, s := range all {
			if s.Node != node || s.State == StateLost {
				continue
			}
			s.LastState, s.State, s.UpdatedAt = s.State, StateLost, now
			raw, err := json.Marshal(s)
			if err != nil {
				return marked, fmt.Errorf("session %s's directory entry: %w", s.ID, err)
			}
			cmps = append(cmps, fleet.Cmp{Key: kvs[i].Key, ModRevision: kvs[i].ModRevision})
			ops = append(ops, fleet.Op{Key: kvs[i].Key, Value: raw})
		}
		if len(ops) == 0 {
			return marked, nil
		}
		changed := false
		for start := 0; start < len(ops); start += maxTxnOps {
			end := min(start+maxTxnOps, len(ops))
			applied, err := st.Txn(ctx, cmps[start:end], ops[start:end])
			if err != nil {
				return marked, fmt.Errorf("marking node %s's sessions lost (%d marked): %w", node, marked, err)
			}
			if applied {
				marked += end - start
			} else {
				changed = true
			}
		}
		if !changed {
			return marked, nil
		}
	}
	return marked, fmt.Errorf("marking node %s's sessions lost: its entries kept changing under %d reads (is the node still running?), %d marked: %w",
		node, markLostAttempts, marked, errdefs.ErrConflict)
}
