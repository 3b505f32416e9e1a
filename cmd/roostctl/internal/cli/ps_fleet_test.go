package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet/directory"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/server"
)

// roostctl ps --fleet, its table, -a, -q, --json and the note on each unreachable node,
// against roost's gRPC server on a real socket, reading a real etcd member's session
// directory: node-a heard, node-b never registered (as a node cut off since its start);
// then node-b forgotten, its session listed lost.
func TestPsFleetShowsSessionDirectory(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	st, err := etcdstore.New(etcdstore.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	created := time.Now().Add(-3 * time.Hour)
	for node, ss := range map[string][]directory.Session{
		"node-a": {
			{ID: "ses_0001aaaaaaaaaaaa", Name: "build", State: "running", Capsule: "hello@0.1.0", Class: "sealed", CreatedAt: created},
			{ID: "ses_0002aaaaaaaaaaaa", State: "exited", Capsule: "hello@0.1.0", CreatedAt: created, EndedAt: created.Add(time.Minute)},
		},
		"node-b": {{ID: "ses_0003bbbbbbbbbbbb", Name: "build", State: "paused", Capsule: "agent@2.0.0", CreatedAt: created}},
	} {
		p, err := directory.PublishSessions(directory.SessionsConfig{Store: st, Node: node, List: func() ([]directory.Session, error) { return ss, nil }})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := directory.Register(directory.Config{Store: st, Node: "node-a", StartedAt: time.Now(), TTL: 2 * time.Second, Interval: 50 * time.Millisecond,
		Capacity: func() directory.Capacity { return directory.Capacity{} }})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop(ctx)
	for {
		nodes, err := directory.List(ctx, st, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) == 1 && nodes[0].Reachable {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	dir := t.TempDir()
	srv := server.New(server.Config{StateDir: dir, Fleet: &server.Fleet{Store: st, Node: "node-a"}})
	srv.SetServing()
	sock := filepath.Join(dir, "roost.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	run := func(args ...string) (string, string, error) {
		t.Helper()
		a := &app{}
		root := a.rootCommand()
		var out, errOut bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetArgs(append([]string{"--socket", sock}, args...))
		err := root.ExecuteContext(ctx)
		if a.conn != nil {
			a.conn.Close()
		}
		return out.String(), errOut.String(), err
	}

	table, notes, err := run("ps", "--fleet")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SESSION ID") {
		t.Fatalf("ps --fleet:\n%s", table)
	}
	for _, want := range []string{"SESSION ID", "NAME", "NODE", "STATE", "CAPSULE", "CREATED"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("ps --fleet has no %s column: %q", want, lines[0])
		}
	}
	if f := strings.Fields(lines[1]); len(f) < 6 || f[0] != "ses_0001aaaaaaaaaaaa" || f[1] != "build" || f[2] != "node-a" || f[3] != "running" || f[4] != "hello@0.1.0" || f[5] != "3h" {
		t.Errorf("ps --fleet, node-a's session: %q", lines[1])
	}
	if f := strings.Fields(lines[2]); len(f) < 4 || f[0] != "ses_0003bbbbbbbbbbbb" || f[2] != "node-b" || f[3] != "paused" {
		t.Errorf("ps --fleet, node-b's session: %q", lines[2])
	}
	if notes != "node node-b is unreachable: its sessions are as it last wrote them\n" {
		t.Errorf("ps --fleet said on stderr %q; want the note on node-b alone", notes)
	}

	quiet, _, err := run("ps", "--fleet", "-a", "-q")
	if err != nil || quiet != "ses_0001aaaaaaaaaaaa\nses_0002aaaaaaaaaaaa\nses_0003bbbbbbbbbbbb\n" {
		t.Errorf("ps --fleet -a -q: %q, %v", quiet, err)
	}
	if only, _, err := run("ps", "--fleet", "-a", "-q", "--node", "node-b"); err != nil || only != "ses_0003bbbbbbbbbbbb\n" {
		t.Errorf("ps --fleet -a -q --node node-b: %q, %v", only, err)
	}
	if _, _, err := run("ps", "--node", "node-b"); !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "only with --fleet") {
		t.Errorf("ps --node without --fleet: %v, want a usage error", err)
	}
	raw, _, err := run("ps", "--fleet", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var listed []struct {
		ID            string `json:"id"`
		Node          string `json:"node"`
		NodeReachable bool   `json:"node_reachable"`
	}
	if err := json.Unmarshal([]byte(raw), &listed); err != nil {
		t.Fatalf("ps --fleet --json: %v:\n%s", err, raw)
	}
	if len(listed) != 2 || listed[0].Node != "node-a" || !listed[0].NodeReachable || listed[1].Node != "node-b" || listed[1].NodeReachable {
		t.Errorf("ps --fleet --json: %+v", listed)
	}

	if _, _, err := run("ps", "--fleet", "--tree"); !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "--fleet and --tree") {
		t.Errorf("ps --fleet --tree: %v", err)
	}

	forgot, _, err := run("fleet", "node", "forget", "--yes", "node-b")
	if err != nil || !strings.Contains(forgot, "marked 1 of node-b's sessions lost in the session directory") {
		t.Errorf("fleet node forget node-b: %q, %v", forgot, err)
	}
	table, _, err = run("ps", "--fleet")
	if err != nil || !strings.Contains(table, "lost (was paused)") {
		t.Errorf("ps --fleet once node-b is forgotten: %v\n%s", err, table)
	}
}
