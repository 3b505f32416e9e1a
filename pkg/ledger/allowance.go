package ledger

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
)

// Allowance is what a fleet node may admit on one UTC day: the tokens of the fleet's blocks
// it holds for that day, those it has spent included. On any other day it admits nothing.
type Allowance struct {
	Day    string `json:"day"`
	Tokens int64  `json:"tokens"`
	// Low, when set, is the headroom below which an admission signals AllowanceLow: the
	// node should ask the fleet for another block before it runs out.
	Low int64 `json:"low,omitempty"`
	// Unreachable says the fleet's store cannot be reached: refusals at the allowance say
	// "fleet ledger unreachable". It is not kept in the file.
	Unreachable bool `json:"-"`
}

// fundedDay is what reservations a day's allowance admitted were charged and hold open.
type fundedDay struct {
	charged, reserved int64
}

// SetAllowance sets the node's fleet allowance and keeps it in the file (the day, tokens
// and Low). Raising it takes effect once it is kept; lowering it, at once.
func (l *Ledger) SetAllowance(a Allowance) error {
	if !l.fleet {
		return fmt.Errorf("an allowance for %s: the ledger is not a fleet node's: %w", a.Day, errdefs.ErrFailedPrecondition)
	}
	if _, err := time.Parse(time.DateOnly, a.Day); err != nil {
		return fmt.Errorf("allowance day %q: expected YYYY-MM-DD: %w", a.Day, errdefs.ErrInvalidArgument)
	}
	if a.Tokens < 0 || a.Tokens > MaxTokens || a.Low < 0 {
		return fmt.Errorf("allowance of %d tokens (low %d) for %s: must be between 0 and %d: %w", a.Tokens, a.Low, a.Day, int64(MaxTokens), errdefs.ErrInvalidArgument)
	}
	l.mu.Lock()
	was := l.allow
	kept := was.Day == a.Day && was.Tokens == a.Tokens && was.Low == a.Low
	// Lowered, it holds at once (then it is kept); raised, only once it is kept: a crash
	// between never leaves the file above what the node holds.
	lower := was.Day == a.Day && a.Tokens < was.Tokens
	if lower {
		l.allow = a
	}
	l.mu.Unlock()
	if !kept {
		err := l.db.Update(func(tx *bolt.Tx) error { return bucket(tx, bucketMeta).Put(keyAllowance, encodeAllowance(a)) })
		if err != nil {
			return fmt.Errorf("keeping the fleet allowance: %w", err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.allow = a
	if l.fundedDayLoaded(a.Day) == nil {
		return l.unreadErr(a.Day)
	}
	if was.Day != a.Day || a.Tokens > was.Tokens {
		// More to admit: wake whoever waits for budget.
		l.notify()
	}
	return nil
}

// ReduceAllowance lowers day's allowance by up to tokens, but never below what it has
// funded (charged and reserved): at once for every admission after it, then in the file.
// It returns by how much; 0 when the allowance in force is another day's. This is how a
// fleet node takes back what it will return: no admission can take those tokens meanwhile.
func (l *Ledger) ReduceAllowance(day string, tokens int64) (int64, error) {
	if tokens <= 0 {
		return 0, nil
	}
	l.mu.Lock()
	if l.allow.Day != day {
		l.mu.Unlock()
		return 0, nil
	}
	f := l.fundedDayLoaded(day)
	if f == nil {
		l.mu.Unlock()
		return 0, l.unreadErr(day)
	}
	cut := min(tokens, max(l.allow.Tokens-f.charged-f.reserved, 0))
	l.allow.Tokens -= cut
	a := l.allow
	l.mu.Unlock()
	if cut == 0 {
		return 0, nil
	}
	err := l.db.Update(func(tx *bolt.Tx) error { return bucket(tx, bucketMeta).Put(keyAllowance, encodeAllowance(a)) })
	if err != nil {
		// Lower in memory than in the file is the safe way round; a restart reads the
		// file, and the fleet node sets the allowance again from its blocks.
		return cut, fmt.Errorf("keeping the fleet allowance: %w", err)
	}
	return cut, nil
}

// Funded reports a fleet node's day: the allowance in force, and what the reservations
// that day's allowance admitted have been charged and still hold. What the node may give
// back of day's blocks is what they held less charged and reserved.
func (l *Ledger) Funded(day string) (allowance Allowance, charged, reserved int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.fundedDayLoaded(day)
	if f == nil {
		return Allowance{}, 0, 0, l.unreadErr(day)
	}
	return l.allow, f.charged, f.reserved, nil
}

// AllowanceLow is signalled when an admission leaves less of the allowance than its Low,
// or is refused at it: the fleet node then asks for a block. It holds one signal at most.
func (l *Ledger) AllowanceLow() <-chan struct{} { return l.low }

// signalLow signals AllowanceLow without waiting. The caller holds l.mu.
func (l *Ledger) signalLow() {
	select {
	case l.low <- struct{}{}:
	default:
	}
}

// fundedDayLoaded returns what day's allowance funded, read from the file the first time;
// nil when that read fails. The caller holds l.mu.
func (l *Ledger) fundedDayLoaded(day string) *fundedDay {
	if f := l.funded[day]; f != nil {
		return f
	}
	var charged int64
	err := l.view(func(tx *bolt.Tx) error {
		if b := bucket(tx, bucketDays).Bucket([]byte(day)); b != nil {
			charged = int64(getUint(b.Get(keyFunded)))
		}
		return nil
	})
	if err != nil {
		return nil
	}
	f := &fundedDay{charged: charged}
	l.funded[day] = f
	return f
}

// fundedDay is fundedDayLoaded while the file is loaded, inside its transaction.
func (l *Ledger) fundedDay(tx *bolt.Tx, day string) *fundedDay {
	if f := l.funded[day]; f != nil {
		return f
	}
	f := &fundedDay{}
	if b := bucket(tx, bucketDays).Bucket([]byte(day)); b != nil {
		f.charged = int64(getUint(b.Get(keyFunded)))
	}
	l.funded[day] = f
	return f
}

func (l *Ledger) unreadErr(day string) error {
	return fmt.Errorf("the spend ledger could not read what %s's fleet allowance funded: %w", day, errdefs.ErrUnavailable)
}

func encodeAllowance(a Allowance) []byte {
	// An Allowance (a string and numbers) always marshals.
	raw, _ := json.Marshal(a)
	return raw
}

func getAllowance(meta *bolt.Bucket) (Allowance, error) {
	var a Allowance
	raw := meta.Get(keyAllowance)
	if raw == nil {
		return a, nil
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return a, fmt.Errorf("the ledger's fleet allowance: %w", err)
	}
	return a, nil
}
