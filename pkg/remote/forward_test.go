package remote

import (
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// A node forwarding a caller's call: the handler sees the caller, by way of the node, and
// the call is held to the caller's role.
func TestNodeForwards(t *testing.T) {
	f := newFixture(t)
	c := f.grpcClient(t, f.dir, "node-a")
	as := func(name, role, by string) metadata.MD {
		return metadata.Pairs(HeaderForwardedFor, name, HeaderForwardedRole, role, HeaderForwardedBy, by)
	}
	kill := func(md metadata.MD, id string) error {
		_, err := c.Kill(metadata.NewOutgoingContext(ctx(t), md), &roostv1.KillRequest{Id: id})
		return err
	}
	if err := kill(as("ci-bot", "operator", "node-a"), "s-1"); err != nil {
		t.Fatalf("an operator's Kill forwarded by node-a: %v", err)
	}
	// A name of any UTF-8, escaped on the way.
	if err := kill(as(EscapeHeader("Zoë 100%"), "operator", "node-a"), "s-2"); err != nil {
		t.Fatalf("Kill for Zoë: %v", err)
	}
	for _, tc := range []struct {
		name string
		md   metadata.MD
		want string
	}{
		{"a reader's Kill", as("dashboard", "reader", "node-a"), `remote client "dashboard" (reader) via node node-a may not call /roost.v1.SessionService/Kill`},
		{"a node's own Kill", nil, `remote client "node-a" (node) may not call /roost.v1.SessionService/Kill: a node may call only the read methods`},
		{"forwarded as a node", as("node-b", "node", "node-a"), `as role "node": a forwarded caller is an operator or a reader`},
		{"forwarded as root", as("ci-bot", "root", "node-a"), `as role "root"`},
		{"by another node's name", as("ci-bot", "operator", "node-b"), `node node-a forwarded a call as node "node-b"`},
		{"without its role", metadata.Pairs(HeaderForwardedFor, "ci-bot", HeaderForwardedBy, "node-a"), "without roost-forwarded-role"},
		{"without its caller", metadata.Pairs(HeaderForwardedRole, "operator", HeaderForwardedBy, "node-a"), "without roost-forwarded-for"},
		{"naming two callers", metadata.Pairs(HeaderForwardedFor, "ci-bot", HeaderForwardedFor, "dashboard", HeaderForwardedRole, "operator", HeaderForwardedBy, "node-a"), "2 roost-forwarded-for headers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := kill(tc.md, "refused")
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Errorf("got %v, want PermissionDenied saying %s", err, tc.want)
			}
		})
	}
	// A node's own read.
	if _, err := c.List(ctx(t), &roostv1.ListRequest{}); err != nil {
		t.Fatalf("node-a's List: %v", err)
	}
	if strings.Join(f.svc.killed, ",") != "s-1,s-2" {
		t.Errorf("killed %v, want s-1,s-2", f.svc.killed)
	}
	want := "Kill by ci-bot as operator via node-a,Kill by Zoë 100% as operator via node-a,List by node-a as node"
	if seen := strings.Join(f.svc.seen(), ","); seen != want {
		t.Errorf("handlers saw %s, want %s", seen, want)
	}
}

// Nobody but a node may name a caller it forwards for, over gRPC or Connect.
func TestForwardedHeadersFromOthers(t *testing.T) {
	f := newFixture(t)
	md := metadata.Pairs(HeaderForwardedFor, "ci-bot", HeaderForwardedRole, "operator", HeaderForwardedBy, "dashboard")
	_, err := f.grpcClient(t, f.dir, "dashboard").Kill(metadata.NewOutgoingContext(ctx(t), md), &roostv1.KillRequest{Id: "s-1"})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `remote client "dashboard" (reader) sent roost-forwarded-* headers, which only a node of the fleet may send`) {
		t.Errorf("a reader naming an operator: %v", err)
	}
	// An operator naming anyone at all is refused too: it would only hide who called.
	_, err = f.grpcClient(t, f.dir, "client").List(metadata.NewOutgoingContext(ctx(t), metadata.Pairs(HeaderForwardedRole, "reader")), &roostv1.ListRequest{})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `"ci-bot" (operator) sent roost-forwarded-*`) {
		t.Errorf("an operator sending a forwarded header: %v", err)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: f.clientTLS(t, f.dir, "dashboard")}}
	req, _ := http.NewRequest(http.MethodPost, "https://"+f.srv.Addr().String()+"/roost.v1.SessionService/Kill", strings.NewReader(`{"id":"s-1"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Roost-Forwarded-For", "ci-bot")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("Connect Kill with Roost-Forwarded-For: %s, want 403", resp.Status)
	}
	if seen := f.svc.seen(); len(seen) != 0 || len(f.svc.killed) != 0 {
		t.Errorf("handlers reached: %v, killed %v", seen, f.svc.killed)
	}
}

func TestEscapeHeader(t *testing.T) {
	for in, want := range map[string]string{
		"ci-bot":                   "ci-bot",
		"uid 0 on node a's socket": "uid 0 on node a's socket",
		"Zoë 100%":                 "Zo%C3%AB 100%25",
		"a\nb":                     "a%0Ab",
	} {
		if got := EscapeHeader(in); got != want {
			t.Errorf("EscapeHeader(%q) = %q, want %q", in, got, want)
		}
	}
	if s := (Caller{CommonName: "ci-bot", Role: Operator, Via: "node-a"}).String(); s != `remote client "ci-bot" (operator) via node node-a` {
		t.Errorf("String: %s", s)
	}
}
