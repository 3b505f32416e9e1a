package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/directory"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/server"
)

// roostctl fleet nodes, --json and its table, against roost's gRPC server on a real socket,
// a node of a fleet on a real etcd member, with two nodes in the node directory: this one,
// registered with its listener's address, and another stopped cleanly.
func TestFleetNodesShowsDirectory(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	st, err := etcdstore.New(etcdstore.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dir := t.TempDir()
	led, err := ledger.Open(ledger.Config{Path: filepath.Join(dir, ledger.File), Fleet: true, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	node, err := fleet.Open(fleet.Config{Store: st, Node: "node-a", StateDir: dir, Ledger: led})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	registered := map[string]*directory.Registrant{}
	for name, addr := range map[string]string{"node-a": "10.0.0.1:7443", "node-b": ""} {
		r, err := directory.Register(directory.Config{Store: st, Node: name, Address: addr, Classes: []string{"unconfined", "advisory"},
			StartedAt: time.Now(), Version: "v1.2.3", TTL: 2 * time.Second, Interval: 50 * time.Millisecond,
			Capacity: func() directory.Capacity {
				return directory.Capacity{CPUs: 8, MemoryBytes: 16 << 30, SessionsRunning: 3, Warm: map[string]int{"a default capsule": 2}}
			}})
		if err != nil {
			t.Fatal(err)
		}
		registered[name] = r
		defer r.Stop(ctx)
	}
	for {
		nodes, err := directory.List(ctx, st, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) == 2 && nodes[0].Reachable && nodes[1].Reachable {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := registered["node-b"].Stop(ctx); err != nil {
		t.Fatal(err)
	}

	srv := server.New(server.Config{Ledger: led, StateDir: dir, Fleet: &server.Fleet{Store: st, Node: "node-a", Status: node.Status}})
	srv.SetServing()
	sock := filepath.Join(dir, "roost.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	run := func(args ...string) string {
		t.Helper()
		a := &app{}
		root := a.rootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"--socket", sock}, args...))
		err := root.ExecuteContext(ctx)
		if a.conn != nil {
			a.conn.Close()
		}
		if err != nil {
			t.Fatalf("roostctl %s: %v", strings.Join(args, " "), err)
		}
		return out.String()
	}

	var got struct {
		Directory []struct {
			Node            string         `json:"node"`
			Reachable       bool           `json:"reachable"`
			State           string         `json:"state"`
			Address         string         `json:"address"`
			Classes         []string       `json:"classes"`
			Cpus            int            `json:"cpus"`
			MemoryBytes     string         `json:"memory_bytes"`
			SessionsRunning int            `json:"sessions_running"`
			Warm            map[string]int `json:"warm"`
			Version         string         `json:"version"`
			StartedAt       string         `json:"started_at"`
		} `json:"directory"`
	}
	raw := run("fleet", "nodes", "--json")
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		t.Fatalf("fleet nodes --json: %v\n%s", err, raw)
	}
	if len(got.Directory) != 2 {
		t.Fatalf("fleet nodes --json lists %d directory nodes:\n%s", len(got.Directory), raw)
	}
	a, b := got.Directory[0], got.Directory[1]
	if a.Node != "node-a" || !a.Reachable || a.State != "up" || a.Address != "10.0.0.1:7443" || strings.Join(a.Classes, ",") != "unconfined,advisory" ||
		a.Cpus != 8 || a.MemoryBytes != "17179869184" || a.SessionsRunning != 3 || a.Warm["a default capsule"] != 2 || a.Version != "v1.2.3" || a.StartedAt == "" {
		t.Errorf("node-a in fleet nodes --json: %+v\n%s", a, raw)
	}
	if b.Node != "node-b" || b.Reachable || b.State != "stopped" || b.Address != "" {
		t.Errorf("node-b, stopped, in fleet nodes --json: %+v\n%s", b, raw)
	}

	table := run("fleet", "nodes")
	for _, want := range []string{
		"NODE  ", "REACHABLE", "ADDRESS", "CLASSES", "SESSIONS", "CPUS", "MEMORY", "WARM", "VERSION", "HELD",
		"node-a (this)", "10.0.0.1:7443", "unconfined,advisory", "16.0 GiB", "v1.2.3", "stopped",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("fleet nodes does not show %q:\n%s", want, table)
		}
	}

	forgot := run("fleet", "node", "forget", "--yes", "node-b")
	if !strings.Contains(forgot, "deleted node-b's node-directory entry") {
		t.Errorf("fleet node forget node-b:\n%s", forgot)
	}
	raw = run("fleet", "nodes", "--json")
	if strings.Contains(raw, `"node-b"`) {
		t.Errorf("node-b still listed once forgotten:\n%s", raw)
	}
}
