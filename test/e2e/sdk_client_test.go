package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"roost.dev/roost/internal/testenv"
)

// roost's own SDKs (sdk/typescript, sdk/python) pass their suites: each starts real roostds,
// from the binaries this package built, and drives sessions through the SDK's facade over
// the daemon's socket. A suite that ran no test fails here, as one that failed does.
func TestClientLibraries(t *testing.T) {
	testenv.NeedRoot(t, "the SDKs' suites start roostd")
	root := repoRoot()
	env := append(os.Environ(), "ROOST_BIN="+binDir)

	t.Run("typescript", func(t *testing.T) {
		dir := filepath.Join(root, "sdk", "typescript")
		_, err := os.Stat(filepath.Join(dir, "node_modules", "@connectrpc", "connect-node", "package.json"))
		testenv.Need(t, "sdk/typescript/node_modules (make sdk-clients)", err)
		// npm test compiles the package with tsc, then runs node --test on what it wrote.
		out := runSuite(t, dir, env, "npm", "test")
		pass, fail := suiteCount(out, `(?m)^# pass (\d+)$`), suiteCount(out, `(?m)^# fail (\d+)$`)
		if pass == 0 || fail != 0 {
			t.Fatalf("node --test: %d passed, %d failed:\n%s", pass, fail, out)
		}
	})

	t.Run("python", func(t *testing.T) {
		// Debian's python3, whose grpcio and protobuf make sdk-clients installs: another
		// python3 first on PATH (pyenv's) may lack them.
		py := "/usr/bin/python3"
		testenv.Need(t, "Debian's python3 with grpcio and protobuf (make sdk-clients)", exec.Command(py, "-c", "import grpc, google.protobuf").Run())
		out := runSuite(t, filepath.Join(root, "sdk", "python"), append(env, "PYTHONDONTWRITEBYTECODE=1"), py, "-m", "unittest", "discover", "-v", "-s", "tests")
		if ran := suiteCount(out, `(?m)^Ran (\d+) tests? in `); ran == 0 || !regexp.MustCompile(`(?m)^OK$`).Match(out) {
			t.Fatalf("unittest ran %d tests:\n%s", ran, out)
		}
	})
}

// runSuite runs a test suite's command in dir and fails t with its output unless it exits 0.
func runSuite(t *testing.T, dir string, env []string, argv ...string) []byte {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v in %s: %v:\n%s", argv, dir, err, out.Bytes())
	}
	return out.Bytes()
}

// suiteCount is the number the pattern's first group matches in out; 0 when it does not match.
func suiteCount(out []byte, pattern string) int {
	m := regexp.MustCompile(pattern).FindSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}
