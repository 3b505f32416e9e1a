package plan

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"roost.dev/roost/pkg/manifest"
)

// An argument written relative to the current directory that names a file or directory of
// the capsule is that file; one that names nothing there, leads out of it, or is not written
// relative to ./ is left to the program.
func TestCommandCapsuleRelative(t *testing.T) {
	root := t.TempDir()
	capsule := filepath.Join(root, "capsule")
	for _, d := range []string{"bin", "data"} {
		if err := os.MkdirAll(filepath.Join(capsule, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"app.py", "bin/run.sh", "data/in.csv"} {
		if err := os.WriteFile(filepath.Join(capsule, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "secret"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := Command(capsule, manifest.Run{
		Command: []string{"python3", "./app.py", "./data", "../capsule/data/in.csv", "./out.txt", "app.py", "../secret", "--in=./app.py"},
		Args:    []string{"./bin/run.sh"},
	})
	want := []string{"python3", capsule + "/app.py", capsule + "/data", capsule + "/data/in.csv", "./out.txt", "app.py", "../secret", "--in=./app.py", capsule + "/bin/run.sh"}
	if !slices.Equal(got, want) {
		t.Errorf("Command:\n got %q\nwant %q", got, want)
	}
	// The program itself, named with a slash, was the capsule's before; a bare name is PATH's.
	if got := Command(capsule, manifest.Run{Command: []string{"bin/run.sh", "./app.py"}}); got[0] != capsule+"/bin/run.sh" || got[1] != capsule+"/app.py" {
		t.Errorf("Command: %q", got)
	}
}
