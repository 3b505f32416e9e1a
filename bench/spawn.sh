#!/usr/bin/env bash
# Measures delegation as a capsule sees it, from inside a sealed parent, with curl against
# the parent's own endpoint (in its network namespace):
#   referee round trip  a spawn the envelope refuses: credential check, referee, 403
#   spawn to running    a granted spawn of a sealed child, from the request until the
#                       child's program runs (POST /v1/spawn answers once it does)
# N requests of each (N=200 by default). Run as root from anywhere: bench/spawn.sh
set -euo pipefail
export LC_ALL=C
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
if [ "$(id -u)" -ne 0 ]; then
	echo "bench/spawn.sh: run as root (sealed sessions need it)" >&2
	exit 1
fi
N=${N:-200}

tmp=$(mktemp -d /tmp/roostspawn.XXXXXX)
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
./bin/roostd --state-dir "$tmp/state" --socket "$tmp/s" --metrics-addr "" 2>>"$tmp/roostd.log" &
pid=$!
until ./bin/roostctl version >/dev/null 2>&1; do sleep 0.01; done

mkdir -p "$tmp/child" "$tmp/wide" "$tmp/parent"
cat >"$tmp/child/capsule.yaml" <<'YAML'
name: child
version: 0.1.0
run:
  command: ["/usr/bin/true"]
capabilities:
  containment: sealed
  limits:
    deadline_seconds: 60
YAML
cat >"$tmp/wide/capsule.yaml" <<'YAML'
name: wide
version: 0.1.0
run:
  command: ["/usr/bin/true"]
capabilities:
  containment: sealed
  network:
    allow: [api.example.com]
YAML
cat >"$tmp/parent/capsule.yaml" <<YAML
name: parent
version: 0.1.0
run:
  command:
    - /bin/sh
    - -c
    - |
      auth="Authorization: Bearer \$ROOST_CREDENTIAL"
      for i in \$(seq $N); do
        curl -s -o /dev/null -w '%{time_total}\n' -H "\$auth" -d '{"capsule":"wide","version":"0.1.0"}' "\$ROOST_ENDPOINT/v1/spawn" >> /work/refused
      done
      for i in \$(seq $N); do
        curl -s -o /work/last -w '%{time_total}\n' -H "\$auth" -d '{"capsule":"child","version":"0.1.0"}' "\$ROOST_ENDPOINT/v1/spawn" >> /work/granted
        id=\$(sed -n 's/.*"session_id":"\([^"]*\)".*/\1/p' /work/last)
        curl -s -o /dev/null -X POST -H "\$auth" "\$ROOST_ENDPOINT/v1/children/\$id/wait"
      done
capabilities:
  containment: sealed
  shell:
    allow: [curl, seq, sed]
  spawn:
    allow: [child, wide]
  limits:
    deadline_seconds: 3600
YAML
./bin/roostctl push "$tmp/child" >/dev/null
./bin/roostctl push "$tmp/wide" >/dev/null
work=$tmp/work
./bin/roostctl run --workdir "$work" "$tmp/parent" >/dev/null

# pct FILE P prints the Pth percentile of FILE's seconds, in ms.
pct() { sort -g "$1" | awk -v p="$2" '{ v[NR] = $1 } END { i = int((NR * p + 99) / 100); if (i < 1) i = 1; printf "%.2f", v[i] * 1000 }'; }
printf '%-22s %6s %10s %10s %10s\n' "" n "p50 ms" "p99 ms" "max ms"
for what in refused granted; do
	f=$work/$what
	label="referee round trip"
	[ "$what" = granted ] && label="spawn to running"
	printf '%-22s %6d %10s %10s %10s\n' "$label" "$(wc -l <"$f")" "$(pct "$f" 50)" "$(pct "$f" 99)" "$(pct "$f" 100)"
done
granted=$(./bin/roostctl ps --all --json | grep -c '"name": "child"' || true)
echo "children launched: $granted (of $N granted requests)"
