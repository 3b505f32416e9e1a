package deploytest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"roost.dev/roost/internal/testenv"
)

// repo is the module's root, from this package's directory.
const repo = "../.."

// binaries are roostd and roost-etcd as this tree builds them: what every manifest's flags
// are checked against, so that a flag renamed or removed in cmd/roostd fails here.
type binaries struct {
	roostd, etcd string
	etcdFlags    map[string]bool
}

func build(t *testing.T) *binaries {
	t.Helper()
	goTool, err := exec.LookPath("go")
	testenv.Need(t, "the go command (to build roostd and roost-etcd)", err)
	dir := t.TempDir()
	b := &binaries{roostd: filepath.Join(dir, "roostd"), etcd: filepath.Join(dir, "roost-etcd")}
	// roost-etcd as make build builds it, so that its build cache serves this one.
	for _, c := range []struct {
		out, pkg string
		env      []string
		flags    []string
	}{
		{b.roostd, "roost.dev/roost/cmd/roostd", nil, nil},
		{b.etcd, "roost.dev/roost/cmd/roost-etcd", []string{"CGO_ENABLED=0"}, []string{"-trimpath", "-ldflags", "-s -w"}},
	} {
		cmd := exec.Command(goTool, append(append([]string{"build"}, c.flags...), "-o", c.out, c.pkg)...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), c.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", c.pkg, err, out)
		}
	}
	help, _ := exec.Command(b.etcd, "--help").CombinedOutput()
	b.etcdFlags = map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+--([a-z0-9-]+)`).FindAllStringSubmatch(string(help), -1) {
		b.etcdFlags[m[1]] = true
	}
	if !b.etcdFlags["initial-cluster"] {
		t.Fatalf("roost-etcd --help lists no --initial-cluster: its usage changed shape:\n%s", help)
	}
	return b
}

// checkRoostdArgs runs roostd with args and --version: roostd parses every flag (names,
// types, the values it checks before it starts) and exits before it opens anything, so an
// unknown flag or a bad value fails as it would at the host's start.
func (b *binaries) checkRoostdArgs(where string, args []string) error {
	cmd := exec.Command(b.roostd, append(append([]string{}, args...), "--version")...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s: %s (%v; the flags: %q)", where, strings.TrimSpace(stderr.String()), err, args)
	}
	if !strings.HasPrefix(string(out), "roostd ") {
		return fmt.Errorf("%s: roostd %q --version printed %q, not its version", where, args, out)
	}
	return nil
}

// flagValue is the value of --name in args (--name=V or --name V), and whether it is there.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// etcdMembers reads deploy/systemd/etcd's environment files, by member name.
func etcdMembers(t *testing.T) map[string]map[string]string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(repo, "deploy/systemd/etcd/*.env"))
	if len(files) == 0 {
		t.Fatal("deploy/systemd/etcd holds no member environment files (*.env)")
	}
	members := map[string]map[string]string{}
	for _, f := range files {
		env, err := readEnvFile(f)
		if err != nil {
			t.Fatal(err)
		}
		members[strings.TrimSuffix(filepath.Base(f), ".env")] = env
	}
	return members
}

func readEnvFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`).MatchString(k) {
			return nil, fmt.Errorf("%s:%d: %q is not NAME=VALUE", path, i+1, line)
		}
		if _, dup := env[k]; dup {
			return nil, fmt.Errorf("%s:%d: %s is set twice", path, i+1, k)
		}
		env[k] = v
	}
	return env, nil
}

// fleetClientURLs are the client URLs the etcd members advertise: what every deployment's
// --fleet-etcd (or fleet.etcd) must list.
func fleetClientURLs(t *testing.T) []string {
	var urls []string
	for _, env := range etcdMembers(t) {
		urls = append(urls, strings.Split(env["ETCD_ADVERTISE_CLIENT_URLS"], ",")...)
	}
	return urls
}

func sameSet(a, b []string) bool {
	seen := map[string]int{}
	for _, x := range a {
		seen[x]++
	}
	for _, x := range b {
		seen[x]--
	}
	for _, n := range seen {
		if n != 0 {
			return false
		}
	}
	return len(a) == len(b)
}
