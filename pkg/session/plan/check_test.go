package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/toolchain"
)

// TestShellAllowRefused: a shell.allow name that is no program on the session's PATH
// is refused at stage with its field path, the name, where roost looked, and the close
// name it probably meant.
func TestShellAllowRefused(t *testing.T) {
	bin := t.TempDir()
	for _, name := range []string{"python3", "perl", "notes.txt"} {
		mode := os.FileMode(0o755)
		if name == "notes.txt" {
			mode = 0o644
		}
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	tools := toolchain.NewResolver()
	check := func(names []string, floor manifest.Class) error {
		_, err := tools.Resolve(names, bin, "")
		if err != nil {
			err = shellAllowRefused(err, floor)
		}
		return err
	}
	err := check([]string{"perl", "pythn3"}, manifest.Scoped)
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("pythn3: %v", err)
	}
	for _, want := range []string{"capabilities.shell.allow[1]", `"pythn3"`, bin, `did you mean "python3"?`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Only executables are suggested, and nothing far off is.
	if err := check([]string{"notes.tx"}, manifest.Scoped); err == nil || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("notes.tx: %v", err)
	}
	if err := check([]string{"perl", "/bin/sh", "@shell"}, manifest.Sealed); err != nil {
		t.Errorf("names that exist, paths and presets: %v", err)
	}
	// A sealed session's view is said to be the host's /usr.
	if err := check([]string{"nosuchprogram"}, manifest.Sealed); err == nil || !strings.Contains(err.Error(), "sealed root") {
		t.Errorf("sealed: %v", err)
	}
}
