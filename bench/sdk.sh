#!/usr/bin/env bash
# Times the SDKs against roostctl and a plain Go gRPC client: a session's round trip
# (create, exec of `true`, remove) through @roost/sdk (sdk/typescript/bench/roundtrip.ts)
# and the roost Python package (sdk/python/bench/roundtrip.py), each one client that stays
# connected, over roostd's mTLS listener and over its unix socket; through bench/apirun
# --exec (Go, the same three steps); and through roostctl, a new process for each of run -d,
# exec and rm -f. A sealed session, cold (one roostd) and warm (a second with --warm-pool
# $WARM_POOL, default 4), and an advisory one (cold: no class but sealed starts warm). N
# round trips per path (default 30), interleaved, p50 and p99 (nearest rank: with N=30 the
# p99 is the slowest). Then WriteFile and ReadFile of 1 MiB and 100 MiB through each SDK and
# apirun, over mTLS and the socket, FILE_RUNS times each (default 5): p50 ms and MiB/s.
# Run as root from anywhere: bench/sdk.sh, or N=100 bench/sdk.sh.
set -euo pipefail
export LC_ALL=C

N=${N:-30}
WARM_POOL=${WARM_POOL:-4}
FILE_RUNS=${FILE_RUNS:-5}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
export PATH=/usr/local/go/bin:$PATH

if [ "$(id -u)" -ne 0 ]; then
	echo "bench/sdk.sh: run as root (sealed sessions need it)" >&2
	exit 1
fi
if [ ! -d sdk/typescript/node_modules ]; then
	echo "bench/sdk.sh: sdk/typescript/node_modules is missing: run make sdk-clients" >&2
	exit 1
fi
# Debian's grpcio and protobuf, which make sdk-clients installs, are the Python SDK's.
py=/usr/bin/python3
if ! "$py" -c 'import grpc, google.protobuf' 2>/dev/null; then
	echo "bench/sdk.sh: $py cannot import grpc and google.protobuf: run make sdk-clients" >&2
	exit 1
fi

tmp=$(mktemp -d /tmp/roostbench.XXXXXX)
# Sessions run as unprivileged uids that pass through here to their workdirs.
chmod 711 "$tmp"
roostd_pid=
warmd_pid=
client_pids=()
cleanup() {
	set +e
	# A client reads its stdin's end, removes its files session and exits.
	for fd in "${client_fds[@]:-}"; do
		[ -n "$fd" ] && exec {fd}>&-
	done
	for pid in "${client_pids[@]:-}"; do
		[ -n "$pid" ] && wait "$pid" 2>/dev/null
	done
	for pid in $roostd_pid $warmd_pid; do
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	# roostd's nosuid,nodev binds of the session trees outlive it by design.
	awk -v d="$tmp/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== building"
make build >/dev/null
go build -o "$tmp/apirun" ./bench/apirun
(cd sdk/typescript && npm run --silent build)

# The capsule: a sealed session that waits, whose allowlist lets exec run true.
for class in sealed advisory; do
	mkdir -p "$tmp/capsule-$class"
	cat >"$tmp/capsule-$class/capsule.yaml" <<EOF
name: bench-rt-$class
version: 0.1.0
run:
  command: [sleep, "3600"]
capabilities:
  containment: $class
  shell:
    allow: [sleep, "true"]
EOF
done

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
./bin/roostctl certs init "$tmp/certs" --client sdk >/dev/null
cold_port=$(free_port)
warm_port=$(free_port)
# Each roostd on a host holds a block of ids of its own (it sweeps what it frees): the two
# split the default block.
config() { # FIRST SLOTS PORT
	printf 'sessions:\n  ids:\n    first: %d\n    slots: %d\n' "$1" "$2"
	printf 'remote:\n  listen: 127.0.0.1:%d\n  tls_cert: %s\n  tls_key: %s\n  client_ca: %s\n  clients:\n    - {common_name: sdk, role: operator}\n' \
		"$3" "$tmp/certs/server.pem" "$tmp/certs/server-key.pem" "$tmp/certs/ca.pem"
}
config $((0x70000000)) 2048 "$cold_port" >"$tmp/cold.yaml"
config $((0x78000000)) 2046 "$warm_port" >"$tmp/warm.yaml"

echo "== starting roostd, and a second one with --warm-pool $WARM_POOL, each with its mTLS listener"
mkdir -p "$tmp/state" "$tmp/warm"
./bin/roostd --config "$tmp/cold.yaml" --state-dir "$tmp/state" --socket "$tmp/s" --metrics-addr "" >"$tmp/roostd.log" 2>&1 &
roostd_pid=$!
# The warm daemon's /metrics says how many sandboxes wait (see settle).
warm_metrics=127.0.0.1:$(free_port)
./bin/roostd --config "$tmp/warm.yaml" --state-dir "$tmp/warm" --socket "$tmp/sw" --metrics-addr "$warm_metrics" --warm-pool "$WARM_POOL" >"$tmp/warmd.log" 2>&1 &
warmd_pid=$!
for _ in $(seq 100); do
	ROOST_SOCKET=$tmp/s ./bin/roostctl version >/dev/null 2>&1 && ROOST_SOCKET=$tmp/sw ./bin/roostctl version >/dev/null 2>&1 && break
	kill -0 "$roostd_pid" 2>/dev/null || { cat "$tmp/roostd.log" >&2; exit 1; }
	kill -0 "$warmd_pid" 2>/dev/null || { cat "$tmp/warmd.log" >&2; exit 1; }
	sleep 0.1
done
doctor=$(ROOST_SOCKET=$tmp/s ./bin/roostctl doctor)
if ! grep -q '^sealed  *yes' <<<"$doctor"; then
	echo "$doctor" >&2
	echo "bench/sdk.sh: roostd cannot run sealed sessions on this host" >&2
	exit 1
fi
# Every path creates sessions of the same pushed capsules, by name@version, as a remote
# client must (a path names a directory on roostd's host).
for sock in "$tmp/s" "$tmp/sw"; do
	for class in sealed advisory; do
		ROOST_SOCKET=$sock ./bin/roostctl push "$tmp/capsule-$class" >/dev/null
	done
done
sealed=bench-rt-sealed@0.1.0
advisory=bench-rt-advisory@0.1.0

# Each client reads a line per measurement on a FIFO and writes its result to another;
# client_in[NAME] and client_out[NAME] are this shell's ends of them.
declare -A client_in client_out
client_fds=()
start_client() { # NAME COMMAND...
	local name=$1 in out
	shift
	mkfifo "$tmp/$name.in" "$tmp/$name.out"
	"$@" <"$tmp/$name.in" >"$tmp/$name.out" 2>"$tmp/$name.err" &
	client_pids+=($!)
	exec {in}>"$tmp/$name.in" {out}<"$tmp/$name.out"
	client_in[$name]=$in
	client_out[$name]=$out
	client_fds+=("$in")
}
tls_args() { # PORT
	echo --server "127.0.0.1:$1" --ca "$tmp/certs/ca.pem" --cert "$tmp/certs/client.pem" --key "$tmp/certs/client-key.pem"
}
ts=(node sdk/typescript/dist/bench/roundtrip.js)
pyc=(env PYTHONPATH=sdk/python "$py" sdk/python/bench/roundtrip.py)
# shellcheck disable=SC2046 # tls_args is words by design
{
	start_client ts-tls-cold "${ts[@]}" $(tls_args "$cold_port") --capsule "$sealed"
	start_client ts-tls-warm "${ts[@]}" $(tls_args "$warm_port") --capsule "$sealed"
	start_client ts-tls-adv "${ts[@]}" $(tls_args "$cold_port") --capsule "$advisory"
	start_client ts-sock-cold "${ts[@]}" --socket "$tmp/s" --capsule "$sealed"
	start_client ts-sock-warm "${ts[@]}" --socket "$tmp/sw" --capsule "$sealed"
	start_client ts-sock-adv "${ts[@]}" --socket "$tmp/s" --capsule "$advisory"
	start_client py-tls-cold "${pyc[@]}" $(tls_args "$cold_port") --capsule "$sealed"
	start_client py-tls-warm "${pyc[@]}" $(tls_args "$warm_port") --capsule "$sealed"
	start_client py-sock-cold "${pyc[@]}" --socket "$tmp/s" --capsule "$sealed"
	start_client py-sock-warm "${pyc[@]}" --socket "$tmp/sw" --capsule "$sealed"
	start_client go-tls-cold "$tmp/apirun" $(tls_args "$cold_port") --capsule "$sealed" --exec true
	start_client go-sock-cold "$tmp/apirun" --socket "$tmp/s" --capsule "$sealed" --exec true
	start_client go-sock-warm "$tmp/apirun" --socket "$tmp/sw" --capsule "$sealed" --exec true
	start_client go-sock-adv "$tmp/apirun" --socket "$tmp/s" --capsule "$advisory" --exec true
}

# ask NAME LINE: the client's answer to one line, which must not be an error.
ask() {
	local answer
	echo "$2" >&"${client_in[$1]}"
	if ! read -r answer <&"${client_out[$1]}"; then
		echo "bench/sdk.sh: client $1 ended:" >&2
		cat "$tmp/$1.err" >&2
		exit 1
	fi
	case $answer in
	error:*)
		echo "bench/sdk.sh: $1: $answer" >&2
		exit 1
		;;
	esac
	echo "$answer"
}

# Each path appends "<total us> <create us> <exec us> <remove us>" to $tmp/<path>.rt.
run_client() { # NAME
	local total id create execd remove
	read -r total id create execd remove < <(ask "$1" rt)
	echo "$total $create $execd $remove" >>"$tmp/$1.rt"
}
# roostctl: a new process for each step, timed by this shell ($EPOCHREALTIME: no fork).
run_cli() { # NAME SOCKET CAPSULE
	local t0 t1 t2 t3 id
	t0=${EPOCHREALTIME/./}
	id=$(ROOST_SOCKET=$2 ./bin/roostctl run -d "$3")
	t1=${EPOCHREALTIME/./}
	ROOST_SOCKET=$2 ./bin/roostctl exec "$id" -- true
	t2=${EPOCHREALTIME/./}
	ROOST_SOCKET=$2 ./bin/roostctl rm -f "$id" >/dev/null
	t3=${EPOCHREALTIME/./}
	echo "$((t3 - t0)) $((t1 - t0)) $((t2 - t1)) $((t3 - t2))" >>"$tmp/$1.rt"
}
# settle waits, untimed, until the warm daemon's pool is full again and the tail of the last
# round trip (its teardown) is done, so that no path is timed while another's background
# work (above all a sandbox being made) takes the CPUs.
settle() {
	local i n
	for i in $(seq 400); do
		n=$(curl -s "http://$warm_metrics/metrics" | awk '/^roost_warm_sandboxes / { print $2 }')
		[ "${n:-0}" -ge "$WARM_POOL" ] && break
		sleep 0.02
	done
	sleep 0.03
}
measure() {
	settle
	case $1 in
	cli-cold) run_cli "$1" "$tmp/s" "$sealed" ;;
	cli-warm) run_cli "$1" "$tmp/sw" "$sealed" ;;
	cli-adv) run_cli "$1" "$tmp/s" "$advisory" ;;
	*) run_client "$1" ;;
	esac
}

paths=(ts-tls-cold ts-tls-warm ts-sock-cold ts-sock-warm py-tls-cold py-tls-warm py-sock-cold py-sock-warm
	go-tls-cold go-sock-cold go-sock-warm cli-cold cli-warm ts-tls-adv ts-sock-adv go-sock-adv cli-adv)
echo "== warm-up (untimed): each path once"
for p in "${paths[@]}"; do measure "$p"; done
rm -f "$tmp"/*.rt
# A warm path is one whose sessions found a sandbox ready: the pool is full before each
# (settle), and this says the capsule fits one.
settle
id=$(ROOST_SOCKET=$tmp/sw ./bin/roostctl run -d "$sealed")
warm=$(ROOST_SOCKET=$tmp/sw ./bin/roostctl inspect -f '{{.warm}}' "$id")
ROOST_SOCKET=$tmp/sw ./bin/roostctl rm -f "$id" >/dev/null
if [ "$warm" != true ]; then
	echo "bench/sdk.sh: a session of $sealed on the --warm-pool roostd started cold (warm: $warm)" >&2
	exit 1
fi

echo "== $N round trips per path, interleaved"
start=${EPOCHREALTIME/./}
for i in $(seq "$N"); do
	# Rotate the order so no path always runs right after another.
	for k in "${!paths[@]}"; do
		measure "${paths[$(((i + k) % ${#paths[@]}))]}"
	done
done
elapsed=$(((${EPOCHREALTIME/./} - start) / 1000))

# pct FILE COLUMN P: the P-th percentile (nearest rank) of a column, in ms.
pct() {
	awk -v c="$2" '{ print $c }' "$1" | sort -n | awk -v p="$3" '{ v[NR] = $1 } END {
		r = int(p / 100 * NR); if (r < p / 100 * NR) r++; if (r < 1) r = 1
		printf "%.1f", v[r] / 1000 }'
}
declare -A label=(
	[ts-tls-cold]="TypeScript SDK, mTLS, sealed cold"
	[ts-tls-warm]="TypeScript SDK, mTLS, sealed warm"
	[ts-sock-cold]="TypeScript SDK, socket, sealed cold"
	[ts-sock-warm]="TypeScript SDK, socket, sealed warm"
	[py-tls-cold]="Python SDK, mTLS, sealed cold"
	[py-tls-warm]="Python SDK, mTLS, sealed warm"
	[py-sock-cold]="Python SDK, socket, sealed cold"
	[py-sock-warm]="Python SDK, socket, sealed warm"
	[go-tls-cold]="Go gRPC (apirun), mTLS, sealed cold"
	[go-sock-cold]="Go gRPC (apirun), socket, sealed cold"
	[go-sock-warm]="Go gRPC (apirun), socket, sealed warm"
	[cli-cold]="roostctl run -d, exec, rm -f: sealed cold"
	[cli-warm]="roostctl run -d, exec, rm -f: sealed warm"
	[ts-tls-adv]="TypeScript SDK, mTLS, advisory"
	[ts-sock-adv]="TypeScript SDK, socket, advisory"
	[go-sock-adv]="Go gRPC (apirun), socket, advisory"
	[cli-adv]="roostctl run -d, exec, rm -f: advisory"
)

echo "== files: ${FILE_RUNS} writes and reads of 1 MiB and 100 MiB per client"
file_clients=(ts-tls-cold ts-sock-cold py-tls-cold py-sock-cold go-tls-cold go-sock-cold)
for size in $((1 << 20)) $((100 << 20)); do
	# untimed: the files session's create, and the blob's first write
	for c in "${file_clients[@]}"; do ask "$c" "files $size" >/dev/null; done
	for r in $(seq "$FILE_RUNS"); do
		for k in "${!file_clients[@]}"; do
			c=${file_clients[$(((r + k) % ${#file_clients[@]}))]}
			settle
			ask "$c" "files $size" >>"$tmp/$c.files.$size"
		done
	done
done

echo
echo "create -> exec([\"true\"]) -> remove, N=$N per path, $(nproc) CPUs, $(uname -r), roost $(git describe --tags --always --dirty 2>/dev/null || echo '?')"
echo "node $(node --version), $("$py" --version), grpcio $("$py" -c 'import grpc; print(grpc.__version__)')"
echo
printf '%-44s %8s %8s %8s %8s %8s\n' "path" "p50 ms" "p99 ms" "create" "exec" "remove"
for p in "${paths[@]}"; do
	printf '%-44s %8s %8s %8s %8s %8s\n' "${label[$p]}" "$(pct "$tmp/$p.rt" 1 50)" "$(pct "$tmp/$p.rt" 1 99)" \
		"$(pct "$tmp/$p.rt" 2 50)" "$(pct "$tmp/$p.rt" 3 50)" "$(pct "$tmp/$p.rt" 4 50)"
done
echo "(create, exec, remove: each step's own p50; roostctl's are a process each, its start included)"
echo
declare -A file_label=([ts-tls-cold]="TypeScript SDK, mTLS" [ts-sock-cold]="TypeScript SDK, socket"
	[py-tls-cold]="Python SDK, mTLS" [py-sock-cold]="Python SDK, socket"
	[go-tls-cold]="Go gRPC (apirun), mTLS" [go-sock-cold]="Go gRPC (apirun), socket")
mibs() { awk -v ms="$1" -v mib="$2" 'BEGIN { printf "%.0f", mib / (ms / 1000) }'; }
printf '%-28s %6s %10s %8s %10s %8s\n' "files, p50 of $FILE_RUNS" "size" "write ms" "MiB/s" "read ms" "MiB/s"
for c in "${file_clients[@]}"; do
	for size in $((1 << 20)) $((100 << 20)); do
		f=$tmp/$c.files.$size
		w=$(pct "$f" 1 50)
		r=$(pct "$f" 2 50)
		printf '%-28s %6s %10s %8s %10s %8s\n' "${file_label[$c]}" "$((size >> 20))MiB" "$w" "$(mibs "$w" $((size >> 20)))" "$r" "$(mibs "$r" $((size >> 20)))"
	done
done
echo
echo "timed loop: ${elapsed} ms; load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
