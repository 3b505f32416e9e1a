package session

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/toolchain"
)

// deadlineAbove refuses a requested deadline above the capsule's own (declared, or the
// default when it declares none): --deadline can only lower it.
func deadlineAbove(p manifest.Policy, d time.Duration) error {
	limit := p.Limits.DeadlineSeconds
	if d <= time.Duration(limit.Value)*time.Second {
		return nil
	}
	whose := fmt.Sprintf("the capsule's limits.deadline_seconds (%d s)", limit.Value)
	if limit.Declared == nil {
		whose = fmt.Sprintf("the default deadline (%d s; the capsule declares no limits.deadline_seconds)", limit.Value)
	}
	return fmt.Errorf("--deadline %s is above %s; it can only lower it: %w", d, whose, errdefs.ErrInvalidArgument)
}

// checkShellNames refuses a shell.allow program name that is no executable on path, the
// PATH the session will look on, naming the entry's field path, the name, where it looked
// (for sealed: the sealed root's /usr, which is the host's bound read-only) and, when one
// is within two edits, the executable it probably meant. Presets and absolute paths are
// the toolchain resolver's to check.
//
// Every entry must exist at stage: there is no "checked at exec time" escape for names. A
// program the session installs itself (into its workdir) is not shell.allow's to grant;
// filesystem.workdir_exec puts the workdir on the allowlist for that.
func checkShellNames(entries []string, path string, floor manifest.Class) error {
	if path == "" {
		path = toolchain.DefaultPath
	}
	var names []string // every executable on path, read once when a name is missing
	for i, e := range entries {
		if e == "" || strings.HasPrefix(e, "@") || strings.Contains(e, "/") {
			continue
		}
		if onPath(e, path) {
			continue
		}
		where := "on PATH (" + path + ")"
		if floor == manifest.Sealed {
			where = "on PATH (" + path + ") as the sealed root has it: the host's /usr, bound read-only"
		}
		if names == nil {
			names = executables(path)
		}
		hint := ""
		if near := manifest.Closest(e, names, 2); near != "" {
			hint = fmt.Sprintf("; did you mean %q?", near)
		}
		return fmt.Errorf("capabilities.shell.allow[%d]: %q: not found %s%s (a program the session installs in its workdir needs filesystem.workdir_exec, not shell.allow): %w",
			i, e, where, hint, errdefs.ErrInvalidArgument)
	}
	return nil
}

// onPath reports whether name is an executable regular file in a directory of path, as
// the session's exec will find it.
func onPath(name, path string) bool {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		if info, err := os.Stat(filepath.Join(dir, name)); err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0 {
			return true
		}
	}
	return false
}

// executables lists the names of executable regular files on path, sorted, each once.
func executables(path string) []string {
	seen := map[string]bool{}
	for _, dir := range filepath.SplitList(path) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, ent := range ents {
			if seen[ent.Name()] {
				continue
			}
			if info, err := os.Stat(filepath.Join(dir, ent.Name())); err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0 {
				seen[ent.Name()] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
