package gateway

import (
	"bytes"
	"unicode"
	"unicode/utf8"
)

// The input estimate. Once a call's output cap is lowered to the last tokens its ceilings
// leave, an input under-estimated is an overshoot, so the estimate must bound what the
// upstream bills; and since every token it over-counts is a token of output the call cannot
// have, it should bound it closely. Raw bytes ÷ 4 does neither: JSON's quotes, keys and
// escapes inflate it, while code, numbers and non-Latin text run well under four bytes a
// token.
//
// So the body is read as the upstream reads it: the text of its strings (escapes undone),
// counted the way a byte-pair tokenizer splits text, every piece at its dearest — a run of
// letters a token per four (a tokenizer's vocabulary holds most words whole), digits in
// threes (as cl100k and o200k split them), each punctuation mark a token (they merge in
// pairs at best), a run of whitespace two (newlines, then indentation), a letter or symbol outside ASCII a token or two
// (CJK is about one a character; symbols and emoji two or more bytes' worth). Member names
// count too, and a token for each object opened: the role markers and message framing the
// upstream adds are no less. Tool definitions are rendered into the prompt as JSON, so there
// the JSON's punctuation counts as well, with a few tokens a tool and the tool-use system
// prompt Anthropic adds (346 tokens as it documents; counted 512). An image or a document
// block counts 1,600 (the most Anthropic bills an image it resizes), its data sent inline
// (base64) four bytes a token more; OpenAI's low-detail images cost less.
//
// On the body Claude Code 2.1.197 sends (117 KB: its system prompt, 24 tools' schemas,
// messages) the estimate is 1.18× what fakellm's tokenizer (CountTokens) bills, and 1.21×
// on the 80 KB body of that shape TestEstimateBoundsTokenizer builds; bytes ÷ 4 is 0.89×
// and 0.71× — under what is billed, so an overshoot once the cap is lowered to the last
// token.
const (
	// toolTokens is what a tool definition adds besides its JSON.
	toolTokens = 8
	// toolPromptTokens is the system prompt an upstream adds when tools are given.
	toolPromptTokens = 512
	// blobFloor is what an image or a document block is counted besides its data.
	blobFloor = 1600
)

// estimateSent estimates the input tokens of a body as it is sent: fields' members, each
// once as the splice keeps it, with the values of set in place of (or after) its own.
func estimateSent(fields *object, set map[string][][]byte, order []string) int64 {
	e := estimator{tokens: 1}
	for i, m := range fields.members {
		if fields.last[m.name] != i {
			continue
		}
		if v, ok := set[m.name]; ok {
			e.member([]byte(m.name), bytes.Join(v, nil), 0, 0, false)
			continue
		}
		e.member([]byte(m.name), fields.raw, m.value, 0, false)
	}
	for _, name := range order {
		if !fields.has(name) {
			e.member([]byte(name), bytes.Join(set[name], nil), 0, 0, false)
		}
	}
	return e.tokens
}

type estimator struct {
	tokens int64
}

// member counts an object's member named name whose value is at b[i], depth objects deep,
// and returns the index just past the value.
func (e *estimator) member(name, b []byte, i, depth int, raw bool) int {
	e.text(name)
	switch {
	case depth == 0 && (bytes.Equal(name, []byte("tools")) || bytes.Equal(name, []byte("functions"))) && b[i] == '[':
		return e.tools(b, i)
	case !raw && b[i] == '"' && (bytes.Equal(name, []byte("data")) || isDataURL(b[i:])):
		end := skipString(b, i)
		e.tokens += (int64(end-i) + 3) / 4
		return end
	case !raw && bytes.Equal(name, []byte("type")) && b[i] == '"':
		end := skipString(b, i)
		switch string(b[i+1 : end-1]) {
		case "image", "image_url", "input_image", "document", "input_file":
			// Its data may be elsewhere (a URL, a file id) or not show its pixels.
			e.tokens += blobFloor
		}
		e.text(b[i+1 : end-1])
		return end
	}
	return e.value(b, i, depth, raw)
}

// value counts the value at b[i], depth objects deep; raw counts its punctuation as text
// (a tool's definition). It returns the index just past the value.
func (e *estimator) value(b []byte, i, depth int, raw bool) int {
	switch b[i] {
	case '{':
		e.tokens++
		if raw {
			e.tokens++
		}
		i = skipSpace(b, i+1)
		for b[i] != '}' {
			nameEnd := skipString(b, i)
			name := b[i+1 : nameEnd-1]
			i = skipSpace(b, nameEnd)
			i = skipSpace(b, e.member(name, b, skipSpace(b, i+1), depth+1, raw))
			if b[i] == ',' {
				if raw {
					e.tokens++
				}
				i = skipSpace(b, i+1)
			}
		}
		if raw {
			e.tokens++
		}
		return i + 1
	case '[':
		if raw {
			e.tokens++
		}
		i = skipSpace(b, i+1)
		for b[i] != ']' {
			i = skipSpace(b, e.value(b, i, depth+1, raw))
			if b[i] == ',' {
				if raw {
					e.tokens++
				}
				i = skipSpace(b, i+1)
			}
		}
		if raw {
			e.tokens++
		}
		return i + 1
	case '"':
		end := skipString(b, i)
		if raw {
			e.tokens += 2
		}
		e.text(b[i+1 : end-1])
		return end
	}
	end := skipValue(b, i)
	e.text(b[i:end])
	return end
}

// tools counts a list of tool definitions: each as its JSON, and what a tool adds.
func (e *estimator) tools(b []byte, i int) int {
	e.tokens += toolPromptTokens
	i = skipSpace(b, i+1)
	for b[i] != ']' {
		e.tokens += toolTokens
		i = skipSpace(b, e.value(b, i, 1, true))
		if b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return i + 1
}

// isDataURL says whether the string at s (its opening quote) is a base64 data: URL.
func isDataURL(s []byte) bool {
	const most = 128
	head := s[1:min(len(s), most)]
	return bytes.HasPrefix(head, []byte("data:")) && bytes.Contains(head, []byte(";base64,"))
}

// text counts a JSON string's content (escaped, as it lies) or a literal.
func (e *estimator) text(s []byte) {
	var t textCount
	for i := 0; i < len(s); {
		r, n := nextRune(s[i:])
		i += n
		t.add(r)
	}
	t.flush()
	e.tokens += t.tokens
}

// nextRune is the first character of a JSON string's content, escapes undone, and its
// length as it lies.
func nextRune(s []byte) (rune, int) {
	if s[0] != '\\' || len(s) < 2 {
		if s[0] < utf8.RuneSelf {
			return rune(s[0]), 1
		}
		return utf8.DecodeRune(s)
	}
	switch s[1] {
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		if len(s) >= 6 {
			return hexRune(s[2:6]), 6
		}
	}
	return rune(s[1]), 2
}

// textCount counts text a character at a time.
type textCount struct {
	tokens int64
	// run is how many characters of class the current run holds (letters, digits,
	// whitespace); lone that it is one space, which joins the next word or mark.
	run   int64
	class byte
	lone  bool
}

// The classes of characters that run together.
const (
	runNone = iota
	runLetter
	runDigit
	runSpace
)

func (t *textCount) add(r rune) {
	var class byte
	switch {
	case 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z':
		class = runLetter
	case '0' <= r && r <= '9':
		class = runDigit
	case r == ' ' || r == '\t' || r == '\n' || r == '\r':
		if t.class != runSpace {
			t.flush()
			t.class, t.lone = runSpace, r == ' '
		} else {
			t.lone = false
		}
		t.run++
		return
	}
	if t.class == runSpace && t.lone && class != runDigit {
		// " word", " (": one piece with what follows.
		t.run, t.class = 0, runNone
	}
	if class != t.class {
		t.flush()
	}
	switch {
	case class != runNone:
		t.class = class
		t.run++
	case r < utf8.RuneSelf:
		t.tokens++
	case unicode.IsLetter(r):
		t.tokens++
	case r >= 0x10000:
		t.tokens += 3
	default:
		t.tokens += 2
	}
}

// flush ends the current run.
func (t *textCount) flush() {
	switch t.class {
	case runLetter:
		t.tokens += (t.run + 3) / 4
	case runDigit:
		t.tokens += (t.run + 2) / 3
	case runSpace:
		// A tokenizer takes a run of newlines whole, and the indentation after it as a
		// second piece (all but its last space, which joins the next word).
		t.tokens += min(t.run, 2)
	}
	t.run, t.class = 0, runNone
}

// hexRune is the rune of four hex digits (utf8.RuneError when they are not).
func hexRune(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return utf8.RuneError
		}
	}
	return r
}
