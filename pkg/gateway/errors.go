package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/ledger"
)

// apiError is an answer the gateway gives itself, on a route the caller's SDK takes for its
// provider's: it is written in that provider's error envelope, so the SDK raises its own
// error class with roost's message, and it says whether to retry.
//
// The official SDKs (openai-node, anthropic-sdk-typescript, and the Python ones alike)
// retry 408, 409, 429 and 5xx unless the answer carries x-should-retry: false, and before
// retrying sleep what retry-after-ms or retry-after asks — without bound in openai-node. So
// every refusal of roost's own carries x-should-retry: false: the route, the model and a
// session's or an ancestor's ceiling will not change by retrying, and a machine's daily
// ceiling frees at the next UTC day (a fleet node's allowance sooner), which retry-after tells, but an SDK honouring it would
// sleep for hours in a session that asked to fail (inference.on_exhausted: fail); a session
// that wants to wait says on_exhausted: wait, and the gateway holds its call until budget
// frees. Only an upstream that does not answer is left to the SDK's retries.
type apiError struct {
	status int
	// code is roost's name for what happened: OpenAI's error code, and the roost field's.
	code string
	msg  string
	// retry leaves retrying to the SDK (no x-should-retry: false).
	retry bool
	// retryAfter, when set, is sent as retry-after (whole seconds, rounded up).
	retryAfter time.Duration
	refusal    *ledger.Refusal
}

func (e *apiError) Error() string { return e.msg }

// roostDetail is the roost field beside the provider's error: roost's code and, for a spend
// refusal, the ceiling met with its numbers.
type roostDetail struct {
	Code string `json:"code"`
	*ledger.Refusal
	RetryAfter int64 `json:"retry_after,omitempty"`
}

// openAIError is OpenAI's error body: type and code name the error, param is null when no
// parameter is at fault.
type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

type anthropicError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// write answers e in format's envelope.
func (e *apiError) write(w http.ResponseWriter, format string) {
	detail := roostDetail{Code: e.code, Refusal: e.refusal}
	h := w.Header()
	for k := range h {
		delete(h, k)
	}
	h.Set("Content-Type", "application/json")
	if !e.retry {
		h.Set("X-Should-Retry", "false")
	}
	if e.retryAfter > 0 {
		secs := int64((e.retryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
		detail.RetryAfter = secs
	}
	var body any
	if format == config.FormatAnthropic {
		body = struct {
			Type  string         `json:"type"`
			Error anthropicError `json:"error"`
			Roost roostDetail    `json:"roost"`
		}{"error", anthropicError{Type: e.anthropicType(), Message: e.msg}, detail}
	} else {
		body = struct {
			Error openAIError `json:"error"`
			Roost roostDetail `json:"roost"`
		}{openAIError{Message: e.msg, Type: e.openAIType(), Code: e.code}, detail}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(body)
	w.WriteHeader(e.status)
	_, _ = w.Write(buf.Bytes())
}

// openAIType is the type OpenAI gives an error of e's status: insufficient_quota for a
// ceiling that will not free, tokens (the limit hit) for the machine's daily one,
// request_forbidden for what is not allowed.
func (e *apiError) openAIType() string {
	switch {
	case e.refusal != nil && (e.refusal.Limit == ledger.LimitMachine || e.refusal.Limit == ledger.LimitFleet):
		return "tokens"
	case e.refusal != nil:
		return "insufficient_quota"
	case e.status == http.StatusForbidden:
		return "request_forbidden"
	case e.status == http.StatusTooManyRequests:
		// OpenAI's rate limits name what ran out: here, requests at once.
		return "requests"
	case e.status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// anthropicType is the type Anthropic gives an error of e's status.
func (e *apiError) anthropicType() string {
	switch e.status {
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	}
	if e.status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// asAPIError classes an error from the ledger or the body's reading as the gateway answers
// it; nil when the caller went away and nothing is to be written.
func (g *Gateway) asAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var refusal *ledger.Refusal
	if errors.As(err, &refusal) {
		e := &apiError{status: http.StatusTooManyRequests, code: "insufficient_quota", refusal: refusal,
			msg: "roost: " + refusal.Error() + " (limit " + refusal.Limit + ")"}
		if refusal.Limit == ledger.LimitMachine {
			// The machine's ceiling is per UTC day: it frees at the next one.
			now := g.now().UTC()
			e.code, e.retryAfter = "rate_limit_exceeded", now.Truncate(24*time.Hour).Add(24*time.Hour).Sub(now)
		}
		if refusal.Limit == ledger.LimitFleet {
			// A fleet node's allowance grows when it takes another block, which it asks for
			// as soon as it runs low, and other nodes give back what they do not use: soon,
			// or once the fleet's store answers again.
			e.code, e.retryAfter = "rate_limit_exceeded", time.Second
			if refusal.Detail != "" {
				e.retryAfter = 5 * time.Second
			}
		}
		return e
	}
	msg := err.Error()
	if cls := errdefs.Resolve(err); cls != errdefs.ErrUnknown {
		msg = strings.TrimSuffix(msg, ": "+cls.Error())
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.Is(err, context.Canceled):
		return nil
	case errors.As(err, &tooBig):
		return &apiError{status: http.StatusRequestEntityTooLarge, code: "request_too_large", msg: msg}
	case errdefs.IsPermissionDenied(err):
		return &apiError{status: http.StatusForbidden, code: "permission_denied", msg: msg}
	case errdefs.IsInvalidArgument(err):
		return &apiError{status: http.StatusBadRequest, code: "invalid_request", msg: msg}
	case errdefs.IsNotFound(err):
		return &apiError{status: http.StatusNotFound, code: "not_found", msg: msg}
	case errdefs.IsFailedPrecondition(err):
		return &apiError{status: http.StatusConflict, code: "failed_precondition", msg: msg}
	case errdefs.IsUnavailable(err):
		return &apiError{status: http.StatusServiceUnavailable, code: "unavailable", msg: msg}
	}
	return &apiError{status: http.StatusInternalServerError, code: "internal", msg: msg}
}
