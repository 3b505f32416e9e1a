package wasmrun

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bytecodealliance/wasmtime-go/v39"
)

// What TestMain builds once for every test: the runner binary, the Go guests and the
// guest's compiled module.
var (
	runnerBin   string // roost-wasm, built from cmd/roost-wasm
	guestWasm   string // testdata/guest, GOOS=wasip1 GOARCH=wasm
	helloWasm   string // testdata/hello
	guestCwasm  string // guestWasm compiled by `roost-wasm compile`
	guestSHA    string // its sha256, as compile printed it
	artifactDir string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "wasmrun-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	artifactDir = dir
	err = buildArtifacts(dir)
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, "building the test guests and runner:", err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func buildArtifacts(dir string) error {
	runnerBin = filepath.Join(dir, "roost-wasm")
	guestWasm = filepath.Join(dir, "guest.wasm")
	helloWasm = filepath.Join(dir, "hello.wasm")
	guestCwasm = filepath.Join(dir, "guest.cwasm")
	builds := []struct {
		out, pkg string
		env      []string
	}{
		{runnerBin, "roost.dev/roost/cmd/roost-wasm", []string{"CGO_ENABLED=1"}},
		{guestWasm, "./testdata/guest", []string{"GOOS=wasip1", "GOARCH=wasm"}},
		{helloWasm, "./testdata/hello", []string{"GOOS=wasip1", "GOARCH=wasm"}},
	}
	errs := make([]error, len(builds))
	var wg sync.WaitGroup
	for i, b := range builds {
		wg.Go(func() {
			cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
			cmd.Env = append(os.Environ(), b.env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	out, err := exec.Command(runnerBin, "compile", "--module", guestWasm, "--out", guestCwasm).Output()
	if err != nil {
		return fmt.Errorf("roost-wasm compile: %v", err)
	}
	guestSHA = strings.TrimSpace(string(out))
	return nil
}

// result is one run of the runner binary.
type result struct {
	code           int
	stdout, stderr string
	// report is what the runner wrote on its report pipe.
	report  string
	elapsed time.Duration
}

// reportOf decodes the run's report; ok is false when it wrote none.
func (r result) reportOf(t *testing.T) (rep Report, ok bool) {
	t.Helper()
	if r.report == "" {
		return Report{}, false
	}
	if err := jsonUnmarshalStrict([]byte(r.report), &rep); err != nil {
		t.Fatalf("report %q: %v", r.report, err)
	}
	return rep, true
}

type runSpec struct {
	stdin string
	// env is the runner's whole environment (nil: just PATH).
	env []string
	// signal, when set, is sent once the guest's stdout has printed signalAfter.
	signal      os.Signal
	signalAfter string
}

// run runs the runner binary with args, a report pipe at descriptor 3 named by
// ROOST_REPORT_FD, and returns how it went.
func run(t *testing.T, spec runSpec, args ...string) result {
	t.Helper()
	cmd := exec.Command(runnerBin, args...)
	cmd.Env = spec.env
	if cmd.Env == nil {
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	}
	cmd.Env = append(cmd.Env, "ROOST_REPORT_FD=3")
	repR, repW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer repR.Close()
	cmd.ExtraFiles = []*os.File{repW}
	cmd.Stdin = strings.NewReader(spec.stdin)
	stdout := &watchedBuffer{want: spec.signalAfter, seen: make(chan struct{})}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	repW.Close()
	repData := make(chan []byte, 1)
	go func() {
		var b bytes.Buffer
		_, _ = b.ReadFrom(repR)
		repData <- b.Bytes()
	}()
	var signalled time.Time
	if spec.signal != nil {
		select {
		case <-stdout.seen:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("the guest never printed %q", spec.signalAfter)
		}
		signalled = time.Now()
		_ = cmd.Process.Signal(spec.signal)
	}
	timer := time.AfterFunc(120*time.Second, func() { _ = cmd.Process.Kill() })
	err = cmd.Wait()
	timer.Stop()
	res := result{stdout: stdout.String(), stderr: stderr.String(), report: string(<-repData), elapsed: time.Since(start)}
	if !signalled.IsZero() {
		res.elapsed = time.Since(signalled)
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr) && exitErr.Exited():
		res.code = exitErr.ExitCode()
	default:
		t.Fatalf("roost-wasm %s: %v\nstderr: %s", strings.Join(args, " "), err, res.stderr)
	}
	return res
}

// watchedBuffer is a stdout that says when want has been written to it.
type watchedBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *watchedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if w.want != "" && strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
}

func (w *watchedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// cached are the flags that run the guest from its compiled module.
func cached() []string {
	return []string{"--module", guestWasm, "--cache", guestCwasm, "--cache-sha256", guestSHA}
}

// guest runs the Go guest (from its compiled module) with extra runner flags and the
// guest's own args.
func guest(t *testing.T, spec runSpec, flags []string, guestArgs ...string) result {
	t.Helper()
	args := append([]string{"run"}, cached()...)
	args = append(args, flags...)
	args = append(append(args, "--"), guestArgs...)
	res := run(t, spec, args...)
	if strings.Contains(res.stderr, "unusable") {
		t.Fatalf("the guest's cache entry was not used: %s", res.stderr)
	}
	return res
}

// watModule writes the module the text wat describes to a file and returns its path.
func watModule(t *testing.T, wat string) string {
	t.Helper()
	wasm, err := wasmtime.Wat2Wasm(wat)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "module.wasm")
	if err := os.WriteFile(path, wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
