package containment

import (
	"path/filepath"

	"roost.dev/roost/pkg/workdir"
)

// PrepareWorkSources makes the scope and read_only directories (missing ones are created,
// beneath the workdir and without following links, owned by owner: the session's), checks each resolves beneath the
// workdir with no symlink on its path, and returns the host path to mount for each.
//
// The mount itself happens in the session's new mount namespace, where a descriptor opened
// here cannot be bind-mounted, so the checked path is passed on. What remains is a race with
// something changing the workdir between this check and the mount: the session's own program
// is not running yet, so only another session given the same --workdir could.
func PrepareWorkSources(workdirPath string, scope string, readOnly []string, owner *workdir.Owner) (map[string]string, error) {
	sources := map[string]string{}
	rels := readOnly
	if scope != "" {
		rels = append([]string{scope}, readOnly...)
	}
	for _, rel := range rels {
		if err := workdir.MkdirAll(workdirPath, rel, 0o755, owner); err != nil {
			return nil, err
		}
		f, err := workdir.OpenDir(workdirPath, rel, true)
		if err != nil {
			return nil, err
		}
		f.Close()
		sources[rel] = filepath.Join(workdirPath, filepath.Clean(rel))
	}
	return sources, nil
}
