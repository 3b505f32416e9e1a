// Package remote answers who may call roostd over TCP, and what each may call. The remote
// listener serves the same gRPC services as the control socket, to gRPC and to Connect
// (HTTP/JSON) clients alike, over TLS 1.3 with client certificates: a client is known by
// the Common Name of its verified certificate, and the role table gives each known name a
// role. An operator may call everything, as root may through the socket; a reader only
// the read methods named in readerMethods. A certificate whose name is not in the table,
// and any method not on the reader list, are refused.
//
// A node is another roostd of the fleet, forwarding a call about a session this roostd
// holds (pkg/fleet/route). It names the caller it forwards for and that caller's role in
// the Roost-Forwarded-* headers, and the call is held to that role as if the caller had
// come itself; a node forwarding nobody may call the read methods only. Nobody but a node
// may send those headers.
package remote

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Role is what a client may do.
type Role string

// The roles.
const (
	// Operator may call every method: it can do whatever root can through the socket.
	Operator Role = "operator"
	// Reader may call only the read methods.
	Reader Role = "reader"
	// Node is another roostd of the fleet: it may forward its own callers' calls, each held
	// to the forwarded caller's role, and call the read methods itself.
	Node Role = "node"
)

// ParseRole reads a role as the config and flags write it.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case Operator, Reader, Node:
		return r, nil
	}
	return "", fmt.Errorf("%q: expected operator, reader or node", s)
}

// The headers (gRPC metadata) of a forwarded call. A node sets all three; the listener
// takes them from a node only.
const (
	// HeaderForwardedFor names the caller the node forwards for: a remote client's Common
	// Name, or "uid N on node X's socket" (EscapeHeader'd).
	HeaderForwardedFor = "roost-forwarded-for"
	// HeaderForwardedRole is that caller's role at the node it called: operator or reader.
	HeaderForwardedRole = "roost-forwarded-role"
	// HeaderForwardedBy is the forwarding node's name; a call carrying it is never
	// forwarded again.
	HeaderForwardedBy = "roost-forwarded-by"
	// headerForwardedPrefix starts every one of them, and any added later.
	headerForwardedPrefix = "roost-forwarded-"
)

// EscapeHeader makes a name fit a header value: '%' and every byte that is not printable
// ASCII become %XX, which the listener reads back. A Common Name may hold any UTF-8.
func EscapeHeader(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// readerMethods are the methods a reader may call, by full name. Everything else — every
// method that starts, stops or changes anything, and any method added later until it is
// listed here — is an operator's only.
var readerMethods = []string{
	"/roost.v1.SessionService/Get",
	"/roost.v1.SessionService/List",
	"/roost.v1.SessionService/Wait",
	"/roost.v1.SessionService/Logs",
	"/roost.v1.SessionService/Events",
	"/roost.v1.SessionService/ListExecs",
	"/roost.v1.SessionService/AttachExec",
	"/roost.v1.SessionService/WaitExec",
	"/roost.v1.SessionService/ListFleet",
	"/roost.v1.FilesService/ReadFile",
	"/roost.v1.FilesService/ListDir",
	"/roost.v1.FilesService/StatFile",
	"/roost.v1.FilesService/DownloadTree",
	"/roost.v1.SpendService/GetDay",
	"/roost.v1.SpendService/ListCalls",
	"/roost.v1.SpendService/GetFleet",
	"/roost.v1.SpendService/ListFleetNodes",
	"/roost.v1.ArtifactService/ListArtifacts",
	"/roost.v1.SystemService/Health",
	"/roost.v1.SystemService/Version",
	"/grpc.health.v1.Health/Check",
	"/grpc.health.v1.Health/Watch",
}

// ReaderMethods lists the methods a reader may call.
func ReaderMethods() []string { return slices.Clone(readerMethods) }

// Allowed says whether role may call method (a full name, /package.Service/Method). A node
// calling for itself is a reader; what it forwards is held to the forwarded role instead.
func Allowed(role Role, method string) bool {
	switch role {
	case Operator:
		return true
	case Reader, Node:
		return slices.Contains(readerMethods, method)
	}
	return false
}

// Client is one entry of the role table.
type Client struct {
	CommonName string
	Role       Role
}

// Roles is the role table: a certificate's Common Name to its role.
type Roles map[string]Role

// NewRoles builds the table; a name given twice, an empty one or an unknown role is an
// error naming the entry (from names where the list came from, e.g. "remote.clients").
func NewRoles(from string, clients []Client) (Roles, error) {
	roles := Roles{}
	for i, c := range clients {
		at := fmt.Sprintf("%s[%d]", from, i)
		switch {
		case strings.TrimSpace(c.CommonName) == "":
			return nil, fmt.Errorf("%s.common_name: a client needs the Common Name of its certificate", at)
		case roles[c.CommonName] != "":
			return nil, fmt.Errorf("%s.common_name: %q is listed twice", at, c.CommonName)
		}
		if _, err := ParseRole(string(c.Role)); err != nil {
			return nil, fmt.Errorf("%s.role: %w", at, err)
		}
		roles[c.CommonName] = c.Role
	}
	return roles, nil
}

// Caller is a remote client that was let in: its certificate's name and role. For a call a
// node forwarded, it is the caller the node forwarded for, with that caller's role, and Via
// is the node's name (its certificate's Common Name).
type Caller struct {
	CommonName string
	Role       Role
	Via        string
}

func (c Caller) String() string {
	if c.Via != "" {
		return fmt.Sprintf("remote client %q (%s) via node %s", c.CommonName, c.Role, c.Via)
	}
	return fmt.Sprintf("remote client %q (%s)", c.CommonName, c.Role)
}

type callerKey struct{}

// CallerFrom is the remote caller of an RPC's context; false for a call that did not come
// through the remote listener. Only the listener's handler puts one there: no client can.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

func withCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}
