package fakellm_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"roost.dev/roost/internal/fakellm"
)

// The command is long enough to be streamed in several pieces and holds a character of more
// than one byte, which a piece must not be cut inside.
const scriptCommand = `printf 'wrote: %s\n' "$(cat out.txt)" > done.txt # café`

func scriptConfig(tool string) fakellm.Config {
	cfg := baseConfig()
	cfg.CachedTokens = 5
	input, _ := json.Marshal(map[string]string{"command": scriptCommand})
	cfg.Script = []fakellm.Turn{
		{Tool: tool, Input: input, Text: "Running it."},
		{Text: "All done."},
	}
	return cfg
}

type sseData struct {
	Type         string `json:"type"`
	Index        int    `json:"index"`
	ContentBlock struct {
		Type  string          `json:"type"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	} `json:"content_block"`
	Delta struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		PartialJSON string `json:"partial_json"`
		StopReason  string `json:"stop_reason"`
	} `json:"delta"`
	Message struct {
		Usage struct {
			InputTokens          int `json:"input_tokens"`
			CacheReadInputTokens int `json:"cache_read_input_tokens"`
		} `json:"usage"`
	} `json:"message"`
	Usage struct {
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

const anthropicTools = `"tools":[{"name":"Bash","description":"Runs a command","input_schema":{"type":"object"}}]`

// A Messages stream of a scripted turn: the text block, then a tool_use block whose input
// arrives as input_json_delta pieces that join to the script's input, stop_reason tool_use.
// The request carrying the tool's result gets the next turn; a side call without tools gets
// the plain reply; and every answer is billed.
func TestScriptMessages(t *testing.T) {
	s := start(t, scriptConfig("Bash"))
	first := `{"model":"claude-x","max_tokens":64000,"stream":true,` + anthropicTools + `,"messages":[{"role":"user","content":"go"}]}`
	resp, b := do(t, s, "POST", "/v1/messages", anthropicHeader(testKey), first)
	checkStreamHeaders(t, resp)
	var names, text, partial []string
	var toolID, stop string
	for _, e := range readSSE(t, b) {
		names = append(names, e.name)
		d := decode[sseData](t, []byte(e.data))
		switch {
		case e.name == "content_block_start" && d.ContentBlock.Type == "tool_use":
			if d.Index != 1 || d.ContentBlock.Name != "Bash" || string(d.ContentBlock.Input) != "{}" || !strings.HasPrefix(d.ContentBlock.ID, "toolu_") {
				t.Errorf("tool_use start: %s", e.data)
			}
			toolID = d.ContentBlock.ID
		case e.name == "content_block_delta" && d.Delta.Type == "text_delta":
			text = append(text, d.Delta.Text)
		case e.name == "content_block_delta" && d.Delta.Type == "input_json_delta":
			if d.Index != 1 {
				t.Errorf("input delta at index %d", d.Index)
			}
			partial = append(partial, d.Delta.PartialJSON)
		case e.name == "message_delta":
			stop = d.Delta.StopReason
		case e.name == "message_start":
			if d.Message.Usage.InputTokens != 11 || d.Message.Usage.CacheReadInputTokens != 5 {
				t.Errorf("message_start usage: %s", e.data)
			}
		}
	}
	if strings.Join(text, "") != "Running it." || stop != "tool_use" || toolID == "" {
		t.Fatalf("text %q, stop %q, events %v", text, stop, names)
	}
	if len(partial) < 3 || partial[0] != "" {
		t.Errorf("the input came in %d pieces, the first %q: want an empty first piece and several more", len(partial), partial)
	}
	var input map[string]string
	if err := json.Unmarshal([]byte(strings.Join(partial, "")), &input); err != nil || input["command"] != scriptCommand {
		t.Fatalf("joined input %q: %v", strings.Join(partial, ""), err)
	}

	// The client runs the tool and posts its result: the next turn, the final text.
	second := `{"model":"claude-x","max_tokens":64000,` + anthropicTools + `,"messages":[{"role":"user","content":"go"},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"` + toolID + `","name":"Bash","input":{}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"` + toolID + `","content":"ok"}]}]}`
	_, b = do(t, s, "POST", "/v1/messages", anthropicHeader(testKey), second)
	type answer struct {
		Content []struct {
			Type, Text string
		} `json:"content"`
		StopReason string `json:"stop_reason"`
	}
	if a := decode[answer](t, b); len(a.Content) != 1 || a.Content[0].Text != "All done." || a.StopReason != "end_turn" {
		t.Fatalf("after the tool result: %s", b)
	}
	// A side call (no tools: a title, a quota probe) between turns changes nothing.
	_, b = do(t, s, "POST", "/v1/messages", anthropicHeader(testKey), `{"model":"claude-x","max_tokens":1,"messages":[{"role":"user","content":"quota"}]}`)
	if a := decode[answer](t, b); len(a.Content) != 1 || a.Content[0].Text != testReply || a.StopReason != "max_tokens" {
		t.Fatalf("a side call: %s", b)
	}
	// A retried first request gets the first turn again.
	_, b = do(t, s, "POST", "/v1/messages", anthropicHeader(testKey), strings.Replace(first, `"stream":true,`, "", 1))
	if a := decode[answer](t, b); len(a.Content) != 2 || a.Content[1].Type != "tool_use" || a.StopReason != "tool_use" {
		t.Fatalf("the first turn again: %s", b)
	}
	// Three answers of 11 input, 5 cached and 7 output; the quota probe's output capped at 1.
	want := fakellm.Usage{InputTokens: 44, OutputTokens: 7*3 + 1, CachedTokens: 20, Tokens: 44 + 20 + 22}
	if got := s.Billed(); got != want {
		t.Fatalf("billed %+v, want %+v", got, want)
	}
}

// A turn calling a tool the request does not offer answers a text naming what it offers.
func TestScriptUnofferedTool(t *testing.T) {
	s := start(t, scriptConfig("Shell"))
	_, b := do(t, s, "POST", "/v1/messages", anthropicHeader(testKey), `{"model":"m","max_tokens":100,`+anthropicTools+`,"messages":[{"role":"user","content":"go"}]}`)
	if !strings.Contains(string(b), `fakellm: the script calls \"Shell\", which the request does not offer (it offers: Bash)`) || !strings.Contains(string(b), `"stop_reason":"end_turn"`) {
		t.Fatalf("answer: %s", b)
	}
}

const responsesTools = `"tools":[{"type":"function","name":"exec_command","parameters":{"type":"object"}},{"type":"namespace","name":"multi","tools":[{"type":"function","name":"spawn"}]}]`

// A Responses stream of a scripted turn: the message item, then a function_call item whose
// arguments arrive as function_call_arguments.delta pieces, then response.completed with the
// usage and both items. A request carrying the call's output gets the final message.
func TestScriptResponses(t *testing.T) {
	s := start(t, scriptConfig("exec_command"))
	first := `{"model":"gpt-x","stream":true,` + responsesTools + `,"input":[{"type":"message","role":"user","content":"go"}]}`
	resp, b := do(t, s, "POST", "/v1/responses", openAIHeader(testKey), first)
	checkStreamHeaders(t, resp)
	type item struct {
		ID, Type, Status, Arguments, Name string
		CallID                            string `json:"call_id"`
	}
	type ev struct {
		Type        string `json:"type"`
		ItemID      string `json:"item_id"`
		OutputIndex int    `json:"output_index"`
		Item        item   `json:"item"`
		Delta       string `json:"delta"`
		Arguments   string `json:"arguments"`
		Response    struct {
			Output []item `json:"output"`
			Usage  struct {
				InputTokens        int `json:"input_tokens"`
				InputTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"input_tokens_details"`
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		} `json:"response"`
	}
	var types, deltas []string
	var done, completed ev
	var added item
	for _, e := range readSSE(t, b) {
		d := decode[ev](t, []byte(e.data))
		if d.Type != e.name {
			t.Errorf("event %s carries type %s", e.name, d.Type)
		}
		types = append(types, e.name)
		switch {
		case e.name == "response.output_item.added" && d.Item.Type == "function_call":
			if d.OutputIndex != 1 || d.Item.Arguments != "" || d.Item.Status != "in_progress" {
				t.Errorf("function_call added: %s", e.data)
			}
			added = d.Item
		case e.name == "response.function_call_arguments.delta":
			if d.ItemID != added.ID {
				t.Errorf("a delta for item %q, the call is %q", d.ItemID, added.ID)
			}
			deltas = append(deltas, d.Delta)
		case e.name == "response.function_call_arguments.done":
			done = d
		case e.name == "response.completed":
			completed = d
		}
	}
	var args map[string]string
	if err := json.Unmarshal([]byte(strings.Join(deltas, "")), &args); err != nil || args["command"] != scriptCommand || len(deltas) < 3 {
		t.Fatalf("arguments in %d deltas %q: %v (events %v)", len(deltas), deltas, err, types)
	}
	if done.Arguments != strings.Join(deltas, "") || added.Name != "exec_command" || !strings.HasPrefix(added.CallID, "call_") {
		t.Errorf("done %+v, added %+v", done, added)
	}
	out := completed.Response.Output
	if len(out) != 2 || out[0].Type != "message" || out[1].Type != "function_call" || out[1].Arguments != done.Arguments || out[1].Status != "completed" {
		t.Fatalf("completed output: %+v", out)
	}
	if u := completed.Response.Usage; u.InputTokens != 11 || u.InputTokensDetails.CachedTokens != 5 || u.OutputTokens != 7 {
		t.Errorf("usage %+v", u)
	}

	second := `{"model":"gpt-x",` + responsesTools + `,"input":[{"type":"message","role":"user","content":"go"},` +
		`{"type":"function_call","call_id":"` + added.CallID + `","name":"exec_command","arguments":"{}"},` +
		`{"type":"function_call_output","call_id":"` + added.CallID + `","output":"ok"}]}`
	_, b = do(t, s, "POST", "/v1/responses", openAIHeader(testKey), second)
	type final struct {
		Output []struct {
			Type    string `json:"type"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
	}
	if f := decode[final](t, b); len(f.Output) != 1 || f.Output[0].Type != "message" || f.Output[0].Content[0].Text != "All done." {
		t.Fatalf("after the call's output: %s", b)
	}
	// OpenAI counts cached input within the input.
	if got, want := s.Billed(), (fakellm.Usage{InputTokens: 22, OutputTokens: 14, CachedTokens: 10, Tokens: 36}); got != want {
		t.Fatalf("billed %+v, want %+v", got, want)
	}
}

// A scripted apply_patch, where the request offers the Responses API's built-in tool of that
// type, is an apply_patch_call carrying the script's operation; the request carrying its
// apply_patch_call_output gets the next turn. A function tool named apply_patch is called as
// any function is.
func TestScriptResponsesApplyPatch(t *testing.T) {
	cfg := baseConfig()
	op := `{"type":"create_file","path":"notes.txt","diff":"+hello\n"}`
	cfg.Script = []fakellm.Turn{{Tool: "apply_patch", Input: json.RawMessage(op)}, {Text: "Patched."}}
	s := start(t, cfg)
	type answer struct {
		Output []struct {
			Type      string          `json:"type"`
			Status    string          `json:"status"`
			CallID    string          `json:"call_id"`
			Name      string          `json:"name"`
			Operation json.RawMessage `json:"operation"`
			Content   []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
	}
	builtin := `"tools":[{"type":"function","name":"exec_command","parameters":{"type":"object"}},{"type":"apply_patch"}]`
	_, b := do(t, s, "POST", "/v1/responses", openAIHeader(testKey), `{"model":"gpt-x",`+builtin+`,"input":"go"}`)
	a := decode[answer](t, b)
	if len(a.Output) != 1 || a.Output[0].Type != "apply_patch_call" || a.Output[0].Status != "completed" ||
		string(a.Output[0].Operation) != op || !strings.HasPrefix(a.Output[0].CallID, "call_") {
		t.Fatalf("the apply_patch turn: %s", b)
	}
	call := a.Output[0].CallID
	second := `{"model":"gpt-x",` + builtin + `,"input":[{"type":"message","role":"user","content":"go"},` +
		`{"type":"apply_patch_call","call_id":"` + call + `","status":"completed","operation":` + op + `},` +
		`{"type":"apply_patch_call_output","call_id":"` + call + `","status":"completed","output":"done"}]}`
	_, b = do(t, s, "POST", "/v1/responses", openAIHeader(testKey), second)
	if a := decode[answer](t, b); len(a.Output) != 1 || a.Output[0].Type != "message" || a.Output[0].Content[0].Text != "Patched." {
		t.Fatalf("after the patch's output: %s", b)
	}

	function := `"tools":[{"type":"function","name":"apply_patch","parameters":{"type":"object"}}]`
	_, b = do(t, s, "POST", "/v1/responses", openAIHeader(testKey), `{"model":"gpt-x",`+function+`,"input":"go"}`)
	if a := decode[answer](t, b); len(a.Output) != 1 || a.Output[0].Type != "function_call" || a.Output[0].Name != "apply_patch" {
		t.Fatalf("a function named apply_patch: %s", b)
	}
}

// Claude Code's connectivity probe is answered without a key.
func TestHeadRoot(t *testing.T) {
	s := start(t, baseConfig())
	resp, b := do(t, s, "HEAD", "/", http.Header{}, "")
	if resp.StatusCode != 200 || len(b) != 0 {
		t.Fatalf("HEAD /: %d %q", resp.StatusCode, b)
	}
}
