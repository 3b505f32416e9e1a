#!/usr/bin/env bash
# Measures the per-session egress proxy (pkg/egress) on loopback: MB/s of a 100 MiB download
# directly and through the proxy as a forwarded request, a CONNECT tunnel and SOCKS5, and
# the time to open a tunnel (p50/p99, µs). No root needed; nothing leaves loopback.
# Run from anywhere: bench/egress.sh, or N=10 SETUPS=5000 bench/egress.sh.
set -euo pipefail
export LC_ALL=C
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

N=${N:-5}              # downloads per variant
SETUPS=${SETUPS:-2000} # tunnels opened per variant

out=$(mktemp /tmp/roostegress.XXXXXX)
trap 'rm -f "$out"' EXIT

go test -run '^$' -bench '^BenchmarkEgress$' -benchtime "${N}x" ./pkg/egress >"$out"
go test -run '^$' -bench '^BenchmarkEgressConnectSetup$' -benchtime "${SETUPS}x" ./pkg/egress >>"$out"

echo "100 MiB download over loopback ($N each)"
printf '  %-10s %10s %9s\n' variant MB/s "vs direct"
awk '$1 ~ /^BenchmarkEgress\// {
	split($1, a, "/"); sub(/-[0-9]+$/, "", a[2])
	for (i = 2; i <= NF; i++) if ($(i+1) == "MB/s") mbs[a[2]] = $i
	order[++n] = a[2]
}
END {
	for (i = 1; i <= n; i++) {
		v = order[i]
		printf "  %-10s %10.0f %8.0f%%\n", v, mbs[v], (mbs["direct"] > 0 ? 100 * mbs[v] / mbs["direct"] : 0)
	}
}' "$out"
echo
echo "tunnel setup ($SETUPS each)"
printf '  %-10s %10s %10s\n' variant "p50 µs" "p99 µs"
awk '$1 ~ /^BenchmarkEgressConnectSetup\// {
	split($1, a, "/"); sub(/-[0-9]+$/, "", a[2])
	p50 = p99 = ""
	for (i = 2; i <= NF; i++) { if ($(i+1) == "p50-µs") p50 = $i; if ($(i+1) == "p99-µs") p99 = $i }
	printf "  %-10s %10.0f %10.0f\n", a[2], p50, p99
}' "$out"
