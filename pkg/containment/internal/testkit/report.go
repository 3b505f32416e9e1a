package testkit

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
	"roost.dev/roost/pkg/containment/roostinit"
)

// ReportRun runs script as a plain session with exec's extra settings (Report among them)
// under init, and returns its exit record and stdout.
func (k *Kit) ReportRun(t *testing.T, init string, s containment.Spec, exec roostinit.ExecSpec) (containment.ExitInfo, string) {
	t.Helper()
	user, err := s.User()
	if err != nil {
		t.Fatal(err)
	}
	exec.Argv, exec.Env, exec.Dir, exec.User = s.Argv, s.Env, s.Dir, user
	p, err := k.NewProcessRuntime(init).StartExec(context.Background(), s, exec, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	info := WaitDone(t, p)
	onDisk, err := containment.ReadExit(s.RecordsDir)
	if err != nil || string(onDisk.Report) != string(info.Report) {
		t.Fatalf("exit.json %+v (%v), Exit() %+v", onDisk, err, info)
	}
	return info, ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile))
}

// FDScript lists the shell's descriptors (ls, a child, reads them from /proc) and
// ROOST_REPORT_FD.
const FDScript = `ls -l /proc/$$/fd/; echo "env=${ROOST_REPORT_FD-unset}"; `

// FDs parses FDScript's output: the descriptor numbers, but those this test process was
// itself handed without close-on-exec (whoever started it leaks them to every descendant,
// roost or not), and the variable.
func FDs(t *testing.T, out string) ([]string, string) {
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
