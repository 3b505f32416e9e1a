package containment_test

import (
	"testing"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
)

// TestGrantsSayEachSentenceOnce: explain prints one row per grant; a long sentence shared
// by several rows (the spawn referee, five times) is noise, so within one class's grants
// no long mechanism is said twice.
func TestGrantsSayEachSentenceOnce(t *testing.T) {
	m, err := manifest.Parse([]byte("name: a\nversion: 0.1.0\nrun: {command: [x]}\n"), "capsule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := manifest.Lower(m)
	for _, class := range []manifest.Class{manifest.Advisory, manifest.Scoped, manifest.Sealed} {
		seen := map[string]string{}
		for _, g := range containment.Grants(class, &p, false, false) {
			if len(g.Mechanism) < 60 {
				continue
			}
			if other, dup := seen[g.Mechanism]; dup {
				t.Errorf("%s: %s and %s both say %q", class, other, g.Key, g.Mechanism)
			}
			seen[g.Mechanism] = g.Key
		}
	}
}
