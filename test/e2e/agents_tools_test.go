package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"roost.dev/roost/internal/fakellm"
)

// agentTool is the command the scripted model has each agent run with its own shell tool. It
// writes what only the session can see into the workdir — the uid, the hostname and the
// cgroups the tool's shell is in — with bash's own constructs ($(<file), [[ ]]), so a
// tool run by sh instead leaves the last line out.
const agentTool = `printf 'uid=%s host=%s\n' "$UID" "$HOSTNAME" > agent.txt; printf '%s\n' "$(</proc/self/cgroup)" >> agent.txt; if [[ $HOSTNAME == ?* && roost == r* ]]; then echo 'bash: [[ ]] matched' >> agent.txt; fi`

// agentFinal is the scripted model's last word, which each CLI prints as its answer.
const agentFinal = "The evidence is in agent.txt."

// agentEnv keeps Claude Code to the gateway: no update checks, telemetry or error reports,
// none of which a session could reach anyway; left on, each is a call that waits to fail.
const agentEnv = "env:\n  DISABLE_AUTOUPDATER: \"1\"\n  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: \"1\"\n  DISABLE_TELEMETRY: \"1\"\n  DISABLE_ERROR_REPORTING: \"1\"\n"

// codexRun is how a capsule runs Codex against its session's gateway: a model provider of
// its own at OPENAI_BASE_URL speaking the Responses API with the session's key, and no
// sandbox of Codex's own (the session is the sandbox; Codex's would need namespaces the
// session does not grant).
const codexRun = `codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox \
  -c model_provider=roost \
  -c "model_providers.roost={name=\"roost\",base_url=\"$OPENAI_BASE_URL\",env_key=\"OPENAI_API_KEY\",wire_api=\"responses\"}" \
  -m fake-coder "Record where you run, in agent.txt." </dev/null
`

// Claude Code and Codex, each a capsule in a sealed and a scoped session, driven through
// roost's gateway by a scripted model that has them run one command with their shell tool
// and then answer. The command ran inside the session (its uid, hostname and cgroups), wrote
// its file into the workdir, ran under bash; the episode ends ok; and roost metered exactly
// what the model billed. With max_session_tokens 20000 the episode still completes: the
// gateway lowers the CLIs' output limit (Claude Code asks for 64000) to what the session has
// left instead of refusing the call.
func TestCodingAgentsRunTools(t *testing.T) {
	claude, codex := agentCLI(t, "claude"), agentCLI(t, "codex")
	vendor := codexVendor(t, codex)
	fakes := map[string]*fakellm.Server{}
	var upstreams strings.Builder
	dir := t.TempDir()
	for _, c := range []struct{ format, tool, arg string }{
		{"anthropic", "Bash", "command"},
		{"openai", "exec_command", "cmd"},
	} {
		input, _ := json.Marshal(map[string]string{c.arg: agentTool})
		fake, err := fakellm.Start(fakellm.Config{
			APIKey: "sk-operator", InputTokens: 900, CachedTokens: 300, OutputTokens: 40,
			Script: []fakellm.Turn{{Tool: c.tool, Input: input, Text: "I will record it."}, {Text: agentFinal}},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(fake.Close)
		fakes[c.format] = fake
		key := filepath.Join(dir, c.format+".key")
		os.WriteFile(key, []byte("sk-operator\n"), 0o600)
		fmt.Fprintf(&upstreams, "    - name: %s\n      format: %s\n      url: %s\n      api_key_file: %s\n", c.format, c.format, fake.URL(), key)
	}
	cfg := filepath.Join(dir, "roostd.yaml")
	os.WriteFile(cfg, []byte("inference:\n  upstreams:\n"+upstreams.String()), 0o600)
	d := newDaemon(t, "--config", cfg)
	// The examples name these upstreams and the CLIs where npm -g puts them: they stage.
	for _, ex := range []string{"examples/claude-code", "examples/codex"} {
		if out := d.ok("explain", ex); !strings.Contains(out, "achieved     sealed") {
			t.Errorf("explain %s:\n%s", ex, out)
		}
	}

	agents := []struct{ name, upstream, shell, top, script string }{
		{"claude", "anthropic", `["bash", "` + claude + `"]`, agentEnv,
			claude + " -p 'Record where you run, in agent.txt.' --allowedTools Bash </dev/null\n"},
		{"codex", "openai", `["bash", "@node", "` + codex + `", "` + vendor + `"]`, "", codexRun},
	}
	for _, a := range agents {
		for _, run := range []struct{ class, budget string }{{"sealed", ""}, {"scoped", ""}, {"sealed", "20000"}} {
			name := a.name + "/" + run.class
			if run.budget != "" {
				name += "/max_session_tokens=" + run.budget
			}
			t.Run(name, func(t *testing.T) {
				caps := "  shell: {allow: " + a.shell + "}\n"
				top := a.top + "inference:\n  upstream: " + a.upstream + "\n"
				if run.budget != "" {
					top += "  max_session_tokens: " + run.budget + "\n"
				}
				fake := fakes[a.upstream]
				before := fake.Billed()
				s, stdout := runWorkload(t, d, workloadCapsule(t, "agent-tools-"+a.name, run.class, caps, top, a.script), run.class)
				if !strings.Contains(stdout, agentFinal) {
					t.Errorf("stdout lacks the model's answer %q:\n%s", agentFinal, stdout)
				}
				evidence, err := os.ReadFile(filepath.Join(s.Workdir, "agent.txt"))
				if err != nil {
					t.Fatalf("the tool's file is not in the workdir: %v\nstdout:\n%s", err, stdout)
				}
				t.Logf("agent.txt:\n%s", evidence)
				checkEvidence(t, s, run.class, filepath.Join(s.Workdir, "agent.txt"), string(evidence))

				if run.budget != "" {
					checkCalls(t, d, s.ID, run.budget, a.name == "claude")
				}
				billed := fake.Billed()
				want := billed.Tokens - before.Tokens
				if got := d.inspectSpend(s.ID); got != int64(want) || want == 0 {
					t.Errorf("roost metered %d tokens; the model billed %d (%+v since %+v)", got, want, billed, before)
				}
			})
		}
	}
}

// checkEvidence holds what the agent's tool wrote to the session it ran in. Sealed: root in
// the session's own user namespace (uid 0 inside, its file owned by another uid outside),
// hostname roost, cgroups rooted at the session's own (a cgroup namespace). Scoped: the
// session's own uid (the file's owner as the host sees it, not root) and the session's cgroup
// by name. Either way bash ran the command's [[ ]].
func checkEvidence(t *testing.T, s session, class, file, evidence string) {
	t.Helper()
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	owner := fi.Sys().(*syscall.Stat_t).Uid
	lines := strings.Split(strings.TrimSpace(evidence), "\n")
	host, _ := os.Hostname()
	want, cgroup := fmt.Sprintf("uid=%d host=%s", owner, host), "/roost/"+s.ID
	if class == "sealed" {
		want, cgroup = "uid=0 host=roost", "/"
	}
	if lines[0] != want || owner == 0 {
		t.Errorf("the tool ran as %q, its file owned by uid %d on the host; want %q and not root's file", lines[0], owner, want)
	}
	cgroups := lines[1:]
	if last := lines[len(lines)-1]; last != "bash: [[ ]] matched" {
		t.Errorf("the tool's shell did not run bash's [[ ]]: last line %q", last)
	} else {
		cgroups = lines[1 : len(lines)-1]
	}
	if len(cgroups) == 0 {
		t.Errorf("the tool saw no cgroups")
	}
	for _, l := range cgroups {
		if _, path, _ := strings.Cut(l[strings.Index(l, ":")+1:], ":"); path != cgroup {
			t.Errorf("the tool's cgroup line %q is not the session's %s", l, cgroup)
		}
	}
}

// checkCalls holds a session's per-call records (roostctl spend --session ID --calls --json)
// under a ceiling of budget tokens: every call answered 200 and was charged no more than it
// was reserved, together no more than the budget; lowered, a call whose cap was lowered says
// so (Claude Code asks for 64000 output tokens a call, which 20000 cannot hold).
func checkCalls(t *testing.T, d *daemon, id, budget string, lowered bool) {
	t.Helper()
	var resp struct {
		Calls []struct {
			Status       int    `json:"status"`
			Reserved     string `json:"reserved"`
			Charged      string `json:"charged"`
			LoweredFrom  string `json:"lowered_from"`
			LoweredTo    string `json:"lowered_to"`
			InputCounted bool   `json:"input_counted"`
		} `json:"calls"`
	}
	out := d.ok("spend", "--session", id, "--calls", "--json")
	if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp.Calls) == 0 {
		t.Fatalf("spend --calls --json: %v\n%s", err, out)
	}
	ceiling, _ := strconv.ParseInt(budget, 10, 64)
	var total int64
	seen := false
	for _, c := range resp.Calls {
		reserved, _ := strconv.ParseInt(c.Reserved, 10, 64)
		charged, _ := strconv.ParseInt(c.Charged, 10, 64)
		total += charged
		if c.Status != 200 || charged > reserved {
			t.Errorf("a call: %+v", c)
		}
		if c.LoweredFrom != "0" && c.LoweredTo != "0" {
			seen = true
		}
	}
	if total > ceiling || lowered && !seen {
		t.Errorf("calls charged %d under a ceiling of %d; a lowered cap recorded: %v\n%s", total, ceiling, seen, out)
	}
	t.Logf("%d calls, %d tokens charged under %d:\n%s", len(resp.Calls), total, ceiling, d.ok("spend", "--session", id, "--calls"))
}
