// Package placement answers which node of the fleet a new session goes to. The candidates
// are the nodes the directory lists reachable and up, with a listener, delivering the class
// the session needs and with room; those holding a warm sandbox of the session's shape come
// first; of K drawn at random the one with the most room wins (best of K, as E2B's API picks
// a node for a sandbox), with the placements still in flight counted. A reservation, written
// in a compare-and-swap Txn on the chosen node's fence key, is what counts a placement in
// flight until the node's own directory entry does: two entry nodes that read the same room
// cannot both take its last slot.
//
// The keys, under the directory's prefix (directory.DefaultPrefix unless configured):
//
//	placement/<node>/fence     the node's fence: every reservation on it rewrites it, so a
//	                           reservation decided on a stale reading of the node is refused
//	placement/<node>/res/<id>  a placement in flight, under a short lease of the entry node
//
// Both are read at one revision. A reservation counts against its node until the node's own
// entry counts the session: the node deletes it in the Txn that writes that entry
// (directory.Config.Settle, fed by Staged), so the two are never both seen, nor neither. An
// entry node that refused to stage deletes it (Release); one killed mid-placement leaves it
// to its lease, at most TTL. Placement only steers: the node itself refuses a session it
// has no room for (its id pool), so the bound holds even for sessions started on it directly.
package placement

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/directory"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/manifest"
)

// Defaults of Config.
const (
	// DefaultK is how many candidates are drawn, the best of which is chosen.
	DefaultK = 3
	// DefaultTTL bounds how long a reservation outlives an entry node that died placing.
	DefaultTTL = 15 * time.Second
	// DefaultTimeout bounds one placement's calls to the store.
	DefaultTimeout = 3 * time.Second
	// firstPause and lastPause bound the random pause before a reservation is tried again
	// after another entry node's won the fence: it doubles from the first to the last, so
	// entry nodes that collided draw apart, and tries go on till the placement's Timeout.
	firstPause = 2 * time.Millisecond
	lastPause  = 100 * time.Millisecond
)

// Store is what placement needs of the fleet's etcd: its keys, and leases for reservations.
type Store interface {
	fleet.Store
	etcdstore.Leaser
}

var _ Store = (*etcdstore.Store)(nil)

// Config is what a Placer places with.
type Config struct {
	Store Store
	// Prefix is the directory's ("" for directory.DefaultPrefix).
	Prefix string
	// Self is the entry node's name, which reservations carry.
	Self string
	// K is how many candidates are drawn (DefaultK when 0); TTL a reservation's lease
	// (DefaultTTL when 0); Timeout bounds a placement's calls to the store (DefaultTimeout
	// when 0), so that a node cut off from etcd says so soon.
	K       int
	TTL     time.Duration
	Timeout time.Duration
	// Intn draws a number in [0, n) (math/rand/v2 when nil): a test seeds it.
	Intn   func(n int) int
	Logger *slog.Logger
}

// Placer places sessions from one entry node.
type Placer struct {
	cfg    Config
	prefix string
	log    *slog.Logger

	// turn is held by the placement of this entry reading and reserving: two of its own
	// would read the same fence and one lose it, so they take turns and only placements
	// from other entry nodes contend.
	turn chan struct{}

	mu        sync.Mutex
	lease     int64
	leaseFrom time.Time
}

// New checks cfg and returns its Placer.
func New(cfg Config) (*Placer, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("placement: no store: %w", errdefs.ErrInvalidArgument)
	}
	if err := fleet.ValidNodeName(cfg.Self); err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	if cfg.K <= 0 {
		cfg.K = DefaultK
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Intn == nil {
		cfg.Intn = mrand.IntN
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = directory.DefaultPrefix
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Placer{cfg: cfg, prefix: prefix, log: log, turn: make(chan struct{}, 1)}, nil
}

// Need is what a session needs of its node.
type Need struct {
	// Class is the least containment class it runs under ("" for any).
	Class string
	// Shapes are the warm sandbox shapes, by name, any of which would start it.
	Shapes []string
	// Node pins it: only this node is a candidate.
	Node string
	// Refused are nodes that refused this session already, each with its word: no longer
	// candidates.
	Refused map[string]string
}

// Candidate is one node as placement saw it.
type Candidate struct {
	Node string `json:"node"`
	// Running is what its entry counts against its bound: the id ranges it holds (sessions
	// not removed, ended ones included, and warm sandboxes) when it has a bound, else the
	// sessions not ended; InFlight the reservations on it its entry does not count yet; Max its MaxSessions (0: unbounded but by its CPUs).
	Running  int `json:"running"`
	InFlight int `json:"in_flight"`
	Max      int `json:"max,omitempty"`
	CPUs     int `json:"cpus"`
	Warm     bool
	// Score is its free share: (Max − Running − InFlight)/Max, or 1/(1 + load per CPU)
	// when unbounded. Higher is better.
	Score float64 `json:"score"`
	// Drawn: among the K the best was chosen from.
	Drawn bool `json:"drawn,omitempty"`
	// Refused says why it was no candidate; empty for one.
	Refused string `json:"refused,omitempty"`
}

// Decision is where a session goes, and why.
type Decision struct {
	Node    string `json:"node"`
	Address string `json:"address"`
	// Entry is the node that placed it.
	Entry string    `json:"entry"`
	At    time.Time `json:"at"`
	// Reason says how the node was chosen.
	Reason     string      `json:"reason"`
	Candidates []Candidate `json:"candidates"`
	// Reservation is the key that counts it in flight ("" once released).
	Reservation string `json:"-"`
}

// reservation is a placement in flight, as JSON in the store.
type reservation struct {
	Entry string    `json:"entry"`
	At    time.Time `json:"at"`
}

func (p *Placer) all() string                     { return p.prefix + "placement/" }
func (p *Placer) fence(node string) string        { return p.all() + node + "/fence" }
func (p *Placer) reservations(node string) string { return p.all() + node + "/res/" }

// delivers: a session runs under its floor or any stronger class its node delivers (doctor's
// "available"), so a node lacking the floor itself but offering one above it will do.
func delivers(classes []string, need string) bool {
	floor, err := manifest.ParseClass(need)
	if need == "" || err != nil {
		return need == "" || slices.Contains(classes, need)
	}
	for _, c := range classes {
		if k, err := manifest.ParseClass(c); err == nil && k >= floor {
			return true
		}
	}
	return false
}

// Place chooses a node for a session needing need and reserves room on it. The caller
// stages the session there, passing the reservation's key, which the node settles (Staged);
// if the node refuses the session, the caller Releases the decision.
//
// An error that is the store's (etcd cut off, no leader, its timeout) wraps ErrStore: the
// caller may stage where it is asked instead.
func (p *Placer) Place(ctx context.Context, need Need) (Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	pause := firstPause
	for tries := 1; ; tries++ {
		d, err := p.tryInTurn(ctx, need)
		if !errors.Is(err, errFenced) {
			return d, err
		}
		t := time.NewTimer(time.Duration(p.cfg.Intn(int(pause)) + 1))
		select {
		case <-ctx.Done():
			t.Stop()
			return Decision{}, fmt.Errorf("placement: %d tries in %s lost the race for their node to other entry nodes: %w", tries, p.cfg.Timeout, err)
		case <-t.C:
		}
		pause = min(2*pause, lastPause)
	}
}

// tryInTurn is one try, in this entry's turn.
func (p *Placer) tryInTurn(ctx context.Context, need Need) (Decision, error) {
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		return Decision{}, storeErr("waiting for this node's placements before it", ctx.Err())
	}
	defer func() { <-p.turn }()
	return p.try(ctx, need)
}

var errFenced = fmt.Errorf("another placement reserved on the node first: %w", errdefs.ErrAborted)

// ErrStore marks a placement that failed because the fleet's store could not be read or
// written, not for anything the nodes said.
var ErrStore = errors.New("the fleet's etcd did not answer")

// storeErr is err, a store call's, marked ErrStore.
func storeErr(what string, err error) error {
	return fmt.Errorf("placement: %s: %w: %w", what, ErrStore, err)
}

func (p *Placer) try(ctx context.Context, need Need) (Decision, error) {
	// The placements in flight first, then the nodes: a node that settles a reservation
	// between the two reads (its count up, the reservation gone, in one Txn) is then
	// counted twice, never not at all.
	kvs, _, err := p.cfg.Store.Get(ctx, p.all(), true)
	if err != nil {
		return Decision{}, storeErr("reading the placements in flight", err)
	}
	nodes, err := directory.List(ctx, p.cfg.Store, p.cfg.Prefix)
	if err != nil {
		return Decision{}, storeErr("reading the node directory", err)
	}
	inFlight := map[string]int{}
	fenceRev := map[string]int64{}
	for _, kv := range kvs {
		node, rest, _ := strings.Cut(strings.TrimPrefix(kv.Key, p.all()), "/")
		switch {
		case rest == "fence":
			fenceRev[node] = kv.ModRevision
		case strings.HasPrefix(rest, "res/"):
			inFlight[node]++
		}
	}

	var cands []Candidate
	addrs := map[string]string{}
	pinnedSeen := false
	for _, n := range nodes {
		if need.Node != "" && n.Node != need.Node {
			continue
		}
		pinnedSeen = true
		c := Candidate{Node: n.Node, Running: n.Capacity.SessionsRunning, InFlight: inFlight[n.Node], Max: n.Capacity.MaxSessions, CPUs: n.Capacity.CPUs}
		if c.Max > 0 {
			// What the node refuses a stage by: its id ranges, which ended sessions hold
			// until removed.
			c.Running = max(c.Running, n.Capacity.SlotsUsed)
		}
		for _, s := range need.Shapes {
			if n.Capacity.Warm[s] > 0 {
				c.Warm = true
			}
		}
		used := c.Running + c.InFlight
		switch {
		case need.Refused[n.Node] != "":
			c.Refused = "refused it: " + need.Refused[n.Node]
		case !n.Reachable:
			c.Refused = "unreachable (its lease lapsed)"
		case n.State != directory.StateUp:
			c.Refused = "state " + n.State
		case n.Address == "":
			c.Refused = "no remote listener"
		case !delivers(n.Classes, need.Class):
			c.Refused = fmt.Sprintf("delivers %s, nothing as strong as %s", strings.Join(n.Classes, ", "), need.Class)
		case c.Max > 0 && used >= c.Max:
			c.Refused = fmt.Sprintf("full (%d of %d sessions, %d in flight)", used, c.Max, c.InFlight)
		}
		if c.Max > 0 {
			c.Score = float64(c.Max-used) / float64(c.Max)
		} else {
			c.Score = 1 / (1 + float64(used)/float64(max(c.CPUs, 1)))
		}
		addrs[n.Node] = n.Address
		cands = append(cands, c)
	}
	if need.Node != "" && !pinnedSeen {
		return Decision{}, fmt.Errorf("placement: node %q is not in the fleet's directory (roostctl fleet nodes lists them): %w", need.Node, errdefs.ErrNotFound)
	}

	chosen, reason, err := p.choose(cands, need)
	if err != nil {
		return Decision{Candidates: cands}, err
	}
	d := Decision{Node: chosen, Address: addrs[chosen], Entry: p.cfg.Self, At: time.Now().UTC(), Reason: reason, Candidates: cands}

	lease, err := p.leaseFor(ctx)
	if err != nil {
		return d, storeErr("a lease for the reservation", err)
	}
	id, err := newID()
	if err != nil {
		return d, err
	}
	body, err := json.Marshal(reservation{Entry: p.cfg.Self, At: d.At})
	if err != nil {
		return d, err
	}
	d.Reservation = p.reservations(chosen) + id
	applied, err := p.cfg.Store.Txn(ctx,
		[]fleet.Cmp{{Key: p.fence(chosen), ModRevision: fenceRev[chosen]}},
		[]fleet.Op{{Key: p.fence(chosen), Value: []byte(p.cfg.Self)}, {Key: d.Reservation, Value: body, Lease: lease}})
	if err != nil {
		// Ambiguous: the reservation may stand. It lapses with its lease if so; placing
		// on a reading that may be stale is what the fence is there to refuse.
		return d, storeErr("reserving room on node "+chosen, err)
	}
	if !applied {
		return d, errFenced
	}
	return d, nil
}

// choose picks among the candidates: warm ones first when there are, then the best of K
// drawn at random; a pinned need takes its node if it is a candidate at all.
func (p *Placer) choose(cands []Candidate, need Need) (string, string, error) {
	var ok []int
	for i, c := range cands {
		if c.Refused == "" {
			ok = append(ok, i)
		}
	}
	if len(ok) == 0 {
		return "", "", refusal(cands, need)
	}
	if need.Node != "" {
		cands[ok[0]].Drawn = true
		return need.Node, "pinned (--node)", nil
	}
	reason := fmt.Sprintf("best of %d by free room", p.cfg.K)
	var warm []int
	for _, i := range ok {
		if cands[i].Warm {
			warm = append(warm, i)
		}
	}
	if len(warm) > 0 {
		ok = warm
		reason = fmt.Sprintf("a warm sandbox of its shape; best of %d by free room", p.cfg.K)
	}
	// A partial Fisher-Yates draw of K.
	for i := 0; i < p.cfg.K && i < len(ok); i++ {
		j := i + p.cfg.Intn(len(ok)-i)
		ok[i], ok[j] = ok[j], ok[i]
	}
	drawn := ok[:min(p.cfg.K, len(ok))]
	best := drawn[0]
	for _, i := range drawn {
		cands[i].Drawn = true
		if c, b := cands[i], cands[best]; c.Score > b.Score || c.Score == b.Score && c.Node < b.Node {
			best = i
		}
	}
	return cands[best].Node, reason, nil
}

// refusal is why no node could take the session, each node's reason said, classified by
// what would help: a reachable node with room (unavailable), a node that delivers the class
// (failed precondition), room (resource exhausted).
func refusal(cands []Candidate, need Need) error {
	if len(cands) == 0 {
		return fmt.Errorf("placement: the fleet's directory lists no node (is any roostd registered? roostctl fleet nodes): %w", errdefs.ErrUnavailable)
	}
	var why []string
	var kind error = errdefs.ErrResourceExhausted
	classless, unreachable := 0, 0
	for _, c := range cands {
		why = append(why, c.Node+": "+c.Refused)
		switch {
		case strings.HasPrefix(c.Refused, "delivers"):
			classless++
		case !strings.HasPrefix(c.Refused, "full"):
			unreachable++
		}
	}
	switch {
	case classless == len(cands):
		kind = errdefs.ErrFailedPrecondition
	case unreachable == len(cands):
		kind = errdefs.ErrUnavailable
	}
	what := "no node can take the session"
	if need.Node != "" {
		what = fmt.Sprintf("node %s cannot take the session", need.Node)
	}
	return fmt.Errorf("placement: %s: %s: %w", what, strings.Join(why, "; "), kind)
}

// leaseFor is a lease for a reservation: one granted with TTL, reused for a third of it, so
// a reservation lapses between two thirds of TTL and TTL after it was made.
func (p *Placer) leaseFor(ctx context.Context) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lease != 0 && time.Since(p.leaseFrom) < p.cfg.TTL/3 {
		return p.lease, nil
	}
	from := time.Now()
	l, err := p.cfg.Store.Grant(ctx, p.cfg.TTL)
	if err != nil {
		return 0, err
	}
	p.lease, p.leaseFrom = l, from
	return l, nil
}

// Release deletes the decision's reservation, for a session its node did not stage. A
// failure is logged: the lease ends the reservation anyway.
func (p *Placer) Release(ctx context.Context, d *Decision) {
	if d.Reservation == "" {
		return
	}
	if _, err := p.cfg.Store.Txn(ctx, nil, []fleet.Op{{Key: d.Reservation, Delete: true}}); err != nil {
		p.log.Warn("placement: a reservation was not released; its lease ends it", "node", d.Node, "key", d.Reservation, "err", err)
	}
	d.Reservation = ""
}

func newID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("placement: a reservation id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Staged is a node's list of reservations of sessions it staged, for its directory entry's
// next write to settle (directory.Config.Settle).
type Staged struct {
	node   string
	prefix string
	mu     sync.Mutex
	keys   []string
}

// NewStaged is node's list; prefix is the directory's ("" for its default).
func NewStaged(node, prefix string) *Staged {
	if prefix == "" {
		prefix = directory.DefaultPrefix
	}
	return &Staged{node: node, prefix: prefix + "placement/" + node + "/res/"}
}

// Check refuses a reservation key that is not one of this node's: a forwarded stage names
// the key its node deletes, and must not name any other.
func (s *Staged) Check(key string) error {
	id, ok := strings.CutPrefix(key, s.prefix)
	if !ok || len(id) != 16 || strings.Trim(id, "0123456789abcdef") != "" {
		return fmt.Errorf("placement reservation %q: not one of node %s's (%s<16 hex digits>): %w", key, s.node, s.prefix, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Add lists a checked key once its session is staged here.
func (s *Staged) Add(key string) {
	s.mu.Lock()
	s.keys = append(s.keys, key)
	s.mu.Unlock()
}

// maxSettle bounds the keys one entry write deletes, within etcd's operations per Txn.
const maxSettle = 100

// Settle is directory.Config.Settle: the keys listed so far (at most maxSettle), taken off
// the list, and given back unless written.
func (s *Staged) Settle() ([]string, func(bool)) {
	s.mu.Lock()
	n := min(len(s.keys), maxSettle)
	keys := slices.Clone(s.keys[:n])
	s.keys = slices.Delete(s.keys, 0, n)
	s.mu.Unlock()
	return keys, func(written bool) {
		if written || len(keys) == 0 {
			return
		}
		s.mu.Lock()
		s.keys = append(keys, s.keys...)
		s.mu.Unlock()
	}
}
