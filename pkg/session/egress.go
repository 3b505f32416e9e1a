package session

import (
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
)

// How a session reaches the outside (pkg/session/delegate's Egress holds the proxies). A sealed or scoped session lives in a network namespace
// of its own that holds loopback and its endpoint only; the endpoint carries its egress proxy
// (HTTP forward, CONNECT and SOCKS5), which admits only its network.allow, resolves names in
// roostd and audits each connection in the session's trace. Unconfined and advisory sessions
// share the host's network: no proxy, network.allow is advisory there.

// hasNetNS says whether a class's sessions get a network namespace of their own.
func hasNetNS(class manifest.Class) bool {
	return class == manifest.Sealed || class == manifest.Scoped
}

// EgressNow is what a live session's proxy has carried so far and how many of its
// connections are open; ok is false when it has no proxy.
func (m *Manager) EgressNow(id string) (t store.EgressTotals, active int, ok bool) {
	return m.egress.Now(id)
}
