package session

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

// accounts are sessions' ledger accounts and their way to the inference gateway: opened at
// launch, closed with the session's end, read into its record while it runs.
type accounts struct {
	ledger  Ledger
	gateway Gateway
	log     *slog.Logger
}

// checkUpstream refuses, at staging, a capsule naming an upstream roostd does not know.
func (a accounts) checkUpstream(p *manifest.Policy, where string) error {
	name := p.Inference.Upstream
	if name == "" {
		return nil
	}
	var known []string
	if a.gateway != nil {
		for n := range a.gateway.Formats() {
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

// inferenceEnv points the official SDKs at the session's gateway. Their "API key" is the
// session's own credential, which they present as the endpoint wants it; the gateway sends
// the operator's key upstream instead.
func (a accounts) inferenceEnv(p *manifest.Policy, ep spawn.Endpoint, credential string, env map[string]string) {
	name := p.Inference.Upstream
	if name == "" || ep == nil || a.gateway == nil {
		return
	}
	base := ep.URL() + "/v1/inference/" + name
	switch a.gateway.Formats()[name] {
	case "openai":
		env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"] = base+"/v1", credential
	case "anthropic":
		env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"] = base, credential
	}
}

// open gives a launching session its ledger account: its own ceiling, its parent's
// account above it.
func (a accounts) open(rec *store.Record, p *manifest.Policy) error {
	if a.ledger == nil {
		return nil
	}
	var ceiling int64
	if c := p.Inference.MaxSessionTokens; c != nil {
		ceiling = *c
	}
	return a.ledger.Register(ledger.Session{ID: rec.ID, Capsule: rec.Capsule.Name, ParentID: rec.ParentID, Ceiling: ceiling})
}

// reopen gives a re-attached session its ledger account back should the ledger have
// lost it (its file removed); normally the account is there and nothing is read.
func (a accounts) reopen(rec *store.Record, policy func() (*manifest.Policy, error)) {
	if a.ledger == nil {
		return
	}
	if _, err := a.ledger.Session(rec.ID); !errdefs.IsNotFound(err) {
		return
	}
	p, err := policy()
	if err == nil {
		err = a.open(rec, p)
	}
	if err != nil {
		a.log.Warn("re-opening the session's ledger account", "session", rec.ID, "err", err)
	}
}

// close ends a session's account (charging what it left reserved) and records its
// totals in the record.
func (a accounts) close(rec *store.Record) {
	if a.ledger == nil {
		return
	}
	s, err := a.ledger.End(rec.ID)
	if err != nil {
		a.log.Error("closing the session's ledger account", "session", rec.ID, "err", err)
	}
	rec.Tokens, rec.InputTokens, rec.OutputTokens = s.Charged, s.InputTokens, s.OutputTokens
}

// fill fills a live session's record with what it has spent so far.
func (a accounts) fill(rec *store.Record) {
	if a.ledger == nil || !rec.State.Live() {
		return
	}
	if s, err := a.ledger.Session(rec.ID); err == nil {
		rec.Tokens, rec.InputTokens, rec.OutputTokens = s.Charged, s.InputTokens, s.OutputTokens
	}
}
