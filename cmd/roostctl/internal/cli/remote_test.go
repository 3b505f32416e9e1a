package cli

import (
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"
)

// How roostctl is told to reach the remote listener, and what it says when told wrongly.
func TestServerFlags(t *testing.T) {
	t.Setenv("ROOST_SOCKET", "")
	t.Setenv("ROOST_SERVER", "")
	dir := filepath.Join(t.TempDir(), "tls")
	if code, msg := execute([]string{"certs", "init", dir}); code != exitOK {
		t.Fatalf("certs init: %d %s", code, msg)
	}
	cert, key := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--tls-cert", cert, "ps"}, exitUsage, "--tls-cert is for roostd's remote listener: give --server https://HOST:PORT too"},
		{[]string{"--server", "http://127.0.0.1:7443", "ps"}, exitUsage, `--server "http://127.0.0.1:7443": expected https://HOST:PORT`},
		{[]string{"--server", "https://127.0.0.1", "ps"}, exitUsage, "expected https://HOST:PORT"},
		{[]string{"--server", "https://127.0.0.1:7443", "--socket", "/run/x.sock", "ps"}, exitUsage, "give one"},
		{[]string{"--server", "https://127.0.0.1:7443", "ps"}, exitUsage, "roostd lets in only clients with a certificate"},
		{[]string{"--server", "https://127.0.0.1:7443", "--tls-cert", cert, "ps"}, exitUsage, "--tls-cert and --tls-key go together"},
		{[]string{"--server", "https://127.0.0.1:7443", "--tls-cert", cert, "--tls-key", filepath.Join(dir, "server-key.pem"), "ps"}, exitFailure, "private key does not match public key"},
		{[]string{"--server", "https://127.0.0.1:7443", "--tls-ca", filepath.Join(dir, "none.pem"), "--tls-cert", cert, "--tls-key", key, "ps"}, exitFailure, "--tls-ca: open"},
		// Nothing listens on port 1: unreachable, named by its URL.
		{[]string{"--server", "https://127.0.0.1:1", "--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", cert, "--tls-key", key, "ps"}, exitUnavailable, "cannot reach roostd at https://127.0.0.1:1"},
		{[]string{"certs", "init", dir}, exitFailure, filepath.Join(dir, "ca.pem") + " exists"},
		{[]string{"certs", "init", t.TempDir(), "--client", "dash:admin"}, exitUsage, `--client "dash:admin": role "admin": expected operator, reader or node`},
	} {
		if code, msg := execute(c.args); code != c.code || !strings.Contains(msg, c.want) {
			t.Errorf("roostctl %s: exit %d %q, want %d %q", strings.Join(c.args, " "), code, msg, c.code, c.want)
		}
	}
	// A node's certificate: its name the Common Name, a client's.
	nodes := t.TempDir()
	if code, msg := execute([]string{"certs", "init", nodes, "--client", "roostctl", "--client", "node-a:node"}); code != exitOK {
		t.Fatalf("certs init --client node-a:node: %d %s", code, msg)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(nodes, "node-a.pem"), filepath.Join(nodes, "node-a-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if leaf := pair.Leaf; leaf.Subject.CommonName != "node-a" || len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("node-a.pem: %s %v, want a client certificate of node-a", leaf.Subject, leaf.ExtKeyUsage)
	}
	// The environment stands for the flags.
	t.Setenv("ROOST_SERVER", "https://127.0.0.1:1")
	t.Setenv("ROOST_TLS_CA", filepath.Join(dir, "ca.pem"))
	t.Setenv("ROOST_TLS_CERT", cert)
	t.Setenv("ROOST_TLS_KEY", key)
	if code, msg := execute([]string{"ps"}); code != exitUnavailable || !strings.Contains(msg, "https://127.0.0.1:1") {
		t.Errorf("ROOST_SERVER: exit %d %q", code, msg)
	}
}
