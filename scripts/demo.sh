#!/usr/bin/env bash
# Runs roostd on a temporary state directory and walks through the example capsules with
# roostctl. Everything it starts is stopped and removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

state=$(mktemp -d "${TMPDIR:-/tmp}/roost-demo.XXXXXX")
socket=$state/roostd.sock
export ROOST_SOCKET=$socket
daemon=""
cleanup() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    for id in $(./bin/roostctl ps -q 2>/dev/null); do ./bin/roostctl kill "$id" >/dev/null 2>&1 || true; done
    kill -TERM "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  # roostd's nosuid,nodev binds of the session trees outlive it by design.
  awk -v d="$state/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT

start_daemon() {
  # Two sealed sandboxes kept made ahead: the sealed examples below start warm.
  ./bin/roostd --state-dir "$state" --socket "$socket" --metrics-addr 127.0.0.1:0 --warm-pool 2 2>>"$state/roostd.log" &
  daemon=$!
  for _ in $(seq 100); do
    ./bin/roostctl version >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "roostd did not start:" >&2
  cat "$state/roostd.log" >&2
  exit 1
}

step() {
  printf '\n\033[1m$ %s\033[0m\n' "$*"
  "$@"
}

# expect CODE CMD...: run a command that is meant to exit with CODE.
expect() {
  local want=$1; shift
  printf '\n\033[1m$ %s\033[0m\n' "$*"
  set +e
  "$@"
  local got=$?
  set -e
  echo "(exit code $got)"
  if [ "$got" -ne "$want" ]; then
    echo "demo: expected exit code $want" >&2
    exit 1
  fi
}

echo "roostd state directory: $state"
start_daemon

step ./bin/roostctl doctor
step ./bin/roostctl explain examples/sealed
expect 0 ./bin/roostctl run examples/hello
expect 0 ./bin/roostctl run examples/limits
expect 3 ./bin/roostctl run examples/countdown
expect 124 ./bin/roostctl run examples/deadline

typo=$state/typo
mkdir -p "$typo"
printf 'name: typo\nversion: 0.1.0\nrun:\n  command: [/bin/true]\ncapabilities:\n  netwrok:\n    allow: [example.com]\n' >"$typo/capsule.yaml"
expect 125 ./bin/roostctl run "$typo"
compile=$state/compile
mkdir -p "$compile"
printf 'name: compile\nversion: 0.1.0\nrun:\n  command: [/bin/sh, -c, "cp /bin/sh /work/mysh && /work/mysh -c \\"echo a program the session wrote runs, and the sealed root still holds it\\""]\ncapabilities:\n  containment: sealed\n  filesystem:\n    workdir_exec: true\n  shell:\n    allow: [cp]\n' >"$compile/capsule.yaml"
expect 0 ./bin/roostctl run "$compile"
expect 0 ./bin/roostctl run examples/sealed
step ./bin/roostctl ps --all --filter capsule=sealed --format '{{short .id}} {{.capsule.name}} warm={{.warm}}'

echo
echo "Delegation: a sealed parent spawns a pushed child through its own endpoint:"
step ./bin/roostctl push examples/worker
expect 0 ./bin/roostctl run examples/delegate
step ./bin/roostctl ps --all --tree

echo
echo "Spend: a capsule reserves and settles tokens under its max_session_tokens of 1000:"
expect 0 ./bin/roostctl run examples/spend
step ./bin/roostctl spend

id=$(./bin/roostctl run --detach examples/deadline)
echo "started $id in the background"
step ./bin/roostctl stop --grace 5s "$id"
step ./bin/roostctl ps --all

echo
echo "Killing roostd with SIGKILL while a session runs, then starting it again:"
running=$(./bin/roostctl run --detach examples/countdown)
before=$(./bin/roostctl events --json | wc -l)
kill -KILL "$daemon"
wait "$daemon" 2>/dev/null || true
sleep 2
start_daemon
after=$(./bin/roostctl events --json | wc -l)
echo "events before the kill: $before; after the restart: $after (the countdown's end was recorded by the new daemon)"
expect 3 ./bin/roostctl wait "$running"
step ./bin/roostctl logs "$running"
step ./bin/roostctl events --since "$((before - 2))"

metrics=$(sed -n 's/.*msg="serving metrics" addr=\([^ ]*\).*/\1/p' "$state/roostd.log" | tail -1)
printf '\n\033[1m$ curl -s http://%s/metrics | grep ^roost_sessions\033[0m\n' "$metrics"
if command -v curl >/dev/null; then
  curl -s "http://$metrics/metrics" | grep '^roost_sessions'
else
  echo "(curl is not installed; skipping)"
fi
echo
echo "demo finished"
