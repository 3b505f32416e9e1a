package session

import (
	"time"

	"roost.dev/roost/pkg/session/store"
)

// wasmDeadlineGrace is how long after a WASM session's deadline roostd ends it: the runner
// interrupts its guest at the deadline itself (exit 124, deadline_reached), and roostd's
// SIGTERM is the backstop for a runner that did not.
const wasmDeadlineGrace = time.Second

// deadline is how long after its start roostd ends the session.
func deadlineOf(r *store.Record) time.Duration {
	if r.Wasm != nil {
		return r.Deadline + wasmDeadlineGrace
	}
	return r.Deadline
}
