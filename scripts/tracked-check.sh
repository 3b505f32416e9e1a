#!/usr/bin/env bash
# scripts/tracked-check.sh: fails, naming each file, when a tracked file outside a testdata/
# directory is an ELF binary or larger than 1 MiB: build outputs belong in bin/, not in git,
# where every clone carries them for ever. It reads what the index holds, not the work tree,
# so a file added and then rebuilt or deleted is still judged by what would be committed.
set -euo pipefail
cd "$(dirname "$0")/.."

limit=$((1 << 20))
bad=0
while IFS= read -r -d '' entry; do
  path=${entry#*$'\t'}
  read -r mode object _ <<<"${entry%%$'\t'*}"
  # A submodule's commit and a symlink's target are not file contents.
  case $mode in 160000 | 120000) continue ;; esac
  case /$path in */testdata/*) continue ;; esac
  size=$(git cat-file -s "$object")
  if [ "$size" -gt "$limit" ]; then
    echo "tracked-check: $path is $size bytes, more than 1 MiB" >&2
    bad=1
  fi
  if [ "$(git cat-file blob "$object" | head -c 4 | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
    echo "tracked-check: $path is an ELF binary" >&2
    bad=1
  fi
done < <(git ls-files -z -s)
[ "$bad" -eq 0 ] || { echo "tracked-check: remove these from git (git rm --cached) or move them under a testdata/ directory" >&2; exit 1; }
