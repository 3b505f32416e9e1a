// Package fdbudget answers one question: may roostd hold one more descriptor on a
// session's behalf? Every socket and file roostd holds for a session — an endpoint
// connection, a proxy's upstream socket, a model call, a log follower's files — takes a slot
// from one Budget, sized from roostd's open-file limit less a reserve kept for what the
// operator needs whatever the sessions do (the control socket, the registry, recovery,
// metrics), so roostctl ps, stop and rm always find a descriptor.
//
// Slots are counted per owner (a session, or a daemon-side owner such as Followers) against
// a share, and all together against the total. A refusal is a *Refused error naming which
// bound held.
package fdbudget

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/containerd/errdefs"
)

// Use is what a slot holds a descriptor for, as the roost_descriptors metric labels it.
type Use uint8

// Uses.
const (
	// Endpoint is a connection accepted on a session's endpoint.
	Endpoint Use = iota
	// Upstream is a proxy's socket to a destination: a CONNECT tunnel's, a SOCKS
	// connection's, a forwarded request's (also while idle in the session's pool).
	Upstream
	// Gateway is a model call forwarded to an inference upstream.
	Gateway
	// Follower is an open log file of a follower of a session's output.
	Follower
	// Exec is a descriptor of a detached exec: its output's pipes, the files that keep it.
	Exec
	nUses
)

var useNames = [nUses]string{"endpoint", "upstream", "gateway", "follower", "exec"}

func (u Use) String() string {
	if u < nUses {
		return useNames[u]
	}
	return fmt.Sprintf("use(%d)", u)
}

// Uses lists every Use, in order.
func Uses() []Use {
	out := make([]Use, nUses)
	for i := range out {
		out[i] = Use(i)
	}
	return out
}

// Followers is the owner log followers' slots are counted under. They are the operator's,
// not a session's (roostctl run and logs -f read through one): their slots come out of the
// reserve, checked against their share alone and never against (nor counted in) the
// sessions' total, so the operator can follow a session while sessions hold every slot
// theirs, and a crowd of followers cannot take what sessions need.
const Followers = "roostd:followers"

// Reserve is how many descriptors of an open-file limit of nofile are kept out of the
// budget: an eighth, at least 256 (the control socket and its clients, the registry, the
// ledger, sessions' log files and pidfds, recovery, metrics), at most half.
func Reserve(nofile uint64) uint64 {
	r := max(nofile/8, 256)
	if r > nofile/2 {
		r = nofile / 2
	}
	return r
}

// DefaultShare is one owner's share of a total when the operator sets none: a sixteenth,
// so a session that holds its whole share leaves fifteen-sixteenths to the others and it
// takes sixteen such sessions at once to spend the total; never below 32 (a session's
// few tunnels and model calls) unless the total itself is smaller.
func DefaultShare(total int64) int64 {
	return max(total/16, min(total, 32))
}

// Budget is roostd's descriptor budget. Its zero value is not usable; make one with New.
type Budget struct {
	limit   uint64
	reserve uint64
	total   int64
	share   int64

	held atomic.Int64
	uses [nUses]atomic.Int64

	mu     sync.Mutex
	owners map[string]*int64
}

// New returns the budget for an open-file limit of nofile: nofile less Reserve(nofile), of
// which one owner holds at most share (DefaultShare of the total when 0 or less; never more
// than the total).
func New(nofile uint64, share int64) *Budget {
	reserve := Reserve(nofile)
	total := int64(min(nofile-reserve, 1<<62))
	if share <= 0 {
		share = DefaultShare(total)
	}
	return &Budget{limit: nofile, reserve: reserve, total: total, share: min(share, total), owners: map[string]*int64{}}
}

// Sized returns a budget of exactly total descriptors with no open-file limit behind it,
// of which one owner holds at most share (the whole total when 0 or less): for a fixed
// setting, and tests.
func Sized(total, share int64) *Budget {
	total = max(total, 0)
	if share <= 0 || share > total {
		share = total
	}
	return &Budget{total: total, share: share, owners: map[string]*int64{}}
}

// InUse is how many slots use holds now.
func (b *Budget) InUse(u Use) int64 { return b.uses[u].Load() }

// Scope says which bound refused a slot.
type Scope string

// Scopes.
const (
	// ScopeShare: the owner held its share.
	ScopeShare Scope = "share"
	// ScopeTotal: all owners together held the budget's total.
	ScopeTotal Scope = "total"
)

// Refused is why a slot was not given. It is errdefs.ErrResourceExhausted.
type Refused struct {
	Owner string
	Use   Use
	Scope Scope
	// Max is the bound that held: the share or the total.
	Max int64
}

func (r *Refused) Error() string {
	if r.Scope == ScopeShare && r.Owner == Followers {
		return fmt.Sprintf("descriptor budget: readers of sessions' logs together hold their share of %d of roostd's descriptors (sessions.descriptors_per_session); end a follower (roostctl logs -f) and ask again", r.Max)
	}
	if r.Scope == ScopeShare {
		return fmt.Sprintf("descriptor budget: %s holds its share of %d of roostd's descriptors (sessions.descriptors_per_session); no %s slot is left for it", r.Owner, r.Max, r.Use)
	}
	return fmt.Sprintf("descriptor budget: all sessions together hold roostd's %d descriptors (its open-file limit less a reserve for the operator); no %s slot is left for %s", r.Max, r.Use, r.Owner)
}

// Is makes a refusal errdefs.ErrResourceExhausted.
func (r *Refused) Is(target error) bool { return target == errdefs.ErrResourceExhausted }

// Slot is one descriptor held. Release it exactly once, when the descriptor is closed.
type Slot struct {
	b     *Budget
	count *int64
	owner string
	use   Use
	// reserved is a slot of the reserve's (Followers'), not in the sessions' total.
	reserved bool
}

// Acquire takes a slot for owner's use, checked against owner's share and the total (a
// Followers slot against its share only). An owner of "" is checked against the total only.
func (b *Budget) Acquire(owner string, u Use) (Slot, error) {
	reserved := owner == Followers
	if !reserved && b.held.Add(1) > b.total {
		b.held.Add(-1)
		return Slot{}, &Refused{Owner: ownerName(owner), Use: u, Scope: ScopeTotal, Max: b.total}
	}
	var count *int64
	if owner != "" {
		b.mu.Lock()
		count = b.owners[owner]
		if count == nil {
			count = new(int64)
			b.owners[owner] = count
		}
		if *count >= b.share {
			if *count == 0 {
				delete(b.owners, owner)
			}
			b.mu.Unlock()
			if !reserved {
				b.held.Add(-1)
			}
			return Slot{}, &Refused{Owner: owner, Use: u, Scope: ScopeShare, Max: b.share}
		}
		*count++
		b.mu.Unlock()
	}
	b.uses[u].Add(1)
	return Slot{b: b, count: count, owner: owner, use: u, reserved: reserved}, nil
}

// AcquireTotal takes a slot checked against the total only, not owner's share (owner only
// names who asked, in a refusal): for a descriptor that has a per-owner cap of its own (an endpoint's connections have
// resources.endpoint_max_connections), so that the owner's share is left for what it
// opens through them and a refusal can be said on the connection that asked.
func (b *Budget) AcquireTotal(owner string, u Use) (Slot, error) {
	if b.held.Add(1) > b.total {
		b.held.Add(-1)
		return Slot{}, &Refused{Owner: ownerName(owner), Use: u, Scope: ScopeTotal, Max: b.total}
	}
	b.uses[u].Add(1)
	return Slot{b: b, use: u}, nil
}

func ownerName(owner string) string {
	if owner == "" {
		return "roostd"
	}
	return owner
}

// Release gives the slot back. Releasing the zero Slot does nothing.
func (s Slot) Release() {
	if s.b == nil {
		return
	}
	if s.count != nil {
		s.b.mu.Lock()
		// Forgotten once it holds nothing: no slot points at the count then, and the map
		// keeps only owners holding something.
		if *s.count--; *s.count == 0 && s.b.owners[s.owner] == s.count {
			delete(s.b.owners, s.owner)
		}
		s.b.mu.Unlock()
	}
	s.b.uses[s.use].Add(-1)
	if !s.reserved {
		s.b.held.Add(-1)
	}
}

// Valid says whether the slot holds anything (it came from a successful Acquire).
func (s Slot) Valid() bool { return s.b != nil }

// Stats is the budget and what it holds now.
type Stats struct {
	// Limit is the open-file limit the budget was made from; Reserve what is kept out of
	// it; Total what sessions may hold together; Share what one owner may.
	Limit, Reserve uint64
	Total, Share   int64
	// Held is what sessions hold of the total (Followers' slots are the reserve's: see
	// ByUse).
	Held            int64
	ByUse           map[string]int64
	Owners, AtShare int
}

// Stats returns the budget's numbers.
func (b *Budget) Stats() Stats {
	st := Stats{Limit: b.limit, Reserve: b.reserve, Total: b.total, Share: b.share, Held: b.held.Load(), ByUse: map[string]int64{}}
	for u := range nUses {
		st.ByUse[u.String()] = b.uses[u].Load()
	}
	b.mu.Lock()
	for _, n := range b.owners {
		st.Owners++
		if *n >= b.share {
			st.AtShare++
		}
	}
	b.mu.Unlock()
	return st
}

// Held is how many slots owner holds now (AcquireTotal's not counted).
func (b *Budget) Held(owner string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := b.owners[owner]; n != nil {
		return *n
	}
	return 0
}

// Share is one owner's share.
func (b *Budget) Share() int64 { return b.share }

// Total is what all owners together may hold.
func (b *Budget) Total() int64 { return b.total }

// String says the budget as roostd logs it.
func (st Stats) String() string {
	return fmt.Sprintf("%d descriptors for sessions (open-file limit %d less a reserve of %d for the operator), at most %d per session", st.Total, st.Limit, st.Reserve, st.Share)
}
