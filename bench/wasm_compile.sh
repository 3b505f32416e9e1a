#!/usr/bin/env bash
# Measures what roost-wasm's compile cache saves, and what its always-on fuel checks cost:
#   compile      wasmtime compiling the Go hello module (GOOS=wasip1), as every run
#                without a usable cache entry does
#   deserialize  loading its compiled form (roost-wasm compile's output), a cache hit
#   fuel on/off  a CPU-bound Go guest loop on roost-wasm's engine (fuel consumption on,
#                even without --fuel) and on one without fuel checks
# Then the same hit and miss end to end: the runner binary starting the Go guest from the
# cache and without it. Run from anywhere: bench/wasm_compile.sh (N=10 iterations).
set -euo pipefail
export LC_ALL=C
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
N=${N:-10}
export GOFLAGS="-tags=seccomp ${GOFLAGS:-}"

go test -count=1 -run '^$' -bench . -benchtime "${N}x" ./pkg/wasmrun/ |
	grep -E '^Benchmark' | awk '{ printf "%-40s %10s ms/op\n", $1, $(NF-1) }'

tmp=$(mktemp -d /tmp/roostwasm.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
CGO_ENABLED=1 go build -o "$tmp/roost-wasm" ./cmd/roost-wasm
GOOS=wasip1 GOARCH=wasm go build -o "$tmp/hello.wasm" ./pkg/wasmrun/testdata/hello
sha=$("$tmp/roost-wasm" compile --module "$tmp/hello.wasm" --out "$tmp/hello.cwasm")
echo "$("$tmp/roost-wasm" version); hello.wasm $(($(stat -c %s "$tmp/hello.wasm") >> 10)) KiB, compiled $(($(stat -c %s "$tmp/hello.cwasm") >> 10)) KiB"
ms() { # ms CMD...: wall time of N runs of CMD, in ms per run
	local start end
	start=$(date +%s%N)
	for _ in $(seq "$N"); do "$@" >/dev/null; done
	end=$(date +%s%N)
	echo $(((end - start) / 1000000 / N))
}
echo "roost-wasm run, no cache:    $(ms "$tmp/roost-wasm" run --module "$tmp/hello.wasm") ms/run"
echo "roost-wasm run, cache hit:   $(ms "$tmp/roost-wasm" run --module "$tmp/hello.wasm" --cache "$tmp/hello.cwasm" --cache-sha256 "$sha") ms/run"
