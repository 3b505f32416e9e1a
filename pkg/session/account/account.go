// Package account is sessions' way to the spend ledger and the inference gateway: a
// session's ledger account, opened at launch and closed with its end, its spend read into
// its record while it runs, and the variables that point the official SDKs at its
// gateway. It holds no session state of its own: the ledger (pkg/ledger) keeps the
// accounts.
package account

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/gateway"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/spawn"
)

// Ledger is what sessions need of the spend ledger (see pkg/ledger).
type Ledger interface {
	Register(ledger.Session) error
	End(sessionID string) (ledger.Spend, error)
	Session(sessionID string) (ledger.Spend, error)
	Admit(ledger.Admission) (ledger.Reservation, error)
	Settle(sessionID, reservationID string, u ledger.Usage) (ledger.Settlement, error)
}

var _ Ledger = (*ledger.Ledger)(nil)

// Gateway forwards sessions' model calls (see pkg/gateway).
type Gateway interface {
	Serve(w http.ResponseWriter, r *http.Request, c gateway.Caller, upstream, path string)
	// Formats maps each upstream roostd's configuration declares to its format.
	Formats() map[string]string
}

var _ Gateway = (*gateway.Gateway)(nil)

// Accounts are sessions' ledger accounts and their way to the inference gateway. Either
// may be nil: then there is nothing to meter, or no gateway to reach.
type Accounts struct {
	Ledger  Ledger
	Gateway Gateway
	Log     *slog.Logger
}

// CheckUpstream refuses, at staging, a capsule naming an upstream roostd does not know.
func (a Accounts) CheckUpstream(p *manifest.Policy, where string) error {
	name := p.Inference.Upstream
	if name == "" {
		return nil
	}
	var known []string
	if a.Gateway != nil {
		for n := range a.Gateway.Formats() {
			known = append(known, n)
		}
	}
	if slices.Contains(known, name) {
		return nil
	}
	slices.Sort(known)
	list := "none"
	if len(known) > 0 {
		list = strings.Join(known, ", ")
	}
	return fmt.Errorf("%s: inference.upstream: %q is not an upstream roostd knows (its --config declares: %s): %w", where, name, list, errdefs.ErrFailedPrecondition)
}

// InferenceEnv points the official SDKs at the session's gateway. Their "API key" is the
// session's own credential, which they present as the endpoint wants it; the gateway sends
// the operator's key upstream instead.
func (a Accounts) InferenceEnv(p *manifest.Policy, ep spawn.Endpoint, credential string, env map[string]string) {
	name := p.Inference.Upstream
	if name == "" || ep == nil || a.Gateway == nil {
		return
	}
	base := ep.URL() + "/v1/inference/" + name
	switch a.Gateway.Formats()[name] {
	case "openai":
		env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"] = base+"/v1", credential
	case "anthropic":
		env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"] = base, credential
	}
}

// Open gives a launching session its ledger account: its own ceiling, its parent's
// account above it.
func (a Accounts) Open(rec *store.Record, p *manifest.Policy) error {
	if a.Ledger == nil {
		return nil
	}
	var ceiling int64
	if c := p.Inference.MaxSessionTokens; c != nil {
		ceiling = *c
	}
	return a.Ledger.Register(ledger.Session{ID: rec.ID, Capsule: rec.Capsule.Name, ParentID: rec.ParentID, Ceiling: ceiling})
}

// Reopen gives a re-attached session its ledger account back should the ledger have
// lost it (its file removed); normally the account is there and nothing is read.
func (a Accounts) Reopen(rec *store.Record, policy func() (*manifest.Policy, error)) {
	if a.Ledger == nil {
		return
	}
	if _, err := a.Ledger.Session(rec.ID); !errdefs.IsNotFound(err) {
		return
	}
	p, err := policy()
	if err == nil {
		err = a.Open(rec, p)
	}
	if err != nil {
		a.Log.Warn("re-opening the session's ledger account", "session", rec.ID, "err", err)
	}
}

// Close ends a session's account (charging what it left reserved) and records its
// totals in the record.
func (a Accounts) Close(rec *store.Record) {
	if a.Ledger == nil {
		return
	}
	s, err := a.Ledger.End(rec.ID)
	if err != nil {
		a.Log.Error("closing the session's ledger account", "session", rec.ID, "err", err)
	}
	rec.Tokens, rec.InputTokens, rec.OutputTokens = s.Charged, s.InputTokens, s.OutputTokens
}

// Fill fills a live session's record with what it has spent so far.
func (a Accounts) Fill(rec *store.Record) {
	if a.Ledger == nil || !rec.State.Live() {
		return
	}
	if s, err := a.Ledger.Session(rec.ID); err == nil {
		rec.Tokens, rec.InputTokens, rec.OutputTokens = s.Charged, s.InputTokens, s.OutputTokens
	}
}
