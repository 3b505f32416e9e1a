package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/fakellm"
	"roost.dev/roost/internal/testenv"
)

// What the scripted model has the agent write, and wc -w counts.
const (
	openAIAgentsNote  = "roost runs the agent's tools\n"
	openAIAgentsFinal = "notes.txt holds five words."
)

// TestOpenAIAgents runs a real OpenAI Agents SDK SandboxAgent (sdk/typescript pins
// @openai/agents) on the host with the SDK's RoostSandboxClient as its sandbox, and a
// scripted model behind roost's gateway on the Responses API: the client creates a session
// of the capsule (its manifest's README.md in the workdir), and the model asks for
// exec_command of ls, the built-in apply_patch creating notes.txt, then exec_command of a
// command reading it. The tools run in the session (the file is in its workdir, the command
// in its cgroup); the run ends with the model's answer; the session is ended by the episode's
// close; and it was charged exactly what the model billed, the agent's model client having
// been given the session's own gateway URL and credential.
func TestOpenAIAgents(t *testing.T) {
	start := time.Now()
	sdk := filepath.Join(repoRoot(), "sdk", "typescript")
	_, err := os.Stat(filepath.Join(sdk, "node_modules", "@openai", "agents", "package.json"))
	testenv.Need(t, "sdk/typescript/node_modules with @openai/agents (make sdk-clients)", err)

	turn := func(tool string, input any) fakellm.Turn {
		raw, _ := json.Marshal(input)
		return fakellm.Turn{Tool: tool, Input: raw}
	}
	// apply_patch's create_file diff: each line of the file, "+" before it.
	diff := "+" + strings.TrimSuffix(openAIAgentsNote, "\n") + "\n"
	fake, err := fakellm.Start(fakellm.Config{
		APIKey: "sk-operator", InputTokens: 900, OutputTokens: 30,
		Script: []fakellm.Turn{
			turn("exec_command", map[string]any{"cmd": "ls"}),
			turn("apply_patch", map[string]string{"type": "create_file", "path": "notes.txt", "diff": diff}),
			// The command reads the file the agent wrote, and says which cgroup it ran in.
			turn("exec_command", map[string]any{"cmd": "wc -w < notes.txt && cat /proc/self/cgroup"}),
			{Text: openAIAgentsFinal},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	dir := t.TempDir()
	key := filepath.Join(dir, "llm.key")
	os.WriteFile(key, []byte("sk-operator\n"), 0o600)
	cfg := filepath.Join(dir, "roostd.yaml")
	os.WriteFile(cfg, fmt.Appendf(nil, "inference:\n  upstreams:\n    - name: oai\n      format: openai\n      url: %s\n      api_key_file: %s\n", fake.URL(), key), 0o600)
	d := newDaemon(t, "--config", cfg)
	caps := "  shell: {allow: [\"@shell\"]}\n  limits: {deadline_seconds: 300}\n"
	top := "inference:\n  upstream: oai\n  model: gpt-test\n"
	capsuleDir := workloadCapsule(t, "openai-agents-sandbox", "advisory", caps, top, "exec sleep 300\n")

	// npm run build compiles the package, the episode's program with it, as npm test does.
	runNode(t, sdk, 3*time.Minute, nil, "npm", "run", "build")
	ran := time.Now()
	out := runNode(t, sdk, 3*time.Minute, []string{"ROOST_SOCKET=" + d.socket, "ROOST_CAPSULE=" + capsuleDir},
		"node", "dist/test/openai-agents-episode.js")
	t.Logf("the episode took %s; it printed:\n%s", time.Since(ran).Round(time.Millisecond), out)

	var id, root, final string
	var results []string
	var tools []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			Session, Root, Tool, Output string
			Final                       *string
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("the episode printed %q, not a JSON line: %v", line, err)
		}
		switch {
		case r.Session != "":
			id, root = r.Session, r.Root
		case r.Tool != "":
			tools = append(tools, r.Tool)
			results = append(results, r.Output)
		case r.Final != nil:
			final = *r.Final
		}
	}
	if id == "" {
		t.Fatalf("the episode did not say which session the client created")
	}
	var rec struct {
		State   string            `json:"state"`
		Workdir string            `json:"workdir"`
		Labels  map[string]string `json:"labels"`
	}
	if err := json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &rec); err != nil {
		t.Fatal(err)
	}
	// The session the client created: the capsule's, labelled, its workdir the manifest's
	// root; and the episode's close ended it, its record kept.
	if rec.Workdir != root || rec.Labels["via"] != "openai-agents" || rec.State != "exited" {
		t.Errorf("the client's session: %+v; want workdir %s, label via=openai-agents, exited by close", rec, root)
	}
	if want := []string{"exec_command", "apply_patch", "exec_command"}; strings.Join(tools, ",") != strings.Join(want, ",") {
		t.Fatalf("the tools that ran: %v, want %v", tools, want)
	}
	if !strings.Contains(results[0], "Process exited with code 0") || !strings.HasSuffix(strings.TrimSpace(results[0]), "README.md") {
		t.Errorf("ls of the workdir the manifest wrote README.md into:\n%s", results[0])
	}
	if results[1] != "Created notes.txt" {
		t.Errorf("apply_patch: %q, want %q", results[1], "Created notes.txt")
	}
	// apply_patch's file, as the SDK's applyDiff makes it (no last newline).
	if data, err := os.ReadFile(filepath.Join(rec.Workdir, "notes.txt")); err != nil || string(data) != strings.TrimSuffix(openAIAgentsNote, "\n") {
		t.Errorf("the workdir's notes.txt: %q, %v; want %q", data, err, openAIAgentsNote)
	}
	_, after, _ := strings.Cut(results[2], "Output:\n")
	if lines := strings.Split(after, "\n"); lines[0] != "5" || !strings.Contains(results[2], "/roost/"+id) || !strings.Contains(results[2], "Process exited with code 0") {
		t.Errorf("exec_command did not count the note's 5 words in the session's cgroup /roost/%s:\n%s", id, results[2])
	}
	if final != openAIAgentsFinal {
		t.Errorf("the run ended with %q, not the model's answer %q", final, openAIAgentsFinal)
	}

	// Every model call went through the session's gateway to the Responses API, with the
	// operator's key, and the session was charged exactly what the model billed.
	reqs := fake.Requests()
	for _, req := range reqs {
		if got := req.Header.Get("Authorization"); got != "Bearer sk-operator" || req.Path != "/v1/responses" {
			t.Errorf("the model saw %s %s with %q; want POST /v1/responses with the operator's key", req.Method, req.Path, got)
		}
	}
	// One call per turn of the script: three tool calls and the answer.
	billed := fake.Billed()
	if len(reqs) != 4 || billed.Tokens != 4*(900+30) {
		t.Errorf("the model saw %d calls and billed %+v; want the run's 4 turns, %d tokens", len(reqs), billed, 4*(900+30))
	}
	if got := d.inspectSpend(id); got != int64(billed.Tokens) {
		t.Errorf("inspect: the session was charged %d tokens; the model billed %d", got, billed.Tokens)
	}
	t.Logf("TestOpenAIAgents took %s", time.Since(start).Round(time.Millisecond))
}
