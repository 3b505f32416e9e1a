#!/usr/bin/env bash
# A WASM session's start, end to end: `roostctl run` of a sealed capsule running a Go hello
# module (GOOS=wasip1; its compiled entry cached at the first stage) against the same for a
# sealed /usr/bin/true, N times (default 20) interleaved; median and p90 of each. Then
# bench/wasm_compile.sh: what the cache saves (compile vs deserialize of the same module).
# Run as root from anywhere: bench/wasm.sh, or N=50 bench/wasm.sh.
set -euo pipefail
export LC_ALL=C

N=${N:-20}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
if [ "$(id -u)" -ne 0 ]; then
	echo "bench/wasm.sh: run as root (sealed sessions need it)" >&2
	exit 1
fi

tmp=$(mktemp -d /tmp/roostwasmbench.XXXXXX)
chmod 711 "$tmp"
roostd_pid=
cleanup() {
	set +e
	if [ -n "$roostd_pid" ]; then
		kill -TERM "$roostd_pid" 2>/dev/null
		wait "$roostd_pid" 2>/dev/null
	fi
	# roostd's nosuid,nodev binds of the session trees outlive it by design.
	awk -v d="$tmp/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== building"
make build >/dev/null
mkdir -p "$tmp/wasm" "$tmp/true"
GOOS=wasip1 GOARCH=wasm GOFLAGS= go build -o "$tmp/wasm/module.wasm" ./pkg/wasmrun/testdata/hello
cat >"$tmp/wasm/capsule.yaml" <<'YAML'
name: bench-wasm
version: 0.1.0
run:
  wasm: module.wasm
capabilities:
  containment: sealed
YAML
cp bench/capsules/true/capsule.yaml "$tmp/true/"

echo "== starting roostd"
mkdir -p "$tmp/state"
./bin/roostd --state-dir "$tmp/state" --socket "$tmp/s" --metrics-addr "" >"$tmp/roostd.log" 2>&1 &
roostd_pid=$!
export ROOST_SOCKET=$tmp/s
for _ in $(seq 100); do
	[ -S "$tmp/s" ] && break
	kill -0 "$roostd_pid" 2>/dev/null || { cat "$tmp/roostd.log" >&2; exit 1; }
	sleep 0.1
done

timed() { # timed NAME DIR: one run, its microseconds appended to $tmp/NAME.us
	local t0 t1
	t0=${EPOCHREALTIME/./}
	./bin/roostctl run "$2" >/dev/null
	t1=${EPOCHREALTIME/./}
	echo $((t1 - t0)) >>"$tmp/$1.us"
}
# The first WASM stage compiles the module (untimed), every later one finds it cached.
t0=${EPOCHREALTIME/./}
./bin/roostctl run "$tmp/wasm" >/dev/null
first=$(((${EPOCHREALTIME/./} - t0) / 1000))
./bin/roostctl run "$tmp/true" >/dev/null

echo "== $N iterations, interleaved"
for i in $(seq "$N"); do
	if ((i % 2)); then timed wasm "$tmp/wasm"; timed true "$tmp/true"; else timed true "$tmp/true"; timed wasm "$tmp/wasm"; fi
done
stats() {
	sort -n "$1" | awk '{ v[NR] = $1 } END {
		med = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		r = int(0.9 * NR); if (r < 0.9 * NR) r++
		printf "%.1f %.1f\n", med / 1000, v[r] / 1000 }'
}
read -r wasm_med wasm_p90 < <(stats "$tmp/wasm.us")
read -r true_med true_p90 < <(stats "$tmp/true.us")
echo
echo "sealed session start, end to end (roostctl run: stage, launch, wait), N=$N, $(nproc) CPUs, $(uname -r)"
printf '%-52s %10s %10s\n' "what" "median ms" "p90 ms"
printf '%-52s %10s %10s\n' "WASM hello (Go, wasip1), compiled entry cached" "$wasm_med" "$wasm_p90"
printf '%-52s %10s %10s\n' "/usr/bin/true" "$true_med" "$true_p90"
printf '%-52s %10s\n' "the first WASM run (its stage compiles the module)" "$first"
echo
echo "== compile vs deserialize (bench/wasm_compile.sh)"
N=5 bash bench/wasm_compile.sh
