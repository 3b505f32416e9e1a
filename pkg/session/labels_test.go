package session

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/session/store"
)

// Stage records the labels it is given and List selects by them; a session's children
// inherit none (its labels describe it, and a child is listed by its own); labels that break
// a rule refuse the stage, recording nothing.
func TestStageLabels(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 30", parentCaps)
	d.push("worker", "true", "")
	parent := run(t, d.m, StageOptions{Capsule: "parent@0.1.0", Labels: map[string]string{"team": "a"}})
	if parent.Labels["team"] != "a" {
		t.Fatalf("staged labels: %v", parent.Labels)
	}
	res, err := d.spawn(parent, "worker", "", true)
	if err != nil {
		t.Fatal(err)
	}
	child, err := d.m.Get(res.SessionID)
	if err != nil || child.Labels != nil {
		t.Fatalf("the child's labels: %v, %v", child.Labels, err)
	}
	sels, err := store.ParseSelectors([]string{"team=a"})
	if err != nil {
		t.Fatal(err)
	}
	if recs, err := d.m.List(true, sels...); err != nil || len(recs) != 1 || recs[0].ID != parent.ID {
		t.Fatalf("List team=a: %v, %v", recs, err)
	}
	before, _ := d.m.List(true)
	_, err = d.m.Stage(StageOptions{Capsule: "worker@0.1.0", Labels: map[string]string{"ok": "1", "a b": "c"}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `label "a b"`) {
		t.Fatalf("a bad label: %v", err)
	}
	if after, _ := d.m.List(true); len(after) != len(before) {
		t.Fatalf("a refused stage recorded a session: %d, then %d", len(before), len(after))
	}
}
