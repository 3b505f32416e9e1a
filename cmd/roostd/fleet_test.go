package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/fleet/directory"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/remote"
	"roost.dev/roost/pkg/remote/certs"
)

// The fleet flags over the config's fleet section: each flag overrides its key, and a bad
// combination names the flag or key at fault.
func TestFleetSettings(t *testing.T) {
	s, err := fleetFromOptions(&options{}, config.Fleet{})
	if err != nil || s.enabled() {
		t.Fatalf("no fleet: %+v, %v", s, err)
	}
	file := config.Fleet{Etcd: []string{"https://10.0.0.1:2379"}, NodeName: "a", EtcdCA: "/ca.pem"}
	s, err = fleetFromOptions(&options{configFile: "/etc/roost/roostd.yaml"}, file)
	if err != nil || !s.enabled() || s.node != "a" || s.etcd.CAFile != "/ca.pem" || s.etcdFrom != "/etc/roost/roostd.yaml: fleet.etcd" {
		t.Fatalf("from the file: %+v, %v", s, err)
	}
	s, err = fleetFromOptions(&options{fleetEtcd: "http://127.0.0.1:2379, http://127.0.0.1:2479", nodeName: "b", fleetEtcdCA: "/other.pem"}, file)
	if err != nil || !slices.Equal(s.etcd.Endpoints, []string{"http://127.0.0.1:2379", "http://127.0.0.1:2479"}) || s.node != "b" || s.etcd.CAFile != "/other.pem" || s.etcdFrom != "--fleet-etcd" {
		t.Fatalf("flags over the file: %+v, %v", s, err)
	}
	for _, c := range []struct {
		o    options
		want string
	}{
		{options{fleetEtcd: "127.0.0.1:2379", nodeName: "a"}, `--fleet-etcd: etcd endpoint "127.0.0.1:2379": want a URL`},
		{options{fleetEtcd: "http://127.0.0.1:2379"}, "--fleet-etcd: a fleet node needs a name: give --node-name"},
		{options{nodeName: "a"}, "--node-name, --fleet-etcd-ca/-cert/-key and --fleet-node-cert/-key, --fleet-peer-ca need --fleet-etcd"},
		{options{fleetEtcdCert: "/c.pem"}, "need --fleet-etcd"},
	} {
		if _, err := fleetFromOptions(&c.o, config.Fleet{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.o, err, c.want)
		}
	}
}

// The node's side of the node-to-node mTLS: flags over fleet.node_tls, each pair complete,
// and the certificate its node's own, a client's, with a key only its owner reads.
func TestFleetNodeTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	clients := []certs.Client{{CommonName: "node-a", Cert: "node-a.pem", Key: "node-a-key.pem"}, {CommonName: "node-b", Cert: "node-b.pem", Key: "node-b-key.pem"}}
	if err := certs.Init(certs.Plan{Dir: dir, ServerNames: []string{"localhost"}, Clients: clients}); err != nil {
		t.Fatal(err)
	}
	at := func(f string) string { return filepath.Join(dir, f) }
	fleet := func(o options) options {
		o.fleetEtcd, o.nodeName = "http://127.0.0.1:2379", "node-a"
		return o
	}
	file := config.Fleet{Etcd: []string{"http://127.0.0.1:2379"}, NodeName: "node-a", NodeTLS: config.NodeTLS{Cert: at("node-a.pem"), Key: at("node-a-key.pem")}}
	noCA := remote.Setting{From: "--client-ca"}
	s, err := fleetFromOptions(&options{configFile: "/etc/roost/roostd.yaml"}, file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodeTLS(noCA); err == nil || !strings.Contains(err.Error(), "/etc/roost/roostd.yaml: fleet.node_tls.cert "+at("node-a.pem")+": give --fleet-peer-ca") {
		t.Errorf("no CA for the other nodes' listeners: %v", err)
	}
	// The peer CA defaults to the remote listener's client CA.
	cfg, err := s.nodeTLS(remote.Setting{Value: at(certs.CAFile), From: "--client-ca"})
	if err != nil || cfg == nil || cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.Certificates[0].Leaf.Subject.CommonName != "node-a" {
		t.Fatalf("node TLS from the file, the client CA as peer CA: %+v, %v", cfg, err)
	}
	// Flags over the file: node-b's certificate is not node-a's.
	s, err = fleetFromOptions(&options{configFile: "/etc/roost/roostd.yaml", fleetNodeCert: at("node-b.pem"), fleetNodeKey: at("node-b-key.pem"), fleetPeerCA: at(certs.CAFile)}, file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodeTLS(noCA); err == nil || !strings.Contains(err.Error(), `--fleet-node-cert `+at("node-b.pem")+`: its Common Name "node-b" is not the node's name "node-a" (/etc/roost/roostd.yaml: fleet.node_name)`) {
		t.Errorf("another node's certificate: %v", err)
	}
	// A server's certificate is no client's.
	o := fleet(options{fleetNodeCert: at(certs.ServerFile), fleetNodeKey: at(certs.ServerKeyFile), fleetPeerCA: at(certs.CAFile)})
	o.nodeName = "localhost"
	if s, err = fleetFromOptions(&o, config.Fleet{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodeTLS(noCA); err == nil || !strings.Contains(err.Error(), "not a client certificate") {
		t.Errorf("a server certificate: %v", err)
	}
	if err := os.Chmod(at("node-a-key.pem"), 0o640); err != nil {
		t.Fatal(err)
	}
	if s, err = fleetFromOptions(ptr(fleet(options{fleetNodeCert: at("node-a.pem"), fleetNodeKey: at("node-a-key.pem"), fleetPeerCA: at(certs.CAFile)})), config.Fleet{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodeTLS(noCA); err == nil || !strings.Contains(err.Error(), "--fleet-node-key "+at("node-a-key.pem")+": mode 0640") {
		t.Errorf("a key others may read: %v", err)
	}
	for _, c := range []struct {
		o    options
		want string
	}{
		{options{fleetNodeCert: "/n.pem"}, "--fleet-node-cert/-key, --fleet-peer-ca need --fleet-etcd"},
		{fleet(options{fleetNodeCert: "/n.pem"}), "--fleet-node-cert /n.pem needs the configuration (no --config): fleet.node_tls.key too"},
		{fleet(options{fleetNodeKey: "/k.pem"}), "--fleet-node-key /k.pem needs the configuration (no --config): fleet.node_tls.cert too"},
		{fleet(options{fleetPeerCA: "/ca.pem"}), "--fleet-peer-ca /ca.pem needs the configuration (no --config): fleet.node_tls.cert"},
	} {
		if _, err := fleetFromOptions(&c.o, config.Fleet{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.o, err, c.want)
		}
	}
	// Without a node certificate, calls are not routed.
	if s, err = fleetFromOptions(ptr(fleet(options{})), config.Fleet{}); err != nil {
		t.Fatal(err)
	}
	if cfg, err := s.nodeTLS(noCA); cfg != nil || err != nil {
		t.Errorf("no node certificate: %v, %v", cfg, err)
	}
}

func ptr[T any](v T) *T { return &v }

// The router's lookup: the session's node from the session directory, its address from the
// node directory in etcd.
func TestLocator(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	st, err := etcdstore.New(etcdstore.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg, err := directory.Register(directory.Config{Store: st, Node: "node-b", Address: "127.0.0.1:7443", Capacity: func() directory.Capacity { return directory.Capacity{} }})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop(ctx)
	none := func(string) (string, string, bool) { return "", "", false }
	if _, _, err := locator(st, none, nil)(ctx, "s-1"); !errdefs.IsNotFound(err) {
		t.Errorf("no session directory: %v, want not found", err)
	}
	// A session this node placed a moment ago is found where it was placed, before any
	// directory is read.
	placed := func(ref string) (string, string, bool) { return "node-p", "127.0.0.1:9", ref == "s-p" }
	if node, addr, err := locator(st, placed, nil)(ctx, "s-p"); node != "node-p" || addr != "127.0.0.1:9" || err != nil {
		t.Errorf("a session placed here: %q %q %v", node, addr, err)
	}
	on := func(node string) func(context.Context, string) (string, error) {
		return func(context.Context, string) (string, error) { return node, nil }
	}
	for {
		node, addr, err := locator(st, none, on("node-b"))(ctx, "s-1")
		if err != nil {
			t.Fatal(err)
		}
		if addr != "" {
			if node != "node-b" || addr != "127.0.0.1:7443" {
				t.Fatalf("located %s at %s", node, addr)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("node-b never registered")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if node, addr, err := locator(st, none, on("node-z"))(ctx, "s-1"); node != "node-z" || addr != "" || err != nil {
		t.Errorf("a node the directory does not know: %q %q %v", node, addr, err)
	}
	st.Close()
	if _, _, err := locator(st, none, on("node-b"))(ctx, "s-1"); err == nil || errdefs.IsNotFound(err) {
		t.Errorf("a directory that cannot be read: %v, want an error other than not found", err)
	}
}
