package roostinit

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
)

// TestExecRefusal: an exec refused under the allowlist says it was shell.allow and what it
// holds; other failures, or no allowlist, add nothing.
func TestExecRefusal(t *testing.T) {
	l := &Landlock{Exec: []string{"ls", "python3"}, ExecTrees: []string{"/usr/lib/git-core"}}
	got := execRefusal(l, fmt.Errorf("exec: %w", syscall.EACCES))
	for _, want := range []string{"refused by shell.allow (not among: ls, python3, /usr/lib/git-core", "filesystem.workdir_exec", "roostctl explain"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q does not say %q", got, want)
		}
	}
	if got := execRefusal(l, syscall.ENOENT); got != "" {
		t.Errorf("ENOENT: %q", got)
	}
	if got := execRefusal(nil, syscall.EACCES); got != "" {
		t.Errorf("no allowlist: %q", got)
	}
}
