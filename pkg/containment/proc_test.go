package containment

import (
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A signal arriving while the watch first looks at its pidfd must not read as the process's
// end: roostd would record a live session lost and kill it. The Go runtime's own preemption
// signals make this happen under load; here a storm of them makes it happen at once.
func TestExitWatchIgnoresSignals(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	start, err := StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var storm sync.WaitGroup
	for range 4 {
		storm.Add(1)
		go func() {
			defer storm.Done()
			for {
				select {
				case <-stop:
					return
				default:
					// SIGURG is the runtime's preemption signal: handled, never fatal.
					_ = syscall.Kill(os.Getpid(), syscall.SIGURG)
				}
			}
		}()
	}
	var watches []*ExitWatch
	for range 2000 {
		w, err := WatchExit(cmd.Process.Pid, start)
		if err != nil {
			t.Fatal(err)
		}
		watches = append(watches, w)
	}
	close(stop)
	storm.Wait()
	// Give every watch's first look time to run.
	time.Sleep(200 * time.Millisecond)
	ended := 0
	for _, w := range watches {
		select {
		case <-w.done:
			ended++
		default:
		}
	}
	if ended > 0 {
		t.Fatalf("%d of %d watches of a live process said it had ended", ended, len(watches))
	}

	// And the end itself still arrives, on every watch.
	_ = cmd.Process.Kill()
	for i, w := range watches {
		select {
		case <-w.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("watch %d did not see the process end", i)
		}
	}
}
