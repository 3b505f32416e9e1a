#!/usr/bin/env bash
# Compares warm sealed starts from a connected client (bench/apirun: Stage, Launch, Wait of
# /usr/bin/true) between two builds of roost, side by side on this machine: a roostd of each,
# each with its own state dir and --warm-pool, taking turns, N starts each (default 60), each
# start timed only once both pools are full again. Two builds measured one after the other
# see different machines (the page cache, the filesystem's recently deleted inodes, the
# other tenants of the host); taking turns, they see the same one.
#
#   A=/path/to/other/checkout bench/warm_ab.sh        # A against this checkout (B)
#   CHURN=4000 A=... bench/warm_ab.sh                 # first make and delete 4000 files in
#                                                     # each state dir's trees
#
# Each checkout needs `make build` run in it. Run as root.
set -euo pipefail
export LC_ALL=C

N=${N:-60}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
A=${A:?A=checkout: the build to compare this one with (make build run in it)}
B=${B:-$repo}
if [ "$(id -u)" -ne 0 ]; then
	echo "bench/warm_ab.sh: run as root (sealed sessions need it)" >&2
	exit 1
fi
for dir in "$A" "$B"; do
	[ -x "$dir/bin/roostd" ] || {
		echo "bench/warm_ab.sh: $dir/bin/roostd is missing: run make build in $dir" >&2
		exit 1
	}
done

tmp=$(mktemp -d /tmp/roostab.XXXXXX)
chmod 711 "$tmp"
pids=()
cleanup() {
	set +e
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
	# roostd's nosuid,nodev binds of the session trees outlive it by design.
	awk -v d="$tmp/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap - EXIT

mkdir -p "$tmp/cap"
cp "$repo/bench/capsules/true/capsule.yaml" "$tmp/cap/"
(cd "$repo" && go build -o "$tmp/apirun" ./bench/apirun)

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
declare -A metrics
i=0
for side in a b; do
	dir=$A
	[ "$side" = b ] && dir=$B
	mkdir -p "$tmp/$side"
	# Two roostds on one host need id blocks of their own.
	printf 'sessions:\n  ids:\n    first: %d\n    slots: 1000\n' $((0x78000000 + i * 0x4000000)) >"$tmp/$side.yaml"
	metrics[$side]=127.0.0.1:$(free_port)
	"$dir/bin/roostd" --config "$tmp/$side.yaml" --state-dir "$tmp/$side" --socket "$tmp/$side.sock" \
		--warm-pool 2 --metrics-addr "${metrics[$side]}" >"$tmp/$side.log" 2>&1 &
	pids+=($!)
	i=$((i + 1))
done
for side in a b; do
	for _ in $(seq 100); do
		[ -S "$tmp/$side.sock" ] && break
		sleep 0.1
	done
	[ -S "$tmp/$side.sock" ] || { cat "$tmp/$side.log" >&2; exit 1; }
done

if [ -n "${CHURN:-}" ]; then
	python3 - "$tmp" "$CHURN" <<'EOF'
import os, sys
tmp, n = sys.argv[1], int(sys.argv[2])
for side in "ab":
    for sub in ("records", "work", "home", "netns", "cgroups"):
        d = os.path.join(tmp, side, sub)
        if not os.path.isdir(d):
            continue
        for i in range(n):
            os.close(os.open(os.path.join(d, ".churn%d" % i), os.O_CREAT | os.O_WRONLY, 0o600))
        for i in range(n):
            os.unlink(os.path.join(d, ".churn%d" % i))
EOF
fi

# full waits, untimed, until both pools hold their two sandboxes again.
full() {
	local s n
	for s in a b; do
		for _ in $(seq 600); do
			n=$(curl -s "http://${metrics[$s]}/metrics" | awk '/^roost_warm_sandboxes / { print $2 }')
			[ "${n:-0}" -ge 2 ] && break
			sleep 0.05
		done
	done
}
for side in a b; do
	mkfifo "$tmp/$side.in" "$tmp/$side.out"
	"$tmp/apirun" --socket "$tmp/$side.sock" --capsule "$tmp/cap" <"$tmp/$side.in" >"$tmp/$side.out" &
	pids+=($!)
done
exec 7>"$tmp/a.in" 8<"$tmp/a.out" 9>"$tmp/b.in" 6<"$tmp/b.out"
one() { # SIDE: one start, its "total_us id stage_us launch_us wait_us" line
	local line
	if [ "$1" = a ]; then echo >&7; read -r line <&8; else echo >&9; read -r line <&6; fi
	echo "$line"
}
echo "== warm-up (untimed)"
for _ in 1 2 3; do full; one a >/dev/null; full; one b >/dev/null; done
echo "== $N starts each, taking turns"
for k in $(seq "$N"); do
	order="a b"
	[ $((k % 2)) = 0 ] || order="b a"
	for side in $order; do
		full
		echo "$side $(one "$side")" >>"$tmp/res"
	done
done
python3 - "$tmp/res" "$A" "$B" <<'EOF'
import statistics, sys
res, names = {"a": [], "b": []}, {"a": sys.argv[2], "b": sys.argv[3]}
errors = 0
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 6 or f[1] == "error:":
        errors += 1
        continue
    res[f[0]].append([int(f[1]) / 1000] + [int(x) / 1000 for x in f[3:6]])
print(f"{'warm start from a connected client, ms (medians)':<52} {'total':>7} {'p90':>7} {'Stage':>7} {'Launch':>7} {'Wait':>7}")
for side in "ab":
    v = res[side]
    if not v:
        print(f"{side}: no start succeeded")
        continue
    cols = list(zip(*v))
    p90 = sorted(cols[0])[min(len(v) - 1, int(0.9 * len(v)))]
    print(f"{side} {names[side][-50:]:<50} {statistics.median(cols[0]):7.2f} {p90:7.2f} "
          + " ".join(f"{statistics.median(c):7.2f}" for c in cols[1:]))
if errors:
    print(f"{errors} starts failed: see the daemons' logs")
    sys.exit(1)
EOF
