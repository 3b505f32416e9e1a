package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
)

func TestValidName(t *testing.T) {
	for _, ok := range []string{"a", "0", "web", "build-1", "a.b_c-d", "x" + strings.Repeat("y", MaxNameLen-1), "sess_1", "ses"} {
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Web", "-x", ".x", "_x", "a b", "a/b", "a:b", "é", "x" + strings.Repeat("y", MaxNameLen), "ses_1", "ses_0190a1b2c3d47e5f8a9b0c1d2e3f4a5b"} {
		err := ValidName(bad)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "[a-z0-9][a-z0-9_.-]*, at most 64 bytes") || !strings.Contains(err.Error(), fmt.Sprintf("name %q", bad)) {
			t.Errorf("ValidName(%q): %v", bad, err)
		}
	}
}

// A registry from before names (no names bucket, level 2) opens as it is; its sessions are
// unnamed and names work from the first one given. An index entry a roostd from before names
// left behind, by removing a named session without knowing the index, does not hold its name.
func TestNamesOnARegistryFromBeforeNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), DBFile)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := json.Marshal(map[string]any{"id": "ses_old", "capsule": map[string]string{"name": "x", "version": "0.1.0"}})
	if err := db.Update(func(tx *bolt.Tx) error {
		v1, _ := tx.CreateBucket(bucketV1)
		v1.Put(keyVersion, binary.AppendUvarint(nil, 2))
		v1.CreateBucket(bucketEvents)
		v1.CreateBucket(bucketIDs)
		s, _ := v1.CreateBucket(bucketSessions)
		b, err := s.CreateBucket([]byte("ses_old"))
		if err != nil {
			return err
		}
		b.Put(keyState, []byte(Exited))
		return b.Put(keyRecord, old)
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	r, err := OpenRegistry(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.SchemaVersion() != "v1.2" {
		t.Fatalf("names need no migration, but the registry is at %s", r.SchemaVersion())
	}
	if err := r.View(func(tx *Tx) error {
		if rec, err := tx.Resolve("ses_old"); err != nil || rec.Name != "" {
			return fmt.Errorf("the old session: %+v %v", rec, err)
		}
		if _, err := tx.Resolve("named"); !errdefs.IsNotFound(err) {
			return fmt.Errorf("a name on a registry without the index: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	named := &Record{ID: "ses_new", Name: "named"}
	if _, err := r.Update(func(tx *Tx) error { return tx.Create(named, []byte("m"), []byte("e")) }); err != nil {
		t.Fatal(err)
	}
	// What a roostd from before names does on rm: the session goes, the entry stays.
	if err := r.db.Update(func(tx *bolt.Tx) error { return sessionsBucket(tx).DeleteBucket([]byte("ses_new")) }); err != nil {
		t.Fatal(err)
	}
	if err := r.db.View(func(tx *bolt.Tx) error {
		if string(getBucket(tx, bucketV1, bucketNames).Get([]byte("named"))) != "ses_new" {
			return fmt.Errorf("the stale entry is not there to test")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Update(func(tx *Tx) error {
		return tx.Create(&Record{ID: "ses_next", Name: "named"}, []byte("m"), []byte("e"))
	}); err != nil {
		t.Fatalf("a stale entry held its name: %v", err)
	}
	if err := r.View(func(tx *Tx) error {
		if rec, err := tx.Resolve("named"); err != nil || rec.ID != "ses_next" {
			return fmt.Errorf("named: %+v %v", rec, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// The names index is where buckets.go says, made with the first name, and emptied as the
// sessions go.
func TestNamesBucketLayout(t *testing.T) {
	r, _ := openTestRegistry(t)
	count := func() (n int, exists bool) {
		r.db.View(func(tx *bolt.Tx) error {
			b := getBucket(tx, bucketV1, bucketNames)
			if exists = b != nil; exists {
				n = b.Stats().KeyN
			}
			return nil
		})
		return n, exists
	}
	stage(t, r, "ses_unnamed")
	if _, exists := count(); exists {
		t.Fatal("the names bucket exists before any name was given")
	}
	rec := &Record{ID: "ses_a", Name: "alpha"}
	if _, err := r.Update(func(tx *Tx) error { return tx.Create(rec, []byte("m"), []byte("e")) }); err != nil {
		t.Fatal(err)
	}
	if n, _ := count(); n != 1 {
		t.Fatalf("%d names after one", n)
	}
	if _, err := r.Update(func(tx *Tx) error { return tx.Delete(rec) }); err != nil {
		t.Fatal(err)
	}
	if n, _ := count(); n != 0 {
		t.Fatalf("%d names after the named session was removed", n)
	}
}

// fakeID is a session id shaped as newID makes them: a time part, then random digits ending
// in tail.
func fakeID(ms uint64, tail string) string {
	hex := fmt.Sprintf("%012x7000%s", ms, strings.Repeat("8", 16-len(tail))+tail)
	return "ses_" + hex
}

func TestResolveOrder(t *testing.T) {
	r, _ := openTestRegistry(t)
	ids := map[string]string{
		"a": fakeID(1, "0000aaaa1111"),
		"b": fakeID(2, "0000aaaa2222"),
		// c and d share their last 12 digits and differ in the 13th from the end.
		"c": fakeID(3, "1cafecafecafe"),
		"d": fakeID(4, "2cafecafecafe"),
		// e's name is hex, and begins a's short id.
		"e": fakeID(5, "00000000eeee"),
	}
	names := map[string]string{"a": "alpha", "e": "0000aa"}
	if _, err := r.Update(func(tx *Tx) error {
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			if err := tx.Create(&Record{ID: ids[k], Name: names[k]}, []byte("m"), []byte("e")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ ref, want string }{
		{"alpha", "a"},
		{ids["b"], "b"},
		{ids["b"][:len(ids["b"])-2], "b"}, // an id prefix
		{"0000aaaa2222", "b"},             // a short id
		{"0000aaaa2", "b"},                // the start of one
		{"aaaa1", "a"},                    // no: a short id is matched from its start
		{"0000aa", "e"},                   // a name beats the short ids it begins
		{"1cafecafecafe", "c"},            // a longer end, as ps shows for a collision
		{"2" + ShortID(ids["d"]), "d"},    // likewise
		{strings.TrimPrefix(ids["c"], "ses_"), "c"},
	} {
		var got *Record
		err := r.View(func(tx *Tx) (err error) {
			got, err = tx.Resolve(c.ref)
			return err
		})
		switch {
		case c.ref == "aaaa1":
			if !errdefs.IsNotFound(err) {
				t.Errorf("resolve(%q): %+v %v", c.ref, got, err)
			}
		case err != nil || got.ID != ids[c.want]:
			t.Errorf("resolve(%q) = %+v, %v; want %s", c.ref, got, err, ids[c.want])
		}
	}
	for _, c := range []struct {
		ref  string
		want []string
	}{
		{"0000", []string{ids["a"] + " (alpha)", ids["b"]}},
		{"cafecafecafe", []string{ids["c"], ids["d"]}},
		{"cafe", []string{ids["c"], ids["d"]}},
		{"ses_0000", []string{ids["a"], ids["b"], ids["c"]}},
	} {
		err := r.View(func(tx *Tx) error { _, err := tx.Resolve(c.ref); return err })
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "ambiguous") {
			t.Errorf("resolve(%q): %v", c.ref, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("resolve(%q) does not list %s: %v", c.ref, w, err)
			}
		}
	}
	for _, ref := range []string{"abc", "ses_", "ses_000", "zzzz", "nobody"} {
		err := r.View(func(tx *Tx) error { _, err := tx.Resolve(ref); return err })
		if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), fmt.Sprintf("no session %q", ref)) {
			t.Errorf("resolve(%q): %v", ref, err)
		}
	}
	if err := r.View(func(tx *Tx) error { _, err := tx.Resolve(""); return err }); !errdefs.IsInvalidArgument(err) {
		t.Errorf("resolve(\"\"): %v", err)
	}
}

// An ambiguity lists a few candidates, not every session.
func TestResolveAmbiguityListsAFew(t *testing.T) {
	r, _ := openTestRegistry(t)
	if _, err := r.Update(func(tx *Tx) error {
		for i := range 9 {
			if err := tx.Create(&Record{ID: fakeID(uint64(i), fmt.Sprintf("beef%08d", i))}, []byte("m"), []byte("e")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	err := r.View(func(tx *Tx) error { _, err := tx.Resolve("beef"); return err })
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "matches 9 sessions") || !strings.Contains(err.Error(), "and 4 more") || strings.Count(err.Error(), "ses_") != 5 {
		t.Fatalf("resolve(beef): %v", err)
	}
}
