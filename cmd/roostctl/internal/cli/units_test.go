package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// --memory takes a size as capsule.yaml writes one and sends it in bytes; one left out sends
// nothing, so the capsule's own applies.
func TestMemoryFlag(t *testing.T) {
	for args, want := range map[string]int64{"--memory 64Mi": 64 << 20, "-m 4G": 4e9, "--memory=1048576": 1 << 20, "": 0} {
		var f stageFlags
		cmd := &cobra.Command{}
		f.register(cmd)
		if err := cmd.ParseFlags(strings.Fields(args)); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		req, err := f.request(t.TempDir())
		if err != nil || req.GetMemoryBytes() != want {
			t.Errorf("%q: memory_bytes %d, %v; want %d", args, req.GetMemoryBytes(), err, want)
		}
	}
	for _, bad := range []string{"64mb", "512m", "1.5Gi", "0", "-1"} {
		var f stageFlags
		cmd := &cobra.Command{}
		f.register(cmd)
		err := cmd.ParseFlags([]string{"--memory", bad})
		if err == nil || !strings.Contains(err.Error(), "--memory") {
			t.Errorf("--memory %s: %v, want an error naming the flag", bad, err)
		}
		if err != nil && bad != "0" && !strings.Contains(err.Error(), "64Mi, 4Gi: powers of 1024; 64M, 4G: powers of 1000") {
			t.Errorf("--memory %s: %v, want the units named", bad, err)
		}
	}
}

// A bad --memory is run's own usage error, 125 (never a code the program could exit with);
// stage's usage errors are 2. A bad set-limit count is a usage error too. None of them
// needs a daemon: they are refused before one is asked; good ones go on to ask it.
func TestUnitsUsageExits(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"run", "--memory", "64mb", "x"}, exitNoLaunch},
		{[]string{"stage", "-m", "4g", "x"}, exitUsage},
		{[]string{"spend", "set-limit", "2Mi"}, exitUsage},
		{[]string{"spend", "set-limit", "2m"}, exitUsage},
		// Read, then refused only for want of a daemon.
		{[]string{"spend", "set-limit", "2M"}, exitUnavailable},
		{[]string{"run", "--memory", "64Mi", "x"}, exitUnavailable},
	} {
		if code := Execute(append(c.args, "--socket", "/nonexistent/roostd.sock")); code != c.code {
			t.Errorf("roostctl %s: exit %d, want %d", strings.Join(c.args, " "), code, c.code)
		}
	}
}

// inspect says the memory limit a session was staged with, and whether its class holds it.
func TestInspectMemoryLimit(t *testing.T) {
	for class, want := range map[string]string{
		"sealed":   "memory limit: 64Mi (67108864 bytes; cgroup memory.max, no swap)\n",
		"advisory": "memory limit: 64Mi (67108864 bytes; recorded, not enforced under advisory)\n",
	} {
		var b bytes.Buffer
		printSession(&b, &roostv1.Session{Id: "ses_x", MemoryLimitBytes: 64 << 20, Containment: &roostv1.ContainmentState{Achieved: class}})
		if !strings.Contains(b.String(), want) {
			t.Errorf("%s: inspect says\n%s\nwant a line %q", class, b.String(), want)
		}
	}
	var b bytes.Buffer
	printSession(&b, &roostv1.Session{Id: "ses_x"})
	if strings.Contains(b.String(), "memory limit") {
		t.Errorf("a session recorded without one shows a memory limit:\n%s", b.String())
	}
}
