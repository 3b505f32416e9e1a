package roostinit

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/landlock-lsm/go-landlock/landlock"
)

// threadsHelperEnv makes the test binary a one-shot helper that takes one of roost-exec's
// steps and prints how long it took: neither a Landlock domain nor a dropped uid can be
// taken back, so each measurement needs a process of its own.
const threadsHelperEnv = "ROOST_TEST_THREADS_HELPER"

// TestThreadsHelper is the helper's body; run normally, it does nothing.
func TestThreadsHelper(t *testing.T) {
	mode := os.Getenv(threadsHelperEnv)
	if mode == "" {
		t.Skip("a helper process for BenchmarkLandlockRestrict and BenchmarkBecomeUser")
	}
	runtime.LockOSThread()
	// roost-exec holds a handful of threads when it takes these steps: the Go runtime's.
	for range 4 {
		go func() {
			runtime.LockOSThread()
			select {}
		}()
	}
	time.Sleep(10 * time.Millisecond)
	l := &Landlock{}
	const id = 61234
	began := time.Now()
	var err error
	switch mode {
	case "landlock-thread":
		_, err = applyLandlock(l, "/usr/bin/true", "/usr/bin")
	case "landlock-all":
		// What applyLandlock did before: the same ruleset on every thread, through libpsx.
		var cfg landlock.Config
		var rules []landlock.Rule
		if cfg, rules, _, err = landlockRules(l, "/usr/bin/true", "/usr/bin"); err == nil {
			err = cfg.Restrict(rules...)
		}
	case "uid-thread":
		err = becomeUser(User{UID: id, GID: id})
	case "uid-all":
		// What becomeUser did before: Go's calls, which switch every thread.
		if err = dropBounding(); err == nil {
			if err = syscall.Setgroups(nil); err == nil {
				if err = syscall.Setresgid(id, id, id); err == nil {
					err = syscall.Setresuid(id, id, id)
				}
			}
		}
	}
	took := time.Since(began)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(took.Microseconds())
	os.Exit(0)
}

// benchHelper runs the helper once per iteration in each mode and reports the median time
// of the step alone, the process aside.
func benchHelper(b *testing.B, modes ...string) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: the helper drops its uid")
	}
	for _, mode := range modes {
		b.Run(mode, func(b *testing.B) {
			var took []float64
			for b.Loop() {
				cmd := exec.Command(os.Args[0], "-test.run=^TestThreadsHelper$")
				cmd.Env = append(os.Environ(), threadsHelperEnv+"="+mode)
				out, err := cmd.Output()
				if err != nil {
					b.Fatalf("helper (%s): %v: %s", mode, err, out)
				}
				us, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
				if err != nil {
					b.Fatalf("helper (%s) printed %q", mode, out)
				}
				took = append(took, us)
			}
			slices.Sort(took)
			b.ReportMetric(took[len(took)/2], "step-µs")
		})
	}
}

// What roost-exec's Landlock step costs on every start with an exec allowlist: on its own
// thread (as it does) and on every thread (as it did).
func BenchmarkLandlockRestrict(b *testing.B) { benchHelper(b, "landlock-thread", "landlock-all") }

// What roost-exec's switch to the session's uid costs on every scoped start: on its own
// thread (as it does) and on every thread (as it did).
func BenchmarkBecomeUser(b *testing.B) { benchHelper(b, "uid-thread", "uid-all") }
