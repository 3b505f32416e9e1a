package fleet

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
)

// memStore is a linearizable Store in memory: every operation is decided under one lock,
// each applied Txn is one revision, as in etcd.
type memStore struct {
	mu       sync.Mutex
	rev      int64
	kv       map[string]KV
	watchers map[*memWatch]struct{}
	// applied, when set, runs under the lock after every applied Txn: the invariant check.
	applied func()
	// late are Txns in flight whose sender was told of an error: each lands when its
	// countdown of later operations on the store (anyone's) runs out.
	late []lateTxn
}

type lateTxn struct {
	cmps  []Cmp
	then  []Op
	after int
}

// deliverLate queues a Txn to land after that many more operations on the store.
func (m *memStore) deliverLate(cmps []Cmp, then []Op, after int) {
	m.mu.Lock()
	m.late = append(m.late, lateTxn{cmps, then, after})
	m.mu.Unlock()
}

// tick counts one operation down for every Txn in flight and lands those due, before the
// operation is served. The caller holds m.mu.
func (m *memStore) tick() {
	kept := m.late[:0]
	var due []lateTxn
	for _, l := range m.late {
		if l.after--; l.after <= 0 {
			due = append(due, l)
		} else {
			kept = append(kept, l)
		}
	}
	m.late = kept
	for _, l := range due {
		m.applyLocked(l.cmps, l.then)
	}
}

// flush lands every Txn still in flight.
func (m *memStore) flush() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for len(m.late) > 0 {
		m.tick()
	}
}

type memWatch struct {
	key    string
	prefix bool
	ch     chan []KV
}

func newMemStore() *memStore {
	return &memStore{kv: map[string]KV{}, watchers: map[*memWatch]struct{}{}}
}

func (m *memStore) Get(ctx context.Context, key string, prefix bool) ([]KV, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tick()
	var out []KV
	for k, kv := range m.kv {
		if k == key || prefix && strings.HasPrefix(k, key) {
			out = append(out, kv)
		}
	}
	return out, m.rev, nil
}

func (m *memStore) Txn(ctx context.Context, cmps []Cmp, then []Op) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return m.apply(cmps, then), nil
}

func (m *memStore) apply(cmps []Cmp, then []Op) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tick()
	return m.applyLocked(cmps, then)
}

func (m *memStore) applyLocked(cmps []Cmp, then []Op) bool {
	for _, c := range cmps {
		if m.kv[c.Key].ModRevision != c.ModRevision {
			return false
		}
	}
	m.rev++
	var changed []KV
	for _, op := range then {
		if op.Delete {
			if _, ok := m.kv[op.Key]; ok {
				delete(m.kv, op.Key)
				changed = append(changed, KV{Key: op.Key, ModRevision: m.rev, Deleted: true})
			}
			continue
		}
		kv := KV{Key: op.Key, Value: append([]byte(nil), op.Value...), ModRevision: m.rev}
		m.kv[op.Key] = kv
		changed = append(changed, kv)
	}
	for w := range m.watchers {
		var mine []KV
		for _, kv := range changed {
			if kv.Key == w.key || w.prefix && strings.HasPrefix(kv.Key, w.key) {
				mine = append(mine, kv)
			}
		}
		if len(mine) > 0 {
			select {
			case w.ch <- mine:
			default:
				// A watcher that does not keep up loses its watch, as etcd cancels a slow
				// one: it re-reads and watches again.
				delete(m.watchers, w)
				close(w.ch)
			}
		}
	}
	if m.applied != nil {
		m.applied()
	}
	return true
}

func (m *memStore) Watch(ctx context.Context, key string, prefix bool, _ int64) <-chan []KV {
	w := &memWatch{key: key, prefix: prefix, ch: make(chan []KV, 16)}
	m.mu.Lock()
	m.watchers[w] = struct{}{}
	m.mu.Unlock()
	go func() {
		<-ctx.Done()
		m.mu.Lock()
		if _, ok := m.watchers[w]; ok {
			delete(m.watchers, w)
			close(w.ch)
		}
		m.mu.Unlock()
	}()
	return w.ch
}

// value reads one key's value, "" when absent.
func (m *memStore) value(key string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return string(m.kv[key].Value)
}

// Fault rates, each out of 1000 calls.
type faultRates struct {
	// Down: not applied, error. Lost: applied, the reply lost (error). Dup: delivered
	// twice. Late: error at once, applied after 1 to 8 more operations on the store (a
	// write still in flight when the client gave up). GetFail: a read fails. WatchFail: a watch ends at once.
	Down, Lost, Dup, Late, GetFail, WatchFail int
}

var errFault = errors.New("injected: no reply (the request may or may not have been applied)")

// faulty is a Store between a node and the memStore that drops, duplicates, delays and
// makes replies ambiguous, as a seeded rng decides.
type faulty struct {
	st *memStore
	mu sync.Mutex
	// rng decides each call's fate; off turns faults off.
	rng   *rand.Rand
	rates faultRates
	off   bool
}

// roll decides a call's fate (0 to 999: below a rate is its fault) and, for a late one,
// after how many operations it lands.
func (f *faulty) roll() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return 1000, 0
	}
	return f.rng.IntN(1000), 1 + f.rng.IntN(8)
}

func (f *faulty) setOff(off bool) {
	f.mu.Lock()
	f.off = off
	f.mu.Unlock()
}

func (f *faulty) Get(ctx context.Context, key string, prefix bool) ([]KV, int64, error) {
	if r, _ := f.roll(); r < f.rates.GetFail {
		return nil, 0, errFault
	}
	return f.st.Get(ctx, key, prefix)
}

func (f *faulty) Txn(ctx context.Context, cmps []Cmp, then []Op) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	r, after := f.roll()
	rt := f.rates
	switch {
	case r < rt.Down:
		return false, errFault
	case r < rt.Down+rt.Lost:
		f.st.apply(cmps, then)
		return false, errFault
	case r < rt.Down+rt.Lost+rt.Dup:
		ok := f.st.apply(cmps, then)
		f.st.apply(cmps, then)
		return ok, nil
	case r < rt.Down+rt.Lost+rt.Dup+rt.Late:
		f.st.deliverLate(cmps, then, after)
		return false, errFault
	}
	return f.st.apply(cmps, then), nil
}

func (f *faulty) Watch(ctx context.Context, key string, prefix bool, rev int64) <-chan []KV {
	if r, _ := f.roll(); r < f.rates.WatchFail {
		ch := make(chan []KV)
		close(ch)
		return ch
	}
	return f.st.Watch(ctx, key, prefix, rev)
}
