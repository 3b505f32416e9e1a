package fleet

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// The fleet's keys in the store, under a prefix (DefaultPrefix unless configured):
//
//	ceiling                      the standing daily ceiling, decimal tokens; a day's pool
//	                             copies it when the day's first block is taken
//	days/<UTC date>/ceiling      that day's ceiling, decimal tokens
//	days/<UTC date>/granted      Σ tokens of the day's blocks less what was returned to it,
//	                             decimal; absent is 0
//	days/<UTC date>/blocks/<id>  one block as JSON (Block): its holder, its tokens, what it
//	                             gave back, what was written off; or a void id, never granted
//	days/<UTC date>/nodes/<node> what a node last said it spent of the day (NodeReport)
//
// Every write that moves tokens is one Txn comparing the ModRevision of granted as read and
// of the block (0: absent), so no two writes decide on the same reading. granted is then
// always Σ over the day's blocks of Tokens − Returned: blocks written off stay in it, as
// spent.
const DefaultPrefix = "/roost/fleet/"

type keys struct{ prefix string }

func (k keys) standing() string             { return k.prefix + "ceiling" }
func (k keys) days() string                 { return k.prefix + "days/" }
func (k keys) day(day string) string        { return k.prefix + "days/" + day + "/" }
func (k keys) ceiling(day string) string    { return k.day(day) + "ceiling" }
func (k keys) granted(day string) string    { return k.day(day) + "granted" }
func (k keys) blocks(day string) string     { return k.day(day) + "blocks/" }
func (k keys) block(day, id string) string  { return k.blocks(day) + id }
func (k keys) nodes(day string) string      { return k.day(day) + "nodes/" }
func (k keys) node(day, node string) string { return k.nodes(day) + node }
func (k keys) dayOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, k.days())
	if !ok {
		return "", false
	}
	day, _, ok := strings.Cut(rest, "/")
	return day, ok
}

// Block states.
const (
	// StateHeld: granted to Node, which spends it and may give part of it back.
	StateHeld = "held"
	// StateWrittenOff: its node was forgotten; what it had not given back counts as spent.
	StateWrittenOff = "written_off"
	// StateVoid: the id was fenced off before any grant under it could apply; it holds
	// nothing and never will.
	StateVoid = "void"
)

// Block is one block of a day's tokens.
type Block struct {
	Node   string `json:"node"`
	Tokens int64  `json:"tokens"`
	State  string `json:"state"`
	// Returned is what the node gave back of it, to granted.
	Returned int64 `json:"returned,omitempty"`
	// WrittenOff is what Forget counted as spent without the node saying so.
	WrittenOff int64 `json:"written_off,omitempty"`
}

// NodeReport is what a node last said of a day, written beside its grants and returns.
type NodeReport struct {
	// Spent is what the node's ledger charged and holds reserved against the day's blocks.
	Spent int64 `json:"spent"`
}

func decodeBlock(kv KV) (Block, error) {
	var b Block
	if err := json.Unmarshal(kv.Value, &b); err != nil {
		return b, fmt.Errorf("fleet block %s: %w", kv.Key, err)
	}
	if b.Tokens < 0 || b.Returned < 0 || b.WrittenOff < 0 || b.Returned+b.WrittenOff > b.Tokens {
		return b, fmt.Errorf("fleet block %s: %d tokens, %d returned, %d written off do not add up", kv.Key, b.Tokens, b.Returned, b.WrittenOff)
	}
	return b, nil
}

func encode(v any) []byte {
	// The types encoded here (plain structs of strings and numbers) always marshal.
	raw, _ := json.Marshal(v)
	return raw
}

func decodeJSON(kv KV, v any) error {
	if err := json.Unmarshal(kv.Value, v); err != nil {
		return fmt.Errorf("fleet key %s: %w", kv.Key, err)
	}
	return nil
}

func decodeTokens(kv KV) (int64, error) {
	n, err := strconv.ParseInt(string(kv.Value), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("fleet key %s: %q is not a count of tokens", kv.Key, kv.Value)
	}
	return n, nil
}

func tokens(n int64) []byte { return []byte(strconv.FormatInt(n, 10)) }
