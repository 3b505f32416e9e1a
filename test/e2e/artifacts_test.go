package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
)

// capsuleDir is where a session runs its capsule from (inspect's capsule.dir).
func (d *daemon) capsuleDir(id string) string {
	d.t.Helper()
	var s struct {
		Capsule struct {
			Dir string `json:"dir"`
		} `json:"capsule"`
	}
	if err := json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &s); err != nil {
		d.t.Fatal(err)
	}
	return s.Capsule.Dir
}

// artifacts rm forgets the name at once; the sessions that ran it, the one still running
// included, keep their stored tree until they are removed (here by prune), and the name can
// be pushed again.
func TestArtifactsRemoveThenPrune(t *testing.T) {
	d := newDaemon(t)
	dir := capsule(t, "worker", `echo start; while [ ! -e go ]; do sleep 0.05; done; cat "$ROOST_CAPSULE_DIR/capsule.yaml" > /dev/null && echo still here`, "")
	d.ok("push", dir)
	// One session ran it to its end, one runs it still.
	ended := strings.TrimSpace(d.ok("run", "-d", "worker@0.1.0"))
	os.WriteFile(filepath.Join(d.inspect(ended).Workdir, "go"), nil, 0o644)
	if res := d.ctl("wait", ended); res.code != 0 {
		t.Fatalf("wait: %+v", res)
	}
	live := strings.TrimSpace(d.ok("run", "-d", "worker@0.1.0"))
	blob := d.capsuleDir(live)
	if blob == "" || d.capsuleDir(ended) != blob {
		t.Fatalf("the sessions run from %q and %q", blob, d.capsuleDir(ended))
	}

	out := d.ok("artifacts", "rm", "worker@0.1.0")
	if !strings.HasPrefix(out, "removed worker@0.1.0 sha256:") {
		t.Fatalf("artifacts rm: %q", out)
	}
	if ls := d.ok("artifacts", "ls"); strings.Contains(ls, "worker@0.1.0") {
		t.Fatalf("artifacts ls after rm:\n%s", ls)
	}
	if js := strings.TrimSpace(d.ok("artifacts", "--json")); js != "[]" {
		t.Fatalf("artifacts --json after rm: %s", js)
	}
	if res := d.ctl("run", "worker@0.1.0"); res.code != 125 || !strings.Contains(res.stderr, "no capsule worker@0.1.0 has been pushed") {
		t.Fatalf("run of a removed capsule: %+v", res)
	}

	// The running session still reads its capsule, and ends well.
	os.WriteFile(filepath.Join(d.inspect(live).Workdir, "go"), nil, 0o644)
	if res := d.ctl("wait", live); res.code != 0 {
		t.Fatalf("the session running the removed capsule: %+v\n%s", res, d.ok("logs", live))
	}
	if logs := d.ok("logs", live); logs != "start\nstill here\n" {
		t.Fatalf("logs: %q", logs)
	}
	if _, err := os.Stat(blob); err != nil {
		t.Fatalf("the stored tree went while sessions record it: %v", err)
	}

	// Removing again, an unknown name, a malformed one: exit 1, each named; the good one in
	// the same call still goes.
	d.ok("push", capsule(t, "other", "true", ""))
	res := d.ctl("artifacts", "rm", "worker@0.1.0", "Not a ref", "other@0.1.0")
	if res.code != 1 || !strings.Contains(res.stderr, "artifacts rm worker@0.1.0: no capsule worker@0.1.0 has been pushed") ||
		!strings.Contains(res.stderr, `"Not a ref" is not a pushed capsule's name@version`) || !strings.HasPrefix(res.stdout, "removed other@0.1.0 ") {
		t.Fatalf("artifacts rm of a removed, a malformed and a pushed ref: %+v", res)
	}
	if res := d.ctl("artifacts", "rm"); res.code != 2 {
		t.Fatalf("artifacts rm without a ref: %+v", res)
	}

	// Once no session records it, prune takes the tree too.
	var pruned struct {
		Removed []struct {
			ID string `json:"id"`
		} `json:"removed"`
	}
	if err := json.Unmarshal([]byte(d.ok("prune", "--json")), &pruned); err != nil || len(pruned.Removed) != 2 {
		t.Fatalf("prune --json: %+v %v", pruned, err)
	}
	if _, err := os.Stat(blob); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stored tree of a removed capsule outlived its last session: %v", err)
	}

	// The name is free: other bytes may be pushed under it.
	if out := d.ok("push", capsule(t, "worker", "echo new", "")); !strings.HasPrefix(out, "pushed worker@0.1.0 ") {
		t.Fatalf("push after rm: %q", out)
	}
	if res := d.ctl("run", "worker@0.1.0"); res.code != 0 || res.stdout != "new\n" {
		t.Fatalf("run of the new worker@0.1.0: %+v", res)
	}
}

// On a terminal prune lists what it would remove and asks; no keeps everything, yes removes,
// -f does not ask. (Every other test runs roostctl on pipes, where prune never asks.)
func TestPruneAsksOnATerminal(t *testing.T) {
	script, err := exec.LookPath("script")
	testenv.Need(t, "script(1), to give roostctl a terminal", err)
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "quick", "true", "")))
	d.ctl("wait", id)
	onTerminal := func(answer string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		line := filepath.Join(binDir, "roostctl") + " " + strings.Join(args, " ")
		cmd := exec.CommandContext(ctx, script, "-qec", line, "/dev/null")
		cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
		cmd.Stdin = strings.NewReader(answer)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("roostctl %s on a terminal: %v\n%s", line, err, out.String())
		}
		return out.String()
	}
	out := onTerminal("n\n", "prune")
	if !strings.Contains(out, "Remove these 1 ended session") || !strings.Contains(out, id) || !strings.Contains(out, "nothing removed") {
		t.Fatalf("prune answered no:\n%s", out)
	}
	if n := len(d.ps()); n != 1 {
		t.Fatalf("prune answered no removed sessions: %d left", n)
	}
	out = onTerminal("y\n", "prune")
	if !strings.Contains(out, "removed 1 ended session") || len(d.ps()) != 0 {
		t.Fatalf("prune answered yes:\n%s", out)
	}
	id = strings.TrimSpace(d.ok("run", "-d", capsule(t, "quick", "true", "")))
	d.ctl("wait", id)
	out = onTerminal("", "prune", "-f")
	if strings.Contains(out, "Remove these") || !strings.Contains(out, "removed 1 ended session") {
		t.Fatalf("prune -f:\n%s", out)
	}
}
