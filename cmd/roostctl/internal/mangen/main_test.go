package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"roost.dev/roost/cmd/roostctl/internal/cli"
)

// TestManPages writes the man pages as make man does and checks one per command.
func TestManPages(t *testing.T) {
	dir := t.TempDir()
	if err := WriteManPages(cli.Root(), dir); err != nil {
		t.Fatal(err)
	}
	for _, page := range []string{"roostctl.1", "roostctl-run.1", "roostctl-exec.1", "roostctl-logs.1"} {
		data, err := os.ReadFile(filepath.Join(dir, page))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(data, []byte(".TH \"ROOSTCTL\"")) || !bytes.Contains(data, []byte(".SH SYNOPSIS")) {
			t.Errorf("%s is not a man page:\n%s", page, data)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "roostctl-completion-bash.1")); err != nil {
		t.Errorf("no page for roostctl completion bash: %v", err)
	}
}
