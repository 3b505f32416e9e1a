#!/usr/bin/env bash
# Measures what a restart costs with sessions running: for N sealed sessions (N=50 and 200 by
# default; COUNTS="10 50" to override), the time from starting roostd to it serving with
# every session re-attached, and roostd's resident memory per running session.
# Run as root from anywhere: bench/recovery.sh
set -euo pipefail
export LC_ALL=C
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
if [ "$(id -u)" -ne 0 ]; then
	echo "bench/recovery.sh: run as root (sealed sessions need it)" >&2
	exit 1
fi
COUNTS=${COUNTS:-"50 200"}

tmp=$(mktemp -d /tmp/roostrecovery.XXXXXX)
# Sessions run as unprivileged uids that pass through here to their workdirs.
chmod 711 "$tmp"
pid=
cleanup() {
	set +e
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		for id in $(ROOST_SOCKET=$tmp/s ./bin/roostctl ps -q 2>/dev/null); do
			ROOST_SOCKET=$tmp/s ./bin/roostctl kill "$id" >/dev/null 2>&1
		done
		kill -TERM "$pid"
		wait "$pid" 2>/dev/null
	fi
	# roostd's nosuid,nodev binds of the session trees outlive it by design.
	awk -v d="$tmp/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

make build >/dev/null
export ROOST_SOCKET=$tmp/s
capsule=$tmp/capsule
mkdir -p "$capsule"
cat >"$capsule/capsule.yaml" <<'YAML'
name: idle
version: 0.1.0
run:
  command: ["/usr/bin/sleep", "3600"]
capabilities:
  containment: sealed
YAML

# serve STATE-DIR starts roostd and sets served to the ms from start until it answers;
# recovery happens before it serves. (Not a $(...): the daemon would hold its pipe open.)
serve() {
	local t0=$EPOCHREALTIME
	./bin/roostd --state-dir "$1" --socket "$tmp/s" --metrics-addr "" >/dev/null 2>>"$tmp/roostd.log" &
	pid=$!
	until ./bin/roostctl version >/dev/null 2>&1; do sleep 0.005; done
	local t1=$EPOCHREALTIME
	served=$(((${t1/./} - ${t0/./}) / 1000))
}

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

printf '%-10s %-22s %-22s %-22s\n' sessions "restart to serving" "roostd RSS" "RSS per session"
for n in $COUNTS; do
	state=$tmp/state-$n
	serve "$state"
	base=$served
	sleep 0.5
	rss0=$(rss_kb "$pid")
	for _ in $(seq "$n"); do ./bin/roostctl run --detach "$capsule" >/dev/null; done
	sleep 1
	rss1=$(rss_kb "$pid")
	running=$(./bin/roostctl ps -q | wc -l)
	[ "$running" -eq "$n" ] || { echo "only $running of $n sessions running" >&2; exit 1; }
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null || true
	serve "$state"
	ms=$served
	attached=$(./bin/roostctl ps --json | grep -c '"state": "running"')
	[ "$attached" -eq "$n" ] || { echo "only $attached of $n sessions re-attached" >&2; exit 1; }
	printf '%-10s %-22s %-22s %-22s\n' "$n" "${ms} ms (empty: ${base} ms)" "$((rss1 / 1024)) MiB (idle $((rss0 / 1024)) MiB)" "$(((rss1 - rss0) / n)) KiB"
	for id in $(./bin/roostctl ps -q); do ./bin/roostctl kill "$id" >/dev/null; done
	kill -TERM "$pid"
	wait "$pid" 2>/dev/null || true
	pid=
done
