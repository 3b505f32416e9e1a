package fakellm

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Turn is one answer of a scripted conversation (Config.Script): a call of one of the tools
// the client offers, or, with no Tool, a final text answer.
//
// A coding agent's CLI loops until the model stops calling tools, so a script of a tool call
// then a text makes it run the tool once and finish: the test sees the agent's own tool
// machinery (its shell, its permission checks) do the work, inside whatever holds the agent.
type Turn struct {
	// Tool is the name of the tool to call, as the request's tools list offers it (Claude
	// Code's "Bash", Codex's "exec_command"). A request that does not offer it is answered
	// with a text naming what it offers, so a script that guessed wrong says so. A Responses
	// request's built-in apply_patch tool ({"type": "apply_patch"}, which has no name) is
	// offered as "apply_patch", and called with an apply_patch_call.
	Tool string
	// Input is the call's arguments, a JSON object, streamed in pieces as the providers do
	// (Anthropic's input_json_delta, OpenAI's function_call_arguments.delta); for the
	// built-in apply_patch, the call's operation ({"type": "create_file", "path": ...,
	// "diff": ...}).
	Input json.RawMessage
	// Text is the answer's text; with a Tool, the text said before the call, as models often
	// do (left empty, the answer is the call alone).
	Text string
}

// Usage is what the fake billed, summed over every answer that reported usage: the main
// conversation's turns and every side call alike.
type Usage struct {
	InputTokens, OutputTokens int
	// CachedTokens are the input read from the prompt cache: Anthropic reports them besides
	// InputTokens (cache_read_input_tokens), OpenAI as a part of it (cached_tokens).
	CachedTokens int
	// Tokens is what the provider charges for: Anthropic's input, cache reads and output,
	// OpenAI's input and output.
	Tokens int
}

// Billed is the total usage the fake has reported so far.
func (s *Server) Billed() Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.billed
}

func (s *Server) bill(u Usage) {
	s.mu.Lock()
	s.billed.InputTokens += u.InputTokens
	s.billed.OutputTokens += u.OutputTokens
	s.billed.CachedTokens += u.CachedTokens
	s.billed.Tokens += u.Tokens
	s.mu.Unlock()
}

// scriptTurn is the turn a request of the main conversation gets: the one after as many tool
// calls as the conversation already holds results of (results counts them in the request's
// history). It keys on the conversation the client sends, not on how many requests came, so a
// retried request, or a side call between two turns, gets the same answer again. A request
// with no tools (a title, a quota probe, a summary) is a side call and gets Config.Reply, as
// does a conversation past the script's end; ok is false for those.
func scriptTurn(cfg Config, f fields, results func(json.RawMessage) int) (Turn, []string, bool) {
	offered := toolNames(f)
	if len(cfg.Script) == 0 || len(offered) == 0 {
		return Turn{}, nil, false
	}
	n := 0
	for _, key := range []string{"messages", "input"} {
		if f.has(key) {
			n = results(f[key])
		}
	}
	if n >= len(cfg.Script) {
		return Turn{}, offered, false
	}
	t := cfg.Script[n]
	if t.Tool != "" && len(t.Input) == 0 {
		t.Input = json.RawMessage("{}")
	}
	return t, offered, true
}

// builtinApplyPatch is the Responses API's built-in tool of file edits: offered by its type
// alone, called with an apply_patch_call, answered with an apply_patch_call_output.
const builtinApplyPatch = "apply_patch"

// toolNames are the names of the tools a request offers: Anthropic's and OpenAI's function
// tools alike carry a name at the top; a Responses tool may be a namespace of them, or the
// built-in apply_patch, named by its type.
func toolNames(f fields) []string {
	tools, _ := f.array("tools")
	var names []string
	for _, raw := range tools {
		var t struct {
			Type  string `json:"type"`
			Name  string `json:"name"`
			Tools []struct {
				Name string `json:"name"`
			} `json:"tools"`
		}
		if json.Unmarshal(raw, &t) != nil {
			continue
		}
		if t.Name != "" {
			names = append(names, t.Name)
		} else if t.Type == builtinApplyPatch {
			names = append(names, builtinApplyPatch)
		}
		for _, sub := range t.Tools {
			names = append(names, sub.Name)
		}
	}
	return names
}

// offersBuiltin says whether a request's tools hold the built-in tool of type typ (one with
// no name), as against a function tool of that name.
func offersBuiltin(f fields, typ string) bool {
	tools, _ := f.array("tools")
	for _, raw := range tools {
		var t struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if json.Unmarshal(raw, &t) == nil && t.Type == typ && t.Name == "" {
			return true
		}
	}
	return false
}

// unoffered is what a scripted turn says instead of calling a tool the request lacks.
func unoffered(t Turn, offered []string) (Turn, bool) {
	if t.Tool == "" || slices.Contains(offered, t.Tool) {
		return t, true
	}
	return Turn{Text: fmt.Sprintf("fakellm: the script calls %q, which the request does not offer (it offers: %s)", t.Tool, strings.Join(offered, ", "))}, false
}

// anthropicResults counts the tool_result blocks in a Messages history.
func anthropicResults(raw json.RawMessage) int {
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &msgs) != nil {
		return 0
	}
	n := 0
	for _, m := range msgs {
		var blocks []struct {
			Type string `json:"type"`
		}
		// A string content holds no blocks.
		_ = json.Unmarshal(m.Content, &blocks)
		for _, b := range blocks {
			if b.Type == "tool_result" {
				n++
			}
		}
	}
	return n
}

// responsesResults counts the tool outputs in a Responses input: a function call's, a custom
// tool's, the local shell's or the built-in apply_patch's.
func responsesResults(raw json.RawMessage) int {
	var items []struct {
		Type string `json:"type"`
	}
	// A string input is a single user message.
	if json.Unmarshal(raw, &items) != nil {
		return 0
	}
	n := 0
	for _, it := range items {
		switch it.Type {
		case "function_call_output", "custom_tool_call_output", "local_shell_call_output", "apply_patch_call_output":
			n++
		}
	}
	return n
}

// splitJSONText cuts a JSON text into the pieces a stream sends its arguments in: a few
// characters each, not at token boundaries, as the providers' partial JSON is not, so only a
// client that joins the pieces before parsing reads the arguments.
func splitJSONText(s string) []string {
	const piece = 7
	var parts []string
	start, runes := 0, 0
	for i := range s {
		// Cut between characters, never inside one: each piece is sent as a JSON string.
		if runes == piece {
			parts = append(parts, s[start:i])
			start, runes = i, 0
		}
		runes++
	}
	return append(parts, s[start:])
}
