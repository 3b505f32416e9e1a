package hooks

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/config"
)

// guestSource is a hook written in Go for wasip1: a policy refusing capsules named
// forbidden, and modes that loop, exhaust memory, echo, or check that the guest sees no
// environment and no file.
const guestSource = `package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

var kept [][]byte

func main() {
	data, _ := io.ReadAll(os.Stdin)
	var in struct {
		Capsule string ` + "`json:\"capsule\"`" + `
		Mode    string ` + "`json:\"mode\"`" + `
	}
	if err := json.Unmarshal(data, &in); err != nil {
		fmt.Println("the input is not JSON:", err)
		os.Exit(1)
	}
	switch in.Mode {
	case "loop":
		for {
		}
	case "oom":
		for {
			kept = append(kept, make([]byte, 1<<20))
		}
	case "echo":
		os.Stdout.Write(data)
		return
	case "contained":
		if env := os.Environ(); len(env) > 0 {
			fmt.Println("the guest sees an environment:", env)
			os.Exit(1)
		}
		if _, err := os.ReadFile("/etc/passwd"); err == nil {
			fmt.Println("the guest reads /etc/passwd")
			os.Exit(1)
		}
		return
	}
	if in.Capsule == "forbidden" {
		fmt.Println("capsules named forbidden are not allowed here")
		os.Exit(1)
	}
}
`

// realRunner is $ROOST_WASM when set, else roost-wasm built now from this tree: a
// bin/roost-wasm from an earlier make build may be older than the code under test, and a
// fresh clone has none, so depending on it would skip this test exactly where it matters.
func realRunner(t *testing.T, goTool string) string {
	t.Helper()
	if runner := os.Getenv("ROOST_WASM"); runner != "" {
		if _, err := os.Stat(runner); err != nil {
			t.Fatalf("ROOST_WASM names no runner: %v", err)
		}
		return runner
	}
	// roost-wasm links wasmtime through cgo: without a C compiler go build would fail for
	// want of a tool, not for a fault in the code.
	cc, err := exec.Command(goTool, "env", "CC").Output()
	if err != nil {
		t.Fatalf("go env CC: %v", err)
	}
	_, err = exec.LookPath(strings.TrimSpace(string(cc)))
	testenv.Need(t, "a C compiler, for roost-wasm's cgo", err)
	runner := filepath.Join(t.TempDir(), "roost-wasm")
	build := exec.Command(goTool, "build", "-o", runner, "roost.dev/roost/cmd/roost-wasm")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building roost-wasm: %v\n%s", err, out)
	}
	return runner
}

// The real runner (realRunner), with a Go guest built now for wasip1.
func TestRealRunner(t *testing.T) {
	goTool, err := exec.LookPath("go")
	testenv.Need(t, "the go tool, to build the runner and the guest", err)
	runner := realRunner(t, goTool)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "guest.go"), []byte(guestSource), 0o644); err != nil {
		t.Fatal(err)
	}
	module := filepath.Join(dir, "guest.wasm")
	build := exec.Command(goTool, "build", "-o", module, "guest.go")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "GOFLAGS=", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the guest: %v\n%s", err, out)
	}

	// A runner compiles the module on each run (taking seconds for a Go guest, unless it
	// caches): the hooks that are to finish get a deadline with room for that.
	rec := newRecorder()
	run := NewExecRunner(Config{Runner: runner})
	h := New([]config.Hook{
		{Name: "policy", On: config.HookStage, Module: module, DeadlineSeconds: 30, MemoryBytes: 64 << 20},
		{Name: "audit", On: config.HookSessionEnd, Module: module, DeadlineSeconds: 30},
	}, run, rec, rec, nil)
	defer h.Close(context.Background())
	loops := New([]config.Hook{{Name: "loops", On: config.HookStage, Module: module, DeadlineSeconds: 1}}, run, nil, nil, nil)

	t.Run("stage", func(t *testing.T) {
		for _, tc := range []struct{ name, input, want string }{
			{"allowed", `{"capsule":"builder"}`, ""},
			{"contained", `{"capsule":"x","mode":"contained"}`, ""},
			{"vetoed", `{"capsule":"forbidden"}`, `hook "policy" refused: capsules named forbidden are not allowed here`},
			{"bad-input", `{"capsule":`, `hook "policy" refused: the input is not JSON: unexpected end of JSON input`},
			{"oom", `{"capsule":"x","mode":"oom"}`, `hook "policy" refused: it ran out of memory (64 MiB)`},
			{"timeout", `{"capsule":"x","mode":"loop"}`, `hook "loops" refused: it ran past its deadline of 1s`},
		} {
			input, want := tc.input, tc.want
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				hooks, limit := h, 30*time.Second
				if tc.name == "timeout" {
					hooks, limit = loops, 1*time.Second+DefaultSlack+time.Second
				}
				start := time.Now()
				err := hooks.Stage(context.Background(), "x@1", []byte(input))
				if (want == "" && err != nil) || (want != "" && (err == nil || err.Error() != want)) {
					var refused *RefusedError
					if errors.As(err, &refused) {
						t.Logf("stderr: %.2000s", refused.Result.Stderr)
					}
					t.Errorf("%s: %v, want %q", input, err, want)
				}
				if took := time.Since(start); took > limit {
					t.Errorf("%s took %s", input, took)
				}
			})
		}
	})

	in := `{"capsule":"x","mode":"echo","session":"s-1"}`
	h.SessionEnd("s-1", []byte(in))
	deadline := time.Now().Add(30 * time.Second)
	for {
		var found *event
		for _, e := range rec.snapshot() {
			if e.hook == "audit" {
				found = &e
			}
		}
		if found != nil {
			if found.subject != "s-1" || found.r.Outcome != OutcomeOK || string(found.r.Stdout) != in {
				t.Errorf("%+v %q", found, found.r.Stdout)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the session_end hook did not report")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
