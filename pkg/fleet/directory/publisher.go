package directory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/fleet"
)

// Defaults and bounds of the publisher.
const (
	// DefaultSessionsInterval is the least time between two write rounds: a node starting a
	// thousand sessions a second writes their entries a few Txns at a time.
	DefaultSessionsInterval = 250 * time.Millisecond
	// DefaultResync is how often the publisher reads its entries again and looks, unasked,
	// whether its sessions changed: a change whose nudge was missed, or an entry changed
	// by another writer, is written within it.
	DefaultResync = 30 * time.Second
	// DefaultCallTimeout bounds each call to etcd, so a cut-off store is a failed round
	// tried again, not a round hung.
	DefaultCallTimeout = 10 * time.Second
	// maxRetryPause bounds the pause after failed rounds.
	maxRetryPause = 5 * time.Second
)

// SessionsConfig is what a node publishes its sessions with.
type SessionsConfig struct {
	Store  fleet.Store
	Prefix string
	// Node is the node's name in the fleet (its --node-name).
	Node string
	// List returns this node's sessions, ended ones too. It is called by the publisher
	// alone, never while a caller of Nudge waits.
	List func() ([]Session, error)
	// Interval is the least time between two write rounds (DefaultSessionsInterval when 0).
	Interval time.Duration
	// Timeout bounds each call to the store (DefaultCallTimeout when 0); Resync is how
	// often it reads its entries again unasked (DefaultResync when 0).
	Timeout, Resync time.Duration
	Logger          *slog.Logger
}

// PublisherStats count what a publisher did, for its tests and its logs.
type PublisherStats struct {
	// Rounds counts rounds that left the directory as List said; Failed those that left
	// something unwritten (written at a later round).
	Rounds, Failed int64
	// Txns counts Txns applied; Conflicts those a compare refused (an entry changed under
	// the publisher: it reads its entries again).
	Txns, Conflicts int64
	Puts, Deletes   int64
}

// Publisher keeps a node's entries in the session directory as its sessions are: a round
// diffs what List says against what it last wrote and writes only the difference.
type Publisher struct {
	cfg    SessionsConfig
	k      keys
	log    *slog.Logger
	nudge  chan struct{}
	cancel context.CancelFunc
	done   chan struct{}

	statsMu sync.Mutex
	stats   PublisherStats

	// roundMu orders rounds (the run loop's, then Stop's last) and guards what follows.
	roundMu sync.Mutex
	//
	// loaded: written and foreign are as the store was last read; false after a conflict or
	// an ambiguous error, so the next round reads the entries again first.
	loaded bool
	// written are this node's entries in the store: what each says (UpdatedAt zeroed) and
	// its ModRevision.
	written map[string]writtenEntry
	// foreign are the ids whose entries name another node, left alone; warned, those said
	// in the log already.
	foreign map[string]string
	warned  map[string]bool
}

type writtenEntry struct {
	body []byte
	rev  int64
}

// PublishSessions checks cfg and starts publishing. It does not wait for etcd: a node cut
// off from it publishes once it can.
func PublishSessions(cfg SessionsConfig) (*Publisher, error) {
	if err := fleet.ValidNodeName(cfg.Node); err != nil {
		return nil, fmt.Errorf("session directory: %w", err)
	}
	if cfg.Store == nil || cfg.List == nil {
		return nil, fmt.Errorf("session directory, node %s: a store and a list of sessions are needed: %w", cfg.Node, errdefs.ErrInvalidArgument)
	}
	if cfg.Interval < 0 || cfg.Timeout < 0 || cfg.Resync < 0 {
		return nil, fmt.Errorf("session directory, node %s: interval %s, timeout %s, resync %s: none may be below 0: %w",
			cfg.Node, cfg.Interval, cfg.Timeout, cfg.Resync, errdefs.ErrInvalidArgument)
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultSessionsInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultCallTimeout
	}
	p := &Publisher{cfg: cfg, k: keysOf(cfg.Prefix), log: cfg.Logger, nudge: make(chan struct{}, 1), done: make(chan struct{}),
		warned: map[string]bool{}}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() {
		defer close(p.done)
		p.run(ctx)
	}()
	// The first round reads what the node wrote before it started.
	p.Nudge()
	return p, nil
}

// Nudge asks for a round soon; it never waits. Nudges coalesce: a burst of them makes one
// round, and rounds are at least Interval apart.
func (p *Publisher) Nudge() {
	select {
	case p.nudge <- struct{}{}:
	default:
	}
}

// Flush runs a round now, under ctx, and returns once it wrote (or why it did not): a
// session staged before the call is in the directory when it returns nil. A stage placed
// here waits on it, so that every node finds the session by the time its client has its id.
func (p *Publisher) Flush(ctx context.Context) error { return p.roundRetrying(ctx) }

// Stats are the publisher's counts so far.
func (p *Publisher) Stats() PublisherStats {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	return p.stats
}

func (p *Publisher) count(f func(*PublisherStats)) {
	p.statsMu.Lock()
	f(&p.stats)
	p.statsMu.Unlock()
}

// Stop stops the rounds, then runs a last one under ctx so that the directory says what
// the node's sessions were when it stopped. The error is that round's. Stopping again
// runs another last round.
func (p *Publisher) Stop(ctx context.Context) error {
	p.cancel()
	<-p.done
	return p.roundRetrying(ctx)
}

func (p *Publisher) run(ctx context.Context) {
	resync := time.NewTicker(p.cfg.Resync)
	defer resync.Stop()
	// next is the earliest the next round may start: Interval after the last, or a pause
	// after a failed one, whatever nudges come meanwhile.
	var next time.Time
	var retry <-chan time.Time
	pause := p.cfg.Interval
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.nudge:
		case <-resync.C:
			// What no event of this node says: its entries marked lost (it was forgotten
			// while it ran), another node's entry of one of its ids gone. Read them again.
			p.roundMu.Lock()
			p.loaded = false
			p.roundMu.Unlock()
		case <-retry:
		}
		if wait := time.Until(next); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		// A nudge before List is this round's; one after it, the next round's.
		select {
		case <-p.nudge:
		default:
		}
		started := time.Now()
		retry = nil
		err := p.roundRetrying(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			p.log.Warn("the session directory: not up to date; trying again", "node", p.cfg.Node, "in", pause.String(), "err", err)
			// From the failure's end: a round that waited out a cut store is not retried
			// at once.
			next = time.Now().Add(pause)
			retry = time.After(pause)
			pause = min(pause*2, maxRetryPause)
		default:
			next = started.Add(p.cfg.Interval)
			pause = p.cfg.Interval
		}
	}
}

// errConflict: a compare failed; the entries are read again before the next try.
var errConflict = errors.New("an entry changed under the publisher")

// roundRetrying runs a round, and again at once after a conflict (having read the entries
// again), a few times.
func (p *Publisher) roundRetrying(ctx context.Context) error {
	p.roundMu.Lock()
	defer p.roundMu.Unlock()
	var err error
	for range 3 {
		if err = p.round(ctx); !errors.Is(err, errConflict) {
			break
		}
	}
	if err != nil {
		p.count(func(s *PublisherStats) { s.Failed++ })
		return err
	}
	p.count(func(s *PublisherStats) { s.Rounds++ })
	return nil
}

func (p *Publisher) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.cfg.Timeout)
}

// load reads the directory's entries (one prefix read) and keeps this node's and the ids
// of other nodes'. An entry it cannot read is another node's, for all it knows.
func (p *Publisher) load(ctx context.Context) error {
	cctx, cancel := p.call(ctx)
	defer cancel()
	kvs, _, err := p.cfg.Store.Get(cctx, p.k.sessions(), true)
	if err != nil {
		return fmt.Errorf("reading the session directory: %w", err)
	}
	written := map[string]writtenEntry{}
	foreign := map[string]string{}
	for _, kv := range kvs {
		id := kv.Key[len(p.k.sessions()):]
		s, err := decodeSession(kv, p.k)
		if err != nil {
			foreign[id] = "(unreadable: " + err.Error() + ")"
			continue
		}
		if s.Node != p.cfg.Node {
			foreign[id] = s.Node
			continue
		}
		body, err := bodyOf(s)
		if err != nil {
			return err
		}
		written[id] = writtenEntry{body: body, rev: kv.ModRevision}
	}
	p.written, p.foreign, p.loaded = written, foreign, true
	return nil
}

// bodyOf is what an entry says, but for when it was written: equal bodies need no write.
func bodyOf(s Session) ([]byte, error) {
	s.UpdatedAt = time.Time{}
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("session %s's directory entry: %w", s.ID, err)
	}
	return raw, nil
}

// pending is one write of a round.
type pending struct {
	id   string
	body []byte // nil for a delete
	raw  []byte // the value put
	cmp  fleet.Cmp
}

func (p *Publisher) round(ctx context.Context) error {
	if !p.loaded {
		if err := p.load(ctx); err != nil {
			return err
		}
	}
	local, err := p.cfg.List()
	if err != nil {
		return fmt.Errorf("listing node %s's sessions: %w", p.cfg.Node, err)
	}
	now := time.Now().UTC()
	seen := make(map[string]bool, len(local))
	var writes []pending
	for _, s := range local {
		if err := checkSessionID(s.ID); err != nil {
			p.log.Warn("the session directory: a session left out", "node", p.cfg.Node, "err", err)
			continue
		}
		if seen[s.ID] {
			continue
		}
		seen[s.ID] = true
		if owner, ok := p.foreign[s.ID]; ok {
			if !p.warned[s.ID] {
				p.warned[s.ID] = true
				p.log.Warn("the session directory: another node's entry has this node's session id; left alone", "node", p.cfg.Node, "session", s.ID, "entry_of", owner)
			}
			continue
		}
		s.Schema, s.Node, s.LastState = Schema, p.cfg.Node, ""
		s.CreatedAt, s.EndedAt = s.CreatedAt.UTC(), s.EndedAt.UTC()
		body, err := bodyOf(s)
		if err != nil {
			return err
		}
		w, ok := p.written[s.ID]
		if ok && bytes.Equal(w.body, body) {
			continue
		}
		s.UpdatedAt = now
		raw, err := json.Marshal(s)
		if err != nil {
			return fmt.Errorf("session %s's directory entry: %w", s.ID, err)
		}
		// rev 0 when it was not written: put only while absent.
		writes = append(writes, pending{id: s.ID, body: body, raw: raw, cmp: fleet.Cmp{Key: p.k.session(s.ID), ModRevision: w.rev}})
	}
	for id, w := range p.written {
		if !seen[id] {
			writes = append(writes, pending{id: id, cmp: fleet.Cmp{Key: p.k.session(id), ModRevision: w.rev}})
		}
	}
	slices.SortFunc(writes, func(a, b pending) int { return strings.Compare(a.cmp.Key, b.cmp.Key) })
	for start := 0; start < len(writes); start += maxTxnOps {
		if err := p.apply(ctx, writes[start:min(start+maxTxnOps, len(writes))]); err != nil {
			return err
		}
	}
	return nil
}

// apply writes one chunk in one Txn and, when it applied, learns the ModRevision its puts
// were given (one Txn's writes share one revision) from one of them read back.
func (p *Publisher) apply(ctx context.Context, chunk []pending) error {
	cmps := make([]fleet.Cmp, 0, len(chunk))
	ops := make([]fleet.Op, 0, len(chunk))
	puts, deletes := 0, 0
	for _, w := range chunk {
		cmps = append(cmps, w.cmp)
		if w.body == nil {
			ops = append(ops, fleet.Op{Key: w.cmp.Key, Delete: true})
			deletes++
		} else {
			ops = append(ops, fleet.Op{Key: w.cmp.Key, Value: w.raw})
			puts++
		}
	}
	cctx, cancel := p.call(ctx)
	applied, err := p.cfg.Store.Txn(cctx, cmps, ops)
	cancel()
	switch {
	case err != nil:
		// It may have applied: read the entries again rather than guess.
		p.loaded = false
		return fmt.Errorf("writing node %s's session entries: %w", p.cfg.Node, err)
	case !applied:
		p.loaded = false
		p.count(func(s *PublisherStats) { s.Conflicts++ })
		return errConflict
	}
	p.count(func(s *PublisherStats) { s.Txns++; s.Puts += int64(puts); s.Deletes += int64(deletes) })
	var rev int64
	for _, w := range chunk {
		if w.body == nil {
			continue
		}
		cctx, cancel := p.call(ctx)
		kvs, _, err := p.cfg.Store.Get(cctx, w.cmp.Key, false)
		cancel()
		if err != nil || len(kvs) != 1 || !bytes.Equal(kvs[0].Value, w.raw) {
			// Written, but its revision unknown (or rewritten since): read them all again
			// before the next write.
			p.loaded = false
			break
		}
		rev = kvs[0].ModRevision
		break
	}
	for _, w := range chunk {
		if w.body == nil {
			delete(p.written, w.id)
		} else if p.loaded {
			p.written[w.id] = writtenEntry{body: w.body, rev: rev}
		}
	}
	return nil
}
