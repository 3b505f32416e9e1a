// Package artifact names capsules by content. DigestDir gives a capsule directory the
// digest a session records as capsule.sha256.
package artifact

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// DigestDir hashes a directory tree: every entry's relative path, type and permission bits,
// a file's bytes and a symlink's target, in lexical order. Symlinks are hashed as links and
// never followed, so the digest names exactly the tree on disk. The result is "sha256:<hex>".
func DigestDir(dir string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode()
		switch {
		case mode.IsDir():
			fmt.Fprintf(h, "dir %q %o\n", filepath.ToSlash(rel), mode.Perm())
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "symlink %q %q\n", filepath.ToSlash(rel), target)
		case mode.IsRegular():
			fmt.Fprintf(h, "file %q %o %d\n", filepath.ToSlash(rel), mode.Perm(), info.Size())
			if err := hashFile(h, path, info.Size()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: a capsule holds only files, directories and symlinks, not %s", path, mode.Type())
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(w io.Writer, path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDONLY|nofollow, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// Hash exactly the size announced in the header, so a file growing under the walk
	// cannot make two different trees hash alike.
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%s changed while it was being read", path)
	}
	return nil
}
