package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
)

// acceptanceSteps are the steps each SDK's acceptance program prints, in its order.
var acceptanceSteps = []string{"create", "write", "exec-stream", "download-tar", "labels", "detach", "attach",
	"refuse-no-cert", "refuse-other-ca", "refuse-reader-kill", "remove"}

// acceptanceStep is one line an acceptance program prints: the step, whether it held, and
// what it saw.
type acceptanceStep struct {
	Step       string            `json:"step"`
	OK         bool              `json:"ok"`
	Error      string            `json:"error"`
	ID         string            `json:"id"`
	Decoy      string            `json:"decoy"`
	State      string            `json:"state"`
	Achieved   string            `json:"achieved"`
	Labels     map[string]string `json:"labels"`
	Chunks     []string          `json:"chunks"`
	Stdout     string            `json:"stdout"`
	ExitCode   int               `json:"exitCode"`
	Names      []string          `json:"names"`
	Note       string            `json:"note"`
	Main       []string          `json:"main"`
	Any        []string          `json:"any"`
	ExecID     string            `json:"execId"`
	Offset     int               `json:"offset"`
	Raw        string            `json:"raw"`
	GRPCCode   string            `json:"grpcCode"`
	Message    string            `json:"message"`
	StateAfter string            `json:"stateAfter"`
	Get        string            `json:"get"`
}

// Issue 31's acceptance: from another network namespace, joined to roostd's by a veth, over
// mTLS, the TypeScript and the Python SDK each create a sealed session with labels, write a
// file, exec a command reading it with its output streamed, download the workdir as a tar,
// list sessions by label, detach an exec and re-attach to it from an offset, and remove the
// session; a client without a certificate, with another CA's, or a reader calling Kill is
// refused, with the gRPC code (through the SDKs) and the HTTP status (Connect's JSON, by
// curl) that say why.
func TestSDKRemote(t *testing.T) {
	n := newTestNet(t)
	work := t.TempDir()
	tlsDir, otherDir := filepath.Join(work, "tls"), filepath.Join(work, "other")
	certsInit(t, tlsDir, "acceptance", "auditor:reader")
	// Another CA's certificate for a name roostd lists: only its CA refuses it.
	certsInit(t, otherDir, "acceptance")
	d := startRemote(t, n, tlsDir, "    - {common_name: acceptance, role: operator}\n    - {common_name: auditor, role: reader}\n")
	// A sealed capsule whose program waits, pushed: a remote client names it name@version.
	d.push(capsule(t, "sdk-accept", "exec sleep 600", sealedCaps("sh, cat, sleep", "", 600)))
	c := remoteClient{t: t, ns: n.inet, tlsDir: tlsDir}
	env := []string{
		"ROOST_SERVER=https://" + remoteAddr,
		"ROOST_CA=" + filepath.Join(tlsDir, "ca.pem"),
		// certs init names the first client's files client.pem and client-key.pem.
		"ROOST_CERT=" + filepath.Join(tlsDir, "client.pem"), "ROOST_KEY=" + filepath.Join(tlsDir, "client-key.pem"),
		"ROOST_READER_CERT=" + filepath.Join(tlsDir, "auditor.pem"), "ROOST_READER_KEY=" + filepath.Join(tlsDir, "auditor-key.pem"),
		"ROOST_OTHER_CERT=" + filepath.Join(otherDir, "client.pem"), "ROOST_OTHER_KEY=" + filepath.Join(otherDir, "client-key.pem"),
		"ROOST_CAPSULE=sdk-accept@0.1.0",
	}
	root := repoRoot()

	t.Run("typescript", func(t *testing.T) {
		sdk := filepath.Join(root, "sdk", "typescript")
		_, err := os.Stat(filepath.Join(sdk, "node_modules", "@connectrpc", "connect-node", "package.json"))
		testenv.Need(t, "sdk/typescript/node_modules (make sdk-clients)", err)
		// npm run build compiles the package with its test programs, the acceptance's among them.
		runNode(t, sdk, 3*time.Minute, nil, "npm", "run", "build")
		c := c
		c.t = t
		res := c.runWithin(5*time.Minute, env, "node", filepath.Join(sdk, "dist", "test", "acceptance.js"))
		checkAcceptance(t, d.in(t), "typescript", res)
	})

	t.Run("python", func(t *testing.T) {
		// Debian's python3, whose grpcio and protobuf make sdk-clients installs.
		py := "/usr/bin/python3"
		testenv.Need(t, "Debian's python3 with grpcio and protobuf (make sdk-clients)", exec.Command(py, "-c", "import grpc, google.protobuf").Run())
		c := c
		c.t = t
		pyEnv := append(slices.Clone(env), "PYTHONPATH="+filepath.Join(root, "sdk", "python"), "PYTHONDONTWRITEBYTECODE=1")
		res := c.runWithin(5*time.Minute, pyEnv, py, filepath.Join(root, "sdk", "python", "tests", "acceptance.py"))
		checkAcceptance(t, d.in(t), "python", res)
	})

	// The same refusals as HTTP statuses, Connect's JSON by curl from the other namespace.
	t.Run("http statuses", func(t *testing.T) {
		c := c
		c.t = t
		staged := strings.TrimSpace(d.in(t).ok("stage", "sdk-accept@0.1.0"))
		if code, res := c.curl("client", "/roost.v1.SessionService/Get", `{"id":"`+staged+`"}`); code != "200" || !strings.Contains(res.stdout, staged) {
			t.Errorf("Get as the operator: %s %+v", code, res)
		}
		// No certificate, or another CA's: refused at the handshake, so no status at all.
		if code, res := c.curl("", "/roost.v1.SessionService/List", "{}"); code != "000" || res.code == 0 || strings.Contains(res.stdout, staged) {
			t.Errorf("curl without a certificate: %s %+v", code, res)
		}
		if code, res := c.curl(filepath.Join(otherDir, "client"), "/roost.v1.SessionService/List", "{}"); code != "000" || res.code == 0 || strings.Contains(res.stdout, staged) {
			t.Errorf("curl with another CA's certificate: %s %+v", code, res)
		}
		if code, res := c.curl("auditor", "/roost.v1.SessionService/Get", `{"id":"`+staged+`"}`); code != "200" || !strings.Contains(res.stdout, staged) {
			t.Errorf("Get as the reader: %s %+v", code, res)
		}
		if code, res := c.curl("auditor", "/roost.v1.SessionService/Kill", `{"id":"`+staged+`"}`); code != "403" || !strings.Contains(res.stdout, `"code":"permission_denied"`) {
			t.Errorf("Kill as the reader: %s %+v", code, res)
		}
		if s := d.in(t).inspect(staged); s.State != "staged" {
			t.Errorf("after the reader's Kill the session is %s", s.State)
		}
		d.in(t).ok("rm", staged)
	})
}

// checkAcceptance checks every line an SDK's acceptance program printed, then that roostd
// (asked through its socket) keeps none of the sessions it made.
func checkAcceptance(t *testing.T, d *daemon, sdk string, res result) {
	t.Helper()
	t.Logf("the %s acceptance printed:\n%s", sdk, res.stdout)
	steps := map[string]acceptanceStep{}
	var order []string
	for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
		var s acceptanceStep
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("the program printed %q, not a step's JSON line: %v\nstderr:\n%s", line, err, res.stderr)
		}
		if !s.OK {
			t.Errorf("step %s failed: %s", s.Step, s.Error)
		}
		steps[s.Step] = s
		order = append(order, s.Step)
	}
	if !slices.Equal(order, acceptanceSteps) || res.code != 0 {
		t.Fatalf("exit %d after the steps %v, want %v\nstderr:\n%s\nroostd:\n%s", res.code, order, acceptanceSteps, res.stderr, d.log)
	}
	note := "written by the " + sdk + " SDK\n"

	created := steps["create"]
	if created.State != "running" || created.Achieved != "sealed" || created.Labels["acceptance"] != sdk || created.Labels["role"] != "main" ||
		!strings.HasPrefix(created.ID, "ses_") || !strings.HasPrefix(created.Decoy, "ses_") {
		t.Errorf("create: %+v", created)
	}
	if ex := steps["exec-stream"]; ex.Stdout != note+"done\n" || ex.ExitCode != 0 || len(ex.Chunks) < 2 || strings.Join(ex.Chunks, "") != ex.Stdout {
		t.Errorf("exec-stream: %+v", ex)
	}
	if tar := steps["download-tar"]; tar.Note != note || !slices.Contains(tar.Names, "note.txt") {
		t.Errorf("download-tar: %+v", tar)
	}
	if l := steps["labels"]; !slices.Equal(l.Main, []string{created.ID}) || !slices.Equal(l.Any, slices.Sorted(slices.Values([]string{created.ID, created.Decoy}))) {
		t.Errorf("labels: %+v (the session %s, the decoy %s)", l, created.ID, created.Decoy)
	}
	det, att := steps["detach"], steps["attach"]
	if det.State != "running" || det.ExecID == "" || att.ExecID != det.ExecID || att.Offset != len("one\n") || att.Stdout != "two\n" || att.ExitCode != 3 {
		t.Errorf("detach %+v, attach %+v", det, att)
	}
	// Without a certificate the SDK refuses first; a raw handshake gets roostd's alert.
	if nc := steps["refuse-no-cert"]; !strings.Contains(strings.ToUpper(nc.Raw), "CERTIFICATE_REQUIRED") {
		t.Errorf("refuse-no-cert: %+v; want the server's certificate_required alert", nc)
	}
	if oc := steps["refuse-other-ca"]; oc.Error != "UnavailableError" || oc.GRPCCode != "unavailable" {
		t.Errorf("refuse-other-ca: %+v", oc)
	}
	if rk := steps["refuse-reader-kill"]; rk.Error != "PermissionDeniedError" || rk.GRPCCode != "permission_denied" || rk.StateAfter != "running" ||
		!strings.Contains(rk.Message, "auditor") {
		t.Errorf("refuse-reader-kill: %+v", rk)
	}
	if rm := steps["remove"]; rm.ID != created.ID || rm.Get != "NotFoundError" {
		t.Errorf("remove: %+v", rm)
	}
	if left := strings.TrimSpace(d.ok("ps", "--all", "-q")); left != "" {
		t.Errorf("after the %s acceptance roostd keeps %q", sdk, left)
	}
}
