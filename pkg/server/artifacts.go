package server

import (
	"context"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// RemoveArtifact forgets a pushed name@version. Sessions are not asked: each runs the blob
// its digest names, which the session manager collects only once no session records it
// (rm, prune, retention, restart), so no session staged, live or ended loses its capsule.
func (s *artifactService) RemoveArtifact(_ context.Context, req *roostv1.RemoveArtifactRequest) (*roostv1.RemoveArtifactResponse, error) {
	a, err := s.store.Remove(req.GetRef())
	if err != nil {
		return nil, err
	}
	return &roostv1.RemoveArtifactResponse{Artifact: artifactProto(a)}, nil
}
