package containment_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/containment/roostinit"
)

// reportRun runs script as a plain session with exec's extra settings (Report among them)
// under init, and returns its exit record and stdout.
func reportRun(t *testing.T, init string, s containment.Spec, exec roostinit.ExecSpec) (containment.ExitInfo, string) {
	t.Helper()
	user, err := containment.SpecUser(s)
	if err != nil {
		t.Fatal(err)
	}
	exec.Argv, exec.Env, exec.Dir, exec.User = s.Argv, s.Env, s.Dir, user
	p, err := containment.StartPlain(kit.NewProcessRuntime(init), context.Background(), s, exec)
	if err != nil {
		t.Fatal(err)
	}
	info := testkit.WaitDone(t, p)
	onDisk, err := containment.ReadExit(s.RecordsDir)
	if err != nil || string(onDisk.Report) != string(info.Report) {
		t.Fatalf("exit.json %+v (%v), Exit() %+v", onDisk, err, info)
	}
	return info, testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile))
}

// fdScript lists the shell's descriptors (ls, a child, reads them from /proc) and
// ROOST_REPORT_FD.
const fdScript = `ls -l /proc/$$/fd/; echo "env=${ROOST_REPORT_FD-unset}"; `

// fds parses fdScript's output: the descriptor numbers, but those this test process was
// itself handed without close-on-exec (whoever started it leaks them to every descendant,
// roost or not), and the variable.
func fds(t *testing.T, out string) ([]string, string) {
	t.Helper()
	inherited := map[string]bool{}
	entries, _ := os.ReadDir("/proc/self/fdinfo")
	for _, e := range entries {
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(info)) {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				if flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64); err == nil && flags&unix.O_CLOEXEC == 0 {
					inherited[e.Name()] = true
				}
			}
		}
	}
	var nums []string
	env := ""
	for line := range strings.Lines(out) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "env="); ok {
			env = v
			continue
		}
		f := strings.Fields(line)
		i := slices.Index(f, "->")
		if i < 1 || i+1 >= len(f) {
			continue
		}
		n := f[i-1]
		if inherited[n] && n != "0" && n != "1" && n != "2" {
			continue
		}
		nums = append(nums, n)
		if n == "3" && !strings.HasPrefix(f[i+1], "pipe:") {
			t.Errorf("descriptor 3 is %s, want the report pipe", f[i+1])
		}
	}
	slices.Sort(nums)
	return nums, env
}

func TestReportLandsInExitRecord(t *testing.T) {
	s := kit.Spec(t, "/bin/sh", "-c", fdScript+`echo '{"status":"crashed", "detail":"wasm trap: wasm `+"`unreachable`"+` instruction executed","backtrace":"0: 0x29 - <unknown>!f"}' >&$ROOST_REPORT_FD; exit 134`)
	// A variable of the session's own never chooses the descriptor.
	s.Env = append(s.Env, "ROOST_REPORT_FD=9")
	info, out := reportRun(t, containment.SelfInit, s, roostinit.ExecSpec{Report: true})
	if info.Code != 134 {
		t.Fatalf("exit %+v", info)
	}
	nums, env := fds(t, out)
	if !slices.Equal(nums, []string{"0", "1", "2", "3"}) || env != "3" {
		t.Fatalf("the program has descriptors %v and ROOST_REPORT_FD=%s; want 0-3 and 3:\n%s", nums, env, out)
	}
	o, ok := info.Outcome()
	if !ok || o.Status != roostinit.OutcomeCrashed || o.Detail != "wasm trap: wasm `unreachable` instruction executed" || o.Backtrace != "0: 0x29 - <unknown>!f" {
		t.Fatalf("report %s -> %+v %v", info.Report, o, ok)
	}
}

func TestReportGarbageDropped(t *testing.T) {
	s := kit.Spec(t, "/bin/sh", "-c", `echo 'not json {' >&$ROOST_REPORT_FD; exit 1`)
	info, _ := reportRun(t, containment.SelfInit, s, roostinit.ExecSpec{Report: true})
	if info.Code != 1 || info.Report != nil {
		t.Fatalf("exit %+v", info)
	}
	if log := testkit.ReadFile(t, filepath.Join(s.RecordsDir, roostinit.InitLogFile)); !strings.Contains(log, "not one JSON object") {
		t.Fatalf("init.log says %q", log)
	}
}

func TestReportNotWritten(t *testing.T) {
	// A descendant keeps the descriptor past the program's end: it is reaped with the
	// session, and the record does not wait for it.
	s := kit.Spec(t, "/bin/sh", "-c", `sleep 300 & exit 0`)
	info, _ := reportRun(t, containment.SelfInit, s, roostinit.ExecSpec{Report: true})
	if info.Code != 0 || info.Report != nil {
		t.Fatalf("exit %+v", info)
	}
}

func TestReportNoDescriptorWithoutReport(t *testing.T) {
	s := kit.Spec(t, "/bin/sh", "-c", fdScript+`exit 0`)
	s.Env = append(s.Env, "ROOST_REPORT_FD=3")
	info, out := reportRun(t, containment.SelfInit, s, roostinit.ExecSpec{})
	nums, env := fds(t, out)
	if info.Code != 0 || info.Report != nil || !slices.Equal(nums, []string{"0", "1", "2"}) || env != "unset" {
		t.Fatalf("exit %+v; the program has descriptors %v and ROOST_REPORT_FD=%s:\n%s", info, nums, env, out)
	}
}
