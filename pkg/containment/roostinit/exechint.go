package roostinit

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// execRefusal explains an exec the kernel refused with EACCES or EPERM while the session's
// exec allowlist (Landlock) holds: Landlock's refusal is a bare EACCES, and "permission
// denied" alone does not say that roost's policy made it, nor what it allows. "" for any
// other failure, or without an allowlist.
func execRefusal(l *Landlock, err error) string {
	if l == nil || !(errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)) {
		return ""
	}
	allowed := append(append([]string{}, l.Exec...), l.ExecTrees...)
	among := "nothing but the program"
	if len(allowed) > 0 {
		among = strings.Join(allowed, ", ")
	}
	msg := fmt.Sprintf("refused by shell.allow (not among: %s; their interpreters are allowed with them)", among)
	if len(l.WritableExec) == 0 {
		msg += "; nothing in a tree the session writes executes (filesystem.workdir_exec)"
	}
	return msg + "; roostctl explain CAPSULE lists what it may read, write and execute"
}
