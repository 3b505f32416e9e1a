package store

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestCheckLabels(t *testing.T) {
	many := func(n, valueLen int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", valueLen)
		}
		return m
	}
	long := strings.Repeat("a", 63)
	for _, c := range []struct {
		labels map[string]string
		// want is what the error says; "" for labels that are good.
		want string
	}{
		{labels: nil},
		{labels: map[string]string{"team": "a"}},
		{labels: map[string]string{"team": ""}},
		{labels: map[string]string{"app.kubernetes.io/name": "web-1", "A_b.c-D": "X.y_z-9"}},
		{labels: map[string]string{long: strings.Repeat("v", MaxLabelValueLen)}},
		{labels: map[string]string{strings.Repeat("p", 63) + "." + strings.Repeat("q", 63) + "." + strings.Repeat("r", 63) + "." + strings.Repeat("s", 61) + "/n": "1"}},
		{labels: map[string]string{"sha": strings.Repeat("0f", 32)}},
		{labels: many(MaxLabels, 0)},
		{labels: map[string]string{"a b": "c"}, want: `label "a b": its name has ' ' at byte 1; a label key is [PREFIX/]NAME`},
		{labels: map[string]string{"": "c"}, want: `label "": its name is empty`},
		{labels: map[string]string{"-a": "c"}, want: `label "-a": its name begins with '-'`},
		{labels: map[string]string{"a.": "c"}, want: `label "a.": its name ends with '.'`},
		{labels: map[string]string{long + "b": "c"}, want: `its name is 64 characters long`},
		{labels: map[string]string{"x/": "c"}, want: `label "x/": its name is empty`},
		{labels: map[string]string{"/x": "c"}, want: `label "/x": its prefix is empty`},
		{labels: map[string]string{"Example.com/x": "c"}, want: `its prefix "Example.com" has 'E' in its label "Example"`},
		{labels: map[string]string{"a..b/x": "c"}, want: `its prefix "a..b" has an empty label`},
		{labels: map[string]string{"a-/x": "c"}, want: `its prefix "a-" has '-' in its label "a-"`},
		{labels: map[string]string{"a/b/c": "c"}, want: `its prefix "a/b" has '/'`},
		{labels: map[string]string{strings.Repeat("p", 64) + "/x": "c"}, want: `has a label of 64 characters (at most 63)`},
		{labels: map[string]string{strings.Repeat("p.", 127) + "p/x": "c"}, want: `its prefix is 255 characters long`},
		{labels: map[string]string{"team": "a b"}, want: `label "team": its value has ' ' at byte 1; a label value is empty, or at most 256`},
		{labels: map[string]string{"team": "a,b"}, want: `its value has ',' at byte 1`},
		{labels: map[string]string{"team": "a=b"}, want: `its value has '=' at byte 1`},
		{labels: map[string]string{"team": "_a"}, want: `its value begins with '_'`},
		{labels: map[string]string{"team": strings.Repeat("v", MaxLabelValueLen+1)}, want: `its value is 257 characters long`},
		{labels: map[string]string{"team": "é"}, want: `its value has 'é' at byte 0`},
		{labels: map[string]string{"roost.dev/x": "1"}, want: `label "roost.dev/x": keys under roost.dev/ are reserved for roost`},
		{labels: map[string]string{"sub.roost.dev/x": "1"}, want: `label "sub.roost.dev/x": keys under roost.dev/ are reserved`},
		{labels: map[string]string{"notroost.dev/x": "1"}},
		{labels: many(MaxLabels+1, 0), want: "65 labels: a session has at most 64"},
		{labels: many(MaxLabels, 254), want: "labels of 16448 bytes (keys and values together): a session's labels hold at most 16384 (16 KiB)"},
		// The first bad key in order is named, whatever the map's order.
		{labels: map[string]string{"z z": "", "a a": "", "m m": ""}, want: `label "a a"`},
	} {
		err := CheckLabels(c.labels)
		if c.want == "" {
			if err != nil {
				t.Errorf("%v: %v", c.labels, err)
			}
			continue
		}
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.80v: %v, want InvalidArgument saying %q", c.labels, err, c.want)
		}
	}
}

func TestSelectors(t *testing.T) {
	labels := map[string]string{"team": "a", "tier": "", "app.kubernetes.io/name": "web"}
	for _, c := range []struct {
		sels  []string
		match bool
	}{
		{nil, true},
		{[]string{"team=a"}, true},
		{[]string{"team=b"}, false},
		{[]string{"team"}, true},
		{[]string{"owner"}, false},
		{[]string{"tier="}, true},
		{[]string{"tier"}, true},
		{[]string{"team="}, false},
		{[]string{"owner="}, false},
		{[]string{"team=a", "app.kubernetes.io/name=web"}, true},
		{[]string{"team=a", "app.kubernetes.io/name=api"}, false},
		// Reserved keys may be selected: only setting them is roost's alone.
		{[]string{"roost.dev/x"}, false},
	} {
		sels, err := ParseSelectors(c.sels)
		if err != nil {
			t.Fatalf("%q: %v", c.sels, err)
		}
		if got := MatchLabels(labels, sels); got != c.match {
			t.Errorf("%q over %v: %v, want %v", c.sels, labels, got, c.match)
		}
	}
	for _, c := range []struct{ sel, want string }{
		{"a b=c", `label selector "a b=c": label "a b": its name has ' ' at byte 1`},
		{"=c", `label selector "=c": label "": its name is empty`},
		{"team=a b", `label selector "team=a b": label "team": its value has ' '`},
		{"team=a=b", `its value has '=' at byte 1`},
		{"", `label selector "": label "": its name is empty`},
	} {
		if _, err := ParseSelectors([]string{"team=a", c.sel}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("selector %q: %v, want InvalidArgument saying %q", c.sel, err, c.want)
		}
	}
}

// FuzzCheckLabels holds the validator to the rules it states, over any key and value: what
// it accepts is bounded and made of the characters allowed, every refusal is
// InvalidArgument naming the key, and a key or value it accepts reads back as a selector
// that matches it.
func FuzzCheckLabels(f *testing.F) {
	for _, seed := range [][2]string{{"team", "a"}, {"app.kubernetes.io/name", "web"}, {"a b", "c"}, {"roost.dev/x", "1"},
		{"x/", ""}, {"a/b/c", "d"}, {"é", "ü"}, {strings.Repeat("a", 64), ""}, {"k", strings.Repeat("v", 257)}} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		err := CheckLabels(map[string]string{k: v})
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("%q=%q: %v is not InvalidArgument", k, v, err)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("label %q", k)) {
				t.Fatalf("%q=%q: %v does not name the key", k, v, err)
			}
			return
		}
		name := k
		if i := strings.LastIndexByte(k, '/'); i >= 0 {
			prefix := k[:i]
			name = k[i+1:]
			if len(prefix) > MaxLabelPrefixLen || strings.Trim(prefix, "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" || prefix == reservedLabelRealm || strings.HasSuffix(prefix, "."+reservedLabelRealm) {
				t.Fatalf("%q=%q accepted with the prefix %q", k, v, prefix)
			}
		}
		const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
		if name == "" || len(name) > MaxLabelNameLen || strings.Trim(name, chars) != "" {
			t.Fatalf("%q=%q accepted with the name %q", k, v, name)
		}
		if len(v) > MaxLabelValueLen || strings.Trim(v, chars) != "" {
			t.Fatalf("%q=%q accepted", k, v)
		}
		for _, s := range []string{k, k + "=" + v} {
			sels, err := ParseSelectors([]string{s})
			if err != nil || !MatchLabels(map[string]string{k: v}, sels) {
				t.Fatalf("selector %q of an accepted label: %v, %v", s, sels, err)
			}
		}
	})
}

// Labels are part of the record: they survive the registry's reopening, a record written
// before labels reads as one with none, and labels that break a rule refuse the create
// whoever calls it, leaving nothing recorded.
func TestLabelsInTheRecord(t *testing.T) {
	r, path := openTestRegistry(t)
	rec := &Record{ID: "ses_a", Capsule: CapsuleRef{Name: "x", Version: "0.1.0"}, Labels: map[string]string{"team": "a", "example.com/run": "r-1"}}
	if _, err := r.Update(func(tx *Tx) error { return tx.Create(rec, []byte("m"), []byte("e")) }); err != nil {
		t.Fatal(err)
	}
	// The labels have a key of their own, so a listing by label reads only it of the
	// sessions it passes over; the record's JSON does not repeat them.
	if err := r.View(func(tx *Tx) error {
		b := sessionBucket(tx.tx, "ses_a")
		if got := string(b.Get(keyLabels)); got != `{"example.com/run":"r-1","team":"a"}` {
			t.Errorf("the labels key holds %q", got)
		}
		if strings.Contains(string(b.Get(keyRecord)), "team") {
			t.Errorf("the record's JSON holds the labels: %s", b.Get(keyRecord))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// What a roostd from before labels wrote: a record, and no labels key.
	if _, err := r.Update(func(tx *Tx) error {
		if err := tx.Create(&Record{ID: "ses_b"}, []byte("m"), []byte("e")); err != nil {
			return err
		}
		return sessionBucket(tx.tx, "ses_b").Put(keyRecord, []byte(`{"id":"ses_b","capsule":{"name":"x","version":"0.1.0","sha256":"","source":""},"declared":"advisory","achieved":"advisory","workdir":"/w","records_dir":"/r","command":["true"],"deadline":0,"created_at":"2026-01-01T00:00:00Z","depth_remaining":1}`))
	}); err != nil {
		t.Fatal(err)
	}
	_, err := r.Update(func(tx *Tx) error {
		return tx.Create(&Record{ID: "ses_c", Labels: map[string]string{"roost.dev/x": "1"}}, []byte("m"), []byte("e"))
	})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `label "roost.dev/x"`) {
		t.Fatalf("a reserved label: %v", err)
	}
	r.Close()
	r, err = OpenRegistry(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.View(func(tx *Tx) error {
		a, err := tx.Get("ses_a")
		if err != nil || len(a.Labels) != 2 || a.Labels["team"] != "a" || a.Labels["example.com/run"] != "r-1" {
			t.Errorf("labels after reopening: %v, %v", a, err)
		}
		if b, err := tx.Get("ses_b"); err != nil || b.Labels != nil {
			t.Errorf("a record from before labels: %v, %v", b, err)
		}
		if _, err := tx.Get("ses_c"); !errdefs.IsNotFound(err) {
			t.Errorf("the refused session was recorded: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
