package session

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/dirs"
	"roost.dev/roost/pkg/session/plan"
	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
)

// The test binary plays roost-init and roost-exec, as roostd's binary does.
func TestMain(m *testing.M) {
	if containment.RunHelper(os.Args) {
		return
	}
	os.Exit(m.Run())
}

type recorder struct {
	mu        sync.Mutex
	started   int
	failed    int
	recovered []string
	ends      []string // class/status
}

func (r *recorder) SessionStarted(manifest.Class, time.Duration) {
	r.mu.Lock()
	r.started++
	r.mu.Unlock()
}
func (r *recorder) SessionStartFailed(manifest.Class) { r.mu.Lock(); r.failed++; r.mu.Unlock() }
func (r *recorder) SessionRecovered(o string) {
	r.mu.Lock()
	r.recovered = append(r.recovered, o)
	r.mu.Unlock()
}
func (r *recorder) Egress(string, int64, int64) {}
func (r *recorder) SessionEnded(class, status string) {
	r.mu.Lock()
	r.ends = append(r.ends, class+"/"+status)
	r.mu.Unlock()
}

func (r *recorder) endsSeen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ends)
}

// testPool is this package's tests' block of host ids, apart from roostd's and other
// packages' tests', and (by the test process's pid) from another run of the same tests on
// the machine: freeing a range sweeps it, killing what runs on it.
var testPool = store.IDPool{First: 0x20000000 + uint32(os.Getpid()%16)*0x01000000, Slots: 256}

// stateDir is a state directory whose parents let sessions' uids pass, as /var/lib does.
func stateDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

func testConfig(stateDir string, obs *recorder) Config {
	host := containment.Host{Root: os.Geteuid() == 0}
	rt := containment.NewProcessRuntime(containment.SelfInit)
	return Config{
		StateDir:       stateDir,
		Host:           host,
		Catalog:        containment.NewCatalog(host, containment.ErrNoRuntime, containment.ErrNoRuntime),
		Runtimes:       map[manifest.Class]Runtime{manifest.Unconfined: rt, manifest.Advisory: rt},
		Observer:       obs,
		StopGrace:      500 * time.Millisecond,
		GuardInterval:  100 * time.Millisecond,
		HostEnv:        []string{"LANG=C.UTF-8", "SECRET_TOKEN=hunter2", "OTHER=x", "PROXY_URL=http://me:pw@proxy:3128", "TZ=UTC"},
		EnvPassthrough: []string{"LANG", "OTHER", "PROXY_URL", "SECRET_TOKEN"},
		IDs:            testPool,
	}
}

func openManager(t *testing.T, stateDir string) (*Manager, *recorder) {
	t.Helper()
	obs := &recorder{}
	m, err := Open(testConfig(stateDir, obs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, obs
}

// capsule writes a capsule directory with the given run.command and extra manifest text.
func capsule(t *testing.T, command string, extra string) string {
	t.Helper()
	dir := t.TempDir()
	src := "name: test\nversion: 0.1.0\nrun:\n  command: [\"/bin/sh\", \"-c\", " + jsonString(command) + "]\n" + extra
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func run(t *testing.T, m *Manager, opts StageOptions) *store.Record {
	t.Helper()
	rec, err := m.Stage(opts)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err = m.Launch(context.Background(), rec.ID); err != nil {
		t.Fatal(err)
	}
	return rec
}

func waitEnd(t *testing.T, m *Manager, id string) *store.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, err := m.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func logs(t *testing.T, m *Manager, id string) (string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := m.Logs(context.Background(), id, records.LogOptions{}, func(c records.LogChunk) error {
		if c.Stream == records.Stdout {
			out.Write(c.Data)
		} else {
			errOut.Write(c.Data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String()
}

func TestRunToCompletion(t *testing.T) {
	m, obs := openManager(t, stateDir(t))
	dir := capsule(t, `echo "hello $GREETING"; echo oops >&2; echo data > out.txt; env | sort > env.txt`,
		"env:\n  GREETING: world\ncapabilities:\n  env:\n    allow: [LANG, PROXY_URL, TZ]\n")
	rec := run(t, m, StageOptions{Capsule: dir})
	if rec.State != store.Running && rec.State != store.Exited {
		t.Fatalf("state after launch: %s", rec.State)
	}
	rec = waitEnd(t, m, rec.ID)
	if rec.ExitStatus != store.StatusOK || *rec.ExitCode != 0 || rec.Detail != "exited with code 0" {
		t.Fatalf("end: %+v", rec)
	}
	if rec.StartedAt.IsZero() || rec.EndedAt.Before(rec.StartedAt) || rec.Declared != "advisory" || rec.Achieved != "advisory" {
		t.Fatalf("record: %+v", rec)
	}
	if !strings.HasPrefix(rec.Capsule.SHA256, "sha256:") || rec.Capsule.Name != "test" {
		t.Fatalf("capsule: %+v", rec.Capsule)
	}
	stdout, stderr := logs(t, m, rec.ID)
	if stdout != "hello world\n" || stderr != "oops\n" {
		t.Fatalf("logs %q %q", stdout, stderr)
	}
	if data, err := os.ReadFile(filepath.Join(rec.Workdir, "out.txt")); err != nil || string(data) != "data\n" {
		t.Fatalf("workdir output: %q %v", data, err)
	}
	if info, err := os.Stat(rec.Workdir); err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("workdir mode: %v %v", info.Mode(), err)
	}

	envData, _ := os.ReadFile(filepath.Join(rec.Workdir, "env.txt"))
	env := strings.Split(strings.TrimSpace(string(envData)), "\n")
	for _, want := range []string{"LANG=C.UTF-8", "GREETING=world", "ROOST_SESSION_ID=" + rec.ID, "ROOST_CAPSULE=test@0.1.0", "ROOST_CAPSULE_DIR=" + dir, "HOME=" + m.trees.Home(rec.ID)} {
		if !slices.Contains(env, want) {
			t.Errorf("environment lacks %s:\n%s", want, envData)
		}
	}
	for _, kv := range env {
		// OTHER is in the operator's passthrough but not env.allow, TZ the other way round;
		// PROXY_URL is in both but carries a password; SECRET_TOKEN looks like a credential.
		for _, leak := range []string{"SECRET_TOKEN=", "OTHER=", "TZ=", "PROXY_URL="} {
			if strings.HasPrefix(kv, leak) {
				t.Errorf("host variable leaked: %s", kv)
			}
		}
	}

	trace := readTrace(t, rec.RecordsDir)
	if len(trace) != 2 || trace[0]["event_type"] != "session_start" || trace[1]["event_type"] != "session_end" {
		t.Fatalf("trace: %v", trace)
	}
	grants, _ := trace[0]["effective_grants"].(map[string]any)
	if grants == nil || grants["containment"].(map[string]any)["achieved"] != "advisory" {
		t.Fatalf("session_start lacks the effective grants: %v", trace[0])
	}
	if trace[1]["exit_status"] != "ok" {
		t.Fatalf("session_end: %v", trace[1])
	}
	if obs.started != 1 {
		t.Fatalf("observer saw %d starts", obs.started)
	}
}

func readTrace(t *testing.T, dir string) []map[string]any {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, records.TraceFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("trace line %q: %v", sc.Text(), err)
		}
		out = append(out, rec)
	}
	return out
}

func TestExitStatuses(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	cases := []struct {
		command string
		status  store.ExitStatus
		code    int
		detail  string
	}{
		{"exit 3", store.StatusError, 3, "exited with code 3"},
		{"kill -SEGV $$", store.StatusCrashed, 128 + 11, "killed by SIGSEGV"},
		{"ulimit -St 1; while :; do :; done", store.StatusCrashed, 128 + int(syscall.SIGXCPU), "resources.cpu_seconds used up"},
	}
	for _, c := range cases {
		rec := waitEnd(t, m, run(t, m, StageOptions{Capsule: capsule(t, c.command, "")}).ID)
		if rec.ExitStatus != c.status || *rec.ExitCode != c.code || !strings.Contains(rec.Detail, c.detail) {
			t.Errorf("%q: %s %d %q", c.command, rec.ExitStatus, *rec.ExitCode, rec.Detail)
		}
	}
}

func TestStartFailure(t *testing.T) {
	m, obs := openManager(t, stateDir(t))
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, manifest.FileName), []byte("name: t\nversion: 0.1.0\nrun:\n  command: [no-such-program-roost]\n"), 0o644)
	rec := run(t, m, StageOptions{Capsule: dir})
	if rec.State != store.Exited || rec.ExitStatus != store.StatusStartFailed || rec.ExitCode != nil || !strings.Contains(rec.Detail, "no-such-program-roost") {
		t.Fatalf("record: %+v", rec)
	}
	if obs.failed != 1 {
		t.Fatalf("observer saw %d failures", obs.failed)
	}
}

func TestDeadline(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, "sleep 30", "capabilities:\n  limits:\n    deadline_seconds: 1\n")})
	if rec.DeadlineAt.Sub(rec.StartedAt) != time.Second {
		t.Fatalf("deadline_at %v started %v", rec.DeadlineAt, rec.StartedAt)
	}
	rec = waitEnd(t, m, rec.ID)
	if rec.ExitStatus != store.StatusDeadlineReached || *rec.ExitCode != 128+int(syscall.SIGTERM) {
		t.Fatalf("end: %+v", rec)
	}
	// A program that ignores SIGTERM is killed once the grace has passed.
	rec = run(t, m, StageOptions{Capsule: capsule(t, "trap '' TERM; sleep 30", ""), Deadline: time.Second})
	rec = waitEnd(t, m, rec.ID)
	if rec.ExitStatus != store.StatusDeadlineReached || *rec.ExitCode != 128+int(syscall.SIGKILL) {
		t.Fatalf("end: %+v", rec)
	}
}

func TestDeadlineOptionOnlyLowers(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	dir := capsule(t, "true", "capabilities:\n  limits:\n    deadline_seconds: 5\n")
	rec, err := m.Stage(StageOptions{Capsule: dir, Deadline: 2 * time.Second})
	if err != nil || rec.Deadline != 2*time.Second {
		t.Fatalf("deadline %v %v", rec.Deadline, err)
	}
	// One above the capsule's is refused, not ignored (TestDeadlineAboveManifestRefused).
	if _, err := m.Stage(StageOptions{Capsule: dir, Deadline: time.Hour}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("deadline above the capsule's: %v", err)
	}
	if _, err := m.Stage(StageOptions{Capsule: dir, Deadline: 1500 * time.Millisecond}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("fractional deadline: %v", err)
	}
}

func TestStopAndKill(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, "sleep 30", "")})
	stopped, err := m.Stop(context.Background(), rec.ID, 5*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	if stopped.State != store.Exited || stopped.ExitStatus != store.StatusTerminated || *stopped.ExitCode != 143 {
		t.Fatalf("stop: %+v", stopped)
	}
	// Stopping again is harmless; killing an ended session is refused.
	if again, err := m.Stop(context.Background(), rec.ID, time.Second, ""); err != nil || again.ExitStatus != store.StatusTerminated {
		t.Fatalf("second stop: %+v %v", again, err)
	}
	if _, err := m.Kill(context.Background(), rec.ID, syscall.SIGKILL); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("kill of an ended session: %v", err)
	}

	rec = run(t, m, StageOptions{Capsule: capsule(t, "trap '' TERM; sleep 30", "")})
	killed, err := m.Kill(context.Background(), rec.ID, syscall.SIGKILL)
	if err != nil || killed.ExitStatus != store.StatusTerminated || *killed.ExitCode != 137 {
		t.Fatalf("kill: %+v %v", killed, err)
	}

	// A signal the program handles does not end it, and does not make its later end a
	// termination.
	rec = run(t, m, StageOptions{Capsule: capsule(t, "trap 'exit 0' USR1; touch ready; while :; do sleep 0.05; done", "")})
	waitFile(t, filepath.Join(rec.Workdir, "ready"))
	got, err := m.Kill(context.Background(), rec.ID, syscall.SIGUSR1)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.Exited {
		got = waitEnd(t, m, rec.ID)
	}
	if got.ExitStatus != store.StatusOK {
		t.Fatalf("handled signal: %+v", got)
	}

	staged, _ := m.Stage(StageOptions{Capsule: capsule(t, "true", "")})
	if _, err := m.Stop(context.Background(), staged.ID, time.Second, ""); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("stop of a staged session: %v", err)
	}
}

func TestStageRefusals(t *testing.T) {
	state := stateDir(t)
	m, _ := openManager(t, state)
	bad := capsule(t, "true", "capabilities:\n  netwrok: {}\n")
	_, err := m.Stage(StageOptions{Capsule: bad})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "capabilities.netwrok: unknown key") {
		t.Fatalf("misspelt key: %v", err)
	}
	_, err = m.Stage(StageOptions{Capsule: capsule(t, "true", "capabilities:\n  containment: sealed\n")})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `floor "sealed"`) || !strings.Contains(err.Error(), `at most "advisory"`) {
		t.Fatalf("sealed floor: %v", err)
	}
	_, err = m.Stage(StageOptions{Capsule: capsule(t, "true", ""), Containment: manifest.Scoped})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "run --containment") {
		t.Fatalf("scoped by option: %v", err)
	}
	for path, check := range map[string]func(error) bool{
		"relative/path":                    errdefs.IsInvalidArgument,
		"/nonexistent/capsule":             errdefs.IsNotFound,
		t.TempDir():                        errdefs.IsInvalidArgument,
		filepath.Join(bad, "capsule.yaml"): errdefs.IsInvalidArgument,
	} {
		if _, err := m.Stage(StageOptions{Capsule: path}); !check(err) {
			t.Errorf("capsule %q: %v", path, err)
		}
	}
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o644)
	if _, err := m.Stage(StageOptions{Capsule: capsule(t, "true", ""), Workdir: file}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("workdir that is a file: %v", err)
	}
	recs, _ := m.List(true)
	if len(recs) != 0 {
		t.Fatalf("refused stages left %d sessions", len(recs))
	}
	m.reg.View(func(tx *store.Tx) error {
		if tx.LastSeq() != 0 {
			t.Errorf("refused stages left events")
		}
		return nil
	})
}

func TestRemove(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	staged, _ := m.Stage(StageOptions{Capsule: capsule(t, "true", "")})
	if err := m.Remove(staged.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(staged.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("removed session still there: %v", err)
	}

	rec := run(t, m, StageOptions{Capsule: capsule(t, "sleep 30", "")})
	if err := m.Remove(rec.ID); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("remove of a running session: %v", err)
	}
	m.Kill(context.Background(), rec.ID, syscall.SIGKILL)
	if err := m.Remove(rec.ID); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{rec.RecordsDir, rec.Workdir} {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survived rm: %v", dir, err)
		}
	}

	// A workdir the operator named is theirs: rm leaves it.
	mine := filepath.Join(t.TempDir(), "mine")
	rec = run(t, m, StageOptions{Capsule: capsule(t, "echo x > f", ""), Workdir: mine})
	waitEnd(t, m, rec.ID)
	if err := m.Remove(rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mine, "f")); err != nil {
		t.Fatalf("operator's workdir was removed: %v", err)
	}
}

func TestIDPrefix(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec, _ := m.Stage(StageOptions{Capsule: capsule(t, "true", "")})
	got, err := m.Get(rec.ID[:len(rec.ID)-3])
	if err != nil || got.ID != rec.ID {
		t.Fatalf("prefix lookup: %v", err)
	}
	m.Stage(StageOptions{Capsule: capsule(t, "true", "")})
	if _, err := m.Get("ses_"); !errdefs.IsNotFound(err) {
		t.Fatalf("too-short prefix: %v", err)
	}
	if _, err := m.Get(rec.ID[:len("ses_")+4]); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("ambiguous prefix: %v", err)
	}
}

func TestEventsReplayAndFollow(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, "true", "")})
	waitEnd(t, m, rec.ID)
	var got []store.Event
	if err := m.Events(context.Background(), 0, false, func(ev store.Event) error { got = append(got, ev); return nil }); err != nil {
		t.Fatal(err)
	}
	types := []string{}
	for i, ev := range got {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
		types = append(types, ev.Type)
	}
	want := []string{store.EventStaged, store.EventLaunching, store.EventRunning, store.EventExited}
	if !slices.Equal(types, want) {
		t.Fatalf("events %v, want %v", types, want)
	}

	// A follower from the last seen sequence gets exactly what commits next.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	followed := make(chan store.Event, 16)
	go m.Events(ctx, got[len(got)-1].Seq, true, func(ev store.Event) error { followed <- ev; return nil })
	m.Remove(rec.ID)
	select {
	case ev := <-followed:
		if ev.Type != store.EventRemoved || ev.Seq != uint64(len(got)+1) {
			t.Fatalf("followed %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("follower saw nothing")
	}
}

func TestLogsFollow(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, "for i in 1 2 3 4 5; do echo line $i; sleep 0.1; done; echo end >&2", "")})
	var out bytes.Buffer
	err := m.Logs(context.Background(), rec.ID, records.LogOptions{Follow: true}, func(c records.LogChunk) error {
		out.WriteString(c.Stream + ":" + string(c.Data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"line 1", "line 5", "stderr:end\n"} {
		if !strings.Contains(got, want) {
			t.Fatalf("followed logs %q lack %q", got, want)
		}
	}
	final, _ := m.Get(rec.ID)
	if final.State != store.Exited {
		t.Fatalf("logs -f returned before the end: %s", final.State)
	}
}

// A daemon that goes away leaves its sessions running; the next one re-attaches to those
// still running and records the ends of those that finished meanwhile.
func TestRecovery(t *testing.T) {
	state := stateDir(t)
	obs := &recorder{}
	m, err := Open(testConfig(state, obs))
	if err != nil {
		t.Fatal(err)
	}
	// quick must still run when the daemon closes, and end before the next one opens.
	quick := run(t, m, StageOptions{Capsule: capsule(t, "sleep 1; echo done; exit 4", "")})
	slow := run(t, m, StageOptions{Capsule: capsule(t, "trap 'exit 9' TERM; touch ready; while :; do sleep 0.05; done", "")})
	waitFile(t, filepath.Join(slow.Workdir, "ready"))
	lost := run(t, m, StageOptions{Capsule: capsule(t, "sleep 30", "")})
	timed := run(t, m, StageOptions{Capsule: capsule(t, "sleep 30", ""), Deadline: 3 * time.Second})

	// While no daemon runs: quick ends by itself; lost loses its supervisor's records.
	if got, _ := m.Get(quick.ID); got.State == store.Exited {
		t.Fatal("quick ended before the daemon closed; the test needs it running then")
	}
	m.Close()
	// quick ends while no daemon watches: roost-init records its end in exit.json.
	waitFile(t, filepath.Join(quick.RecordsDir, containment.ExitFile))
	os.Remove(filepath.Join(lost.RecordsDir, containment.InitFile))
	syscall.Kill(lost.Process.InitPID, syscall.SIGKILL)
	syscall.Kill(-lost.Process.PID, syscall.SIGKILL)
	// This test process is roost-init's parent (a real daemon that died would not be, and
	// init would be reaped by the host's init): reap it so it is truly gone.
	syscall.Wait4(lost.Process.InitPID, nil, 0, nil)
	os.Remove(filepath.Join(lost.RecordsDir, containment.ExitFile))

	m2, obs2 := openManager(t, state)
	got, _ := m2.Get(quick.ID)
	if got.State != store.Exited || got.ExitStatus != store.StatusError || *got.ExitCode != 4 {
		t.Fatalf("quick after restart: %+v", got)
	}
	if out, _ := logs(t, m2, quick.ID); out != "done\n" {
		t.Fatalf("quick's output: %q", out)
	}
	got, _ = m2.Get(lost.ID)
	if got.State != store.Exited || got.ExitStatus != store.StatusLost || got.Detail == "" {
		t.Fatalf("lost after restart: %+v", got)
	}
	got, _ = m2.Get(slow.ID)
	if got.State != store.Running {
		t.Fatalf("slow after restart: %+v", got)
	}
	stopped, err := m2.Stop(context.Background(), slow.ID, 5*time.Second, "")
	if err != nil || stopped.ExitStatus != store.StatusTerminated || *stopped.ExitCode != 9 {
		t.Fatalf("stop after restart: %+v %v", stopped, err)
	}
	// The deadline is re-armed from its absolute time.
	got = waitEnd(t, m2, timed.ID)
	if got.ExitStatus != store.StatusDeadlineReached {
		t.Fatalf("deadline after restart: %+v", got)
	}
	slices.Sort(obs2.recovered)
	if !slices.Equal(obs2.recovered, []string{RecoveredAttached, RecoveredAttached, RecoveredExited, RecoveredLost}) {
		t.Fatalf("recovery outcomes %v", obs2.recovered)
	}
	// Every transition is in the event log once, in order.
	var seqs []uint64
	m2.Events(context.Background(), 0, false, func(ev store.Event) error { seqs = append(seqs, ev.Seq); return nil })
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("event sequence %v", seqs)
		}
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
	t.Fatalf("%s never appeared", path)
}

func TestSecondManagerRefused(t *testing.T) {
	state := stateDir(t)
	openManager(t, state)
	_, err := Open(testConfig(state, &recorder{}))
	if !errors.Is(err, store.ErrLocked) {
		t.Fatalf("second manager: %v", err)
	}
}

func TestLeftoversSwept(t *testing.T) {
	state := stateDir(t)
	m, _ := openManager(t, state)
	m.Close()
	stray := filepath.Join(state, dirs.RecordsDir, "ses_0123456789abcdef0123456789abcdef")
	keep := filepath.Join(state, dirs.RecordsDir, "not-a-session")
	os.MkdirAll(stray, 0o700)
	os.MkdirAll(keep, 0o700)
	openManager(t, state)
	if _, err := os.Stat(stray); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("leftover records dir survived: %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("a directory roost did not make was removed: %v", err)
	}
}

// A daemon that died after roost-init started but before the session was recorded running
// leaves a launching session; the next daemon finds its program through init.json.
func TestRecoverMidLaunch(t *testing.T) {
	state := stateDir(t)
	m, err := Open(testConfig(state, &recorder{}))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := m.Stage(StageOptions{Capsule: capsule(t, "echo started; sleep 0.5; exit 6", "")})
	if err != nil {
		t.Fatal(err)
	}
	// Do what Launch does, up to the moment it would record the session running.
	if err := m.reg.update(func(tx *store.Tx) error { return tx.Transition(rec, store.Launching) }); err != nil {
		t.Fatal(err)
	}
	if _, err := m.start(context.Background(), &liveSession{ended: make(chan struct{})}, rec, manifest.Advisory, m.cfg.Runtimes[manifest.Advisory], nil); err != nil {
		t.Fatal(err)
	}
	m.Close()

	m2, obs := openManager(t, state)
	got := waitEnd(t, m2, rec.ID)
	if got.ExitStatus != store.StatusError || *got.ExitCode != 6 || got.StartedAt.IsZero() {
		t.Fatalf("after recovery: %+v", got)
	}
	if len(obs.recovered) != 1 || (obs.recovered[0] != RecoveredAttached && obs.recovered[0] != RecoveredExited) {
		t.Fatalf("recovery outcome %v", obs.recovered)
	}
	var types []string
	m2.Events(context.Background(), 0, false, func(ev store.Event) error { types = append(types, ev.Type); return nil })
	if !slices.Equal(types, []string{store.EventStaged, store.EventLaunching, store.EventRunning, store.EventRecovered, store.EventExited}) && !slices.Equal(types, []string{store.EventStaged, store.EventLaunching, store.EventExited, store.EventRecovered}) {
		t.Fatalf("events %v", types)
	}
}

func TestWorkdirGuard(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, "head -c 3000000 /dev/urandom > big; sleep 30",
		"capabilities:\n  resources:\n    workdir_max_bytes: 1048576\n")})
	rec = waitEnd(t, m, rec.ID)
	if rec.ExitStatus != store.StatusTerminated || !strings.Contains(rec.Detail, "past resources.workdir_max_bytes (1048576)") {
		t.Fatalf("end: %s %q", rec.ExitStatus, rec.Detail)
	}
	// A symlink to a large tree is not the workdir's size.
	rec = run(t, m, StageOptions{Capsule: capsule(t, "ln -s /usr big; sleep 0.5",
		"capabilities:\n  resources:\n    workdir_max_bytes: 1048576\n")})
	if rec = waitEnd(t, m, rec.ID); rec.ExitStatus != store.StatusOK {
		t.Fatalf("a symlink counted as its target: %s %q", rec.ExitStatus, rec.Detail)
	}
}

// explain says, variable by variable, what of roostd's environment reaches a session and
// why, and who the session would run as.
func TestExplainEnvAndIdentity(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	dir := capsule(t, "true", "capabilities:\n  env:\n    allow: [LANG, PROXY_URL, TZ, HOSTNAME]\n")
	e, _, err := m.Explain(StageOptions{Capsule: dir}, false)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, v := range e.GetEnv() {
		got[v.GetName()] = v.GetVerdict()
		if v.GetReason() == "" {
			t.Errorf("%s: no reason", v.GetName())
		}
	}
	want := map[string]string{"LANG": plan.EnvPasses, "PROXY_URL": plan.EnvCredentialValue, "TZ": plan.EnvNotInPassthrough, "HOSTNAME": plan.EnvNotInPassthrough}
	if !maps.Equal(got, want) {
		t.Fatalf("env verdicts %v, want %v", got, want)
	}
	if id := e.GetIdentity(); id.GetHostRoot() || id.GetSize() != idsPerSession {
		t.Fatalf("identity %v", id)
	}
	if len(e.GetReadable()) == 0 {
		t.Fatal("explain lists nothing readable")
	}
}

// Every session holds a uid range of its own from stage until it is removed, none shared by
// two sessions; a capsule the operator names in allow_root runs as host root instead.
func TestIDRanges(t *testing.T) {
	state := stateDir(t)
	obs := &recorder{}
	cfg := testConfig(state, obs)
	cfg.IDs = store.IDPool{First: testPool.First, Slots: 3}
	cfg.AllowRoot = []string{"rooted"}
	m, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	dir := capsule(t, "id -u > uid.txt", "")
	a, err := m.Stage(StageOptions{Capsule: dir})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Stage(StageOptions{Capsule: dir})
	if err != nil {
		t.Fatal(err)
	}
	if a.IDs == nil || b.IDs == nil || a.IDs.First == b.IDs.First || a.IDs.First == cfg.IDs.First || b.IDs.First == cfg.IDs.First {
		t.Fatalf("ranges %+v %+v (the pool's first is the daemon's)", a.IDs, b.IDs)
	}
	// Two slots for sessions: the third is refused, and says what to do.
	if _, err := m.Stage(StageOptions{Capsule: dir}); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "roostctl rm") {
		t.Fatalf("third stage: %v", err)
	}
	// Removing a session frees its range for the next.
	if err := m.Remove(a.ID); err != nil {
		t.Fatal(err)
	}
	c, err := m.Stage(StageOptions{Capsule: dir})
	if err != nil || c.IDs == nil || c.IDs.First != a.IDs.First {
		t.Fatalf("after rm: %+v %v", c, err)
	}
	// The range outlives a restart: held ranges come from the registry.
	m.Close()
	if m, err = Open(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Stage(StageOptions{Capsule: dir}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("after restart, a held range was handed out again: %v", err)
	}
	c, err = m.Launch(context.Background(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	c = waitEnd(t, m, c.ID)
	if data, err := os.ReadFile(filepath.Join(c.Workdir, "uid.txt")); err != nil || strings.TrimSpace(string(data)) != fmt.Sprint(c.IDs.First) {
		t.Fatalf("the program ran as uid %q (%v), want %d", data, err, c.IDs.First)
	}
	if st, err := os.Stat(filepath.Join(c.Workdir, "uid.txt")); err != nil || st.Sys().(*syscall.Stat_t).Uid != c.IDs.First {
		t.Fatalf("its file is not its uid's on the host: %v", err)
	}
	rooted := filepath.Join(t.TempDir(), "rooted")
	os.Mkdir(rooted, 0o755)
	os.WriteFile(filepath.Join(rooted, manifest.FileName), []byte("name: rooted\nversion: 0.1.0\nrun:\n  command: [/bin/sh, -c, 'id -u > uid.txt']\n"), 0o644)
	r := run(t, m, StageOptions{Capsule: rooted})
	r = waitEnd(t, m, r.ID)
	if !r.HostRoot || r.IDs != nil {
		t.Fatalf("allow_root capsule: %+v", r)
	}
	if data, _ := os.ReadFile(filepath.Join(r.Workdir, "uid.txt")); strings.TrimSpace(string(data)) != "0" {
		t.Fatalf("an allow_root session ran as %q", data)
	}
}

// An operator's workdir is lent to the session (what its owner owns becomes the session's)
// and handed back when the session is removed; a file with several links, which may be
// somebody else's too, is never re-owned.
func TestOperatorWorkdirLentAndReturned(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	work := filepath.Join(stateDir(t), "project")
	os.Mkdir(work, 0o755)
	os.Chown(work, 4321, 4321)
	os.WriteFile(filepath.Join(work, "mine.txt"), []byte("x"), 0o644)
	os.Chown(filepath.Join(work, "mine.txt"), 4321, 4321)
	outside := filepath.Join(t.TempDir(), "outside")
	os.WriteFile(outside, []byte("not yours"), 0o644)
	if err := os.Link(outside, filepath.Join(work, "linked")); err != nil {
		t.Fatal(err)
	}
	dir := capsule(t, "echo new > made.txt && echo more >> mine.txt", "")
	rec := run(t, m, StageOptions{Capsule: dir, Workdir: work})
	rec = waitEnd(t, m, rec.ID)
	if rec.ExitStatus != store.StatusOK {
		t.Fatalf("end: %+v", rec)
	}
	owner := func(p string) uint32 {
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		return st.Sys().(*syscall.Stat_t).Uid
	}
	if owner(filepath.Join(work, "made.txt")) != rec.IDs.First || owner(filepath.Join(work, "mine.txt")) != rec.IDs.First {
		t.Fatal("the session's files are not its uid's")
	}
	if owner(outside) != 0 {
		t.Fatal("a file with another link was re-owned")
	}
	if err := m.Remove(rec.ID); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"", "made.txt", "mine.txt"} {
		if got := owner(filepath.Join(work, f)); got != 4321 {
			t.Errorf("%s is uid %d after rm, want the operator's 4321", filepath.Join(work, f), got)
		}
	}
}

// filesystem.host_read names only trees roostd offers (sessions.host_paths), refused at stage
// otherwise, and the refusal says what is offered.
func TestHostReadOffered(t *testing.T) {
	state := stateDir(t)
	cfg := testConfig(state, &recorder{})
	offered := t.TempDir()
	os.MkdirAll(filepath.Join(offered, "rust"), 0o755)
	cfg.HostPaths = []string{offered}
	m, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ok := capsule(t, "true", "capabilities:\n  filesystem:\n    host_read: ["+filepath.Join(offered, "rust")+"]\n")
	if _, err := m.Stage(StageOptions{Capsule: ok}); err != nil {
		t.Fatalf("a tree beneath an offered one: %v", err)
	}
	no := capsule(t, "true", "capabilities:\n  filesystem:\n    host_read: [/etc]\n")
	if _, err := m.Stage(StageOptions{Capsule: no}); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "host_read[0]: /etc") || !strings.Contains(err.Error(), offered) {
		t.Fatalf("a tree not offered: %v", err)
	}
	missing := capsule(t, "true", "capabilities:\n  filesystem:\n    host_read: ["+filepath.Join(offered, "gone")+"]\n")
	if _, err := m.Stage(StageOptions{Capsule: missing}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("a tree this host lacks: %v", err)
	}
}

// roostd never takes over a directory others write in: --state-dir /tmp would otherwise
// lock every other user out of /tmp.
func TestStateDirSharedRefused(t *testing.T) {
	shared := t.TempDir()
	if err := os.Chmod(shared, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	err := dirs.Prepare(shared)
	if err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Fatalf("PrepareStateDir of a 1777 directory: %v", err)
	}
	if info, _ := os.Stat(shared); info.Mode().Perm() != 0o777 || info.Mode()&os.ModeSticky == 0 {
		t.Fatalf("the shared directory's mode changed to %s", info.Mode())
	}
}

// The record holds uid ranges for sandboxes by the prefix of their ids; the sealed runtime
// names them with it.
func TestSandboxPrefix(t *testing.T) {
	if store.SandboxPrefix != sealed.WarmPrefix {
		t.Fatalf("store.SandboxPrefix %q, sealed.WarmPrefix %q", store.SandboxPrefix, sealed.WarmPrefix)
	}
}
