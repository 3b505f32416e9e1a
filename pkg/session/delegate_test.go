package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/artifact"
	"roost.dev/roost/pkg/endpoint"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/spawn"
)

// delegation is a manager with an artifact store and real endpoints (on host loopback:
// these sessions have no network namespace).
type delegation struct {
	t     *testing.T
	m     *Manager
	store *artifact.Store
	keys  *spawn.Keys
	state string
}

func delegationConfig(t *testing.T, state string, store *artifact.Store, maxDepth, maxConcurrent int) (Config, *spawn.Keys) {
	t.Helper()
	keys, err := spawn.LoadKeys(filepath.Join(state, spawn.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	eps, err := endpoint.New(keys, filepath.Join(state, "netns"), nil)
	if err != nil {
		t.Fatal(err)
	}
	spend, err := ledger.Open(ledger.Config{Path: filepath.Join(state, ledger.File)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { spend.Close() })
	cfg := testConfig(state, &recorder{})
	cfg.Artifacts, cfg.Endpoints, cfg.Ledger = store, eps, spend
	cfg.MaxDepth, cfg.MaxConcurrent = maxDepth, maxConcurrent
	// A capsule the operator lets run as root, for the tests that try to reach it.
	cfg.AllowRoot = []string{"rooted"}
	return cfg, keys
}

func newDelegation(t *testing.T, maxDepth, maxConcurrent int) *delegation {
	t.Helper()
	return newDelegationWith(t, func(cfg *Config) { cfg.MaxDepth, cfg.MaxConcurrent = maxDepth, maxConcurrent })
}

// newDelegationWith is newDelegation with the configuration as set changes it.
func newDelegationWith(t *testing.T, set func(*Config)) *delegation {
	t.Helper()
	state := stateDir(t)
	store, err := artifact.Open(filepath.Join(state, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cfg, keys := delegationConfig(t, state, store, 2, 4)
	set(&cfg)
	m, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := &delegation{t: t, m: m, store: store, keys: keys, state: state}
	t.Cleanup(func() { d.endAll(); d.m.Close() })
	return d
}

// endAll kills whatever a test left running: sessions outlive their manager by design.
func (d *delegation) endAll() {
	recs, _ := d.m.List(false)
	for _, r := range recs {
		if r.State.Live() {
			_, _ = d.m.Kill(context.Background(), r.ID, syscall.SIGKILL)
		}
	}
}

// push stores a capsule named name@0.1.0 running command, with the given capabilities.
func (d *delegation) push(name, command, caps string) {
	d.t.Helper()
	dir := d.t.TempDir()
	src := fmt.Sprintf("name: %s\nversion: 0.1.0\nrun:\n  command: [\"/bin/sh\", \"-c\", %s]\ncapabilities:\n  containment: advisory\n%s", name, jsonString(command), caps)
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), []byte(src), 0o644); err != nil {
		d.t.Fatal(err)
	}
	if _, _, err := d.store.Push(dir); err != nil {
		d.t.Fatal(err)
	}
}

// start runs a pushed capsule as a top-level session.
func (d *delegation) start(name string) *store.Record {
	d.t.Helper()
	return run(d.t, d.m, StageOptions{Capsule: name + "@0.1.0"})
}

func (d *delegation) spawn(parent *store.Record, name, task string, wait bool) (spawn.SpawnResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return d.m.backend.Spawn(ctx, parent.ID, spawn.Request{Capsule: name, Version: "0.1.0", Task: task, Wait: wait})
}

const parentCaps = `  spawn:
    allow: [worker, sleeper, middle]
  network:
    allow: [example.com]
`

func TestSpawnRunsChildWithTask(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 30", parentCaps)
	d.push("worker", `cat "$ROOST_TASK_FILE" > result.txt; echo "parent=$ROOST_SESSION_ID"`, "")
	parent := d.start("parent")

	res, err := d.spawn(parent, "worker", "count the stars", true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Completion == nil || res.Completion.Status != "ok" || *res.Completion.ExitCode != 0 {
		t.Fatalf("completion: %+v", res.Completion)
	}
	child, err := d.m.Get(res.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if child.ParentID != parent.ID || child.DepthRemaining != parent.DepthRemaining-1 {
		t.Errorf("child parent %q depth %d; want %q and %d", child.ParentID, child.DepthRemaining, parent.ID, parent.DepthRemaining-1)
	}
	// The parent reaches the child's files through its own workdir.
	if !strings.HasPrefix(res.Workdir, ".roost/children/worker-") {
		t.Fatalf("child workdir as the parent sees it: %q", res.Workdir)
	}
	got, err := os.ReadFile(filepath.Join(parent.Workdir, res.Workdir, "result.txt"))
	if err != nil || string(got) != "count the stars" {
		t.Fatalf("the child's file through the parent's workdir: %q, %v", got, err)
	}
	var c spawn.Completion
	data, err := os.ReadFile(filepath.Join(child.Workdir, CompletionFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &c); err != nil || c.SessionID != child.ID || c.Status != "ok" || c.Capsule != "worker@0.1.0" {
		t.Fatalf("completion.json: %s (%v)", data, err)
	}
	var delegations int
	for _, tr := range readTrace(t, parent.RecordsDir) {
		if tr["event_type"] == "delegation" && tr["child_id"] == child.ID && tr["child"] == "worker@0.1.0" {
			delegations++
		}
	}
	if delegations != 1 {
		t.Errorf("the parent's trace records %d delegations of the child, want 1", delegations)
	}
	list, err := d.m.backend.Children(parent.ID)
	if err != nil || len(list) != 1 || list[0].SessionID != child.ID || list[0].State != "exited" {
		t.Fatalf("children: %+v, %v", list, err)
	}
}

func TestSpawnRefusalsLaunchNothing(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 30", parentCaps)
	d.push("worker", "true", "  network:\n    allow: [api.example.com]\n")
	d.push("stranger", "true", "")
	parent := d.start("parent")
	before, _ := d.m.List(true)

	_, err := d.spawn(parent, "stranger", "", false)
	var r *spawn.Refusal
	if !errors.As(err, &r) || r.Key != "capabilities.spawn.allow" || !errdefs.IsPermissionDenied(err) {
		t.Fatalf("a name outside spawn.allow: %v", err)
	}
	_, err = d.spawn(parent, "worker", "", false)
	if !errors.As(err, &r) || r.Reason != spawn.ReasonEnvelope {
		t.Fatalf("an envelope mismatch: %v", err)
	}
	want := `capabilities.network.allow: the child declares "api.example.com", which its parent does not hold`
	if err.Error() != want {
		t.Errorf("refusal:\n got %s\nwant %s", err, want)
	}
	after, _ := d.m.List(true)
	if len(after) != len(before) {
		t.Errorf("a refused spawn left %d sessions behind", len(after)-len(before))
	}
	refusals := 0
	for _, tr := range readTrace(t, parent.RecordsDir) {
		if tr["event_type"] == "delegation_refused" {
			refusals++
		}
	}
	if refusals != 2 {
		t.Errorf("the parent's trace records %d refusals, want 2", refusals)
	}
}

func TestSpawnDepthAndConcurrency(t *testing.T) {
	d := newDelegation(t, 1, 1)
	d.push("parent", "sleep 30", parentCaps)
	d.push("sleeper", "sleep 30", "  spawn:\n    allow: [sleeper]\n")
	parent := d.start("parent")
	if parent.DepthRemaining != 1 {
		t.Fatalf("a top-level session under --max-depth 1 has depth %d", parent.DepthRemaining)
	}
	res, err := d.spawn(parent, "sleeper", "", false)
	if err != nil {
		t.Fatal(err)
	}
	// --max-concurrent 1: the second live child is one too many.
	_, err = d.spawn(parent, "sleeper", "", false)
	var r *spawn.Refusal
	if !errors.As(err, &r) || r.Reason != spawn.ReasonChildren {
		t.Fatalf("a second live child: %v", err)
	}
	// The child is one level down: no depth is left below it.
	child, _ := d.m.Get(res.SessionID)
	_, err = d.spawn(child, "sleeper", "", false)
	if !errors.As(err, &r) || r.Reason != spawn.ReasonDepth {
		t.Fatalf("a spawn with no depth left: %v", err)
	}
	// Once the child has ended there is room again.
	if _, err := d.m.backend.StopChild(context.Background(), parent.ID, child.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.spawn(parent, "sleeper", "", false); err != nil {
		t.Fatalf("a child after the first ended: %v", err)
	}
}

// A child sees itself and its own children: every other id, its parent and siblings
// included, is not found.
func TestChildSeesOnlyItsOwn(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 30", parentCaps)
	d.push("sleeper", "sleep 30", "")
	parent := d.start("parent")
	a, err := d.spawn(parent, "sleeper", "", false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.spawn(parent, "sleeper", "", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{b.SessionID, parent.ID, "ses_00000000000000000000000000000000"} {
		if _, err := d.m.backend.Child(a.SessionID, other); !errdefs.IsNotFound(err) {
			t.Errorf("child A looking at %s: %v, want not found", other, err)
		}
		if _, err := d.m.backend.StopChild(context.Background(), a.SessionID, other); !errdefs.IsNotFound(err) {
			t.Errorf("child A stopping %s: %v, want not found", other, err)
		}
	}
	if kids, err := d.m.backend.Children(a.SessionID); err != nil || len(kids) != 0 {
		t.Errorf("child A's children: %+v, %v", kids, err)
	}
	if rec, _ := d.m.Get(b.SessionID); rec.State != store.Running {
		t.Errorf("sibling B is %s after A tried to stop it", rec.State)
	}
	if s, err := d.m.backend.Self(a.SessionID); err != nil || s.SessionID != a.SessionID || s.ParentID != parent.ID {
		t.Errorf("self: %+v, %v", s, err)
	}
}

// The lifeline: killing a parent ends its whole subtree, each end recorded terminated.
func TestKillingParentEndsSubtree(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 30", parentCaps)
	d.push("middle", "sleep 30", "  spawn:\n    allow: [sleeper]\n")
	d.push("sleeper", "sleep 30", "")
	parent := d.start("parent")
	mid, err := d.spawn(parent, "middle", "", false)
	if err != nil {
		t.Fatal(err)
	}
	midRec, _ := d.m.Get(mid.SessionID)
	leaf, err := d.spawn(midRec, "sleeper", "", false)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.m.Kill(ctx, parent.ID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Kill answers once the subtree is gone too.
	for _, id := range []string{mid.SessionID, leaf.SessionID} {
		rec, _ := d.m.Get(id)
		if rec.State != store.Exited || rec.ExitStatus != store.StatusTerminated || !strings.Contains(rec.Detail, "its parent ses_") {
			t.Errorf("%s: %s %s %q", id, rec.State, rec.ExitStatus, rec.Detail)
		}
		if _, err := os.Stat(filepath.Join(rec.Workdir, CompletionFile)); err != nil {
			t.Errorf("%s left no completion: %v", id, err)
		}
	}
	// An ended parent's credential no longer spawns anything.
	if _, err := d.spawn(parent, "sleeper", "", false); err == nil {
		t.Fatal("an ended parent spawned a child")
	}
}

// A restarted daemon honours the credentials of sessions it re-attaches, on the same
// endpoint, and stops children whose parent ended while it was down.
func TestDelegationSurvivesRestart(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 30", parentCaps)
	d.push("sleeper", "sleep 30", "")
	parent := d.start("parent")
	survivor := d.start("parent")
	res, err := d.spawn(parent, "sleeper", "", false)
	if err != nil {
		t.Fatal(err)
	}
	survivor, _ = d.m.Get(survivor.ID)
	d.m.Close()
	d.m.cfg.Ledger.(*ledger.Ledger).Close()
	// The parent dies while no daemon watches.
	if err := syscall.Kill(-parent.Process.PID, syscall.SIGKILL); err != nil {
		if err := syscall.Kill(parent.Process.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	waitFile(t, filepath.Join(parent.RecordsDir, "exit.json"))

	cfg, _ := delegationConfig(t, d.state, d.store, 3, 4)
	m, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.m = m
	// Before this manager's ledger closes (cleanups run last first).
	t.Cleanup(d.endAll)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	child, err := m.Wait(ctx, res.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if child.ExitStatus != store.StatusTerminated || !strings.Contains(child.Detail, parent.ID) {
		t.Errorf("the orphaned child: %s %q", child.ExitStatus, child.Detail)
	}
	// The survivor's endpoint listens where its environment says, and its credential works.
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/self", survivor.EndpointPort)
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+d.keys.Mint(survivor.ID))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), survivor.ID) {
		t.Fatalf("self after restart: %d %s", resp.StatusCode, body)
	}
}

// A name in spawn.workdir_snapshot starts with a copy of the parent's workdir: files copied,
// links copied as links (never followed), the children's own tree left out.
func TestSpawnWorkdirSnapshot(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 30", "  spawn:\n    allow: [worker]\n    workdir_snapshot: [worker]\n")
	d.push("worker", "cat notes.txt > seen.txt; echo extra >> notes.txt", "")
	parent := d.start("parent")
	if err := os.WriteFile(filepath.Join(parent.Workdir, "notes.txt"), []byte("from the parent\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/hostname", filepath.Join(parent.Workdir, "planted")); err != nil {
		t.Fatal(err)
	}
	res, err := d.spawn(parent, "worker", "", true)
	if err != nil {
		t.Fatal(err)
	}
	child, _ := d.m.Get(res.SessionID)
	if got, _ := os.ReadFile(filepath.Join(child.Workdir, "seen.txt")); string(got) != "from the parent\n" {
		t.Errorf("the child saw %q in its copy", got)
	}
	if target, err := os.Readlink(filepath.Join(child.Workdir, "planted")); err != nil || target != "/etc/hostname" {
		t.Errorf("the planted link in the copy: %q, %v", target, err)
	}
	if _, err := os.Lstat(filepath.Join(child.Workdir, ".roost")); !os.IsNotExist(err) {
		t.Errorf("the copy holds the parent's .roost: %v", err)
	}
	// The child wrote to its copy, not the parent's file.
	if got, _ := os.ReadFile(filepath.Join(parent.Workdir, "notes.txt")); string(got) != "from the parent\n" {
		t.Errorf("the parent's file became %q", got)
	}
}

// A parent that planted a link where its children's tree goes gets a refusal, and nothing
// is made through the link.
func TestSpawnRefusesPlantedLink(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 30", "  spawn:\n    allow: [worker]\n")
	d.push("worker", "true", "")
	parent := d.start("parent")
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(parent.Workdir, ".roost")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.spawn(parent, "worker", "", false); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("a spawn through a planted link: %v", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("roost made %d entries through the planted link", len(entries))
	}
}

// A child's spend counts against its whole ancestry: through three levels of delegation the
// top session's max_session_tokens refuses the middle and the leaf, naming it.
func TestAncestorCeilingThroughDelegation(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 30", "  spawn:\n    allow: [middle, sleeper]\ninference:\n  max_session_tokens: 100\n")
	d.push("middle", "sleep 30", "  spawn:\n    allow: [sleeper]\n")
	d.push("sleeper", "sleep 30", "")
	parent := d.start("parent")
	mid, err := d.spawn(parent, "middle", "", false)
	if err != nil {
		t.Fatal(err)
	}
	midRec, _ := d.m.Get(mid.SessionID)
	leaf, err := d.spawn(midRec, "sleeper", "", false)
	if err != nil {
		t.Fatal(err)
	}
	r, err := d.m.backend.Admit(leaf.SessionID, spawn.AdmitRequest{Tokens: 80})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.m.backend.Settle(leaf.SessionID, spawn.SettleRequest{Reservation: r.ID, InputTokens: 50, OutputTokens: 20}); err != nil {
		t.Fatal(err)
	}
	_, err = d.m.backend.Admit(mid.SessionID, spawn.AdmitRequest{Tokens: 40})
	var refusal *ledger.Refusal
	if !errors.As(err, &refusal) || refusal.Limit != "ancestor "+parent.ID || refusal.Used != 70 || refusal.Ceiling != 100 {
		t.Fatalf("the middle session's admission: %v", err)
	}
	if _, err := d.m.backend.Admit(leaf.SessionID, spawn.AdmitRequest{Tokens: 30}); err != nil {
		t.Fatalf("the leaf's admission that fits exactly: %v", err)
	}
	if _, err := d.m.backend.Admit(leaf.SessionID, spawn.AdmitRequest{Tokens: 1}); !errors.As(err, &refusal) || refusal.Limit != "ancestor "+parent.ID {
		t.Fatalf("the leaf past the ceiling: %v", err)
	}
	// The lifeline ends the subtree; the leaf's open 30 is charged in full; the parent's
	// record shows its own spend, its account the subtree's.
	if _, err := d.m.Kill(context.Background(), parent.ID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if rec, _ := d.m.Get(leaf.SessionID); rec.Tokens != 100 || rec.InputTokens != 50 || rec.OutputTokens != 20 {
		t.Errorf("the leaf's record: %d tokens (%d in, %d out)", rec.Tokens, rec.InputTokens, rec.OutputTokens)
	}
	s, _ := d.m.backend.Spend(parent.ID)
	if s.Charged != 0 || s.SubtreeCharged != 100 || !s.Ended {
		t.Errorf("the parent's account: %+v", s)
	}
}

// A session cannot become host root through a child: a capsule sessions.allow_root names is
// refused to a parent that does not run as root itself, and nothing is staged.
func TestSpawnRefusesHostRootChild(t *testing.T) {
	d := newDelegation(t, 3, 4)
	d.push("parent", "sleep 30", "  spawn:\n    allow: [rooted]\n")
	d.push("rooted", "id -u", "")
	parent := d.start("parent")
	if parent.HostRoot || parent.IDs == nil {
		t.Fatalf("the parent runs as %+v", parent.IDs)
	}
	before, _ := d.m.List(true)
	_, err := d.spawn(parent, "rooted", "", true)
	var r *spawn.Refusal
	if !errors.As(err, &r) || r.Key != "sessions.allow_root" || !strings.Contains(r.Msg, "host root") {
		t.Fatalf("spawn of a host-root child: %v", err)
	}
	if after, _ := d.m.List(true); len(after) != len(before) {
		t.Fatalf("a refused spawn staged something: %d sessions, then %d", len(before), len(after))
	}
}
