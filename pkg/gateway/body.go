package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"unicode/utf8"
)

// A request body is read where it lies: its top-level members are found by a scan of the
// bytes json.Valid has accepted, only the few the meter needs are decoded, and a rewrite is
// a splice of the original bytes (pieces of it and a few new ones), never a decoded map
// written again — so a call costs its body once, not four times.

// maxMembers bounds an object's members the gateway keeps track of (a body's, its
// stream_options'): no API takes more than a few dozen, and each costs the gateway a name.
const maxMembers = 1024

// member is one member of a JSON object: its name decoded as encoding/json decodes it, and
// where it lies in the object's bytes — start at its name's opening quote, value at its
// value, end just past the value.
type member struct {
	name              string
	start, value, end int
}

// object is a JSON object's members as the gateway reads them: a name given twice is the
// last one given, as encoding/json reads it.
type object struct {
	raw     []byte
	members []member
	// last is each name's last member.
	last map[string]int
}

// parseObject reads a JSON object's members; raw must be valid JSON (json.Valid). field
// names the object in errors ("" for the body).
func parseObject(raw []byte, field string) (*object, error) {
	what := "the request body"
	i := skipSpace(raw, 0)
	switch {
	case field == "" && raw[i] != '{':
		return nil, invalid("the request body is not a JSON object: it is %s", snippet(bytes.TrimSpace(raw)))
	case raw[i] != '{':
		return nil, invalid("%s: expected an object, got %s", field, snippet(bytes.TrimSpace(raw)))
	case field != "":
		what = field
	}
	o := &object{raw: raw, last: map[string]int{}}
	i = skipSpace(raw, i+1)
	if raw[i] == '}' {
		return o, nil
	}
	for {
		if len(o.members) == maxMembers {
			return nil, invalid("%s: more than %d members", what, maxMembers)
		}
		start := i
		nameEnd := skipString(raw, i)
		name, err := decodeName(raw[start:nameEnd])
		if err != nil {
			return nil, invalid("%s: a member's name: %v", what, err)
		}
		i = skipSpace(raw, nameEnd)
		// raw[i] is the ':'.
		value := skipSpace(raw, i+1)
		end := skipValue(raw, value)
		o.last[name] = len(o.members)
		o.members = append(o.members, member{name: name, start: start, value: value, end: end})
		i = skipSpace(raw, end)
		if raw[i] == '}' {
			return o, nil
		}
		// raw[i] is the ','.
		i = skipSpace(raw, i+1)
	}
}

// get is the value of name's last member, and whether it is there and not null (the
// providers take null as absent).
func (o *object) get(name string) ([]byte, bool) {
	i, ok := o.last[name]
	if !ok {
		return nil, false
	}
	v := o.raw[o.members[i].value:o.members[i].end]
	return v, string(v) != "null"
}

// has reports whether name is given at all, null included.
func (o *object) has(name string) bool {
	_, ok := o.last[name]
	return ok
}

// unique reports whether no name is given twice.
func (o *object) unique() bool { return len(o.last) == len(o.members) }

// splice is o written with the values of set in place of (or, for names o lacks, after)
// its own, each name once as o reads it: pieces of o's bytes and of set's, copied nowhere.
// A value in set is one JSON value, pieces of it in order.
func (o *object) splice(set map[string][][]byte, order []string) [][]byte {
	return o.write(nil, set, order)
}

// subset is o with only the members names lists, written as splice writes them (set's
// values in place of o's, and after them those of set's names o lacks).
func (o *object) subset(names []string, set map[string][][]byte) [][]byte {
	var order []string
	for _, name := range names {
		if _, ok := set[name]; ok {
			order = append(order, name)
		}
	}
	return o.write(names, set, order)
}

// write is splice, keeping only the members keep names (all of them when keep is nil).
func (o *object) write(keep []string, set map[string][][]byte, order []string) [][]byte {
	out := [][]byte{[]byte("{")}
	comma := func() {
		if len(out) > 1 {
			out = append(out, []byte(","))
		}
	}
	for i, m := range o.members {
		if o.last[m.name] != i || keep != nil && !slices.Contains(keep, m.name) {
			continue
		}
		comma()
		if v, ok := set[m.name]; ok {
			out = append(out, o.raw[m.start:m.value])
			out = append(out, v...)
			continue
		}
		out = append(out, o.raw[m.start:m.end])
	}
	for _, name := range order {
		if o.has(name) {
			continue
		}
		comma()
		key, _ := json.Marshal(name)
		out = append(out, append(key, ':'))
		out = append(out, set[name]...)
	}
	return append(out, []byte("}"))
}

// decodeName is a member's name (quoted, as it lies) as encoding/json decodes it: escapes
// undone, invalid UTF-8 replaced.
func decodeName(quoted []byte) (string, error) {
	inner := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), nil
	}
	var s string
	err := json.Unmarshal(quoted, &s)
	return s, err
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString is the index just past the string whose opening quote is at i.
func skipString(b []byte, i int) int {
	for i++; i < len(b); {
		j := bytes.IndexAny(b[i:], `"\`)
		if j < 0 {
			return len(b)
		}
		i += j
		if b[i] == '"' {
			return i + 1
		}
		i += 2
	}
	return len(b)
}

// skipValue is the index just past the (valid) JSON value starting at i.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			j := bytes.IndexAny(b[i:], `"{}[]`)
			if j < 0 {
				return len(b)
			}
			i += j
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			default:
				depth--
			}
			i++
			if depth == 0 {
				return i
			}
		}
		return len(b)
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// elements is how many elements the (valid) JSON array raw holds, and the first one.
func elements(raw []byte) (int64, []byte) {
	i := skipSpace(raw, 1)
	if raw[i] == ']' {
		return 0, nil
	}
	var n int64
	var first []byte
	for {
		end := skipValue(raw, i)
		if n == 0 {
			first = raw[i:end]
		}
		n++
		i = skipSpace(raw, end)
		if raw[i] == ']' {
			return n, first
		}
		i = skipSpace(raw, i+1)
	}
}

// snippet is a value as an error quotes it: its start, when it is long.
func snippet(raw []byte) string {
	const most = 64
	if len(raw) > most {
		return fmt.Sprintf("%s… (%d bytes)", raw[:most], len(raw))
	}
	return string(raw)
}

// pieces is a body as it is sent: the parts of a splice, in order.
type pieces [][]byte

func (p pieces) size() int64 {
	var n int64
	for _, b := range p {
		n += int64(len(b))
	}
	return n
}

// reader reads the pieces in order, copying none of them.
func (p pieces) reader() io.ReadCloser {
	rs := make([]io.Reader, len(p))
	for i, b := range p {
		rs[i] = bytes.NewReader(b)
	}
	return io.NopCloser(io.MultiReader(rs...))
}

// join is the pieces as one slice: the only piece itself, else a copy (for tests and for a
// body small enough that a copy costs nothing).
func (p pieces) join() []byte {
	if len(p) == 1 {
		return p[0]
	}
	return bytes.Join(p, nil)
}
