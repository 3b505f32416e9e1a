package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/fakellm"
	"roost.dev/roost/pkg/manifest"
)

// The official SDKs, unchanged, in sealed sessions with default resources (and in an advisory
// one, where RLIMIT_AS holds memory at its default): test/e2e/sdk
// pins `openai` and `@anthropic-ai/sdk` (make e2e runs npm ci there), and each capsule copies
// it, node_modules included, and runs one SDK's program against the fake upstreams through
// roost's gateway. The programs build their clients from the environment alone
// (new OpenAI(), new Anthropic()) and print "ok CHECK" or "FAIL CHECK: why" per check.

// sdkDir is the npm project the capsules copy.
func sdkDir() string { return filepath.Join(repoRoot(), "test", "e2e", "sdk") }

// Every call's fixed usage at the fake: each successful model call is charged exactly this.
const (
	sdkInputTokens  = 12
	sdkOutputTokens = 30
	sdkCallTokens   = sdkInputTokens + sdkOutputTokens
	// sdkCeiling is each capsule's inference.max_session_tokens: room for every call's worst
	// case (its input and 64 output tokens), while the ceiling check's call, asking for twice
	// it, cannot be lowered to fit: its least (five answers of 256 tokens; an Anthropic
	// thinking call's 1,025) is more than the whole ceiling.
	sdkCeiling = 1000
)

// sdkCapsule is one SDK's capsule and what its run must show.
type sdkCapsule struct {
	name, program, upstream, format string
	// class is the capsule's containment; addressSpace what /proc/self/limits must show for
	// it with default resources (RLIMIT_AS only where no cgroup holds memory).
	class, addressSpace string
	model, otherModel   string
	// checks are the program's check names, each of which must print "ok NAME".
	checks []string
	// calls are the requests the fake must see, by path, and charged those of them that are
	// model calls the ledger charges sdkCallTokens each (count_tokens is never charged).
	calls   map[string]int
	charged []string
}

var sdkCapsules = []sdkCapsule{
	{
		name: "sdk-openai", program: "openai.mjs", upstream: "oai", format: "openai",
		class: "sealed", addressSpace: "unlimited",
		model: "gpt-test", otherModel: "gpt-forbidden",
		checks:  []string{"chat", "chat-stream", "chat-stream-helper", "responses", "responses-stream", "responses-stream-helper", "forbidden-model", "ceiling"},
		calls:   map[string]int{"/v1/chat/completions": 3, "/v1/responses": 3},
		charged: []string{"/v1/chat/completions", "/v1/responses"},
	},
	{
		name: "sdk-anthropic", program: "anthropic.mjs", upstream: "ant", format: "anthropic",
		class: "sealed", addressSpace: "unlimited",
		model: "claude-test", otherModel: "claude-forbidden",
		checks:  []string{"messages", "messages-stream", "messages-stream-helper", "count-tokens", "forbidden-model", "ceiling"},
		calls:   map[string]int{"/v1/messages": 3, "/v1/messages/count_tokens": 1},
		charged: []string{"/v1/messages"},
	},
	{
		// No cgroup holds an advisory session's memory, so RLIMIT_AS does, at its default.
		name: "sdk-openai-advisory", program: "openai.mjs", upstream: "oai-advisory", format: "openai",
		class: "advisory", addressSpace: fmt.Sprint(manifest.DefaultMemoryBytes),
		model: "gpt-test", otherModel: "gpt-forbidden",
		checks:  []string{"chat", "chat-stream", "chat-stream-helper", "responses", "responses-stream", "responses-stream-helper", "forbidden-model", "ceiling"},
		calls:   map[string]int{"/v1/chat/completions": 3, "/v1/responses": 3},
		charged: []string{"/v1/chat/completions", "/v1/responses"},
	},
}

// sdkVersions are the versions package.json pins, which node_modules must hold.
func sdkVersions(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(sdkDir(), "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(data, &pkg); err != nil {
		t.Fatal(err)
	}
	return pkg.Dependencies
}

// requireSDKs fails unless node_modules holds exactly the pinned SDKs (make e2e installs them).
func requireSDKs(t *testing.T) {
	t.Helper()
	for name, want := range sdkVersions(t) {
		data, err := os.ReadFile(filepath.Join(sdkDir(), "node_modules", name, "package.json"))
		var pkg struct {
			Version string `json:"version"`
		}
		if err == nil {
			err = json.Unmarshal(data, &pkg)
		}
		if err != nil || pkg.Version != want {
			t.Fatalf("test/e2e/sdk/node_modules lacks %s %s (%q, %v): run `make sdk` (npm ci in test/e2e/sdk)", name, want, pkg.Version, err)
		}
	}
}

// copyTree copies src into dst (which exists): directories, files with their modes, and
// symlinks as links (node_modules/.bin holds some; roost stores them as links).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.Type().IsRegular():
			in, err := os.Open(path)
			if err != nil {
				return err
			}
			defer in.Close()
			out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, info.Mode().Perm())
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, in); err != nil {
				out.Close()
				return err
			}
			return out.Close()
		default:
			return fmt.Errorf("%s: neither a file, a directory nor a symlink", path)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sdkDaemon starts one fake upstream per format and a roostd whose --config declares them:
// "oai" (openai) and "ant" (anthropic), both with the operator's key sk-operator.
func sdkDaemon(t *testing.T) (*daemon, map[string]*fakellm.Server) {
	t.Helper()
	dir := t.TempDir()
	key := filepath.Join(dir, "llm.key")
	if err := os.WriteFile(key, []byte("sk-operator\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fakes := map[string]*fakellm.Server{}
	cfg := "inference:\n  upstreams:\n"
	for _, c := range sdkCapsules {
		fake, err := fakellm.Start(fakellm.Config{APIKey: "sk-operator", InputTokens: sdkInputTokens, OutputTokens: sdkOutputTokens})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(fake.Close)
		fakes[c.upstream] = fake
		cfg += fmt.Sprintf("    - name: %s\n      format: %s\n      url: %s\n      api_key_file: %s\n", c.upstream, c.format, fake.URL(), key)
	}
	path := filepath.Join(dir, "roostd.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return newDaemon(t, "--config", path), fakes
}

// TestOfficialSDKs runs the OpenAI and the Anthropic SDK, each in a sealed session (and
// OpenAI's in an advisory one too) with default resources and nothing but the environment
// inference.upstream gives it, through the gateway:
// every call they make works, plain and streamed, through their streaming helpers too; a model
// the capsule may not use (403) and a call past the session's ceiling (429) surface as the
// SDK's APIError at once, in the provider's error envelope with roost's detail, and are not
// retried; count_tokens is never charged; and the ledger holds exactly the usage the fake
// reported.
func TestOfficialSDKs(t *testing.T) {
	requireSDKs(t)
	start := time.Now()
	d, fakes := sdkDaemon(t)

	type running struct {
		c     sdkCapsule
		id    string
		start time.Time
	}
	var runs []running
	for _, c := range sdkCapsules {
		// No resources block: the SDKs must work with the defaults. No workdir_exec: node
		// reads the SDKs' files from /capsule, it executes none of them.
		caps := "  shell: {allow: [\"@shell\", \"@node\"]}\n  limits: {deadline_seconds: 180}\n"
		top := fmt.Sprintf("env:\n  SDK_MODEL: %s\n  SDK_OTHER_MODEL: %s\n  SDK_REPLY: %s\n  SDK_INPUT_TOKENS: \"%d\"\n  SDK_OUTPUT_TOKENS: \"%d\"\n"+
			"inference:\n  upstream: %s\n  model: %s\n  max_session_tokens: %d\n",
			c.model, c.otherModel, fakellm.DefaultReply, sdkInputTokens, sdkOutputTokens, c.upstream, c.model, sdkCeiling)
		dir := workloadCapsule(t, c.name, c.class, caps, top, "awk '/^Max address space/ { print \"address space limit:\", $4 }' /proc/self/limits\n"+
			`exec node "$ROOST_CAPSULE_DIR/`+c.program+`"`+"\n")
		copyStart := time.Now()
		copyTree(t, sdkDir(), dir)
		t.Logf("%s: copied test/e2e/sdk into the capsule in %s", c.name, time.Since(copyStart).Round(time.Millisecond))
		if out := d.ok("explain", dir); !strings.Contains(out, "achieved     "+c.class) {
			t.Fatalf("explain: %s does not run %s:\n%s", c.name, c.class, out)
		}
		s := time.Now()
		id := strings.TrimSpace(d.ok("run", "--detach", dir))
		t.Logf("%s: staged and started %s in %s", c.name, id, time.Since(s).Round(time.Millisecond))
		runs = append(runs, running{c, id, s})
	}

	var total int64
	for _, r := range runs {
		t.Run(r.c.name, func(t *testing.T) {
			c := r.c
			waited := d.ctlWithin(5*time.Minute, "wait", r.id)
			logs := d.ctl("logs", r.id)
			s := d.inspect(r.id)
			t.Logf("%s: exit %d (%s) after %s; its output:\n%s", c.name, waited.code, s.ExitStatus, time.Since(r.start).Round(time.Millisecond), logs.stdout)
			if logs.stderr != "" {
				t.Logf("%s: stderr:\n%s", c.name, logs.stderr)
			}
			for _, check := range c.checks {
				if !hasLine(logs.stdout, "ok "+check) {
					t.Errorf("no %q", "ok "+check)
				}
			}
			for _, line := range strings.Split(logs.stdout, "\n") {
				if strings.HasPrefix(line, "FAIL") {
					t.Errorf("%s", line)
				}
			}
			if waited.code != 0 || s.ExitStatus != "ok" {
				t.Errorf("the session: exit %d (%s, %s)", waited.code, s.ExitStatus, s.Detail)
			}
			if !hasLine(logs.stdout, "address space limit: "+c.addressSpace) {
				t.Errorf("the %s session's address space limit is not %s", c.class, c.addressSpace)
			}
			if s.Containment.Achieved != c.class {
				t.Errorf("containment %+v", s.Containment)
			}

			// The fake saw exactly the calls that should have reached it, with the operator's
			// key, and none of the refused ones.
			seen := map[string]int{}
			var want int64
			for _, req := range fakes[c.upstream].Requests() {
				seen[req.Method+" "+req.Path]++
				key := req.Header.Get("X-Api-Key")
				if c.format == "openai" {
					key = strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")
				}
				if key != "sk-operator" {
					t.Errorf("the upstream saw %s %s with key %q", req.Method, req.Path, key)
				}
				if bytes.Contains(req.Body, []byte(c.otherModel)) {
					t.Errorf("the forbidden model reached the upstream: %s", req.Body)
				}
				if bytes.Contains(req.Body, []byte(fmt.Sprint(2*sdkCeiling))) {
					t.Errorf("the call past the ceiling reached the upstream: %s", req.Body)
				}
				for _, p := range c.charged {
					if req.Path == p {
						want += sdkCallTokens
					}
				}
			}
			for path, n := range c.calls {
				if seen["POST "+path] != n {
					t.Errorf("the upstream saw POST %s %d times, want %d (it saw %v)", path, seen["POST "+path], n, seen)
				}
			}

			// The ledger holds exactly the usage the fake reported for the calls that reached it.
			if got := d.inspectSpend(r.id); got != want {
				t.Errorf("inspect: the session was charged %d tokens; the upstream reported %d (%d×%d)", got, want, want/sdkCallTokens, sdkCallTokens)
			}
			total += want
		})
	}
	l := d.spend()
	if l.Charged != fmt.Sprint(total) || l.Reserved != "0" || len(l.Sessions) != len(runs) {
		t.Errorf("spend --json: charged %s, reserved %s, %d sessions; want %d charged, 0 reserved, %d sessions (%+v)", l.Charged, l.Reserved, len(l.Sessions), total, len(runs), l)
	}
	t.Logf("TestOfficialSDKs took %s", time.Since(start).Round(time.Millisecond))
}
