package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"roost.dev/roost/internal/mantest"
)

// roostd.8 has an item for every key of the file, naming its default where it has one, and
// none for a key that is gone.
func TestManPageKeys(t *testing.T) {
	documented := map[string]string{}
	for _, it := range mantest.Items(t, "roostd.8", "CONFIGURATION") {
		documented[it.Term] = it.Text
	}
	// The defaults of list items are what Parse fills in one given only its required keys.
	module := filepath.Join(t.TempDir(), "hook.wasm")
	if err := os.WriteFile(module, []byte("\x00asm\x01\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Parse([]byte(`inference:
  upstreams:
    - {name: a, format: openai, url: "http://x", api_key_file: /k, routes: [{method: POST, path: v1/x, metered: false}]}
hooks:
  - {name: h, on: session_end, module: `+module+`}
remote:
  clients: [{common_name: ci-bot, role: operator}]
`), "roostd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		typ := v.Type()
		switch {
		case typ.Kind() == reflect.Struct:
			for i := range typ.NumField() {
				if name := yamlName(typ.Field(i)); name != "" {
					walk(v.Field(i), join(path, name))
				}
			}
			return
		case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.Struct:
			keys = append(keys, path)
			walk(v.Index(0), path+"[]")
			return
		}
		keys = append(keys, path)
		text, ok := documented[path]
		if !ok {
			return
		}
		// What the sample gives a required key is no default.
		if def := v.Interface(); !v.IsZero() && v.Kind() != reflect.Slice && v.Kind() != reflect.Map && !strings.Contains(text, "Required.") {
			if !strings.Contains(text, fmt.Sprint(def)) {
				t.Errorf("roostd.8's %s does not give its default, %v: %s", path, def, text)
			}
		}
	}
	walk(reflect.ValueOf(c).Elem(), "")
	for _, k := range keys {
		if _, ok := documented[k]; !ok {
			t.Errorf("roostd.8 has no item for %s", k)
		}
	}
	for term := range documented {
		// A mapping's own item (sessions.ids) is the operator's choice; its keys are not.
		if !slices.Contains(keys, term) && !slices.ContainsFunc(keys, func(k string) bool { return strings.HasPrefix(k, term+".") }) {
			t.Errorf("roostd.8 documents %s, which roostd.yaml does not have", term)
		}
	}
}

// The error roostd.8 shows is the one roostd gives.
func TestManPageError(t *testing.T) {
	shown := strings.Join(strings.Fields(mantest.Example(t, "roostd.8", "CONFIGURATION")), " ")
	_, err := Parse([]byte("sessions:\n  allow_root: []\n  descriptor_per_session: 3\n"), "/etc/roost/roostd.yaml")
	if err == nil || err.Error() != shown {
		t.Fatalf("roostd.8 shows\n%s\nParse says\n%v", shown, err)
	}
}
