package manifest

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"roost.dev/roost/internal/mantest"
)

// capsule.yaml.5 has an item for every key the decoder reads, and none for a key it does
// not. The keys are the decoder's own: its "unknown key (known keys: ...)" at each mapping.
func TestManPageKeys(t *testing.T) {
	var keys []string
	var walk func(path []string)
	walk = func(path []string) {
		for _, k := range knownKeys(t, path) {
			p := append(slices.Clone(path), k)
			keys = append(keys, strings.Join(p, "."))
			walk(p)
		}
	}
	walk(nil)
	if !slices.Contains(keys, "capabilities.resources.egress_bytes_per_sec") {
		t.Fatalf("the walk missed keys: %v", keys)
	}
	var documented []string
	for _, it := range mantest.Items(t, "capsule.yaml.5", "KEYS") {
		documented = append(documented, it.Term)
	}
	for _, k := range keys {
		if !slices.Contains(documented, k) {
			t.Errorf("capsule.yaml.5 has no item for %s", k)
		}
	}
	for _, d := range documented {
		if !slices.Contains(keys, d) {
			t.Errorf("capsule.yaml.5 documents %s, which the manifest does not have", d)
		}
	}
}

// probe is a key no manifest mapping has, nor one a typo away.
const probe = "zzzzzzzz"

// knownKeys are the keys of the mapping at path, as the decoder lists them for an unknown
// one; nil when path holds no mapping of fixed keys.
func knownKeys(t *testing.T, path []string) []string {
	doc := map[string]any{"name": "a", "version": "0.1.0", "run": map[string]any{"command": []string{"x"}}}
	var at any = map[string]any{probe: 1}
	for i := len(path) - 1; i >= 0; i-- {
		at = map[string]any{path[i]: at}
	}
	for k, v := range at.(map[string]any) {
		doc[k] = v
	}
	data, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Parse(data, FileName)
	var me *Error
	if !errors.As(err, &me) {
		return nil
	}
	for _, f := range me.Fields {
		if f.Path != strings.Join(append(slices.Clone(path), probe), ".") {
			continue
		}
		if list, ok := strings.CutPrefix(f.Msg, "unknown key (known keys: "); ok {
			return strings.Split(strings.TrimSuffix(list, ")"), ", ")
		}
		t.Fatalf("%s: %s", f.Path, f.Msg)
	}
	return nil
}

// The page's example is a manifest roost accepts.
func TestManPageExample(t *testing.T) {
	src := mantest.Example(t, "capsule.yaml.5", "EXAMPLES")
	m, err := Parse([]byte(src), "capsule.yaml.5")
	if err != nil {
		t.Fatalf("%v\n%s", err, src)
	}
	if m.Ref() != "hello@0.1.0" || len(m.Run.Command) != 3 || m.Run.Command[1] != "-c" {
		t.Fatalf("read %+v from\n%s", m, src)
	}
}

func TestManPageRenders(t *testing.T) {
	mantest.Lint(t, mantest.Path("capsule.yaml.5"))
}
