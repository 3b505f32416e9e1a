package fleet

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// SetCeiling sets the fleet's standing daily ceiling and today's (day, YYYY-MM-DD UTC) in
// one Txn. Lowered under what is granted, nodes see it through their watch and give back
// what they hold unspent; what is spent stays spent. Repeating it after an ambiguous error
// is harmless: it writes the same.
func SetCeiling(ctx context.Context, st Store, prefix, day string, tokens int64) error {
	if tokens < 0 {
		return fmt.Errorf("fleet ceiling %d: must be 0 or more tokens: %w", tokens, errdefs.ErrInvalidArgument)
	}
	if _, err := time.Parse(time.DateOnly, day); err != nil {
		return fmt.Errorf("fleet ceiling for %q: expected YYYY-MM-DD: %w", day, errdefs.ErrInvalidArgument)
	}
	k := keys{orDefault(prefix)}
	v := []byte(fmt.Sprint(tokens))
	if _, err := st.Txn(ctx, nil, []Op{{Key: k.standing(), Value: v}, {Key: k.ceiling(day), Value: v}}); err != nil {
		return fmt.Errorf("setting the fleet ceiling: %w", err)
	}
	return nil
}

func orDefault(prefix string) string {
	if prefix == "" {
		return DefaultPrefix
	}
	return prefix
}

// Day is the fleet's ledger for one UTC day, as the store has it.
type Day struct {
	Date string `json:"date"`
	// Ceiling is the day's (the standing one when the day's pool is not open yet);
	// Granted Σ of its blocks less what was given back; Open whether its pool is.
	Ceiling int64     `json:"ceiling"`
	Granted int64     `json:"granted"`
	Open    bool      `json:"open"`
	Nodes   []NodeDay `json:"nodes"`
}

// NodeDay is one node's part of a day.
type NodeDay struct {
	Node string `json:"node"`
	// Held is what its blocks hold, spent or not (tokens less what was given back), of
	// those not written off; Spent what it last said it charged and reserved of them.
	Held       int64 `json:"held"`
	Spent      int64 `json:"spent"`
	Returned   int64 `json:"returned"`
	WrittenOff int64 `json:"written_off"`
	Blocks     int   `json:"blocks"`
}

// ReadDay reads the fleet's ledger of day (YYYY-MM-DD, UTC) at one revision: what
// `roostctl spend --fleet` shows.
func ReadDay(ctx context.Context, st Store, prefix, day string) (Day, error) {
	if _, err := time.Parse(time.DateOnly, day); err != nil {
		return Day{}, fmt.Errorf("fleet day %q: expected YYYY-MM-DD: %w", day, errdefs.ErrInvalidArgument)
	}
	k := keys{orDefault(prefix)}
	kvs, _, err := st.Get(ctx, k.day(day), true)
	if err != nil {
		return Day{}, fmt.Errorf("reading the fleet's %s: %w", day, err)
	}
	d := Day{Date: day}
	nodes := map[string]*NodeDay{}
	node := func(name string) *NodeDay {
		if nodes[name] == nil {
			nodes[name] = &NodeDay{Node: name}
		}
		return nodes[name]
	}
	for _, kv := range kvs {
		switch {
		case kv.Key == k.ceiling(day):
			if d.Ceiling, err = decodeTokens(kv); err != nil {
				return Day{}, err
			}
			d.Open = true
		case kv.Key == k.granted(day):
			if d.Granted, err = decodeTokens(kv); err != nil {
				return Day{}, err
			}
		case strings.HasPrefix(kv.Key, k.blocks(day)):
			b, err := decodeBlock(kv)
			if err != nil {
				return Day{}, err
			}
			if b.State == StateVoid {
				continue
			}
			nd := node(b.Node)
			nd.Blocks++
			nd.Returned += b.Returned
			nd.WrittenOff += b.WrittenOff
			if b.State == StateHeld {
				nd.Held += b.Tokens - b.Returned
			}
		case strings.HasPrefix(kv.Key, k.nodes(day)):
			var r NodeReport
			if err := decodeJSON(kv, &r); err != nil {
				return Day{}, err
			}
			node(strings.TrimPrefix(kv.Key, k.nodes(day))).Spent = r.Spent
		}
	}
	if !d.Open {
		kvs, _, err := st.Get(ctx, k.standing(), false)
		if err != nil {
			return Day{}, fmt.Errorf("reading the fleet's standing ceiling: %w", err)
		}
		for _, kv := range kvs {
			if d.Ceiling, err = decodeTokens(kv); err != nil {
				return Day{}, err
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(nodes)) {
		d.Nodes = append(d.Nodes, *nodes[name])
	}
	return d, nil
}

// Forgotten is what Forget wrote off of a node.
type Forgotten struct {
	Node string `json:"node"`
	// Days maps each day it held blocks of to what was written off as spent then.
	Days map[string]int64 `json:"days"`
	// WrittenOff is their sum; UnderUse at most what of it the node never spent: the
	// written-off tokens less what it last said it spent of them.
	WrittenOff int64 `json:"written_off"`
	UnderUse   int64 `json:"under_use"`
}

// Forget writes a lost node's blocks off as spent, on every day it holds any: nothing it
// holds goes back to the pool, since nothing says it no longer spends (a lease lapsing
// says only that it cannot be heard), but it stops counting as held. Forgetting a node
// that comes back is safe: what it spends of its blocks was counted spent already.
// Repeating it after an error finishes the job.
func Forget(ctx context.Context, st Store, prefix, node string) (Forgotten, error) {
	if err := ValidNodeName(node); err != nil {
		return Forgotten{}, err
	}
	k := keys{orDefault(prefix)}
	kvs, _, err := st.Get(ctx, k.days(), true)
	if err != nil {
		return Forgotten{}, fmt.Errorf("reading the fleet's blocks: %w", err)
	}
	f := Forgotten{Node: node, Days: map[string]int64{}}
	spent := map[string]int64{}
	for _, kv := range kvs {
		day, ok := k.dayOf(kv.Key)
		if !ok {
			continue
		}
		if kv.Key == k.node(day, node) {
			var r NodeReport
			if err := decodeJSON(kv, &r); err != nil {
				return f, err
			}
			spent[day] = r.Spent
			continue
		}
		if !strings.HasPrefix(kv.Key, k.blocks(day)) {
			continue
		}
		b, err := decodeBlock(kv)
		if err != nil {
			return f, err
		}
		if b.Node != node || b.State != StateHeld {
			continue
		}
		off := b.Tokens - b.Returned
		if err := writeOff(ctx, st, kv, b); err != nil {
			return f, err
		}
		f.Days[day] += off
		f.WrittenOff += off
	}
	for day, off := range f.Days {
		f.UnderUse += max(off-spent[day], 0)
	}
	return f, nil
}

// writeOff marks one block written off, comparing its revision: a return the node still
// makes either lands first (and is then not written off) or fails.
func writeOff(ctx context.Context, st Store, kv KV, b Block) error {
	for {
		b.State, b.WrittenOff = StateWrittenOff, b.Tokens-b.Returned
		applied, txnErr := st.Txn(ctx, []Cmp{{Key: kv.Key, ModRevision: kv.ModRevision}}, []Op{{Key: kv.Key, Value: encode(b)}})
		if txnErr == nil && applied {
			return nil
		}
		kvs, _, err := st.Get(ctx, kv.Key, false)
		if err != nil {
			return fmt.Errorf("writing off %s: %w", kv.Key, err)
		}
		if len(kvs) == 0 {
			return fmt.Errorf("writing off %s: the block vanished: %w", kv.Key, errdefs.ErrDataLoss)
		}
		if now, err := decodeBlock(kvs[0]); err != nil || now.State != StateHeld {
			return err
		}
		if txnErr != nil && kvs[0].ModRevision == kv.ModRevision {
			return fmt.Errorf("writing off %s: %w", kv.Key, txnErr)
		}
		kv, b = kvs[0], Block{}
		if b, err = decodeBlock(kv); err != nil {
			return err
		}
	}
}
