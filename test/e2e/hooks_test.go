package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// hookGuests are the operator's hooks, Go programs built for wasip1 at test time.
var hookGuests = map[string]string{
	// policy vetoes capsules named "forbidden", with its reason on stdout.
	"policy": `package main

import (
	"encoding/json"
	"fmt"
	"os"
)

func main() {
	var in struct {
		Event   string ` + "`json:\"event\"`" + `
		Capsule struct{ Name string ` + "`json:\"name\"`" + ` } ` + "`json:\"capsule\"`" + `
		Explanation struct {
			Containment struct{ Achieved string ` + "`json:\"achieved\"`" + ` } ` + "`json:\"containment\"`" + `
		} ` + "`json:\"explanation\"`" + `
	}
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil || in.Event != "stage" || in.Explanation.Containment.Achieved == "" {
		fmt.Println("unreadable input:", err)
		os.Exit(2)
	}
	if in.Capsule.Name == "forbidden" {
		fmt.Println("capsules named forbidden are not allowed here")
		os.Exit(1)
	}
}
`,
	"spin": `package main

func main() {
	for n := 0; ; n++ {
	}
}
`,
	// echo writes its input (the ended session's record) to its stdout.
	"echo": `package main

import (
	"io"
	"os"
)

func main() { io.Copy(os.Stdout, os.Stdin) }
`,
}

// hookModules builds the hooks into a directory every uid may read (hooks run as an
// unprivileged uid of roostd's own) and returns the modules by name.
func hookModules(t *testing.T, names ...string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, name := range names {
		src := filepath.Join(t.TempDir(), "main.go")
		if err := os.WriteFile(src, []byte(hookGuests[name]), 0o644); err != nil {
			t.Fatal(err)
		}
		mod := filepath.Join(dir, name+".wasm")
		cmd := exec.Command("go", "build", "-o", mod, src)
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "GOFLAGS=", "CGO_ENABLED=0")
		cmd.Dir = filepath.Dir(src)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building hook %s: %v\n%s", name, err, b)
		}
		if err := os.Chmod(mod, 0o644); err != nil {
			t.Fatal(err)
		}
		out[name] = mod
	}
	return out
}

func hookDaemon(t *testing.T, hooksYAML string) *daemon {
	t.Helper()
	path := filepath.Join(t.TempDir(), "roostd.yaml")
	if err := os.WriteFile(path, []byte("hooks:\n"+hooksYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	return newDaemon(t, "--config", path)
}

// A stage hook vetoes capsules named forbidden — run and spawn alike — with its reason, and
// lets the rest through; a session_end hook hears every end, its output kept in an event;
// every run is counted.
func TestHooks(t *testing.T) {
	mods := hookModules(t, "policy", "echo")
	d := hookDaemon(t, fmt.Sprintf("  - {name: policy, on: stage, module: %s}\n  - {name: audit, on: session_end, module: %s}\n", mods["policy"], mods["echo"]))

	res := d.ctl("run", capsule(t, "forbidden", "echo ran", ""))
	if res.code != 125 || !strings.Contains(res.stderr, `hook "policy" refused: capsules named forbidden are not allowed here`) {
		t.Fatalf("a forbidden capsule: %+v", res)
	}
	if len(d.byCapsule("forbidden")) != 0 {
		t.Fatalf("a refused capsule left a session")
	}
	res = d.ctl("run", capsule(t, "allowed", "echo ran", ""))
	if res.code != 0 || res.stdout != "ran\n" {
		t.Fatalf("an allowed capsule: %+v", res)
	}
	allowed := d.byCapsule("allowed")[0].ID

	// A spawn of a forbidden child is refused 403 with the same reason.
	d.push(capsule(t, "forbidden", "echo child ran", sealedCaps("", "", 30)))
	parent := capsule(t, "parent", apiShell+`api -w '\n%{http_code}\n' -d '{"capsule":"forbidden","version":"0.1.0","wait":true}' "$ROOST_ENDPOINT/v1/spawn"
`, sealedCaps("curl", "forbidden", 60))
	res = d.ctl("run", parent)
	if !strings.Contains(res.stdout, "\n403\n") || !strings.Contains(res.stdout, `hook \"policy\" refused: capsules named forbidden are not allowed here`) {
		t.Fatalf("a forbidden child: %+v", res)
	}

	// The session_end hook ran for the allowed session: its output, the record, is in an event.
	var found bool
	for deadline := time.Now().Add(30 * time.Second); !found && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for _, ev := range d.events(0) {
			if ev.Type == "hook.ran" && ev.SessionID == allowed && strings.Contains(ev.Detail, `hook "audit"`) &&
				strings.Contains(ev.Detail, `"id":"`+allowed+`"`) && strings.Contains(ev.Detail, `"exit_status":"ok"`) {
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("no hook.ran event of the audit hook carrying %s's record: %+v", allowed, d.events(0))
	}
	metrics := scrape(t, d)
	for _, series := range []string{`roost_hook_runs_total{hook="policy",result="vetoed"} 2`, `roost_hook_runs_total{hook="policy",result="allowed"}`, `roost_hook_runs_total{hook="audit",result="ok"}`, `roost_hook_seconds_count{hook="policy"}`} {
		if !strings.Contains(metrics, series) {
			t.Errorf("metrics lack %s:\n%s", series, grepLines(metrics, "roost_hook"))
		}
	}
}

// A stage hook that never ends refuses at its deadline: hooks fail closed.
func TestHookFailsClosed(t *testing.T) {
	mods := hookModules(t, "spin")
	d := hookDaemon(t, fmt.Sprintf("  - {name: slow, on: stage, module: %s, deadline_seconds: 1}\n", mods["spin"]))
	start := time.Now()
	res := d.ctl("run", capsule(t, "any", "echo ran", ""))
	if res.code != 125 || !strings.Contains(res.stderr, `hook "slow" refused: it ran past its deadline of 1s`) {
		t.Fatalf("a looping hook: %+v", res)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("the refusal took %s", took)
	}
	var seen bool
	for _, ev := range d.events(0) {
		if ev.Type == "hook.ran" && strings.Contains(ev.Detail, "timeout") {
			seen = true
		}
	}
	if !seen {
		t.Errorf("no hook.ran event of the timeout: %+v", d.events(0))
	}
}
