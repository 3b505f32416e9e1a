package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The file's shape is checked against Config's yaml tags before yaml decodes it: yaml's own
// errors ("line 3: field foo not found in type config.Sessions") name a Go type, not where
// in the file the operator went wrong nor what belongs there. Walking the types keeps the
// schema in one place, the structs.

// decodeFile decodes data into c, or says the first thing wrong with it as
// "file:line: key.path: what was expected".
func decodeFile(data []byte, file string, c *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return syntaxError(data, file, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return syntaxError(data, file, err)
		}
		return fmt.Errorf("%s:%d: roostd reads one YAML document; found a second one", file, extra.Line)
	}
	s := &shaper{file: file}
	if err := s.value(&doc, reflect.TypeFor[Config](), ""); err != nil {
		return err
	}
	if err := doc.Decode(c); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

// syntaxError turns the YAML library's "yaml: line N: msg" into "file:L: YAML syntax: msg",
// L the line the problem is on. yaml names the line where the enclosing block began (line 1
// for a misindented key deep in the file), or none: L is the first line at which the file's
// beginning, cut there, already fails so.
func syntaxError(data []byte, file string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	from := 1
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, after, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				from, msg = n, after
			}
		}
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	failsAt := func(k int) bool {
		var n yaml.Node
		err := yaml.Unmarshal(bytes.Join(lines[:k], nil), &n)
		return err != nil && strings.HasSuffix(err.Error(), msg)
	}
	if from > len(lines) || !failsAt(len(lines)) {
		return fmt.Errorf("%s: YAML syntax: %s", file, msg)
	}
	// Past the problem's line every cut fails as the whole file does.
	lo, hi := min(from, len(lines)), len(lines)
	for lo < hi {
		if mid := (lo + hi) / 2; failsAt(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return fmt.Errorf("%s:%d: YAML syntax: %s", file, lo, msg)
}

// maxNodes bounds the nodes one file's walk visits: aliases can make a small file a huge
// tree, which yaml's decoder refuses too.
const maxNodes = 1 << 20

type shaper struct {
	file  string
	nodes int
}

func (s *shaper) fail(n *yaml.Node, path, format string, args ...any) error {
	at := fmt.Sprintf("%s:%d: ", s.file, n.Line)
	if path != "" {
		at += path + ": "
	}
	return errors.New(at + fmt.Sprintf(format, args...))
}

// value checks that n can hold a t, at path.
func (s *shaper) value(n *yaml.Node, t reflect.Type, path string) error {
	if s.nodes++; s.nodes > maxNodes {
		return s.fail(n, path, "the file expands past %d YAML nodes (through aliases)", maxNodes)
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		n = n.Content[0]
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		return s.mapping(n, t, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return s.fail(n, path, "expected %s, got %s", expected(t), describe(n))
		}
		for i, item := range n.Content {
			if err := s.value(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return s.fail(n, path, "expected %s, got %s", expected(t), describe(n))
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return s.fail(k, path, "keys must be plain strings, got %s", describe(k))
			}
			if err := s.value(v, t.Elem(), join(path, k.Value)); err != nil {
				return err
			}
		}
		return nil
	}
	// A scalar: yaml decodes it alone into a value of the field's type, so what is accepted
	// is what yaml accepts there; but an integer is an integer, where yaml would cut 1.5 to 1.
	if n.Kind != yaml.ScalarNode || n.Decode(reflect.New(t).Interface()) != nil || isInt(t) && n.ShortTag() != "!!int" {
		return s.fail(n, path, "expected %s, got %s", expected(t), describe(n))
	}
	return nil
}

// mapping checks a mapping against struct t: every key one of t's, none twice.
func (s *shaper) mapping(n *yaml.Node, t reflect.Type, path string) error {
	if n.Kind != yaml.MappingNode {
		return s.fail(n, path, "expected %s, got %s", expected(t), describe(n))
	}
	fields := map[string]reflect.Type{}
	for f := range t.Fields() {
		if name := yamlName(f); name != "" {
			fields[name] = f.Type
		}
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return s.fail(k, path, "keys must be plain strings, got %s", describe(k))
		}
		if k.ShortTag() == "!!merge" {
			// "<<: *defaults" merges a mapping (or a list of them) into this one.
			if err := s.merge(v, t, path); err != nil {
				return err
			}
			continue
		}
		p := join(path, k.Value)
		ft, ok := fields[k.Value]
		if !ok {
			return s.fail(k, p, "unknown key (expected one of: %s)", strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
		}
		if line, dup := seen[k.Value]; dup {
			return s.fail(k, p, "given twice (first on line %d)", line)
		}
		seen[k.Value] = k.Line
		if err := s.value(v, ft, p); err != nil {
			return err
		}
	}
	return nil
}

func (s *shaper) merge(v *yaml.Node, t reflect.Type, path string) error {
	if v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	if v.Kind == yaml.SequenceNode {
		for _, m := range v.Content {
			if err := s.merge(m, t, path); err != nil {
				return err
			}
		}
		return nil
	}
	return s.value(v, t, path)
}

// yamlName is the key a struct field is read from; "" for none.
func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	return name
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// expected says what a value of type t is written as.
func expected(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		return "a mapping"
	case reflect.Map:
		return "a mapping of " + plural(t.Elem())
	case reflect.Slice:
		return "a list of " + plural(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		return "an integer"
	case reflect.Uint32:
		return "an integer from 0 to 4294967295"
	}
	return "a " + t.Kind().String()
}

func isInt(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Uint32:
		return true
	}
	return false
}

// plural names the values of a list or mapping of t.
func plural(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct:
		return "mappings"
	case reflect.String:
		return "strings"
	}
	return "values (each " + expected(t) + ")"
}

// describe says what the file holds at n.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!str" {
			return strconv.Quote(n.Value)
		}
		return n.Value
	}
	return "an alias"
}
