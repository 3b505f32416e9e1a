package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// grpcurlPath is the grpcurl tools/go.mod pins, built into .tools/bin (make tools) when it
// is not there yet.
func grpcurlPath(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(repoRoot())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, ".tools", "bin", "grpcurl")
	if _, err := os.Stat(path); err != nil {
		build := exec.Command("make", "-C", root, path)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building grpcurl (make %s): %v\n%s", path, err, out)
		}
	}
	return path
}

// grpcurl runs grpcurl with flags against socket, then the verb and its arguments; with
// prefix (setpriv ...) in front.
func grpcurl(prefix []string, bin, socket string, flags []string, verb ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	argv := append(append(append(append(slices.Clone(prefix), bin, "-plaintext", "-unix"), flags...), socket), verb...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// The standard gRPC tooling works against roostd: reflection lists every service, the
// health service answers SERVING for the daemon and for each service, and both sit behind
// the control socket's peer check.
func TestOpsGRPCurl(t *testing.T) {
	bin := grpcurlPath(t)
	d := newDaemon(t)

	out, err := grpcurl(nil, bin, d.socket, nil, "list")
	if err != nil {
		t.Fatalf("grpcurl list: %v\n%s", err, out)
	}
	listed := strings.Fields(out)
	for _, want := range []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "roost.v1.ArtifactService", "roost.v1.CapsuleService", "roost.v1.FilesService", "roost.v1.SessionService", "roost.v1.SpendService", "roost.v1.SystemService"} {
		if !slices.Contains(listed, want) {
			t.Errorf("grpcurl list lacks %s:\n%s", want, out)
		}
	}
	if out, err := grpcurl(nil, bin, d.socket, nil, "describe", "roost.v1.SessionService"); err != nil || !strings.Contains(out, "rpc Stage") {
		t.Fatalf("grpcurl describe: %v\n%s", err, out)
	}

	for _, service := range []string{"", "roost.v1.SessionService", "roost.v1.SystemService"} {
		out, err := grpcurl(nil, bin, d.socket, []string{"-d", `{"service":"` + service + `"}`}, "grpc.health.v1.Health/Check")
		if err != nil || !strings.Contains(out, `"status": "SERVING"`) {
			t.Fatalf("health of %q: %v\n%s", service, err, out)
		}
	}
	if out, err := grpcurl(nil, bin, d.socket, []string{"-d", `{"service":"roost.v1.Nothing"}`}, "grpc.health.v1.Health/Check"); err == nil || !strings.Contains(out, "NotFound") {
		t.Fatalf("health of an unknown service: %v\n%s", err, out)
	}

	// Opened to everyone, the socket still serves nothing to a caller the peer check
	// refuses: not health, not reflection.
	if err := os.Chmod(d.socket, 0o666); err != nil {
		t.Fatal(err)
	}
	public := filepath.Join(t.TempDir(), "grpcurl")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(public, data, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Dir(public), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(public)), 0o755)
	nobody := []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}
	for _, args := range [][]string{{"grpc.health.v1.Health/Check"}, {"list"}} {
		out, err := grpcurl(nobody, public, d.socket, nil, args...)
		if err == nil || !strings.Contains(out, "PermissionDenied") || !strings.Contains(out, "uid 65534 is not root") {
			t.Fatalf("grpcurl %v as nobody: %v\n%s", args, err, out)
		}
	}
}
