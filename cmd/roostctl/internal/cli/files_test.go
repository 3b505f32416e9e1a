package cli

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestSessionPath(t *testing.T) {
	for arg, want := range map[string][2]string{"web:out/x": {"web", "out/x"}, "ses_01:": {"ses_01", ""}} {
		if s, p, ok := sessionPath(arg); !ok || s != want[0] || p != want[1] {
			t.Errorf("sessionPath(%q) = %q %q %v", arg, s, p, ok)
		}
	}
	for _, arg := range []string{"./web:x", "/tmp/a:b", "dir/web:x", "plain", ":x"} {
		if _, _, ok := sessionPath(arg); ok {
			t.Errorf("sessionPath(%q) took it for a session's", arg)
		}
	}
}

// What cp extracts stays in its directory, whatever the archive names or links.
func TestExtractTarStaysInside(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	dest := filepath.Join(base, "dest")
	for _, d := range []string{outside, dest} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	archive := func(hs ...*tar.Header) *bytes.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hs {
			if h.Typeflag == tar.TypeReg {
				h.Size = 4
			}
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("EVIL"))
			}
		}
		tw.Close()
		return bytes.NewReader(buf.Bytes())
	}
	if err := extractTar(archive(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}), dest, ""); err == nil {
		t.Error("../escape was extracted")
	}
	err := extractTar(archive(
		&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside},
		&tar.Header{Name: "l/x", Typeflag: tar.TypeReg, Mode: 0o644},
	), dest, "")
	if err == nil {
		t.Error("a file through an archived link was extracted")
	}
	if names, _ := os.ReadDir(outside); len(names) != 0 || fileExists(filepath.Join(base, "escape")) {
		t.Fatalf("written outside: %v", names)
	}
	// The positive control: a file and a link, the link kept as a link.
	if err := extractTar(archive(
		&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o644},
		&tar.Header{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: outside},
	), dest, ""); err != nil {
		t.Fatal(err)
	}
	if l, err := os.Readlink(filepath.Join(dest, "d", "l")); err != nil || l != outside {
		t.Fatalf("d/l: %q %v", l, err)
	}
	if data, _ := os.ReadFile(filepath.Join(dest, "d", "f")); string(data) != "EVIL" {
		t.Fatalf("d/f: %q", data)
	}
	// A name given twice (a tree read while it changed): the later entry wins.
	if err := extractTar(archive(
		&tar.Header{Name: "d/f", Typeflag: tar.TypeSymlink, Linkname: "elsewhere"},
		&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: outside},
	), dest, ""); err != nil {
		t.Fatal(err)
	}
	if l, err := os.Readlink(filepath.Join(dest, "d", "f")); err != nil || l != "elsewhere" {
		t.Fatalf("d/f given again as a link: %q %v", l, err)
	}
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
