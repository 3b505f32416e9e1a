package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/fakellm"
	"roost.dev/roost/internal/testenv"
)

// deepagentsNote is what the scripted model has the agent write, and wc -w counts.
const (
	deepagentsNote  = "roost runs the agent's tools\n"
	deepagentsFinal = "notes.txt holds five words."
)

// TestDeepAgents runs a real deepagents agent (sdk/typescript pins deepagents and
// @langchain/anthropic) on the host with the SDK's RoostSandbox as its backend, and a
// scripted model behind roost's gateway: the model asks for ls of the workdir, write_file of
// notes.txt, then execute of a command reading it. The tools run in the session (the file is
// in its workdir, the command in its cgroup); execute's result is what the command printed;
// the agent ends with the model's answer; and the session was charged exactly what the model
// billed, the agent's client having been given the session's own gateway URL and credential.
func TestDeepAgents(t *testing.T) {
	start := time.Now()
	sdk := filepath.Join(repoRoot(), "sdk", "typescript")
	_, err := os.Stat(filepath.Join(sdk, "node_modules", "deepagents", "package.json"))
	testenv.Need(t, "sdk/typescript/node_modules with deepagents (make sdk-clients)", err)

	// deepagents' file tools take absolute paths, so the script names the workdir's, fixed
	// before the session: a directory each of its path's parents lets the session's uid pass.
	dir := t.TempDir()
	work := filepath.Join(dir, "work")
	for _, p := range []string{filepath.Dir(dir), dir} {
		os.Chmod(p, 0o711)
	}
	if err := os.Mkdir(work, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(work, 0o777)
	note := filepath.Join(work, "notes.txt")
	turn := func(tool string, input map[string]string) fakellm.Turn {
		raw, _ := json.Marshal(input)
		return fakellm.Turn{Tool: tool, Input: raw}
	}
	fake, err := fakellm.Start(fakellm.Config{
		APIKey: "sk-operator", InputTokens: 700, OutputTokens: 25,
		Script: []fakellm.Turn{
			turn("ls", map[string]string{"path": work}),
			turn("write_file", map[string]string{"file_path": note, "content": deepagentsNote}),
			// The command reads the file the agent wrote, and says which cgroup it ran in.
			turn("execute", map[string]string{"command": "wc -w < notes.txt && cat /proc/self/cgroup"}),
			{Text: deepagentsFinal},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	key := filepath.Join(dir, "llm.key")
	os.WriteFile(key, []byte("sk-operator\n"), 0o600)
	cfg := filepath.Join(dir, "roostd.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("inference:\n  upstreams:\n    - name: ant\n      format: anthropic\n      url: %s\n      api_key_file: %s\n", fake.URL(), key)), 0o600)
	d := newDaemon(t, "--config", cfg)
	caps := "  shell: {allow: [\"@shell\"]}\n  limits: {deadline_seconds: 300}\n"
	top := "inference:\n  upstream: ant\n  model: claude-test\n"
	capsuleDir := workloadCapsule(t, "deepagents-sandbox", "advisory", caps, top, "exec sleep 300\n")
	id := strings.TrimSpace(d.ok("run", "--detach", "--workdir", work, capsuleDir))
	t.Logf("started %s in %s", id, time.Since(start).Round(time.Millisecond))

	// npm run build compiles the package, the episode's program with it, as npm test does.
	runNode(t, sdk, 3*time.Minute, nil, "npm", "run", "build")
	ran := time.Now()
	out := runNode(t, sdk, 3*time.Minute, []string{"ROOST_SOCKET=" + d.socket, "ROOST_SESSION=" + id},
		"node", "dist/test/deepagents-episode.js")
	t.Logf("the episode took %s; it printed:\n%s", time.Since(ran).Round(time.Millisecond), out)

	results := map[string]string{}
	var final string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			Tool    string `json:"tool"`
			Content string `json:"content"`
			Final   string `json:"final"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("the episode printed %q, not a JSON line: %v", line, err)
		}
		if r.Tool != "" {
			results[r.Tool] = r.Content
		} else {
			final = r.Final
		}
	}
	if !strings.Contains(results["ls"], "No files found") {
		t.Errorf("ls of the empty workdir: %q", results["ls"])
	}
	if want := "Successfully wrote to '" + note + "'"; results["write_file"] != want {
		t.Errorf("write_file: %q, want %q", results["write_file"], want)
	}
	if data, err := os.ReadFile(note); err != nil || string(data) != deepagentsNote {
		t.Errorf("the workdir's notes.txt: %q, %v; want %q", data, err, deepagentsNote)
	}
	lines := strings.Split(results["execute"], "\n")
	if lines[0] != "5" || !strings.Contains(results["execute"], "/roost/"+id) || !strings.HasSuffix(results["execute"], "[Command succeeded with exit code 0]") {
		t.Errorf("execute did not count the note's 5 words in the session's cgroup /roost/%s:\n%s", id, results["execute"])
	}
	if final != deepagentsFinal {
		t.Errorf("the agent ended with %q, not the model's answer %q", final, deepagentsFinal)
	}

	// Every model call went through the session's gateway, with the session's credential,
	// and the session was charged exactly what the model billed.
	reqs := fake.Requests()
	for _, req := range reqs {
		if got := req.Header.Get("X-Api-Key"); got != "sk-operator" || req.Path != "/v1/messages" {
			t.Errorf("the model saw %s %s with key %q; want POST /v1/messages with the operator's", req.Method, req.Path, got)
		}
	}
	// One call per turn of the script: three tool calls and the answer.
	billed := fake.Billed()
	if len(reqs) != 4 || billed.Tokens != 4*(700+25) {
		t.Errorf("the model saw %d calls and billed %+v; want the episode's 4 turns, %d tokens", len(reqs), billed, 4*(700+25))
	}
	if got := d.inspectSpend(id); got != int64(billed.Tokens) {
		t.Errorf("inspect: the session was charged %d tokens; the model billed %d", got, billed.Tokens)
	}
	d.ok("kill", id)
	t.Logf("TestDeepAgents took %s", time.Since(start).Round(time.Millisecond))
}

// runNode runs argv in dir with env added, within timeout, and returns its stdout.
func runNode(t *testing.T, dir string, timeout time.Duration, env []string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(argv, " "), err, out.String(), errOut.String())
	}
	return out.String()
}
