package store

import (
	"fmt"
	"slices"

	"github.com/containerd/errdefs"
)

// Two pseudo-states bracket a session's life in the transition table: it comes from
// nowhere when staged and goes to removed when forgotten. Neither is ever stored.
const (
	none    State = ""
	removed State = "removed"
)

// transitions is every legal move. A session ends only through exited: a launch that fails,
// a process found gone on recovery, a stop, a kill and a deadline all land there.
var transitions = map[State][]State{
	none:      {Staged},
	Staged:    {Launching, removed},
	Launching: {Running, Exited},
	Running:   {Paused, Stopping, Exited},
	Paused:    {Running, Stopping, Exited},
	Stopping:  {Exited},
	Exited:    {removed},
}

// transition is the one place a session's state changes: it refuses any move not in the
// table, and moves rec otherwise.
func transition(rec *Record, to State) error {
	if !slices.Contains(transitions[rec.State], to) {
		return fmt.Errorf("session %s is %s; it cannot become %s: %w", rec.ID, describeState(rec.State), to, errdefs.ErrFailedPrecondition)
	}
	rec.State = to
	return nil
}

func describeState(s State) string {
	if s == none {
		return "not yet staged"
	}
	return string(s)
}
