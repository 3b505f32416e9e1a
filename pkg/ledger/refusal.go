package ledger

import (
	"fmt"
	"strings"
)

// The ceilings an admission can meet.
const (
	LimitSession  = "session"
	LimitAncestor = "ancestor"
	LimitMachine  = "machine"
	// LimitFleet is a fleet node's allowance: the tokens of the fleet's blocks it holds.
	LimitFleet = "fleet"
)

// Refusal is an admission refused at a ceiling: which one ("session", "ancestor <id>" or
// "machine"), its value, what is used (charged and reserved) and what was requested (the
// least the admission could do with). Latched says the session will be refused at that
// ceiling from now on: what is charged alone leaves too little. It classifies as resource
// exhausted.
type Refusal struct {
	Limit     string `json:"limit"`
	Ceiling   int64  `json:"ceiling"`
	Used      int64  `json:"used"`
	Requested int64  `json:"requested"`
	Latched   bool   `json:"latched,omitempty"`
	// Detail says more of why, when there is more to say: "fleet ledger unreachable" when a
	// fleet node is refused for want of tokens it could not ask the fleet for.
	Detail string `json:"detail,omitempty"`
}

func (r *Refusal) Error() string {
	what := map[string]string{
		LimitSession: "the session's inference.max_session_tokens",
		LimitMachine: "the machine's tokens per day (roostd --machine-tokens-per-day)",
		LimitFleet:   "the fleet's tokens per day (what this node holds of it)",
	}[r.Limit]
	if id, ok := r.ancestor(); ok {
		what = "the inference.max_session_tokens of ancestor " + id
	}
	msg := fmt.Sprintf("spend refused at %s: %d of %d tokens used or reserved, %d more requested", what, r.Used, r.Ceiling, r.Requested)
	if r.Detail != "" {
		msg += " (" + r.Detail + ")"
	}
	return msg
}

// ResourceExhausted marks the refusal for errdefs.
func (*Refusal) ResourceExhausted() {}

// Kind is the refusal's limit without the ancestor's id, for a bounded metric label.
func (r *Refusal) Kind() string {
	if _, ok := r.ancestor(); ok {
		return LimitAncestor
	}
	return r.Limit
}

func (r *Refusal) ancestor() (string, bool) {
	return strings.CutPrefix(r.Limit, LimitAncestor+" ")
}
