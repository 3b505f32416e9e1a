package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"roost.dev/roost/internal/mantest"
)

// roostd.8 has an item for every flag, saying its default, and none for a flag that is gone.
func TestManPageFlags(t *testing.T) {
	items := mantest.Items(t, "roostd.8", "OPTIONS")
	documented := map[string]mantest.Item{}
	for _, it := range items {
		for _, name := range strings.Split(it.Term, ", ") {
			name, _, _ = strings.Cut(name, " ")
			documented[name] = it
		}
	}
	fs, _, _ := flagSet(&options{})
	defined := []string{"--help", "-h"} // pflag's own
	fs.VisitAll(func(f *pflag.Flag) {
		name := "--" + f.Name
		defined = append(defined, name)
		it, ok := documented[name]
		if !ok {
			t.Errorf("roostd.8 has no item for %s", name)
			return
		}
		if def := manDefault(f); def != "" && !strings.Contains(it.Text, "Default: "+def+".") {
			t.Errorf("roostd.8's %s does not say \"Default: %s.\": %s", name, def, it.Text)
		}
	})
	for name := range documented {
		if !slices.Contains(defined, name) {
			t.Errorf("roostd.8 documents %s, which roostd does not have", name)
		}
	}
}

// manDefault is a flag's default as the page writes it; "" for one it describes in words.
func manDefault(f *pflag.Flag) string {
	switch def := f.DefValue; {
	case def == "" || def == "[]" || def == "false":
		return ""
	case f.Value.Type() == "duration":
		// 10m0s is written 10m, 720h0m0s 720h.
		if def == "0s" {
			return "0"
		}
		if strings.HasSuffix(def, "m0s") {
			def = strings.TrimSuffix(def, "0s")
		}
		if strings.HasSuffix(def, "h0m") {
			def = strings.TrimSuffix(def, "0m")
		}
		return def
	default:
		return def
	}
}

func TestManPageRenders(t *testing.T) {
	mantest.Lint(t, mantest.Path("roostd.8"))
}
