package cli

import (
	"slices"
	"testing"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// TestActedOn holds each verb's completion to the sessions roostd lets it act on.
func TestActedOn(t *testing.T) {
	list := []*roostv1.Session{
		{Id: "ses_staged", Name: "st", State: "staged"},
		{Id: "ses_running", Name: "run", State: "running"},
		{Id: "ses_paused", State: "paused"},
		{Id: "ses_exited", Name: "done", State: "exited"},
		// An ended parent whose child still runs: rm refuses its tree without -f.
		{Id: "ses_parent", State: "exited"},
		{Id: "ses_child", ParentId: "ses_parent", State: "stopping"},
	}
	ids := func(verb string, force bool, given ...string) []string {
		var out []string
		for _, s := range actedOn(verb, force, list, given) {
			out = append(out, s.GetId())
		}
		return out
	}
	all := []string{"ses_staged", "ses_running", "ses_paused", "ses_exited", "ses_parent", "ses_child"}
	for _, tc := range []struct {
		verb  string
		force bool
		given []string
		want  []string
	}{
		{"launch", false, nil, []string{"ses_staged"}},
		{"stop", false, nil, []string{"ses_running", "ses_paused", "ses_child"}},
		{"kill", false, []string{"run"}, []string{"ses_paused", "ses_child"}},
		{"pause", false, nil, []string{"ses_running"}},
		{"resume", false, nil, []string{"ses_paused"}},
		{"exec", false, nil, []string{"ses_running"}},
		{"rm", false, nil, []string{"ses_staged", "ses_exited"}},
		{"rm", false, []string{"ses_staged"}, []string{"ses_exited"}},
		{"rm", true, []string{"done"}, []string{"ses_staged", "ses_running", "ses_paused", "ses_parent", "ses_child"}},
		{"logs", false, nil, all},
		{"inspect", false, nil, all},
		{"wait", false, nil, all},
		{"stats", false, []string{"ses_paused"}, []string{"ses_staged", "ses_running", "ses_exited", "ses_parent", "ses_child"}},
	} {
		if got := ids(tc.verb, tc.force, tc.given...); !slices.Equal(got, tc.want) {
			t.Errorf("%s (force %v, given %v) completes %v; want %v", tc.verb, tc.force, tc.given, got, tc.want)
		}
	}
}
