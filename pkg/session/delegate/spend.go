package delegate

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/containerd/errdefs"
	"roost.dev/roost/pkg/gateway"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/spawn"
)

// Admit reserves tokens for a call the session makes itself.
func (b *Backend) Admit(id string, req spawn.AdmitRequest) (ledger.Reservation, error) {
	l, err := b.ledger()
	if err != nil {
		return ledger.Reservation{}, err
	}
	res, err := l.Admit(ledger.Admission{SessionID: id, RequestID: req.RequestID, Tokens: req.Tokens})
	if refusal := (*ledger.Refusal)(nil); errors.As(err, &refusal) {
		if rec, gerr := b.s.Record(id); gerr == nil {
			b.cfg.Logger.Info("spend refused", "session", rec.ID, "capsule", rec.Capsule.Name+"@"+rec.Capsule.Version, "class", rec.Achieved,
				"limit", refusal.Kind(), "ceiling", refusal.Ceiling, "used", refusal.Used, "requested", refusal.Requested, "reason", refusal.Error())
		}
	}
	return res, err
}

// Settle reports what a reserved call spent.
func (b *Backend) Settle(id string, req spawn.SettleRequest) (ledger.Settlement, error) {
	l, err := b.ledger()
	if err != nil {
		return ledger.Settlement{}, err
	}
	if req.Reservation == "" {
		return ledger.Settlement{}, fmt.Errorf("reservation: the id admit returned is required: %w", errdefs.ErrInvalidArgument)
	}
	s, err := l.Settle(id, req.Reservation, ledger.Usage{Input: req.InputTokens, Output: req.OutputTokens})
	if err == nil && s.Reason == ledger.ReasonSettled && s.Charged > s.Reserved {
		b.spendOverrun(id, s)
	}
	return s, err
}

// EventSpendOverrun is a settlement that charged more than its call was admitted for: the
// reported usage is charged, and the event says both.
const EventSpendOverrun = "spend.overrun"

// spendOverrun records a settlement above its reservation as an event on the session.
func (b *Backend) spendOverrun(id string, s ledger.Settlement) {
	rec, err := b.s.Record(id)
	if err != nil {
		return
	}
	detail := fmt.Sprintf("reserved %d, charged %d (input %d, output %d)", s.Reserved, s.Charged, s.InputTokens, s.OutputTokens)
	if s.Model != "" {
		detail += ", model " + s.Model
	}
	if err := b.s.Note(rec, EventSpendOverrun, detail); err != nil {
		b.cfg.Logger.Warn("recording a spend overrun", "session", id, "err", err)
	}
}

// Spend is the session's account.
func (b *Backend) Spend(id string) (ledger.Spend, error) {
	l, err := b.ledger()
	if err != nil {
		return ledger.Spend{}, err
	}
	return l.Session(id)
}

// Inference forwards the session's model call through the gateway, as its manifest allows.
func (b *Backend) Inference(w http.ResponseWriter, r *http.Request, id, upstream, path string) {
	rec, p, err := b.s.Policy(id)
	if b.cfg.Gateway == nil || p == nil || err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"this roostd has no inference gateway for the session (no upstreams in --config)"}` + "\n"))
		return
	}
	b.cfg.Gateway.Serve(w, r, gateway.Caller{
		SessionID: id, Upstream: p.Inference.Upstream, Model: p.Inference.Model,
		OnExhausted: p.Inference.OnExhausted, Deadline: rec.DeadlineAt,
		OnOverrun: func(s ledger.Settlement) { b.spendOverrun(id, s) },
		OnCall:    func(c gateway.CallRecord) { b.traceCall(id, rec.RecordsDir, p.Resources.LogMaxBytes.Value, c) },
	}, upstream, path)
}
