package spawn

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/containerd/errdefs"

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

// LimitReporter hears the bounds a session's endpoint enforces on it (too many
// connections): limit names the bound, detail what was cut.
type LimitReporter interface {
	LimitHit(sessionID, limit, detail string)
}

// Backend is everything a session's endpoint serves, and whom it tells of the bounds it
// enforces; the session manager is one.
type Backend interface {
	Delegator
	Spender
	Inferencer
	LimitReporter
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

// WriteError answers an error as every session-endpoint route does: JSON {"error": ...}
// with the status its class calls for, and a spend refusal as WriteRefusal does. A caller
// that went away gets nothing. It returns the status written (0 for none).
func WriteError(w http.ResponseWriter, err error) int {
	var refusal *ledger.Refusal
	if errors.As(err, &refusal) {
		WriteRefusal(w, refusal)
		return http.StatusTooManyRequests
	}
	status := http.StatusInternalServerError
	var tooBig *http.MaxBytesError
	switch {
	case errors.Is(err, context.Canceled):
		return 0
	case errors.As(err, &tooBig):
		status = http.StatusRequestEntityTooLarge
	case errdefs.IsPermissionDenied(err):
		status = http.StatusForbidden
	case errdefs.IsInvalidArgument(err):
		status = http.StatusBadRequest
	case errdefs.IsNotFound(err):
		status = http.StatusNotFound
	case errdefs.IsResourceExhausted(err):
		status = http.StatusTooManyRequests
	case errdefs.IsFailedPrecondition(err), errdefs.IsAlreadyExists(err):
		status = http.StatusConflict
	case errdefs.IsUnavailable(err):
		status = http.StatusServiceUnavailable
	}
	msg := err.Error()
	if cls := errdefs.Resolve(err); cls != errdefs.ErrUnknown {
		msg = strings.TrimSuffix(msg, ": "+cls.Error())
	}
	data, _ := json.Marshal(map[string]string{"error": msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
	return status
}
