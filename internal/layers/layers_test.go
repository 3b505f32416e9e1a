// Package layers holds the test that keeps roost's packages in their layers: the record
// below the live session, the formats below both, nothing importing upward.
package layers

import (
	"os/exec"
	"strings"
	"testing"
)

// deps lists every roost package pkg imports, directly or not.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "roost.dev/roost/"+pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pkg, err, out)
	}
	var roost []string
	for _, p := range strings.Fields(string(out)) {
		if p, ok := strings.CutPrefix(p, "roost.dev/roost/"); ok && p != pkg {
			roost = append(roost, p)
		}
	}
	return roost
}

// TestLayers: each package may reach only what is below it. A package listed here imports
// none of the packages its rule names, nor anything beneath them.
func TestLayers(t *testing.T) {
	for _, rule := range []struct {
		pkg    string
		forbid []string
	}{
		// The record knows no process, no containment, no endpoint and no gateway.
		{"pkg/session/store", []string{"pkg/containment", "pkg/endpoint", "pkg/gateway", "pkg/egress", "pkg/spawn", "pkg/ledger", "pkg/session/", "api/"}},
		// The records directory's format is a leaf both roost-init's side and roostd's read.
		{"pkg/records", []string{"pkg/session", "pkg/containment", "pkg/endpoint", "pkg/gateway", "pkg/ledger", "api/"}},
		// What sits below the session manager never reaches up to it.
		{"pkg/session/delegate", []string{"pkg/session/plan", "pkg/session/warmpool", "pkg/session/retention", "pkg/server", "pkg/endpoint"}},
		{"pkg/session/plan", []string{"pkg/session/delegate", "pkg/session/warmpool", "pkg/session/retention", "pkg/server", "pkg/endpoint", "pkg/ledger"}},
		{"pkg/session/warmpool", []string{"pkg/session/delegate", "pkg/session/plan", "pkg/session/retention", "pkg/session/store", "pkg/server", "pkg/endpoint"}},
		{"pkg/session/retention", []string{"pkg/session/delegate", "pkg/session/plan", "pkg/session/warmpool", "pkg/containment", "pkg/server", "pkg/endpoint"}},
		// The manager's parts answer one question each and reach none of their siblings
		// beside the record, the end's words (outcome) and the formats.
		{"pkg/session/outcome", []string{"pkg/session/delegate", "pkg/session/plan", "pkg/session/warmpool", "pkg/session/retention", "pkg/session/exec", "pkg/session/spec", "pkg/session/guard", "pkg/session/dirs", "pkg/session/account", "pkg/server", "pkg/endpoint", "pkg/gateway", "pkg/ledger"}},
		{"pkg/session/exec", []string{"pkg/session/delegate", "pkg/session/plan", "pkg/session/warmpool", "pkg/session/retention", "pkg/session/spec", "pkg/session/guard", "pkg/session/dirs", "pkg/session/account", "pkg/server", "pkg/endpoint", "pkg/gateway", "pkg/ledger"}},
		{"pkg/session/spec", []string{"pkg/session/delegate", "pkg/session/plan", "pkg/session/warmpool", "pkg/session/retention", "pkg/session/exec", "pkg/session/guard", "pkg/session/dirs", "pkg/session/account", "pkg/server", "pkg/endpoint", "pkg/gateway", "pkg/ledger"}},
		{"pkg/session/guard", []string{"pkg/containment", "pkg/session/delegate", "pkg/session/plan", "pkg/session/warmpool", "pkg/session/retention", "pkg/session/exec", "pkg/session/spec", "pkg/session/dirs", "pkg/session/account", "pkg/server", "pkg/endpoint", "pkg/gateway", "pkg/ledger"}},
		{"pkg/session/dirs", []string{"pkg/containment", "pkg/session/delegate", "pkg/session/plan", "pkg/session/warmpool", "pkg/session/retention", "pkg/session/exec", "pkg/session/spec", "pkg/session/guard", "pkg/session/account", "pkg/server", "pkg/endpoint", "pkg/gateway", "pkg/ledger"}},
		{"pkg/session/ranges", []string{"pkg/session/delegate", "pkg/session/plan", "pkg/session/warmpool", "pkg/session/retention", "pkg/session/exec", "pkg/session/spec", "pkg/session/guard", "pkg/session/dirs", "pkg/session/account", "pkg/server", "pkg/endpoint", "pkg/gateway", "pkg/ledger"}},
		{"pkg/session/account", []string{"pkg/containment", "pkg/session/delegate", "pkg/session/plan", "pkg/session/warmpool", "pkg/session/retention", "pkg/session/exec", "pkg/session/spec", "pkg/session/guard", "pkg/session/dirs", "pkg/server", "pkg/endpoint"}},
		// Containment runs programs; it knows nothing of sessions' records or the API.
		{"pkg/containment", []string{"pkg/session", "pkg/server", "pkg/endpoint", "pkg/gateway", "pkg/ledger", "api/"}},
		{"pkg/containment/cgroups", []string{"pkg/containment/sealed", "pkg/containment/scoped", "pkg/session", "pkg/server", "api/"}},
		{"pkg/containment/seccomp", []string{"pkg/containment/sealed", "pkg/containment/scoped", "pkg/session", "pkg/server", "api/"}},
		{"pkg/containment/scoped", []string{"pkg/containment/sealed", "pkg/session", "pkg/server", "pkg/endpoint", "api/"}},
		{"pkg/containment/sealed", []string{"pkg/containment/scoped", "pkg/session", "pkg/server", "pkg/endpoint", "api/"}},
		{"pkg/containment/idsweep", []string{"pkg/containment/sealed", "pkg/containment/scoped", "pkg/session", "pkg/server", "pkg/endpoint", "api/"}},
		{"pkg/containment/roostinit", []string{"pkg/session", "pkg/server", "pkg/containment/sealer", "api/"}},
		{"pkg/session", []string{"pkg/server", "cmd/"}},
		{"pkg/server", []string{"cmd/"}},
	} {
		for _, d := range deps(t, rule.pkg) {
			for _, f := range rule.forbid {
				if d == strings.TrimSuffix(f, "/") || strings.HasPrefix(d, f) || strings.HasPrefix(d, strings.TrimSuffix(f, "/")+"/") {
					t.Errorf("%s imports %s (directly or through another package): its layer forbids %s", rule.pkg, d, f)
				}
			}
		}
	}
}
