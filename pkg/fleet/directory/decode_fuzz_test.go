package directory

import (
	"encoding/json"
	"testing"

	"roost.dev/roost/pkg/fleet"
)

// Whatever a session entry's bytes are, decoding refuses them or yields an entry of its own
// key that encodes back to itself.
func FuzzDecodeSession(f *testing.F) {
	k := keysOf("")
	f.Add("ses_a", []byte(`{"schema":1,"id":"ses_a","node":"node-a","state":"running","capsule":"hello@0.1.0","created_at":"2026-12-03T10:00:00Z","updated_at":"2026-12-03T10:00:01Z"}`))
	f.Add("ses_a", []byte(`{"schema":2,"id":"ses_a","node":"node-a"}`))
	f.Add("ses_b", []byte(`{"schema":1,"id":"ses_a","node":"node-a"}`))
	f.Add("ses_a", []byte(`{"schema":1,"id":"ses_a","node":""}`))
	f.Add("ses_a", []byte(`[`))
	f.Fuzz(func(t *testing.T, id string, raw []byte) {
		s, err := decodeSession(fleet.KV{Key: k.session(id), Value: raw}, k)
		if err != nil {
			return
		}
		if s.ID != id || s.Node == "" || s.Schema != Schema {
			t.Fatalf("decoded %+v from key %q", s, k.session(id))
		}
		again, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		s2, err := decodeSession(fleet.KV{Key: k.session(id), Value: again}, k)
		if err != nil || s2 != s {
			t.Fatalf("re-encoded %s decodes as %+v, %v", again, s2, err)
		}
	})
}
