package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Parse reads and validates a manifest. file names the source in error messages. The
// returned error is an *Error listing every problem found, each with its key path and line.
func Parse(data []byte, file string) (*Manifest, error) {
	if file == "" {
		file = FileName
	}
	if len(data) > MaxSize {
		return nil, &Error{File: file, Fields: []*FieldError{{Msg: fmt.Sprintf("manifest is %d bytes; the limit is %d", len(data), MaxSize)}}}
	}
	root, err := parseYAML(data)
	if err != nil {
		return nil, &Error{File: file, Fields: []*FieldError{err}}
	}
	d := &decoder{}
	m := d.manifest(root)
	if len(d.errs) > 0 {
		// The decoder finds problems in schema order (checks across keys come last); the
		// operator reads the file from the top.
		slices.SortStableFunc(d.errs, func(a, b *FieldError) int {
			if a.Line != b.Line {
				return a.Line - b.Line
			}
			return a.Column - b.Column
		})
		return nil, &Error{File: file, Fields: d.errs}
	}
	return m, nil
}

// parseYAML returns the single document's top node.
func parseYAML(data []byte) (*yaml.Node, *FieldError) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &FieldError{Msg: "the manifest is empty"}
		}
		return nil, syntaxError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, syntaxError(err)
		}
		return nil, &FieldError{Line: extra.Line, Msg: "a manifest is one YAML document; found a second one"}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, &FieldError{Msg: "the manifest is empty"}
	}
	return doc.Content[0], nil
}

// syntaxError turns the YAML library's "yaml: line N: msg" into a positioned error.
func syntaxError(err error) *FieldError {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	fe := &FieldError{Msg: "YAML syntax: " + msg}
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, after, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				fe.Line, fe.Msg = n, "YAML syntax: "+after
			}
		}
	}
	return fe
}

// digitsRE matches an integer too large for YAML to resolve as one.
var digitsRE = regexp.MustCompile(`^[-+]?[0-9_]+$`)

type decoder struct {
	errs []*FieldError
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	fe := &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		fe.Line, fe.Column = n.Line, n.Column
	}
	d.errs = append(d.errs, fe)
}

// field is one known key of a mapping and what to do with its value. A value that is YAML
// null is treated as absent and never reaches decode.
type field struct {
	name   string
	decode func(n *yaml.Node, path string)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// mapping walks a mapping node, refusing unknown and repeated keys, and reports which known
// keys carried a non-null value.
func (d *decoder) mapping(n *yaml.Node, path string, fields []field) map[string]bool {
	seen := map[string]bool{}
	if !d.kind(n, path, yaml.MappingNode, "a mapping") {
		return seen
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			d.fail(k, path, "keys must be plain strings")
			continue
		}
		p := join(path, k.Value)
		if _, dup := seen[k.Value]; dup {
			d.fail(k, p, "key appears twice")
			continue
		}
		idx := slices.IndexFunc(fields, func(f field) bool { return f.name == k.Value })
		if idx < 0 {
			d.fail(k, p, "unknown key%s", suggest(k.Value, fields))
			continue
		}
		if v.Kind == yaml.AliasNode {
			d.fail(v, p, "YAML aliases are not supported; write the value out")
			seen[k.Value] = false
			continue
		}
		if isNull(v) {
			seen[k.Value] = false
			continue
		}
		seen[k.Value] = true
		fields[idx].decode(v, p)
	}
	return seen
}

// keyNode is the key node of key in mapping n; n itself when there is none.
func keyNode(n *yaml.Node, key string) *yaml.Node {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Kind == yaml.ScalarNode && n.Content[i].Value == key {
				return n.Content[i]
			}
		}
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// suggest names the closest known key when the unknown one looks like a typo of it.
func suggest(key string, fields []field) string {
	best, bestDist := "", 3
	for _, f := range fields {
		if dist := editDistance(key, f.name); dist < bestDist {
			best, bestDist = f.name, dist
		}
	}
	if best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.name
	}
	return " (known keys: " + strings.Join(names, ", ") + ")"
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

var kindNames = map[yaml.Kind]string{
	yaml.MappingNode:  "a mapping",
	yaml.SequenceNode: "a list",
	yaml.ScalarNode:   "a scalar",
	yaml.AliasNode:    "an alias",
	yaml.DocumentNode: "a document",
}

func describe(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!str":
			return "a string"
		case "!!int":
			return "an integer"
		case "!!float":
			return "a number"
		case "!!bool":
			return "a boolean"
		case "!!null":
			return "null"
		default:
			return "a value tagged " + n.ShortTag()
		}
	}
	return kindNames[n.Kind]
}

func (d *decoder) kind(n *yaml.Node, path string, k yaml.Kind, want string) bool {
	if n.Kind == k {
		return true
	}
	d.fail(n, path, "expected %s, got %s", want, describe(n))
	return false
}

func (d *decoder) str(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		hint := ""
		if n.Kind == yaml.ScalarNode {
			hint = fmt.Sprintf(" (quote it: %q)", n.Value)
		}
		d.fail(n, path, "expected a string, got %s%s", describe(n), hint)
		return "", false
	}
	return n.Value, true
}

func (d *decoder) boolean(n *yaml.Node, path string) *bool {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		d.fail(n, path, "expected true or false, got %s", describe(n))
		return nil
	}
	var b bool
	if err := n.Decode(&b); err != nil {
		d.fail(n, path, "expected true or false: %v", err)
		return nil
	}
	return &b
}

// positive reads a limit: an integer greater than zero. Zero is an error, never "unlimited".
func (d *decoder) positive(n *yaml.Node, path string) *int64 {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && digitsRE.MatchString(n.Value) {
		d.fail(n, path, "expected a whole number that fits in 64 bits, got %s", n.Value)
		return nil
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.fail(n, path, "expected a whole number, got %s", describe(n))
		return nil
	}
	var v int64
	if err := n.Decode(&v); err != nil {
		d.fail(n, path, "expected a whole number that fits in 64 bits, got %q", n.Value)
		return nil
	}
	if v <= 0 {
		d.fail(n, path, "must be greater than 0 (leave the key out for the default), got %d", v)
		return nil
	}
	return &v
}

func (d *decoder) strList(n *yaml.Node, path string) []string {
	if !d.kind(n, path, yaml.SequenceNode, "a list") {
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for i, item := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		if item.Kind == yaml.AliasNode {
			d.fail(item, p, "YAML aliases are not supported; write the value out")
			continue
		}
		if s, ok := d.str(item, p); ok {
			out = append(out, s)
		}
	}
	return out
}

// set returns a decode func that stores the result of read into *dst.
func set[T any](dst *T, read func(*yaml.Node, string) T) func(*yaml.Node, string) {
	return func(n *yaml.Node, path string) { *dst = read(n, path) }
}

func (d *decoder) strVal(n *yaml.Node, path string) string {
	s, _ := d.str(n, path)
	return s
}

// checkedStr reads a string and checks it, reporting a failed check at the value's line.
func (d *decoder) checkedStr(check func(string) error) func(*yaml.Node, string) string {
	return func(n *yaml.Node, path string) string {
		s, ok := d.str(n, path)
		if !ok {
			return ""
		}
		if err := check(s); err != nil {
			d.fail(n, path, "%v", err)
		}
		return s
	}
}

// checkedList reads a list of strings and checks each entry at its own path and line.
func (d *decoder) checkedList(check func(string) error) func(*yaml.Node, string) []string {
	return func(n *yaml.Node, path string) []string {
		list := d.strList(n, path)
		if n.Kind != yaml.SequenceNode || len(list) != len(n.Content) {
			return list
		}
		for i, s := range list {
			if err := check(s); err != nil {
				d.fail(n.Content[i], fmt.Sprintf("%s[%d]", path, i), "%v", err)
			}
		}
		return list
	}
}

// Closest is the candidate nearest name by edit distance, when one is within maxDist (ties
// go to the first in candidates); "" when none is. Roost uses it for did-you-mean hints.
func Closest(name string, candidates []string, maxDist int) string {
	best, bestDist := "", maxDist+1
	for _, c := range candidates {
		if d := editDistance(name, c); d < bestDist && c != name {
			best, bestDist = c, d
		}
	}
	return best
}
