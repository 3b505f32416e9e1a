package server

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/durationpb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// A session is explained as it was staged: what would re-decide it (a capsule, a floor, a
// deadline, the OCI spec) is refused, naming the session, before any lookup.
func TestExplainSessionRefusesCapsuleOptions(t *testing.T) {
	s := &capsuleService{}
	for _, req := range []*roostv1.ExplainRequest{
		{Session: "web", Capsule: "/x"},
		{Session: "web", Containment: "sealed"},
		{Session: "web", Deadline: durationpb.New(1e9)},
		{Session: "web", Oci: true},
	} {
		_, err := s.Explain(context.Background(), req)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `session "web"`) {
			t.Errorf("%v: %v, want InvalidArgument naming the session", req, err)
		}
	}
}
