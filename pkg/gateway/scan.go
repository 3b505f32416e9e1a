package gateway

import (
	"bytes"
	"encoding/json"
)

// scan reads one JSON value as it passes, a piece at a time, and keeps only the members
// the meter reads — usage at the top, in message or in response, the top's type and
// whether its choices are empty — so an answer of any size costs the meter a few small
// buffers, never the answer. It judges the value's shape (brackets, strings, what follows
// the end) but not every rule of JSON: what it keeps is decoded by encoding/json.
type scan struct {
	depth int
	// objs has bit d set when the container at depth d+1 is an object (depths past 64 are
	// only counted: nothing is read there).
	objs uint64
	// inString, escape: inside a string, just after a backslash; inKey: the string is a
	// member's name; expectKey: the next string in this object is a name.
	inString, escape, inKey, expectKey bool
	// scalar: inside a number or literal.
	scalar bool
	// key is the name being read (bounded); names are what each depth's member is named
	// (depth 1 and 2).
	key          []byte
	name1, name2 slot
	// capturing is the slot a value is being kept for; capDepth the depth it began at.
	capturing slot
	capDepth  int
	buf       []byte
	over      bool
	// kept are the values kept, by slot: every one given, in order (a name given twice is
	// decoded twice into the same place, as encoding/json does).
	kept [slots][][]byte
	// held is what each slot keeps, in bytes; unreadable that it passed its most.
	held       [slots]int
	unreadable [slots]bool
	// started: a value began; complete: it ended; bad: it is not JSON.
	started, complete, bad bool
}

// slot is a member the meter reads.
type slot int

const (
	slotNone slot = iota
	slotUsage
	slotMessageUsage
	slotResponseUsage
	slotType
	slotChoices
	slots
)

// Names the scan knows, and the most each kept value may hold: a usage object is small,
// a type a word; choices is kept only to see whether it is "[]".
const (
	maxKey     = 64
	maxUsage   = 64 << 10
	maxType    = 256
	maxChoices = 16
)

// The names of the members a usage may sit in.
const (
	nameMessage slot = slots + 1 + iota
	nameResponse
)

func (s *scan) reset() { *s = scan{key: s.key[:0], buf: s.buf[:0]} }

// write takes the value's next bytes.
func (s *scan) write(p []byte) {
	for i := 0; i < len(p) && !s.bad; i++ {
		c := p[i]
		if s.inString {
			if s.escape {
				s.escape = false
				s.keep(p[i : i+1])
				continue
			}
			j := bytes.IndexAny(p[i:], `"\`)
			if j < 0 {
				s.keep(p[i:])
				return
			}
			s.keep(p[i : i+j+1])
			i += j
			if p[i] == '\\' {
				s.escape = true
				continue
			}
			s.inString = false
			if s.inKey {
				s.inKey, s.expectKey = false, false
				s.named()
				continue
			}
			s.ended()
			continue
		}
		if s.scalar {
			switch c {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				s.scalar = false
				s.ended()
			default:
				s.keep(p[i : i+1])
				continue
			}
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			s.keep(p[i : i+1])
		case '"':
			if s.expectKey && s.depth > 0 {
				s.inKey, s.key = true, s.key[:0]
			} else {
				s.begin()
			}
			s.inString = true
			s.keep(p[i : i+1])
		case '{', '[':
			s.begin()
			s.keep(p[i : i+1])
			if s.depth < 64 && c == '{' {
				s.objs |= 1 << s.depth
			} else if s.depth < 64 {
				s.objs &^= 1 << s.depth
			}
			s.depth++
			s.expectKey = c == '{'
		case '}', ']':
			if s.depth == 0 {
				s.bad = true
				return
			}
			s.keep(p[i : i+1])
			s.depth--
			s.ended()
		case ':', ',':
			if s.depth == 0 {
				s.bad = true
				return
			}
			s.keep(p[i : i+1])
			if c == ',' {
				s.expectKey = s.inObject()
			}
		default:
			s.begin()
			s.scalar = true
			s.keep(p[i : i+1])
		}
	}
}

// inObject: the innermost open container is an object.
func (s *scan) inObject() bool {
	d := s.depth - 1
	return d >= 0 && d < 64 && s.objs&(1<<d) != 0
}

// objectAt: the container at depth d (1 is the top) is an object.
func (s *scan) objectAt(d int) bool { return d >= 1 && d <= 64 && s.objs&(1<<(d-1)) != 0 }

// keep adds bytes to the name being read and the value being kept, if any.
func (s *scan) keep(p []byte) {
	if s.inKey {
		if len(s.key)+len(p) <= maxKey {
			s.key = append(s.key, p...)
		} else {
			s.key = append(s.key[:0], '!')
		}
	}
	if s.capturing == slotNone || s.over {
		return
	}
	if len(s.buf)+len(p) > s.capturing.most() {
		s.over = true
		return
	}
	s.buf = append(s.buf, p...)
}

func (sl slot) most() int {
	switch sl {
	case slotType:
		return maxType
	case slotChoices:
		return maxChoices
	}
	return maxUsage
}

// named is a member's name read, its quotes included.
func (s *scan) named() {
	name := slotNone
	k := s.key
	if len(k) < 2 || k[0] != '"' {
		k = nil
	} else if bytes.IndexByte(k, '\\') >= 0 {
		var d string
		if json.Unmarshal(k, &d) != nil {
			d = ""
		}
		k = []byte(d)
	} else {
		k = k[1 : len(k)-1]
	}
	// encoding/json matches a member to a field as bytes.EqualFold does; so does the meter.
	switch {
	case bytes.EqualFold(k, []byte("usage")):
		name = slotUsage
	case bytes.EqualFold(k, []byte("type")):
		name = slotType
	case bytes.EqualFold(k, []byte("choices")):
		name = slotChoices
	case bytes.EqualFold(k, []byte("message")):
		name = nameMessage
	case bytes.EqualFold(k, []byte("response")):
		name = nameResponse
	}
	switch s.depth {
	case 1:
		s.name1 = name
	case 2:
		s.name2 = name
	}
}

// begin is a value's start, at the current depth.
func (s *scan) begin() {
	if s.depth == 0 {
		if s.started {
			s.bad = true
		}
		s.started = true
		return
	}
	if s.capturing != slotNone || !s.objectAt(s.depth) {
		return
	}
	switch {
	case s.depth == 1 && (s.name1 == slotUsage || s.name1 == slotType || s.name1 == slotChoices):
		s.capturing = s.name1
	case s.depth == 2 && s.objectAt(1) && s.name2 == slotUsage && s.name1 == nameMessage:
		s.capturing = slotMessageUsage
	case s.depth == 2 && s.objectAt(1) && s.name2 == slotUsage && s.name1 == nameResponse:
		s.capturing = slotResponseUsage
	default:
		return
	}
	s.capDepth, s.buf, s.over = s.depth, s.buf[:0], false
}

// ended is a value's end; the depth is the one it began at.
func (s *scan) ended() {
	if s.capturing != slotNone && s.depth == s.capDepth {
		sl := s.capturing
		switch {
		case s.unreadable[sl]:
		case s.over || s.held[sl]+len(s.buf) > sl.most():
			// Too much to read: none of it is.
			s.kept[sl], s.unreadable[sl] = [][]byte{[]byte("0")}, true
		default:
			s.kept[sl] = append(s.kept[sl], bytes.Clone(s.buf))
			s.held[sl] += len(s.buf)
		}
		s.capturing = slotNone
	}
	if s.depth == 0 {
		s.complete = true
	}
}

// end is the value's end: whether it was one whole JSON value.
func (s *scan) end() bool {
	if s.scalar {
		s.scalar = false
		s.ended()
	}
	return s.complete && !s.bad && !s.inString && s.depth == 0
}

// decode decodes the kept values of sl into v in order, as encoding/json decodes a name
// given twice; false when one does not decode.
func (s *scan) decode(sl slot, v any) bool {
	for _, raw := range s.kept[sl] {
		if json.Unmarshal(raw, v) != nil {
			return false
		}
	}
	return true
}

// carrier is what the scan kept, decoded as encoding/json decodes usageCarrier from the
// whole value; false when one of its members does not decode (encoding/json would refuse
// the value).
func (s *scan) carrier() (c usageCarrier, ok bool) {
	var message, response *usageHolder
	var choices json.RawMessage
	ok = s.decode(slotType, &c.Type) && s.decode(slotUsage, &c.Usage) && s.decode(slotChoices, &choices)
	if ok && len(s.kept[slotMessageUsage]) > 0 {
		message = &usageHolder{}
		ok = s.decode(slotMessageUsage, &message.Usage)
	}
	if ok && len(s.kept[slotResponseUsage]) > 0 {
		response = &usageHolder{}
		ok = s.decode(slotResponseUsage, &response.Usage)
	}
	c.Message, c.Response, c.Choices = message, response, choices
	return c, ok
}
