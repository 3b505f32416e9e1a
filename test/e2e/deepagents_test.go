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
// @langchain/anthropic) with the SDK's RoostSandbox as its backend, and a scripted model
// behind roost's gateway: the model asks for ls of the workdir, write_file of notes.txt, then
// execute of a command reading it. The tools run in the session (the file is in its workdir,
// the command in its cgroup and namespaces); execute's result is what the command printed;
// the agent ends with the model's answer; and the session was charged exactly what the model
// billed, the agent's client having been given the session's own gateway URL and credential.
//
// advisory: the agent runs on the host and names the workdir by its host path. sealed: the
// agent names the workdir as the session's commands see it (/work, Session.session_workdir),
// and runs in the session's network namespace, where its gateway listens.
func TestDeepAgents(t *testing.T) {
	sdk := filepath.Join(repoRoot(), "sdk", "typescript")
	_, err := os.Stat(filepath.Join(sdk, "node_modules", "deepagents", "package.json"))
	testenv.Need(t, "sdk/typescript/node_modules with deepagents (make sdk-clients)", err)
	// npm run build compiles the package, the episode's program with it, as npm test does.
	runNode(t, sdk, 3*time.Minute, nil, "npm", "run", "build")
	t.Run("advisory", func(t *testing.T) { deepAgentsEpisode(t, sdk, "advisory") })
	t.Run("sealed", func(t *testing.T) { deepAgentsEpisode(t, sdk, "sealed") })
}

func deepAgentsEpisode(t *testing.T, sdk, class string) {
	start := time.Now()
	dir := t.TempDir()
	for _, p := range []string{filepath.Dir(dir), dir} {
		os.Chmod(p, 0o711)
	}
	// deepagents' file tools take absolute paths, so the script names the workdir's as the
	// agent is told it: the host's, fixed before the session (a directory each of its path's
	// parents lets the session's uid pass), or a sealed root's /work.
	work, runArgs := filepath.Join(dir, "work"), []string{"run", "--detach"}
	if class == "sealed" {
		work = "/work"
	} else {
		if err := os.Mkdir(work, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(work, 0o777)
		runArgs = append(runArgs, "--workdir", work)
	}
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
			// The command reads the file the agent wrote, and says which cgroup and pid
			// namespace it ran in.
			turn("execute", map[string]string{"command": "wc -w < notes.txt && cat /proc/self/cgroup && readlink /proc/self/ns/pid"}),
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
	capsuleDir := workloadCapsule(t, "deepagents-sandbox", class, caps, top, "exec sleep 300\n")
	id := strings.TrimSpace(d.ok(append(runArgs, capsuleDir)...))
	rec := d.inspect(id)
	t.Logf("started %s in %s", id, time.Since(start).Round(time.Millisecond))

	argv := []string{"node", "dist/test/deepagents-episode.js"}
	var pid string
	if class == "sealed" {
		var live struct {
			Pid int `json:"pid"`
		}
		json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &live)
		if live.Pid == 0 {
			t.Fatalf("inspect %s: no pid for the running session", id)
		}
		pid = fmt.Sprint(live.Pid)
		argv = append([]string{"nsenter", "--net=/proc/" + pid + "/ns/net", "--"}, argv...)
	}
	ran := time.Now()
	out := runNode(t, sdk, 3*time.Minute, []string{"ROOST_SOCKET=" + d.socket, "ROOST_SESSION=" + id}, argv...)
	t.Logf("the episode took %s; it printed:\n%s", time.Since(ran).Round(time.Millisecond), out)

	results := map[string]string{}
	var final, told string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			Tool    string `json:"tool"`
			Content string `json:"content"`
			Final   string `json:"final"`
			Workdir string `json:"workdir"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("the episode printed %q, not a JSON line: %v", line, err)
		}
		switch {
		case r.Workdir != "":
			told = r.Workdir
		case r.Tool != "":
			results[r.Tool] = r.Content
		default:
			final = r.Final
		}
	}
	if told != work {
		t.Errorf("RoostSandbox.workdir is %q; the session's commands see the workdir at %q", told, work)
	}
	if !strings.Contains(results["ls"], "No files found") {
		t.Errorf("ls of the empty workdir: %q", results["ls"])
	}
	if want := "Successfully wrote to '" + note + "'"; results["write_file"] != want {
		t.Errorf("write_file: %q, want %q", results["write_file"], want)
	}
	if data, err := os.ReadFile(filepath.Join(rec.Workdir, "notes.txt")); err != nil || string(data) != deepagentsNote {
		t.Errorf("the workdir's notes.txt (%s on the host): %q, %v; want %q", rec.Workdir, data, err, deepagentsNote)
	}
	lines := strings.Split(results["execute"], "\n")
	if lines[0] != "5" || !strings.HasSuffix(results["execute"], "[Command succeeded with exit code 0]") {
		t.Errorf("execute did not count the note's 5 words:\n%s", results["execute"])
	}
	if class == "sealed" {
		// A sealed session's cgroup namespace hides the path; its pid namespace is the
		// program's, whose link the host reads.
		ns, err := os.Readlink("/proc/" + pid + "/ns/pid")
		if err != nil || !strings.Contains(results["execute"], "\n"+ns+"\n") {
			t.Errorf("execute did not run in the session's pid namespace %s (%v):\n%s", ns, err, results["execute"])
		}
	} else if !strings.Contains(results["execute"], "/roost/"+id) {
		t.Errorf("execute did not run in the session's cgroup /roost/%s:\n%s", id, results["execute"])
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
	t.Logf("the %s episode took %s", class, time.Since(start).Round(time.Millisecond))
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
