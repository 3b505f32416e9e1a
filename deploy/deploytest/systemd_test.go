package deploytest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// execStart is a unit file's effective ExecStart (the last one; continuation lines joined),
// its %H and ${VAR} expanded with a sample host name and the file's own Environment=, and
// whether an empty ExecStart= resets the unit's before it (as a drop-in must).
func execStart(t *testing.T, file string) (args []string, reset bool) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	env := map[string]string{}
	var last string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "Environment="); ok {
			k, val, _ := strings.Cut(v, "=")
			env[k] = val
		}
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			if v == "" {
				reset = true
			}
			last = v
		}
	}
	if last == "" {
		t.Fatalf("%s: no ExecStart", file)
	}
	for _, f := range strings.Fields(last) {
		f = strings.ReplaceAll(f, "%H", "host-a")
		f = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`).ReplaceAllStringFunc(f, func(m string) string {
			v, ok := env[m[2:len(m)-1]]
			if !ok {
				t.Errorf("%s: ExecStart names %s, which no Environment= in the file sets", file, m)
			}
			return v
		})
		args = append(args, f)
	}
	return args, reset
}

func TestSystemd(t *testing.T) {
	bin := build(t)
	unit := filepath.Join(repo, "deploy/systemd/roostd.service")
	args, _ := execStart(t, unit)
	if err := bin.checkRoostdArgs(unit, args[1:]); err != nil {
		t.Error(err)
	}
	dropIn := filepath.Join(repo, "deploy/systemd/roostd.service.d/roostd-fleet.conf")
	args, reset := execStart(t, dropIn)
	if !reset {
		t.Errorf("%s: no empty ExecStart= before its own: systemd would refuse a second ExecStart for a Type=notify service", dropIn)
	}
	if err := bin.checkRoostdArgs(dropIn, args[1:]); err != nil {
		t.Error(err)
	}
	for _, f := range []string{"fleet-etcd", "node-name", "fleet-etcd-ca", "fleet-etcd-cert", "fleet-etcd-key", "listen-tcp", "tls-cert", "tls-key", "client-ca"} {
		if _, ok := flagValue(args, f); !ok {
			t.Errorf("%s: roostd is not given --%s", dropIn, f)
		}
	}
	if v, _ := flagValue(args, "fleet-etcd"); !sameSet(strings.Split(v, ","), fleetClientURLs(t)) {
		t.Errorf("%s: --fleet-etcd %q is not deploy/systemd/etcd's members' %v", dropIn, v, fleetClientURLs(t))
	}
}

// TestEtcdMembers holds deploy/systemd/etcd's environment files to roost-etcd's flags
// (ETCD_FOO_BAR is --foo-bar) and to one another: one cluster of three, each member named
// as its file and listed with its peer URL in everyone's initial cluster.
func TestEtcdMembers(t *testing.T) {
	bin := build(t)
	members := etcdMembers(t)
	if len(members) != 3 {
		t.Fatalf("deploy/systemd/etcd: %d members, want 3", len(members))
	}
	var cluster []string
	for name, env := range members {
		cluster = append(cluster, name+"="+env["ETCD_INITIAL_ADVERTISE_PEER_URLS"])
	}
	for name, env := range members {
		for k := range env {
			flag := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(k, "ETCD_")), "_", "-")
			if !strings.HasPrefix(k, "ETCD_") || !bin.etcdFlags[flag] {
				t.Errorf("%s.env: %s: roost-etcd has no flag --%s", name, k, flag)
			}
		}
		if env["ETCD_NAME"] != name {
			t.Errorf("%s.env: ETCD_NAME is %q, want %q (roost-etcd@%s.service reads this file)", name, env["ETCD_NAME"], name, name)
		}
		if got := strings.Split(env["ETCD_INITIAL_CLUSTER"], ","); !sameSet(got, cluster) {
			t.Errorf("%s.env: ETCD_INITIAL_CLUSTER %v, want the three members' peer URLs %v", name, got, cluster)
		}
		for _, k := range []string{"ETCD_CLIENT_CERT_AUTH", "ETCD_PEER_CLIENT_CERT_AUTH"} {
			if env[k] != "true" {
				t.Errorf("%s.env: %s is %q: etcd must ask its clients and peers for certificates", name, k, env[k])
			}
		}
		for k, v := range env {
			if strings.HasSuffix(k, "_URLS") && slices.ContainsFunc(strings.Split(v, ","), func(u string) bool { return !strings.HasPrefix(u, "https://") }) {
				t.Errorf("%s.env: %s %q: not TLS", name, k, v)
			}
		}
	}
}
