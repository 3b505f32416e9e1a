package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/config"
)

// Id ranges. Every session that does not run as host root runs as a range of host ids of
// its own (config.IDsPerSession of them), held in the ids bucket under its first id. What
// a session's uid leaves behind outside its own trees — processes, SysV IPC objects, files
// in /tmp — would reach the next session given the range, so a range let go is not free:
// it is freed, to be swept (pkg/containment/idsweep), then clean, and only a clean range
// (or one never used) is handed out again, the least recently freed first. A range whose
// sweep failed is quarantined: kept from every session, swept again later, reported.
//
// The entry's value is the holder's id (a session's, or a sandbox's made ahead of its
// session), or, for a range no one holds, a NUL byte and its rangeNote as JSON: no id
// begins with NUL.

// SandboxPrefix begins the id of every sandbox made ahead of its session
// (sealed.WarmPrefix): only those may hold a range without a session.
const SandboxPrefix = "warm-"

// IDPool is the block of host ids sessions' ranges come from. Its first range is the
// daemon's own (rehearsals run as it); sessions get the others.
type IDPool struct {
	First uint32
	Slots uint32
}

// RehearsalIDs is the range rehearsals run as.
func (p IDPool) RehearsalIDs() IDs {
	return IDs{First: p.First, Size: config.IDsPerSession}
}

// Holds says whether the pool hands out the range that begins at first.
func (p IDPool) Holds(first uint32) bool {
	const size = config.IDsPerSession
	f := uint64(first)
	return f >= uint64(p.First)+size && f+size <= uint64(p.First)+uint64(p.Slots)*size && (f-uint64(p.First))%size == 0
}

// RangeState is where a range no session holds stands.
type RangeState string

const (
	// RangeFreed: let go, not swept yet.
	RangeFreed RangeState = "freed"
	// RangeClean: swept; it may be handed out.
	RangeClean RangeState = "clean"
	// RangeQuarantined: its sweep failed; it is swept again, never handed out before.
	RangeQuarantined RangeState = "quarantined"
)

type rangeNote struct {
	State   RangeState `json:"state"`
	FreedAt time.Time  `json:"freed_at"`
	// By is who held it last, for the operator.
	By    string `json:"by,omitempty"`
	Tries int    `json:"tries,omitempty"`
	Error string `json:"error,omitempty"`
}

func encodeNote(n rangeNote) []byte {
	data, _ := json.Marshal(n)
	return append([]byte{0}, data...)
}

// decodeNote reads a value that is a note; ok is false for a holder's id.
func decodeNote(v []byte) (n rangeNote, ok bool) {
	if len(v) == 0 || v[0] != 0 {
		return n, false
	}
	if err := json.Unmarshal(v[1:], &n); err != nil {
		// Unreadable: swept again before anyone gets it.
		return rangeNote{State: RangeQuarantined, Error: "unreadable note: " + err.Error()}, true
	}
	return n, true
}

// letGo frees the range at first if holder holds it. A range anything ran on (used) is to
// be swept before it is handed out again; one nothing ran on (a staged session's, which
// never launched or took a sandbox's instead) is clean at once.
func (t *Tx) letGo(first uint32, holder string, used bool) error {
	b := idsBucket(t.tx)
	if string(b.Get(idKey(first))) != holder {
		return nil
	}
	state := RangeFreed
	if !used {
		state = RangeClean
	}
	return b.Put(idKey(first), encodeNote(rangeNote{State: state, FreedAt: time.Now().UTC(), By: holder}))
}

// AllocateIDs gives rec a range of pool: the lowest never used, else the clean one freed
// longest ago, recorded in the same transaction as whatever else it writes. Ranges are
// keyed by their first id, so a pool moved by a configuration change never hands out a
// range that overlaps one held.
func (t *Tx) AllocateIDs(rec *Record, pool IDPool) error {
	ids, err := t.reserveIDs(rec.ID, pool)
	if err != nil {
		return fmt.Errorf("session %s: %w", rec.ID, err)
	}
	rec.IDs = &ids
	return nil
}

// ReserveIDs holds a range for a sandbox made ahead of its session (see warmPool); the
// session that claims it takes the range with TakeIDs.
func (t *Tx) ReserveIDs(sandbox string, pool IDPool) (IDs, error) {
	if !strings.HasPrefix(sandbox, SandboxPrefix) {
		return IDs{}, fmt.Errorf("%q is not a sandbox's id: %w", sandbox, errdefs.ErrInvalidArgument)
	}
	return t.reserveIDs(sandbox, pool)
}

func (t *Tx) reserveIDs(owner string, pool IDPool) (IDs, error) {
	const size = config.IDsPerSession
	end := uint64(pool.First) + uint64(pool.Slots)*size
	next := uint64(pool.First) + size
	gap := uint64(0)
	var oldest []byte
	var oldestAt time.Time
	unusable := 0
	b := idsBucket(t.tx)
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		held := uint64(binary.BigEndian.Uint32(k))
		if n, ok := decodeNote(v); ok && pool.Holds(uint32(held)) {
			switch {
			case n.State != RangeClean:
				unusable++
			case oldest == nil || n.FreedAt.Before(oldestAt):
				oldest, oldestAt = slices.Clone(k), n.FreedAt
			}
		}
		if gap != 0 || held+size <= next {
			continue
		}
		if held >= next+size {
			if next+size <= end {
				gap = next
			}
			continue
		}
		next = held + size
	}
	if gap == 0 && next+size <= end {
		gap = next
	}
	var first uint64
	switch {
	case gap != 0:
		first = gap
	case oldest != nil:
		first = uint64(binary.BigEndian.Uint32(oldest))
	default:
		why := ""
		if unusable > 0 {
			why = fmt.Sprintf(" (%d of them let go but not yet swept clean: roostctl doctor lists any quarantined)", unusable)
		}
		return IDs{}, fmt.Errorf("every one of the %d uid ranges from %d is held%s; remove ended sessions (roostctl rm) or widen sessions.ids in roostd's config: %w",
			pool.Slots-1, pool.First, why, errdefs.ErrResourceExhausted)
	}
	if err := b.Put(idKey(uint32(first)), []byte(owner)); err != nil {
		return IDs{}, err
	}
	return IDs{First: uint32(first), Size: size}, nil
}

// TakeIDs gives rec the range a sandbox held, freeing the one rec held before.
func (t *Tx) TakeIDs(rec *Record, sandbox string, ids IDs) error {
	b := idsBucket(t.tx)
	if got := b.Get(idKey(ids.First)); string(got) != sandbox {
		return fmt.Errorf("uid range %d is held by %q, not sandbox %s: %w", ids.First, holderOf(got), sandbox, errdefs.ErrFailedPrecondition)
	}
	// The range staged with it: nothing has run on it (it launches on the sandbox's).
	if rec.IDs != nil {
		if err := t.letGo(rec.IDs.First, rec.ID, false); err != nil {
			return err
		}
	}
	if err := b.Put(idKey(ids.First), []byte(rec.ID)); err != nil {
		return err
	}
	rec.IDs = &ids
	return nil
}

func holderOf(v []byte) string {
	if n, ok := decodeNote(v); ok {
		return "no one (" + string(n.State) + ")"
	}
	return string(v)
}

// ReleaseIDs frees the ranges held by sandboxes keep does not name: those of a previous
// daemon, which are gone, or one made but not kept.
func (t *Tx) ReleaseIDs(keep func(sandbox string) bool) error {
	b := idsBucket(t.tx)
	type drop struct {
		first  uint32
		holder string
	}
	var drops []drop
	if err := b.ForEach(func(k, v []byte) error {
		if strings.HasPrefix(string(v), SandboxPrefix) && !keep(string(v)) {
			drops = append(drops, drop{binary.BigEndian.Uint32(k), string(v)})
		}
		return nil
	}); err != nil {
		return err
	}
	for _, d := range drops {
		if err := t.letGo(d.first, d.holder, true); err != nil {
			return err
		}
	}
	return nil
}

// IDsHeld maps every held range's first id to the session or sandbox holding it.
func (t *Tx) IDsHeld() map[uint32]string {
	out := map[uint32]string{}
	_ = idsBucket(t.tx).ForEach(func(k, v []byte) error {
		if _, ok := decodeNote(v); !ok {
			out[binary.BigEndian.Uint32(k)] = string(v)
		}
		return nil
	})
	return out
}

// LetGo is a range no one holds that is not clean: freed and waiting for its sweep, or
// quarantined.
type LetGo struct {
	IDs     IDs
	State   RangeState
	FreedAt time.Time
	By      string
	Tries   int
	Error   string
}

// ToSweep lists the ranges let go that are not clean, freed longest ago first.
func (t *Tx) ToSweep() []LetGo {
	var out []LetGo
	_ = idsBucket(t.tx).ForEach(func(k, v []byte) error {
		if n, ok := decodeNote(v); ok && n.State != RangeClean {
			out = append(out, LetGo{IDs: IDs{First: binary.BigEndian.Uint32(k), Size: config.IDsPerSession}, State: n.State, FreedAt: n.FreedAt, By: n.By, Tries: n.Tries, Error: n.Error})
		}
		return nil
	})
	slices.SortFunc(out, func(a, b LetGo) int { return a.FreedAt.Compare(b.FreedAt) })
	return out
}

// Swept records the sweep of a range let go: clean when err is nil, quarantined (with
// err, and one more try counted) when not. A range the pool no longer hands out is
// forgotten once swept: it is no one's to hand out. A range held again meanwhile is left
// as it is.
func (t *Tx) Swept(first uint32, pool IDPool, err error) error {
	b := idsBucket(t.tx)
	n, ok := decodeNote(b.Get(idKey(first)))
	if !ok || n.State == RangeClean {
		return nil
	}
	if err == nil {
		if !pool.Holds(first) {
			return b.Delete(idKey(first))
		}
		n.State, n.Error = RangeClean, ""
		return b.Put(idKey(first), encodeNote(n))
	}
	n.State, n.Error = RangeQuarantined, err.Error()
	n.Tries++
	return b.Put(idKey(first), encodeNote(n))
}

// RangeCounts counts the pool's ranges by where they stand: held (by a session or a
// sandbox), free (clean or never used), and, of those let go, freed (waiting for their
// sweep) and quarantined.
func (t *Tx) RangeCounts(pool IDPool) map[string]int {
	counts := map[string]int{"held": 0, "free": 0, string(RangeFreed): 0, string(RangeQuarantined): 0}
	used := 0
	_ = idsBucket(t.tx).ForEach(func(k, v []byte) error {
		if !pool.Holds(binary.BigEndian.Uint32(k)) {
			return nil
		}
		used++
		n, ok := decodeNote(v)
		switch {
		case !ok:
			counts["held"]++
		case n.State == RangeClean:
			counts["free"]++
		default:
			counts[string(n.State)]++
		}
		return nil
	})
	counts["free"] += int(pool.Slots) - 1 - used
	return counts
}

// TreeRanges says how many ranges the delegation tree of session id holds (its top-level
// session and every session below that one, live or ended, until removed) and how many
// all spawned sessions hold together, and names the tree's top-level session.
func (t *Tx) TreeRanges(id string) (top string, tree, spawned int, err error) {
	recs, err := t.List(nil)
	if err != nil {
		return "", 0, 0, err
	}
	parent := make(map[string]string, len(recs))
	for _, r := range recs {
		parent[r.ID] = r.ParentID
	}
	topOf := func(id string) string {
		// Bounded: a corrupt record naming itself an ancestor ends the walk.
		for range len(parent) + 1 {
			p := parent[id]
			if p == "" {
				return id
			}
			id = p
		}
		return id
	}
	top = topOf(id)
	for _, holder := range t.IDsHeld() {
		p, ok := parent[holder]
		if !ok {
			continue // a sandbox's
		}
		if p != "" {
			spawned++
		}
		if topOf(holder) == top {
			tree++
		}
	}
	return top, tree, spawned, nil
}
