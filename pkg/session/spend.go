package session

import (
	"errors"
	"fmt"
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

// The session manager serves everything a session's endpoint offers.
var _ spawn.Backend = (*Manager)(nil)

// checkUpstream refuses, at staging, a capsule naming an upstream roostd does not know.
func (m *Manager) checkUpstream(p *manifest.Policy, where string) error {
	name := p.Inference.Upstream
	if name == "" {
		return nil
	}
	var known []string
	if m.cfg.Gateway != nil {
		for n := range m.cfg.Gateway.Formats() {
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
func (m *Manager) inferenceEnv(p *manifest.Policy, ep spawn.Endpoint, credential string, env map[string]string) {
	name := p.Inference.Upstream
	if name == "" || ep == nil || m.cfg.Gateway == nil {
		return
	}
	base := ep.URL() + "/v1/inference/" + name
	switch m.cfg.Gateway.Formats()[name] {
	case "openai":
		env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"] = base+"/v1", credential
	case "anthropic":
		env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"] = base, credential
	}
}

// openAccount gives a launching session its ledger account: its own ceiling, its parent's
// account above it.
func (m *Manager) openAccount(rec *store.Record, p *manifest.Policy) error {
	if m.cfg.Ledger == nil {
		return nil
	}
	var ceiling int64
	if c := p.Inference.MaxSessionTokens; c != nil {
		ceiling = *c
	}
	return m.cfg.Ledger.Register(ledger.Session{ID: rec.ID, Capsule: rec.Capsule.Name, ParentID: rec.ParentID, Ceiling: ceiling})
}

// reopenAccount gives a re-attached session its ledger account back should the ledger have
// lost it (its file removed); normally the account is there and nothing is read.
func (m *Manager) reopenAccount(l *liveSession, rec *store.Record) {
	if m.cfg.Ledger == nil {
		return
	}
	if _, err := m.cfg.Ledger.Session(rec.ID); !errdefs.IsNotFound(err) {
		return
	}
	policy, err := m.policyOf(l, rec)
	if err == nil {
		err = m.openAccount(rec, policy)
	}
	if err != nil {
		m.cfg.Logger.Warn("re-opening the session's ledger account", "session", rec.ID, "err", err)
	}
}

// closeAccount ends a session's account (charging what it left reserved) and records its
// totals in the record.
func (m *Manager) closeAccount(rec *store.Record) {
	if m.cfg.Ledger == nil {
		return
	}
	s, err := m.cfg.Ledger.End(rec.ID)
	if err != nil {
		m.cfg.Logger.Error("closing the session's ledger account", "session", rec.ID, "err", err)
	}
	rec.Tokens, rec.InputTokens, rec.OutputTokens = s.Charged, s.InputTokens, s.OutputTokens
}

// withSpend fills a live session's record with what it has spent so far.
func (m *Manager) withSpend(rec *store.Record) {
	if m.cfg.Ledger == nil || !rec.State.Live() {
		return
	}
	if s, err := m.cfg.Ledger.Session(rec.ID); err == nil {
		rec.Tokens, rec.InputTokens, rec.OutputTokens = s.Charged, s.InputTokens, s.OutputTokens
	}
}

func (m *Manager) ledger() (Ledger, error) {
	if m.cfg.Ledger == nil {
		return nil, fmt.Errorf("this roostd keeps no spend ledger: %w", errdefs.ErrUnavailable)
	}
	return m.cfg.Ledger, nil
}

// Admit reserves tokens for a call the session makes itself.
func (m *Manager) Admit(id string, req spawn.AdmitRequest) (ledger.Reservation, error) {
	l, err := m.ledger()
	if err != nil {
		return ledger.Reservation{}, err
	}
	res, err := l.Admit(ledger.Admission{SessionID: id, RequestID: req.RequestID, Tokens: req.Tokens})
	if refusal := (*ledger.Refusal)(nil); errors.As(err, &refusal) {
		if rec, gerr := m.Get(id); gerr == nil {
			m.cfg.Logger.Info("spend refused", "session", rec.ID, "capsule", rec.Capsule.Name+"@"+rec.Capsule.Version, "class", rec.Achieved,
				"limit", refusal.Kind(), "ceiling", refusal.Ceiling, "used", refusal.Used, "requested", refusal.Requested, "reason", refusal.Error())
		}
	}
	return res, err
}

// Settle reports what a reserved call spent.
func (m *Manager) Settle(id string, req spawn.SettleRequest) (ledger.Settlement, error) {
	l, err := m.ledger()
	if err != nil {
		return ledger.Settlement{}, err
	}
	if req.Reservation == "" {
		return ledger.Settlement{}, fmt.Errorf("reservation: the id admit returned is required: %w", errdefs.ErrInvalidArgument)
	}
	s, err := l.Settle(id, req.Reservation, ledger.Usage{Input: req.InputTokens, Output: req.OutputTokens})
	if err == nil && s.Reason == ledger.ReasonSettled && s.Charged > s.Reserved {
		m.spendOverrun(id, s)
	}
	return s, err
}

// EventSpendOverrun is a settlement that charged more than its call was admitted for: the
// reported usage is charged, and the event says both.
const EventSpendOverrun = "spend.overrun"

// spendOverrun records a settlement above its reservation as an event on the session.
func (m *Manager) spendOverrun(id string, s ledger.Settlement) {
	rec, err := m.Get(id)
	if err != nil {
		return
	}
	detail := fmt.Sprintf("reserved %d, charged %d (input %d, output %d)", s.Reserved, s.Charged, s.InputTokens, s.OutputTokens)
	if s.Model != "" {
		detail += ", model " + s.Model
	}
	if err := m.update(func(tx *store.Tx) error { return tx.Note(rec, EventSpendOverrun, detail) }); err != nil {
		m.cfg.Logger.Warn("recording a spend overrun", "session", id, "err", err)
	}
}

// Spend is the session's account.
func (m *Manager) Spend(id string) (ledger.Spend, error) {
	l, err := m.ledger()
	if err != nil {
		return ledger.Spend{}, err
	}
	return l.Session(id)
}

// Inference forwards the session's model call through the gateway, as its manifest allows.
func (m *Manager) Inference(w http.ResponseWriter, r *http.Request, id, upstream, path string) {
	rec, err := m.liveRecord(id)
	var p *manifest.Policy
	if l := m.lookup(id); l != nil && err == nil {
		p, err = m.policyOf(l, rec)
	}
	if m.cfg.Gateway == nil || p == nil || err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"this roostd has no inference gateway for the session (no upstreams in --config)"}` + "\n"))
		return
	}
	m.cfg.Gateway.Serve(w, r, gateway.Caller{
		SessionID: id, Upstream: p.Inference.Upstream, Model: p.Inference.Model,
		OnExhausted: p.Inference.OnExhausted, Deadline: rec.DeadlineAt,
		OnOverrun: func(s ledger.Settlement) { m.spendOverrun(id, s) },
	}, upstream, path)
}
