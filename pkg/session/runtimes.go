package session

import (
	"log/slog"

	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
)

// runtimes is what holds resources for sessions outside the record: each class's runtime
// (containers, cgroups, composed roots) and the endpoints' pinned network namespaces.
type runtimes struct {
	byClass   map[manifest.Class]Runtime
	endpoints Endpoints // nil for none
	log       *slog.Logger
}

// release frees what the session's runtime holds for it, and unpins its network namespace.
func (r runtimes) release(rec *store.Record) {
	// The pin goes first: the namespace lives on while the container is in it, and whoever
	// sees the container gone sees the pin gone too.
	if r.endpoints != nil {
		if err := r.endpoints.Release(rec.ID); err != nil {
			r.log.Warn("unpinning the session's network namespace", "session", rec.ID, "err", err)
		}
	}
	class, err := manifest.ParseClass(rec.Achieved)
	if err != nil || r.byClass[class] == nil {
		return
	}
	if err := r.byClass[class].Release(rec.ID); err != nil {
		r.log.Warn("releasing the session's runtime resources", "session", rec.ID, "err", err)
	}
}

// sweep releases what the runtimes and endpoints still hold for sessions that are not live.
func (r runtimes) sweep(live func(id string) bool) {
	for _, rt := range r.byClass {
		h, ok := rt.(Holder)
		if !ok {
			continue
		}
		held, err := h.Held()
		if err != nil {
			r.log.Warn("listing runtime leftovers", "err", err)
			continue
		}
		for _, id := range held {
			if !live(id) {
				r.log.Info("releasing leftover runtime resources", "session", id)
				if err := rt.Release(id); err != nil {
					r.log.Warn("releasing leftover", "session", id, "err", err)
				}
			}
		}
	}
	if r.endpoints == nil {
		return
	}
	pinned, err := r.endpoints.Pinned()
	if err != nil {
		r.log.Warn("listing pinned network namespaces", "err", err)
	}
	for _, id := range pinned {
		if !live(id) {
			r.log.Info("unpinning a leftover network namespace", "session", id)
			if err := r.endpoints.Release(id); err != nil {
				r.log.Warn("unpinning a leftover network namespace", "session", id, "err", err)
			}
		}
	}
}
