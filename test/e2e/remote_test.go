package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// remoteAddr is where roostd's remote listener listens, in the test network's daemon
// namespace; the clients run in its other namespace, across the veth.
var remoteAddr = daemonAddr + ":7443"

// remoteClient runs commands in the test network's other namespace, as a remote client.
type remoteClient struct {
	t      *testing.T
	ns     string
	tlsDir string
}

// run runs argv in the client's namespace and returns its output and exit code.
func (c remoteClient) run(argv ...string) result {
	c.t.Helper()
	return c.runWithin(60*time.Second, nil, argv...)
}

// runWithin is run with env added to the environment, killed after timeout.
func (c remoteClient) runWithin(timeout time.Duration, env []string, argv ...string) result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + c.ns, "--"}, argv...)...)
	cmd.Dir, cmd.Env = repoRoot(), append(os.Environ(), env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	res := result{stdout: out.String(), stderr: errOut.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	case err != nil:
		c.t.Fatalf("%v: %v", argv, err)
	}
	return res
}

// ctl is roostctl --server with the certificate in certDir named cert (client for the
// first of certs init's clients), trusting the listener's CA.
func (c remoteClient) ctl(certDir, cert string, args ...string) result {
	c.t.Helper()
	argv := []string{filepath.Join(binDir, "roostctl"), "--server", "https://" + remoteAddr, "--tls-ca", filepath.Join(c.tlsDir, "ca.pem"),
		"--tls-cert", filepath.Join(certDir, cert+".pem"), "--tls-key", filepath.Join(certDir, cert+"-key.pem")}
	return c.run(append(argv, args...)...)
}

func (c remoteClient) ok(args ...string) string {
	c.t.Helper()
	res := c.ctl(c.tlsDir, "client", args...)
	if res.code != 0 {
		c.t.Fatalf("roostctl --server %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

// curl POSTs body to method as Connect's JSON with the certificate named (none for "": in
// tlsDir, or an absolute path without .pem); it returns the HTTP status (0 when no answer
// came) and the body.
func (c remoteClient) curl(cert, method, body string) (string, result) {
	c.t.Helper()
	argv := []string{"curl", "-sS", "--max-time", "10", "--noproxy", "*", "--cacert", filepath.Join(c.tlsDir, "ca.pem"), "-o", "-", "-w", "\n%{http_code}",
		"-H", "Content-Type: application/json", "-d", body}
	if cert != "" {
		if !filepath.IsAbs(cert) {
			cert = filepath.Join(c.tlsDir, cert)
		}
		argv = append(argv, "--cert", cert+".pem", "--key", cert+"-key.pem")
	}
	res := c.run(append(argv, "https://"+remoteAddr+method)...)
	out, code, _ := cutLast(res.stdout, "\n")
	res.stdout = out
	return code, res
}

// certsInit makes a CA and certificates in dir with roostctl certs init, the server's for
// the listener's address and one for each client (NAME or NAME:ROLE); it returns what
// certs init printed.
func certsInit(t *testing.T, dir string, clients ...string) string {
	t.Helper()
	argv := []string{"certs", "init", dir, "--server-name", daemonAddr}
	for _, c := range clients {
		argv = append(argv, "--client", c)
	}
	out, err := exec.Command(filepath.Join(binDir, "roostctl"), argv...).CombinedOutput()
	if err != nil {
		t.Fatalf("roostctl %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// startRemote starts roostd in the test network's daemon namespace with its remote
// listener on remoteAddr, serving tlsDir's certificates (certsInit's) to the clients its
// CA signed that clients (remote.clients' YAML list items) names.
func startRemote(t *testing.T, n *testNet, tlsDir, clients string) *daemon {
	t.Helper()
	// The config lists the clients; its listen is overridden by the flags, as are the files.
	cfg := filepath.Join(t.TempDir(), "roostd.yaml")
	if err := os.WriteFile(cfg, []byte("remote:\n  listen: 127.0.0.1:1\n  clients:\n"+clients), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, netns: n.daemon}
	state := stateDir(t)
	d.stateDir, d.socket, d.metricsAddr = state, filepath.Join(state, "roostd.sock"), "127.0.0.1:9464"
	d.args = []string{"--config", cfg, "--listen-tcp", remoteAddr, "--tls-cert", filepath.Join(tlsDir, "server.pem"),
		"--tls-key", filepath.Join(tlsDir, "server-key.pem"), "--client-ca", filepath.Join(tlsDir, "ca.pem")}
	d.start()
	t.Cleanup(func() {
		if d.cmd.ProcessState != nil {
			return
		}
		for _, id := range strings.Fields(d.ctl("ps", "-q").stdout) {
			d.ctl("kill", id)
		}
		d.cmd.Process.Signal(unix.SIGTERM)
		d.cmd.Wait()
	})
	if !strings.Contains(d.log.String(), "serving the control API over TCP") || !strings.Contains(d.log.String(), "addr="+remoteAddr) {
		t.Fatalf("roostd's log does not say the listener serves:\n%s", d.log)
	}
	return d
}

func cutLast(s, sep string) (string, string, bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// roostd's remote listener, from another network namespace over mTLS: roostctl --server
// runs a capsule through it, curl reads the API as Connect's JSON, and a client without a
// certificate, with another CA's, with a name not listed, or a reader calling Kill, is
// refused with the code that says why.
func TestRemoteListener(t *testing.T) {
	n := newTestNet(t)
	work := t.TempDir()
	tlsDir, otherDir := filepath.Join(work, "tls"), filepath.Join(work, "other")
	if out := certsInit(t, tlsDir, "ci-bot", "dashboard:reader", "stranger"); !strings.Contains(out, "{common_name: dashboard, role: reader}") {
		t.Fatalf("certs init does not list the reader:\n%s", out)
	}
	certsInit(t, otherDir, "ci-bot")
	d := startRemote(t, n, tlsDir, "    - {common_name: ci-bot, role: operator}\n    - {common_name: dashboard, role: reader}\n")
	c := remoteClient{t: t, ns: n.inet, tlsDir: tlsDir}

	t.Run("roostctl runs a capsule", func(t *testing.T) {
		c := c
		c.t = t
		dir := capsule(t, "remote-hello", "echo hello over the wire", "capabilities:\n  containment: advisory\n")
		run := c.ctl(tlsDir, "client", "run", dir)
		if run.code != 0 || !strings.Contains(run.stdout, "hello over the wire") {
			t.Fatalf("run: %+v", run)
		}
		id := strings.TrimSpace(c.ok("ps", "--all", "-q"))
		if !strings.HasPrefix(id, "ses_") || strings.Contains(id, "\n") {
			t.Fatalf("ps -q: %q", id)
		}
		var s session
		if err := json.Unmarshal([]byte(c.ok("inspect", "--json", id)), &s); err != nil || s.State != "exited" || s.Capsule.Name != "remote-hello" {
			t.Fatalf("inspect: %+v %v", s, err)
		}
		if logs := c.ok("logs", id); !strings.Contains(logs, "hello over the wire") {
			t.Fatalf("logs: %q", logs)
		}
		c.ok("rm", id)
		if left := d.in(t).ok("ps", "--all", "-q"); strings.TrimSpace(left) != "" {
			t.Fatalf("after rm over the listener, the socket lists %q", left)
		}
	})

	// A session for the refusals to aim at.
	staged := strings.TrimSpace(d.ok("stage", capsule(t, "remote-target", "sleep 60", "capabilities:\n  containment: advisory\n")))

	t.Run("curl reads Connect JSON", func(t *testing.T) {
		c := c
		c.t = t
		code, res := c.curl("client", "/roost.v1.SessionService/List", "{}")
		var list struct {
			Sessions []struct{ ID, State string }
		}
		if code != "200" || json.Unmarshal([]byte(res.stdout), &list) != nil || len(list.Sessions) != 1 || list.Sessions[0].ID != staged {
			t.Fatalf("List: %s %+v", code, res)
		}
	})

	t.Run("refused", func(t *testing.T) {
		c := c
		c.t = t
		// No certificate: the handshake fails, so neither gRPC nor HTTP is spoken.
		if code, res := c.curl("", "/roost.v1.SessionService/List", "{}"); code != "000" || res.code == 0 || strings.Contains(res.stdout, staged) {
			t.Errorf("curl without a certificate: %s %+v", code, res)
		}
		// Another CA's certificate: refused at the handshake too; roostctl says it cannot reach roostd (69).
		// (The server's alert names the CA when it reaches the client before the connection closes.)
		if res := c.ctl(otherDir, "client", "ps"); res.code != 69 || !strings.Contains(res.stderr, "cannot reach roostd at https://"+remoteAddr) || strings.Contains(res.stdout, staged) {
			t.Errorf("roostctl with another CA's certificate: %+v", res)
		}
		// A certificate of the CA whose name is not listed: PermissionDenied naming it.
		if res := c.ctl(tlsDir, "stranger", "ps"); res.code != 1 || !strings.Contains(res.stderr, `"stranger" is not among remote.clients`) {
			t.Errorf("roostctl as stranger: %+v", res)
		}
		if code, res := c.curl("stranger", "/roost.v1.SessionService/List", "{}"); code != "403" || !strings.Contains(res.stdout, `"code":"permission_denied"`) {
			t.Errorf("curl as stranger: %s %+v", code, res)
		}
		// A reader reads, and may not kill: over gRPC (roostctl) and Connect (curl).
		if res := c.ctl(tlsDir, "dashboard", "ps", "-q"); res.code != 0 || strings.TrimSpace(res.stdout) != staged {
			t.Errorf("roostctl ps as the reader: %+v", res)
		}
		if res := c.ctl(tlsDir, "dashboard", "kill", staged); res.code != 1 || !strings.Contains(res.stderr, "may not call /roost.v1.SessionService/Kill") {
			t.Errorf("roostctl kill as the reader: %+v", res)
		}
		if code, res := c.curl("dashboard", "/roost.v1.SessionService/Kill", `{"id":"`+staged+`"}`); code != "403" || !strings.Contains(res.stdout, `"code":"permission_denied"`) {
			t.Errorf("curl Kill as the reader: %s %+v", code, res)
		}
		if s := d.in(t).inspect(staged); s.State != "staged" {
			t.Errorf("after the refusals the session is %s", s.State)
		}
		// An operator may.
		if res := c.ctl(tlsDir, "client", "rm", staged); res.code != 0 {
			t.Errorf("rm as the operator: %+v", res)
		}
	})

	// SIGTERM drains the listener with the socket, and roostd exits 0.
	d.cmd.Process.Signal(unix.SIGTERM)
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("roostd stopping: %v\n%s", err, d.log)
	}
	if code, res := c.curl("client", "/roost.v1.SessionService/List", "{}"); code != "000" || res.code == 0 {
		t.Errorf("the listener still answers after roostd stopped: %s %+v", code, res)
	}
}
