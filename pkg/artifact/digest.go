// Package artifact names capsules by content and keeps pushed ones. DigestDir gives a
// capsule directory the digest a session records as capsule.sha256; a Store keeps immutable
// copies of trees under their digests.
//
// Every tree is read by descriptors, never by path: roostd reads, as root, trees that
// hostile programs own and may rearrange under the walk.
package artifact

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
)

// Bounds on a tree roostd reads, so that a hostile one cannot fill the disk or exhaust
// descriptors: entries below the root, bytes of all regular files, directory nesting.
const (
	MaxFiles       = 100_000
	MaxBytes int64 = 4 << 30
	MaxDepth       = 256
)

type limits struct {
	files int
	bytes int64
	depth int
}

var defaultLimits = limits{files: MaxFiles, bytes: MaxBytes, depth: MaxDepth}

// Like git, a tree keeps of its modes only whether a file is executable: what is stored must
// be readable by unprivileged sessions, and no setuid bit or private mode of the source
// survives into it.
const dirMode = 0o755

func fileMode(mode uint32) uint32 {
	if mode&0o111 != 0 {
		return 0o755
	}
	return 0o644
}

// DigestDir hashes a directory tree: every entry's relative path, type and normalised mode
// (0755 for a directory and an executable file, 0644 for any other file), a file's bytes and
// a symlink's target, in lexical order. Symlinks are hashed as links and never followed, so
// the digest names exactly the tree on disk, and what a Store keeps of it. Anything but
// files, directories and symlinks is refused, and so is a tree over MaxFiles, MaxBytes or
// MaxDepth. The result is "sha256:<hex>".
func DigestDir(dir string) (string, error) {
	root, err := openTree(dir, dir)
	if err != nil {
		return "", err
	}
	defer root.Close()
	t, err := hashTree(root, dir, defaultLimits)
	return t.digest, err
}

// hashTree walks the tree under root, hashing it; label names it in errors.
func hashTree(root *os.File, label string, lim limits) (tree, error) {
	return walkTree(root, nil, label, lim)
}

// walkTree walks the tree under root, hashing it and, when dst is not nil, copying it into
// dst (an empty directory) from the same reads.
func walkTree(root, dst *os.File, label string, lim limits) (tree, error) {
	w := &walker{label: label, lim: lim, h: sha256.New()}
	if err := w.root(root, dst); err != nil {
		return tree{}, err
	}
	w.t.digest = "sha256:" + hex.EncodeToString(w.h.Sum(nil))
	return w.t, nil
}
