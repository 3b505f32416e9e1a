package spawn

import (
	"encoding/json"
	"net/http"

	"roost.dev/roost/pkg/ledger"
)

// AdmitRequest is a capsule's ask to reserve tokens before a model call it makes itself.
type AdmitRequest struct {
	Tokens int64 `json:"tokens"`
	// RequestID makes the admission idempotent: a retry with the same id admits once.
	RequestID string `json:"request_id,omitempty"`
}

// SettleRequest reports what a reserved call spent.
type SettleRequest struct {
	Reservation  string `json:"reservation"`
	InputTokens  int64  `json:"input_tokens"`
	OutputTokens int64  `json:"output_tokens"`
}

// Spender serves a session's spend through its endpoint.
type Spender interface {
	Admit(sessionID string, req AdmitRequest) (ledger.Reservation, error)
	Settle(sessionID string, req SettleRequest) (ledger.Settlement, error)
	Spend(sessionID string) (ledger.Spend, error)
}

// Inferencer forwards a session's model call to the upstream it names, metered.
type Inferencer interface {
	Inference(w http.ResponseWriter, r *http.Request, sessionID, upstream, path string)
}

// Backend is everything a session's endpoint serves; the session manager is one.
type Backend interface {
	Delegator
	Spender
	Inferencer
}

// RefusalBody is the JSON of a spend refusal (429), from the admission route and the
// inference gateway alike: the ceiling met ("session", "ancestor <id>" or "machine"), its
// value, what is used (charged and reserved) and what was requested.
type RefusalBody struct {
	Error string `json:"error"`
	*ledger.Refusal
}

// WriteRefusal answers a spend refusal: 429 with RefusalBody.
func WriteRefusal(w http.ResponseWriter, r *ledger.Refusal) {
	data, _ := json.Marshal(RefusalBody{Error: r.Error(), Refusal: r})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(append(data, '\n'))
}
