// Package ledger meters the tokens sessions spend. Admission reserves before a model call and
// is strict: under any number of concurrent admitters, what is charged plus what is reserved
// never exceeds a ceiling — the session's own (inference.max_session_tokens), every
// ancestor's (a child's spend counts against its whole ancestry), and the machine's per UTC
// day. Settlement replaces a reservation with the actual usage, once; a reservation never
// settled is charged in full when it expires or its session ends. Every admission and
// settlement is fsynced before it is acknowledged; concurrent ones share commits through
// bbolt's Batch.
package ledger

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
)

// File is the ledger's name in the state directory.
const File = "ledger.db"

// DefaultTTL is how long a reservation may stay open before it is charged in full.
const DefaultTTL = 10 * time.Minute

// MaxTokens bounds a single admission or settlement: far beyond any model call, and far
// from overflowing a sum.
const MaxTokens = 1 << 40

// Why a reservation was charged.
const (
	ReasonSettled      = "settled"
	ReasonExpired      = "expired"
	ReasonSessionEnded = "session_ended"
)

// Config is what a Ledger needs.
type Config struct {
	Path string
	// Clock tells the time (time.Now when nil); the day window follows its UTC date.
	Clock func() time.Time
	// TTL is how long a reservation stays open; DefaultTTL when 0.
	TTL time.Duration
	// MachineCeiling, when set, replaces the stored per-day machine ceiling (0: none).
	MachineCeiling *int64
	// ExpireEvery is how often expired reservations are charged; 0 leaves it to the caller
	// (Expire).
	ExpireEvery time.Duration
	// Commit is how writes reach the file: CommitGroup (the default) or, for comparison in
	// benchmarks, bbolt's Batch or a transaction per write. Every one fsyncs before it
	// returns.
	Commit CommitMode
	// Fleet makes the ledger a node of a fleet: besides every other ceiling, an admission
	// must fit the node's allowance (SetAllowance), the tokens of the fleet's blocks it
	// holds for the day, refused with limit "fleet" when it does not. Until an allowance is
	// set (the last one set is kept in the file), the node admits nothing.
	Fleet bool
	// Observer hears every committed charge and every refusal, for metrics; nil for none.
	Observer Observer
	Logger   *slog.Logger
}

// Observer hears what the ledger decides.
type Observer interface {
	Charged(Settlement)
	Refused(*Refusal)
}

// CommitMode is how the ledger commits writes.
type CommitMode string

// The commit modes.
const (
	CommitGroup     CommitMode = ""
	CommitBoltBatch CommitMode = "bolt-batch"
	CommitTxPerOp   CommitMode = "tx-per-op"
)

// Ledger is the token ledger. Its state is in memory, decided under one lock, and every
// change is committed to the file before it is acknowledged.
type Ledger struct {
	db    *bolt.DB
	clock func() time.Time
	ttl   time.Duration
	log   *slog.Logger
	// commit writes one admission's or settlement's change and fsyncs it.
	commit func(func(*bolt.Tx) error) error
	// view reads the file once it is open: db.View, in a field so that, as with commit, a
	// test can make it fail.
	view func(func(*bolt.Tx) error) error
	obs  Observer

	mu       sync.Mutex
	accounts map[string]*account
	open     map[string]*reservation
	// byRequest maps session 0x00 request id to an open reservation.
	byRequest map[string]string
	reserved  int64
	ceiling   int64
	// fleet is set in fleet mode: allow is then the node's allowance, and funded what the
	// reservations each day's allowance admitted were charged (settled) and hold (open).
	fleet  bool
	allow  Allowance
	funded map[string]*fundedDay
	// low is signalled (without blocking) when an admission leaves less of the allowance
	// than allow.Low, or one is refused at it.
	low      chan struct{}
	lifetime int64
	day      window
	// broken is set when a commit failed: memory is then ahead of the file, and the ledger
	// refuses every admission rather than count what it cannot keep.
	broken error
	// unread is why the new day's window could not be read, until a read succeeds: roll
	// refuses each call meanwhile, and this keeps the failure to one line in the log.
	unread  error
	changed chan struct{}

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

type account struct {
	id string
	storedAccount
	reserved, subReserved int64
}

type reservation struct {
	id string
	storedReservation
}

type window struct {
	date     string
	charged  int64
	sessions map[string]int64
	capsules map[string]int64
}

// Open opens (creating when absent) the ledger file and rebuilds the ledger's state from it.
func Open(cfg Config) (*Ledger, error) {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	db, err := openDB(cfg.Path)
	if err != nil {
		return nil, err
	}
	l := &Ledger{
		db: db, view: db.View, clock: cfg.Clock, ttl: cfg.TTL, log: cfg.Logger, obs: cfg.Observer,
		accounts: map[string]*account{}, open: map[string]*reservation{}, byRequest: map[string]string{},
		changed: make(chan struct{}), stop: make(chan struct{}),
		fleet: cfg.Fleet, funded: map[string]*fundedDay{}, low: make(chan struct{}, 1),
	}
	switch cfg.Commit {
	case CommitGroup:
		l.commit = (&groupCommit{db: db}).commit
	case CommitBoltBatch:
		l.commit = db.Batch
	case CommitTxPerOp:
		l.commit = db.Update
	default:
		db.Close()
		return nil, fmt.Errorf("ledger: unknown commit mode %q", cfg.Commit)
	}
	if cfg.MachineCeiling != nil {
		if err := l.SetMachineCeiling(*cfg.MachineCeiling); err != nil {
			db.Close()
			return nil, err
		}
	}
	if err := db.View(l.load); err != nil {
		db.Close()
		return nil, err
	}
	if cfg.ExpireEvery > 0 {
		l.wg.Add(1)
		go l.expireLoop(cfg.ExpireEvery)
	}
	return l, nil
}

func (l *Ledger) load(tx *bolt.Tx) error {
	meta := bucket(tx, bucketMeta)
	l.ceiling = int64(getUint(meta.Get(keyMachineCeiling)))
	if l.fleet {
		a, err := getAllowance(meta)
		if err != nil {
			return err
		}
		l.allow = a
	}
	l.lifetime = int64(getUint(meta.Get(keyLifetime)))
	err := bucket(tx, bucketAccounts).ForEach(func(k, _ []byte) error {
		a, err := getAccount(tx, string(k))
		if err != nil {
			return err
		}
		l.accounts[string(k)] = &account{id: string(k), storedAccount: *a}
		return nil
	})
	if err != nil {
		return err
	}
	err = forEachReservation(tx, func(id string, r *storedReservation) error {
		l.open[id] = &reservation{id: id, storedReservation: *r}
		if r.RequestID != "" {
			l.byRequest[string(requestKey(r.Session, r.RequestID))] = id
		}
		l.reserve(r.Session, r.Tokens)
		if r.Funded != "" {
			l.fundedDay(tx, r.Funded).reserved += r.Tokens
		}
		return nil
	})
	if err != nil {
		return err
	}
	date := dayOf(l.clock())
	d := getDay(tx, date)
	l.day = window{date: date, charged: d.charged, sessions: d.sessions, capsules: d.capsules}
	return nil
}

// Close stops the expiry loop and closes the file. Closing again does nothing.
func (l *Ledger) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.stop)
		l.wg.Wait()
		err = l.db.Close()
	})
	return err
}

func dayOf(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// resetsAt is when the day window of date ends.
func resetsAt(date string) time.Time {
	d, _ := time.Parse(time.DateOnly, date)
	return d.AddDate(0, 0, 1)
}

// roll moves the day window to the clock's UTC date. The caller holds l.mu.
//
// When the new day's window cannot be read, the window stays where it was and roll fails
// until a read succeeds: starting the day at zero would admit again what the file says
// was already charged against the machine's ceiling, and a charge made into a window not
// read would be counted into the wrong day.
func (l *Ledger) roll() error {
	date := dayOf(l.clock())
	if date == l.day.date {
		return nil
	}
	var d storedDay
	err := l.view(func(tx *bolt.Tx) error {
		d = getDay(tx, date)
		return nil
	})
	if err != nil {
		if l.unread == nil {
			l.log.Error("the ledger could not read the day's charges; refusing all spending until it can", "day", date, "err", err)
		}
		l.unread = err
		return fmt.Errorf("the spend ledger could not read what %s was charged (%v); nothing is admitted or charged until it can: %w", date, err, errdefs.ErrUnavailable)
	}
	if l.unread != nil {
		l.log.Info("the ledger read the day's charges; spending resumes", "day", date)
		l.unread = nil
	}
	l.day = window{date: date, charged: d.charged, sessions: d.sessions, capsules: d.capsules}
	// A new day frees the machine's budget: wake whoever waits for it.
	l.notify()
	return nil
}

// notify wakes every waiter; the caller holds l.mu.
func (l *Ledger) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Changed returns a channel closed at the next change that may free budget or settle a
// refusal: a charge, a raised machine ceiling, a new day. Take it before checking.
func (l *Ledger) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// Session is what the ledger is told of a session before it may spend.
type Session struct {
	ID, Capsule, ParentID string
	// Ceiling is inference.max_session_tokens; 0 for none.
	Ceiling int64
}

// Register opens a session's account. Registering a session again changes nothing. A
// parent must be registered before its children: the child's spend counts against it.
func (l *Ledger) Register(s Session) error {
	if s.Ceiling < 0 {
		return fmt.Errorf("session %s: a ceiling of %d tokens: %w", s.ID, s.Ceiling, errdefs.ErrInvalidArgument)
	}
	l.mu.Lock()
	if _, ok := l.accounts[s.ID]; ok {
		l.mu.Unlock()
		return nil
	}
	var ancestors []string
	if s.ParentID != "" {
		parent, ok := l.accounts[s.ParentID]
		if !ok {
			l.mu.Unlock()
			return fmt.Errorf("session %s: its parent %s has no ledger account: %w", s.ID, s.ParentID, errdefs.ErrFailedPrecondition)
		}
		ancestors = append([]string{s.ParentID}, parent.Ancestors...)
	}
	a := &account{id: s.ID, storedAccount: storedAccount{
		Capsule: s.Capsule, Parent: s.ParentID, Ancestors: ancestors, Ceiling: s.Ceiling, Registered: l.clock().UTC(),
	}}
	l.mu.Unlock()
	err := l.db.Update(func(tx *bolt.Tx) error {
		if existing, err := getAccount(tx, s.ID); err != nil || existing != nil {
			return err
		}
		return putAccount(tx, s.ID, &a.storedAccount)
	})
	if err != nil {
		return err
	}
	l.mu.Lock()
	if _, ok := l.accounts[s.ID]; !ok {
		l.accounts[s.ID] = a
	}
	l.mu.Unlock()
	return nil
}

// Reservation is tokens set aside for one call.
type Reservation struct {
	ID        string    `json:"reservation"`
	SessionID string    `json:"session_id"`
	RequestID string    `json:"request_id,omitempty"`
	Tokens    int64     `json:"tokens"`
	ExpiresAt time.Time `json:"expires_at"`
	// Settled is set when the request was admitted and settled before: the admission is
	// not repeated.
	Settled *Settlement `json:"settled,omitempty"`
}

// Settlement is what one reservation was charged.
type Settlement struct {
	ReservationID string `json:"reservation"`
	SessionID     string `json:"session_id"`
	Capsule       string `json:"capsule"`
	RequestID     string `json:"request_id,omitempty"`
	Model         string `json:"model,omitempty"`
	Reserved      int64  `json:"reserved"`
	InputTokens   int64  `json:"input_tokens"`
	OutputTokens  int64  `json:"output_tokens"`
	Charged       int64  `json:"charged"`
	Reason        string `json:"reason"`
	Day           string `json:"day"`
	// Funded is the UTC day whose fleet allowance admitted the reservation (fleet mode
	// only): a call admitted before midnight and settled after is charged to the new day's
	// window but was paid for from the old day's blocks.
	Funded string    `json:"funded,omitempty"`
	At     time.Time `json:"at"`
}

// Admission is one request for tokens.
type Admission struct {
	SessionID string
	// RequestID makes the admission idempotent: the same id admits once.
	RequestID string
	// Tokens is the most the call asks for. MinTokens, when set (1 to Tokens), is the least
	// it can do with: the ledger then grants the most between the two that fits under every
	// ceiling, deciding it under the same lock as the check, so concurrent admissions never
	// see room another has taken. 0 asks for Tokens or nothing.
	Tokens, MinTokens int64
	Model             string
}

// Admit reserves tokens for a session's call — Tokens, or less down to MinTokens when only
// that fits (Reservation.Tokens says what was granted) — or refuses with a *Refusal naming
// the ceiling the least would cross. The reservation is on disk before Admit returns.
func (l *Ledger) Admit(req Admission) (Reservation, error) {
	if req.Tokens <= 0 || req.Tokens > MaxTokens {
		return Reservation{}, fmt.Errorf("tokens: %d: must be between 1 and %d: %w", req.Tokens, int64(MaxTokens), errdefs.ErrInvalidArgument)
	}
	if req.MinTokens < 0 || req.MinTokens > req.Tokens {
		return Reservation{}, fmt.Errorf("min_tokens: %d: must be between 0 and tokens (%d): %w", req.MinTokens, req.Tokens, errdefs.ErrInvalidArgument)
	}
	if req.MinTokens == 0 {
		req.MinTokens = req.Tokens
	}
	l.mu.Lock()
	if l.broken != nil {
		l.mu.Unlock()
		return Reservation{}, l.brokenErr()
	}
	if err := l.roll(); err != nil {
		l.mu.Unlock()
		return Reservation{}, err
	}
	a, err := l.account(req.SessionID)
	if err != nil {
		l.mu.Unlock()
		return Reservation{}, err
	}
	if req.RequestID != "" {
		if id, ok := l.byRequest[string(requestKey(req.SessionID, req.RequestID))]; ok {
			r := l.open[id]
			l.mu.Unlock()
			return r.public(), nil
		}
		if s := l.settledRequest(req.SessionID, req.RequestID); s != nil {
			l.mu.Unlock()
			return Reservation{ID: s.ReservationID, SessionID: s.SessionID, RequestID: s.RequestID, Tokens: s.Reserved, Settled: s}, nil
		}
	}
	granted, refusal, latch := l.check(a, req.MinTokens, req.Tokens)
	if refusal != nil {
		if refusal.Limit == LimitFleet {
			l.signalLow()
		}
		l.mu.Unlock()
		if l.obs != nil {
			l.obs.Refused(refusal)
		}
		if latch {
			if err := l.latch(a.id, refusal); err != nil {
				return Reservation{}, err
			}
		}
		return Reservation{}, refusal
	}
	now := l.clock().UTC()
	r := &reservation{id: newID("rsv_"), storedReservation: storedReservation{
		Session: req.SessionID, RequestID: req.RequestID, Tokens: granted, Model: req.Model, Admitted: now, Expires: now.Add(l.ttl),
	}}
	if l.fleet {
		r.Funded = l.day.date
		f := l.funded[r.Funded]
		f.reserved += granted
		if l.allow.Low > 0 && l.allow.Tokens-f.charged-f.reserved < l.allow.Low {
			l.signalLow()
		}
	}
	l.open[r.id] = r
	if r.RequestID != "" {
		l.byRequest[string(requestKey(r.Session, r.RequestID))] = r.id
	}
	l.reserve(r.Session, r.Tokens)
	l.mu.Unlock()

	if err := l.commit(func(tx *bolt.Tx) error { return putReservation(tx, r.id, &r.storedReservation) }); err != nil {
		return Reservation{}, l.fail(err)
	}
	return r.public(), nil
}

func (r *reservation) public() Reservation {
	return Reservation{ID: r.id, SessionID: r.Session, RequestID: r.RequestID, Tokens: r.Tokens, ExpiresAt: r.Expires}
}

// account returns a live session's account; the caller holds l.mu.
func (l *Ledger) account(id string) (*account, error) {
	a, ok := l.accounts[id]
	if !ok {
		return nil, fmt.Errorf("session %s has no ledger account: %w", id, errdefs.ErrNotFound)
	}
	if a.Ended {
		return nil, fmt.Errorf("session %s has ended; it spends nothing more: %w", id, errdefs.ErrFailedPrecondition)
	}
	return a, nil
}

func (l *Ledger) settledRequest(session, request string) *Settlement {
	var s *Settlement
	_ = l.view(func(tx *bolt.Tx) error {
		if id := requestReservation(tx, session, request); id != "" {
			s, _ = getSettlement(tx, id)
		}
		return nil
	})
	return s
}

// check decides an admission of least to most tokens against every ceiling, in order: the
// session's own, each ancestor's from the nearest, the machine's for today. It grants the
// most that fits under all of them, or refuses at the first where not even the least does.
//
// A refusal of the session or an ancestor latches (the budget can only shrink) when the
// least exceeds what is left of the ceiling after what is charged alone: no release of an
// open reservation can make it fit. One that only the open reservations make is judged
// afresh, as the machine's always is — else a call in flight that took the last of the
// room would end the session's spending for good. The caller holds l.mu.
func (l *Ledger) check(a *account, least, most int64) (int64, *Refusal, bool) {
	// A latch holds against what needs more than its ceiling leaves after what is charged; a
	// smaller least is judged as any other, so a session is never refused a call that fits.
	if a.Latched != nil {
		r := *a.Latched
		if charged := l.charged(a, r); charged+least > r.Ceiling {
			r.Used, r.Requested, r.Latched = l.used(a, r), least, true
			return 0, &r, false
		}
	}
	room := most
	var refusal *Refusal
	l.ceilings(a, func(limit string, ceiling, charged, reserved int64) bool {
		left := ceiling - charged - reserved
		if left < least {
			refusal = &Refusal{Limit: limit, Ceiling: ceiling, Used: charged + reserved, Requested: least}
			// The machine's is judged afresh each time; a session's or an ancestor's latches
			// when what is charged alone leaves no room for the least.
			refusal.Latched = limit != LimitMachine && limit != LimitFleet && charged+least > ceiling
			return false
		}
		room = min(room, left)
		return true
	})
	if refusal != nil {
		if refusal.Limit == LimitFleet && l.allow.Unreachable {
			refusal.Detail = "fleet ledger unreachable"
		}
		return 0, refusal, refusal.Latched
	}
	return room, nil, false
}

// Headroom is the most an admission of the session could be granted now: what the
// tightest of its ceilings (its own, each ancestor's, the machine's for today) leaves after
// what is charged and reserved; MaxTokens when none binds.
// It is a reading, not a promise: Admit decides again under its lock.
func (l *Ledger) Headroom(sessionID string) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, err := l.account(sessionID)
	if err != nil {
		return 0, err
	}
	room := int64(MaxTokens)
	l.ceilings(a, func(_ string, ceiling, charged, reserved int64) bool {
		room = min(room, ceiling-charged-reserved)
		return true
	})
	return max(room, 0), nil
}

// ceilings calls fn with each ceiling an admission of a must fit, in order — the session's
// own, each ancestor's from the nearest, the machine's for today — with what is charged and
// reserved against it, until fn returns false. The caller holds l.mu.
func (l *Ledger) ceilings(a *account, fn func(limit string, ceiling, charged, reserved int64) bool) {
	if a.Ceiling > 0 && !fn(LimitSession, a.Ceiling, a.SubtreeCharged, a.subReserved) {
		return
	}
	for _, id := range a.Ancestors {
		if anc := l.accounts[id]; anc != nil && anc.Ceiling > 0 && !fn(LimitAncestor+" "+id, anc.Ceiling, anc.SubtreeCharged, anc.subReserved) {
			return
		}
	}
	if l.ceiling > 0 && !fn(LimitMachine, l.ceiling, l.day.charged, l.reserved) {
		return
	}
	if l.fleet {
		// A node holds nothing of a day it was given no allowance for.
		var tokens, charged, reserved int64
		if l.allow.Day == l.day.date {
			// Unread, what the day's allowance funded might be all of it: nothing fits.
			if f := l.fundedDayLoaded(l.day.date); f != nil {
				tokens, charged, reserved = l.allow.Tokens, f.charged, f.reserved
			}
		}
		fn(LimitFleet, tokens, charged, reserved)
	}
}

// charged is what is charged alone against a latched refusal's ceiling. The caller holds l.mu.
func (l *Ledger) charged(a *account, r Refusal) int64 {
	if id, ok := r.ancestor(); ok {
		a = l.accounts[id]
	}
	if a == nil {
		return r.Used
	}
	return a.SubtreeCharged
}

// used is what now counts against a latched refusal's ceiling. The caller holds l.mu.
func (l *Ledger) used(a *account, r Refusal) int64 {
	if id, ok := r.ancestor(); ok {
		a = l.accounts[id]
	}
	if a == nil {
		return r.Used
	}
	return a.SubtreeCharged + a.subReserved
}

func (l *Ledger) latch(id string, r *Refusal) error {
	l.mu.Lock()
	a := l.accounts[id]
	if a.Latched == nil {
		latched := *r
		a.Latched = &latched
	}
	l.mu.Unlock()
	err := l.commit(func(tx *bolt.Tx) error {
		stored, err := getAccount(tx, id)
		if err != nil || stored == nil || stored.Latched != nil {
			return err
		}
		stored.Latched = r
		return putAccount(tx, id, stored)
	})
	if err != nil {
		return l.fail(err)
	}
	return nil
}

// reserve adds tokens to what a session and its ancestors have reserved (negative to
// release). The caller holds l.mu.
func (l *Ledger) reserve(session string, tokens int64) {
	l.reserved += tokens
	a := l.accounts[session]
	if a == nil {
		return
	}
	a.reserved += tokens
	a.subReserved += tokens
	for _, id := range a.Ancestors {
		if anc := l.accounts[id]; anc != nil {
			anc.subReserved += tokens
		}
	}
}

// Usage is what a call actually spent.
type Usage struct {
	Input, Output int64
}

// Settle replaces a reservation with what the call spent. Settling a reservation again
// returns its first settlement and charges nothing more. The charge is on disk before
// Settle returns.
func (l *Ledger) Settle(sessionID, reservationID string, u Usage) (Settlement, error) {
	if u.Input < 0 || u.Output < 0 || u.Input > MaxTokens || u.Output > MaxTokens {
		return Settlement{}, fmt.Errorf("input_tokens %d, output_tokens %d: each must be between 0 and %d: %w", u.Input, u.Output, int64(MaxTokens), errdefs.ErrInvalidArgument)
	}
	return l.charge(sessionID, reservationID, ReasonSettled, &u)
}

// charge ends an open reservation: with usage when settled, in full otherwise.
func (l *Ledger) charge(sessionID, reservationID, reason string, u *Usage) (Settlement, error) {
	l.mu.Lock()
	if l.broken != nil {
		l.mu.Unlock()
		return Settlement{}, l.brokenErr()
	}
	// The reservation stays open, and held against every ceiling, until the day's window is
	// read: then a settlement again, its expiry or its session's end charges it.
	if err := l.roll(); err != nil {
		l.mu.Unlock()
		return Settlement{}, err
	}
	r, ok := l.open[reservationID]
	if !ok || r.Session != sessionID {
		l.mu.Unlock()
		var s *Settlement
		_ = l.view(func(tx *bolt.Tx) (err error) {
			s, err = getSettlement(tx, reservationID)
			return err
		})
		if s != nil && s.SessionID == sessionID {
			return *s, nil
		}
		return Settlement{}, fmt.Errorf("no reservation %q for this session: %w", reservationID, errdefs.ErrNotFound)
	}
	s := l.apply(r, reason, u)
	ancestors := slices.Clone(l.accounts[r.Session].Ancestors)
	l.mu.Unlock()
	if err := l.commit(func(tx *bolt.Tx) error { return writeCharge(tx, &s, ancestors) }); err != nil {
		return Settlement{}, l.fail(err)
	}
	if l.obs != nil {
		l.obs.Charged(s)
	}
	return s, nil
}

// apply moves a reservation from reserved to charged in memory. The caller holds l.mu.
func (l *Ledger) apply(r *reservation, reason string, u *Usage) Settlement {
	a := l.accounts[r.Session]
	s := Settlement{
		ReservationID: r.id, SessionID: r.Session, Capsule: a.Capsule, RequestID: r.RequestID, Model: r.Model,
		Reserved: r.Tokens, Charged: r.Tokens, Reason: reason, Day: l.day.date, Funded: r.Funded, At: l.clock().UTC(),
	}
	if u != nil {
		s.InputTokens, s.OutputTokens, s.Charged = u.Input, u.Output, u.Input+u.Output
	}
	delete(l.open, r.id)
	if r.RequestID != "" {
		delete(l.byRequest, string(requestKey(r.Session, r.RequestID)))
	}
	l.reserve(r.Session, -r.Tokens)
	if f := l.funded[r.Funded]; r.Funded != "" && f != nil {
		f.reserved -= r.Tokens
		f.charged += s.Charged
	}
	a.Input += s.InputTokens
	a.Output += s.OutputTokens
	a.Charged += s.Charged
	a.SubtreeCharged += s.Charged
	for _, id := range a.Ancestors {
		if anc := l.accounts[id]; anc != nil {
			anc.SubtreeCharged += s.Charged
		}
	}
	l.lifetime += s.Charged
	l.day.charged += s.Charged
	l.day.sessions[r.Session] += s.Charged
	l.day.capsules[a.Capsule] += s.Charged
	// Any charge may change a waiter's verdict: budget freed below the reservation, or a
	// refusal the reservation made that its charge now makes for good.
	l.notify()
	return s
}

// fail marks the ledger broken after a failed commit: memory is ahead of the file, so it
// admits nothing more until a restart rebuilds it from the file.
func (l *Ledger) fail(err error) error {
	l.mu.Lock()
	if l.broken == nil {
		l.broken = err
		l.log.Error("the ledger could not commit; refusing all spending until roostd restarts", "err", err)
	}
	l.mu.Unlock()
	return l.brokenErr()
}

func (l *Ledger) brokenErr() error {
	return fmt.Errorf("the spend ledger could not write to its file (%v); nothing is admitted until roostd restarts: %w", l.broken, errdefs.ErrUnavailable)
}

// Expire charges in full every reservation whose time has passed: the capsule may have
// spent it.
func (l *Ledger) Expire() error {
	l.mu.Lock()
	now := l.clock()
	var due []*reservation
	for _, r := range l.open {
		if !now.Before(r.Expires) {
			due = append(due, r)
		}
	}
	l.mu.Unlock()
	var errs []error
	for _, r := range due {
		if _, err := l.charge(r.Session, r.id, ReasonExpired, nil); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// SettledRetention is how long a settlement is kept for repeated settlements and admissions
// of its request id to find; the totals it went into are kept for ever.
const SettledRetention = 7 * 24 * time.Hour

func (l *Ledger) expireLoop(every time.Duration) {
	defer l.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	var pruned time.Time
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			if err := l.Expire(); err != nil {
				l.log.Error("charging expired reservations", "err", err)
			}
			if now := l.clock(); now.Sub(pruned) > time.Hour {
				pruned = now
				if n, err := l.Prune(now.Add(-SettledRetention)); err != nil {
					l.log.Error("pruning old settlements", "err", err)
				} else if n > 0 {
					l.log.Info("pruned old settlements", "count", n)
				}
			}
		}
	}
}

// Prune forgets settlements made before a time (and their request ids): a repeat of one of
// them is then unknown rather than answered. It returns how many went.
func (l *Ledger) Prune(before time.Time) (int, error) {
	n := 0
	err := l.db.Update(func(tx *bolt.Tx) error {
		var old []*Settlement
		err := bucket(tx, bucketSettled).ForEach(func(k, v []byte) error {
			s, err := getSettlement(tx, string(k))
			if err == nil && s.At.Before(before) {
				old = append(old, s)
			}
			return err
		})
		if err != nil {
			return err
		}
		for _, s := range old {
			if err := deleteSettlement(tx, s); err != nil {
				return err
			}
		}
		n = len(old)
		return nil
	})
	return n, err
}

// End closes a session's account: its open reservations are charged in full (the capsule
// may have spent them) and it admits nothing more. Ending again changes nothing.
func (l *Ledger) End(sessionID string) (Spend, error) {
	l.mu.Lock()
	a, ok := l.accounts[sessionID]
	if !ok {
		l.mu.Unlock()
		return Spend{}, nil
	}
	var open []*reservation
	for _, r := range l.open {
		if r.Session == sessionID {
			open = append(open, r)
		}
	}
	already := a.Ended
	a.Ended = true
	l.mu.Unlock()
	var errs []error
	for _, r := range open {
		if _, err := l.charge(sessionID, r.id, ReasonSessionEnded, nil); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	if !already {
		err := l.db.Update(func(tx *bolt.Tx) error {
			stored, err := getAccount(tx, sessionID)
			if err != nil || stored == nil {
				return err
			}
			stored.Ended = true
			return putAccount(tx, sessionID, stored)
		})
		if err != nil {
			errs = append(errs, l.fail(err))
		}
	}
	spend, _ := l.Session(sessionID)
	return spend, errors.Join(errs...)
}

// Spend is one session's account.
type Spend struct {
	SessionID string `json:"session_id"`
	Capsule   string `json:"capsule"`
	// Ceiling is inference.max_session_tokens; 0 for none.
	Ceiling      int64 `json:"ceiling"`
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// Charged is the session's own spend; Reserved its open reservations.
	Charged  int64 `json:"charged"`
	Reserved int64 `json:"reserved"`
	// SubtreeCharged and SubtreeReserved add its descendants'.
	SubtreeCharged  int64    `json:"subtree_charged"`
	SubtreeReserved int64    `json:"subtree_reserved"`
	Latched         *Refusal `json:"latched,omitempty"`
	Ended           bool     `json:"ended,omitempty"`
}

// Session returns a session's account.
func (l *Ledger) Session(id string) (Spend, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.accounts[id]
	if !ok {
		return Spend{}, fmt.Errorf("session %s has no ledger account: %w", id, errdefs.ErrNotFound)
	}
	return a.spend(), nil
}

func (a *account) spend() Spend {
	return Spend{
		SessionID: a.id, Capsule: a.Capsule, Ceiling: a.Ceiling, InputTokens: a.Input, OutputTokens: a.Output,
		Charged: a.Charged, Reserved: a.reserved, SubtreeCharged: a.SubtreeCharged, SubtreeReserved: a.subReserved,
		Latched: a.Latched, Ended: a.Ended,
	}
}

// SetMachineCeiling sets the per-day machine ceiling (0: none), at once and durably.
func (l *Ledger) SetMachineCeiling(tokens int64) error {
	if tokens < 0 || tokens > MaxTokens {
		return fmt.Errorf("machine ceiling %d: must be between 0 (none) and %d: %w", tokens, int64(MaxTokens), errdefs.ErrInvalidArgument)
	}
	err := l.db.Update(func(tx *bolt.Tx) error {
		return bucket(tx, bucketMeta).Put(keyMachineCeiling, putUint(uint64(tokens)))
	})
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.ceiling = tokens
	l.notify()
	l.mu.Unlock()
	return nil
}

// Day is the ledger for one UTC day.
type Day struct {
	Date     string    `json:"date"`
	ResetsAt time.Time `json:"resets_at"`
	// MachineCeiling is today's ceiling (the one in force now, for past days too); 0 none.
	MachineCeiling int64 `json:"machine_ceiling"`
	Charged        int64 `json:"charged"`
	// Reserved and OpenReservations are now's, for today only.
	Reserved         int64        `json:"reserved"`
	OpenReservations int          `json:"open_reservations"`
	Sessions         []DaySession `json:"sessions"`
	Capsules         []DayCapsule `json:"capsules"`
	// Lifetime is every token the machine's sessions were ever charged.
	Lifetime int64 `json:"lifetime"`
}

// DaySession is one session's part of a day.
type DaySession struct {
	SessionID string `json:"session_id"`
	Capsule   string `json:"capsule"`
	Charged   int64  `json:"charged"`
	Reserved  int64  `json:"reserved"`
	Ceiling   int64  `json:"ceiling"`
}

// DayCapsule is one capsule's part of a day.
type DayCapsule struct {
	Capsule string `json:"capsule"`
	Charged int64  `json:"charged"`
}

// Report returns the ledger of date (YYYY-MM-DD, UTC); "" is today.
func (l *Ledger) Report(date string) (Day, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.roll(); err != nil {
		return Day{}, err
	}
	if date == "" {
		date = l.day.date
	}
	if _, err := time.Parse(time.DateOnly, date); err != nil {
		return Day{}, fmt.Errorf("day %q: expected YYYY-MM-DD: %w", date, errdefs.ErrInvalidArgument)
	}
	d := Day{Date: date, ResetsAt: resetsAt(date), MachineCeiling: l.ceiling, Lifetime: l.lifetime}
	sessions, capsules := map[string]int64{}, map[string]int64{}
	if date == l.day.date {
		d.Charged = l.day.charged
		sessions, capsules = l.day.sessions, l.day.capsules
		d.Reserved, d.OpenReservations = l.reserved, len(l.open)
	} else {
		_ = l.view(func(tx *bolt.Tx) error {
			sd := getDay(tx, date)
			d.Charged, sessions, capsules = sd.charged, sd.sessions, sd.capsules
			return nil
		})
	}
	ids := slices.Collect(maps.Keys(sessions))
	if date == l.day.date {
		for _, a := range l.accounts {
			if a.reserved > 0 {
				if _, ok := sessions[a.id]; !ok {
					ids = append(ids, a.id)
				}
			}
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		ds := DaySession{SessionID: id, Charged: sessions[id]}
		if a := l.accounts[id]; a != nil {
			ds.Capsule, ds.Ceiling = a.Capsule, a.Ceiling
			if date == l.day.date {
				ds.Reserved = a.reserved
			}
		}
		d.Sessions = append(d.Sessions, ds)
	}
	for _, name := range slices.Sorted(maps.Keys(capsules)) {
		d.Capsules = append(d.Capsules, DayCapsule{Capsule: name, Charged: capsules[name]})
	}
	return d, nil
}

// Remaining is what the machine may still admit today; ok is false when there is no
// machine ceiling.
func (l *Ledger) Remaining() (tokens int64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.roll()
	if l.ceiling == 0 {
		return 0, false
	}
	if err != nil {
		// Nothing is admitted while the day's window is unread.
		return 0, true
	}
	return max(l.ceiling-l.day.charged-l.reserved, 0), true
}

// OpenReservations counts reservations not yet settled or charged.
func (l *Ledger) OpenReservations() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.open)
}

func newID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
