package roostinit

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/landlock-lsm/go-landlock/landlock"
)

// landlockHelperEnv makes the test binary a one-shot helper that restricts itself and
// prints how long that took: a Landlock domain cannot be taken back, so each measurement
// needs a process of its own.
const landlockHelperEnv = "ROOST_TEST_LANDLOCK_HELPER"

// TestLandlockHelper is the helper's body; run normally, it does nothing.
func TestLandlockHelper(t *testing.T) {
	mode := os.Getenv(landlockHelperEnv)
	if mode == "" {
		t.Skip("a helper process for BenchmarkLandlockRestrict")
	}
	runtime.LockOSThread()
	// roost-exec holds a handful of threads when it restricts itself: the Go runtime's.
	for range 4 {
		go func() {
			runtime.LockOSThread()
			select {}
		}()
	}
	time.Sleep(10 * time.Millisecond)
	l := &Landlock{}
	began := time.Now()
	var err error
	switch mode {
	case "thread":
		err = applyLandlock(l, "/usr/bin/true", "/usr/bin")
	case "all":
		// What applyLandlock did before: the same ruleset on every thread, through libpsx.
		var cfg landlock.Config
		var rules []landlock.Rule
		if cfg, rules, err = landlockRules(l, "/usr/bin/true", "/usr/bin"); err == nil {
			err = cfg.Restrict(rules...)
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

// What roost-exec's Landlock step costs on every start with an exec allowlist: its own
// thread only (as it does), and every thread (as it did), each in a fresh process with the
// Go runtime's threads running. The metric is the median restriction, the process aside.
func BenchmarkLandlockRestrict(b *testing.B) {
	for _, mode := range []string{"thread", "all"} {
		b.Run(mode, func(b *testing.B) {
			var took []float64
			for b.Loop() {
				cmd := exec.Command(os.Args[0], "-test.run=^TestLandlockHelper$")
				cmd.Env = append(os.Environ(), landlockHelperEnv+"="+mode)
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
			b.ReportMetric(took[len(took)/2], "restrict-µs")
		})
	}
}
