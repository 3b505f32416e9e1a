package fakellm

import (
	"encoding/json"
	"unicode"
	"unicode/utf8"
)

// Input tokens counted from the request (Config.CountInput), for testing how well a client
// estimates what it will be billed. The count is deterministic and shaped like a byte-pair
// tokenizer's (cl100k_base, o200k_base, Claude's): text is split into pieces as cl100k's
// pre-tokenizer splits it — a word with the space before it, digits in groups of three,
// a run of punctuation with the space before it, a run of newlines, the indentation after
// them — and each piece costs what a vocabulary of ~100k pieces makes of it:
//
//   - a word: one token up to six ASCII letters, one per six more; each letter outside
//     ASCII one token (CJK runs about one a character);
//   - a group of up to three digits: one token;
//   - punctuation: one token per two marks; a symbol outside ASCII two (three when it takes
//     four UTF-8 bytes: emoji);
//   - a run of whitespace: one, and one more for the spaces of indentation after a newline.
//
// What is billed is what the upstream puts before the model: the text of the system
// prompt, of every message's content (text, tool results, a tool call's input as JSON),
// of instructions and input (Responses) and of prompt (completions); each tool's
// definition as its JSON plus 8, and 346 for the tool-use system prompt when any tool is
// given (Anthropic's documented figure); 4 a message for its role markers; 1,600 for an
// image (the most Anthropic bills one it resizes). Member names, ids, types and cache
// markers are framing, not billed.

// CountTokens is the input tokens the fake bills for a request body (Config.CountInput);
// a body that is not a JSON object counts 0.
func CountTokens(body []byte) int {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return 0
	}
	n := 0
	for _, name := range []string{"system", "instructions", "prompt"} {
		n += contentTokens(top[name])
	}
	for _, name := range []string{"messages", "input"} {
		raw := top[name]
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) != nil {
			n += contentTokens(raw)
			continue
		}
		for _, m := range list {
			n += 4 + contentTokens(m)
		}
	}
	tools := 0
	for _, name := range []string{"tools", "functions"} {
		var list []json.RawMessage
		if json.Unmarshal(top[name], &list) != nil {
			continue
		}
		for _, t := range list {
			n += 8 + textTokens(string(t))
			tools++
		}
	}
	if tools > 0 {
		n += 346
	}
	return n
}

// contentTokens counts a value of the prompt: strings as text, an image at its fixed
// price, a tool call's input as its JSON; member names and framing members not at all.
func contentTokens(raw json.RawMessage) int {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return 0
	}
	return valueTokens(v)
}

func valueTokens(v any) int {
	switch v := v.(type) {
	case string:
		return textTokens(v)
	case []any:
		n := 0
		for _, e := range v {
			n += valueTokens(e)
		}
		return n
	case map[string]any:
		switch v["type"] {
		case "image", "input_image", "image_url", "document", "input_file":
			return 1600
		}
		n := 0
		for k, e := range v {
			switch k {
			case "type", "role", "id", "tool_use_id", "call_id", "cache_control", "signature":
				continue
			case "input", "arguments":
				if _, ok := e.(string); !ok {
					b, _ := json.Marshal(e)
					n += textTokens(string(b))
					continue
				}
			}
			n += valueTokens(e)
		}
		return n
	case float64, bool:
		b, _ := json.Marshal(v)
		return textTokens(string(b))
	}
	return 0
}

// textTokens counts text as the package comment says.
func textTokens(s string) int {
	n := 0
	for i := 0; i < len(s); {
		r, _ := utf8.DecodeRuneInString(s[i:])
		switch {
		case isSpace(r):
			j := i
			for j < len(s) && isSpace(rune(s[j])) {
				j++
			}
			run := s[i:j]
			nl := -1
			for k := range len(run) {
				if run[k] == '\n' || run[k] == '\r' {
					nl = k
				}
			}
			// The last space joins a word or a mark that follows (digits take none), so
			// it costs nothing of its own.
			next, _ := utf8.DecodeRuneInString(s[j:])
			tail := len(run) - nl - 1
			if j < len(s) && run[len(run)-1] == ' ' && !unicode.IsDigit(next) {
				tail--
			}
			if nl >= 0 {
				n++
			}
			if tail > 0 {
				n++
			}
			i = j
		case unicode.IsLetter(r):
			ascii, wide := 0, 0
			for i < len(s) {
				r, size := utf8.DecodeRuneInString(s[i:])
				if !unicode.IsLetter(r) {
					break
				}
				if r < utf8.RuneSelf {
					ascii++
				} else {
					wide++
				}
				i += size
			}
			n += wide + (ascii+5)/6
		case '0' <= r && r <= '9':
			d := 0
			for i < len(s) && '0' <= s[i] && s[i] <= '9' {
				d++
				i++
			}
			n += (d + 2) / 3
		default:
			marks := 0
			for i < len(s) {
				r, size := utf8.DecodeRuneInString(s[i:])
				if isSpace(r) || unicode.IsLetter(r) || ('0' <= r && r <= '9') {
					break
				}
				switch {
				case r < utf8.RuneSelf:
					marks++
				case size == 4:
					n += 3
				default:
					n += 2
				}
				i += size
			}
			n += (marks + 1) / 2
		}
	}
	return n
}

func isSpace(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\r' }
