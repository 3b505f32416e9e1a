package main

import (
	"slices"
	"strings"
	"testing"

	"roost.dev/roost/pkg/config"
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
		{options{nodeName: "a"}, "--node-name and --fleet-etcd-ca/-cert/-key need --fleet-etcd"},
		{options{fleetEtcdCert: "/c.pem"}, "need --fleet-etcd"},
	} {
		if _, err := fleetFromOptions(&c.o, config.Fleet{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.o, err, c.want)
		}
	}
}
