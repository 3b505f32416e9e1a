package session

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/session/plan"
	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/hooks"
)

// The operator's hooks (roostd's config; pkg/hooks runs them): a stage hook judges every
// session before it is recorded — a spawn's too — and refuses it by vetoing, or by failing
// in any way (fail closed); a session_end hook hears every session's final record, off the
// end's path. Every run is an event.

// Hooks is what the manager asks of the operator's hooks.
type Hooks interface {
	Stage(ctx context.Context, subject string, input []byte) error
	SessionEnd(subject string, input []byte)
}

var _ Hooks = (*hooks.Hooks)(nil)

// EventHookRan is one run of an operator's hook; the detail names the hook, what it judged,
// its result and its reason or output.
const EventHookRan = "hook.ran"

// stageHookInput is what a stage hook reads on its stdin.
type stageHookInput struct {
	Event   string `json:"event"`
	Capsule struct {
		Name    string `json:"name"`
		Version string `json:"version"`
		SHA256  string `json:"sha256"`
		Source  string `json:"source,omitempty"`
	} `json:"capsule"`
	ParentID string `json:"parent_id"`
	// Explanation is the decision and grants exactly as `roostctl explain --json` prints
	// them.
	Explanation json.RawMessage `json:"explanation"`
}

// stageHooks asks the stage hooks about the plan, explained as e; a refusal is
// PermissionDenied (roostctl exit 125, a spawn's 403) saying which hook refused and why.
func stageHooks(ctx context.Context, h Hooks, p *plan.Plan, e *roostv1.Explanation, parentID string) error {
	if h == nil {
		return nil
	}
	explanation, err := explanationJSON.Marshal(e)
	if err != nil {
		return err
	}
	in := stageHookInput{Event: "stage", ParentID: parentID, Explanation: explanation}
	in.Capsule.Name, in.Capsule.Version, in.Capsule.SHA256, in.Capsule.Source = p.Ref.Name, p.Ref.Version, p.Ref.SHA256, p.Ref.Source
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	err = h.Stage(ctx, p.Ref.Name+"@"+p.Ref.Version, data)
	var refused *hooks.RefusedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &refused):
		return errdefs.ErrPermissionDenied.WithMessage(refused.Error())
	default:
		return errdefs.ErrUnavailable.WithMessage(fmt.Sprintf("the stage hooks could not judge %s@%s: %v", p.Ref.Name, p.Ref.Version, err))
	}
}

// endHooks tells the session_end hooks of a session's end: its final record, as
// `roostctl inspect --json` prints it (view).
func endHooks(h Hooks, view func(*store.Record) *roostv1.Session, log *slog.Logger, rec *store.Record) {
	if h == nil {
		return
	}
	data, err := explanationJSON.Marshal(view(rec))
	var compact bytes.Buffer
	if err == nil {
		// protojson varies its spacing on purpose; hooks get one stable form.
		err = json.Compact(&compact, data)
	}
	if err != nil {
		log.Warn("the session_end hooks' input", "session", rec.ID, "err", err)
		return
	}
	h.SessionEnd(rec.ID, compact.Bytes())
}
