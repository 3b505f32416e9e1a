package cli

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// labelsValue is run's and stage's --label: KEY=VALUE, or KEY alone for an empty value (as
// docker's --label), once per key. roostd checks the keys and values against its rules
// (and says what is wrong with one): one rule, in one place.
type labelsValue map[string]string

func (v *labelsValue) Set(s string) error {
	key, value, _ := strings.Cut(s, "=")
	if _, dup := (*v)[key]; dup {
		return fmt.Errorf("label %q given twice; a session has one value for each", key)
	}
	if *v == nil {
		*v = labelsValue{}
	}
	(*v)[key] = value
	return nil
}

func (v *labelsValue) String() string { return strings.Join(labelPairs(*v), ",") }

func (v *labelsValue) Type() string { return "KEY=VALUE" }

// labelPairs is labels as KEY=VALUE, in key order.
func labelPairs(labels map[string]string) []string {
	out := make([]string, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		out = append(out, k+"="+labels[k])
	}
	return out
}

// labelSelected reports whether labels match every selector as roostd's List matches them:
// "KEY=VALUE" the label's value, "KEY" the label at all.
func labelSelected(labels map[string]string, selectors []string) bool {
	for _, s := range selectors {
		key, value, hasValue := strings.Cut(s, "=")
		v, ok := labels[key]
		if !ok || hasValue && v != value {
			return false
		}
	}
	return true
}
