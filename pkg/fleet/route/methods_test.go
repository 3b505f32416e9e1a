package route

import (
	"slices"
	"testing"

	"roost.dev/roost/pkg/server"
)

// Every method roostd's gRPC server registers is classified: routed to its session's node
// or to the node it names, or served where it arrives. A method added to the API fails this until it is put in one
// of the two lists, so none is served on the wrong node by default without a word.
func TestEveryMethodClassified(t *testing.T) {
	srv := server.New(server.Config{})
	registered := map[string]bool{}
	for svc, info := range srv.GetServiceInfo() {
		for _, m := range info.Methods {
			name := "/" + svc + "/" + m.Name
			registered[name] = true
			_, bySession := routed[name]
			_, toNode := byNode[name]
			if bySession && toNode {
				t.Errorf("%s is routed both by session and by node", name)
			}
			isRouted := bySession || toNode
			here := slices.Contains(servedHere, name)
			switch {
			case isRouted && here:
				t.Errorf("%s is both routed and served here", name)
			case !isRouted && !here:
				t.Errorf("%s is neither routed nor listed as served here: classify it in methods.go", name)
			}
		}
	}
	if len(registered) < 40 {
		t.Fatalf("the server registers %d methods: not roostd's", len(registered))
	}
	for name := range routed {
		if !registered[name] {
			t.Errorf("routed %s is not a method the server registers", name)
		}
	}
	for name := range byNode {
		if !registered[name] {
			t.Errorf("%s, routed by node, is not a method the server registers", name)
		}
	}
	for _, name := range servedHere {
		if !registered[name] {
			t.Errorf("%s, listed as served here, is not a method the server registers", name)
		}
	}
}
