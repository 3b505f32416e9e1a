#!/usr/bin/env bash
# Times Codex's default episode (codex exec of a prompt the model answers with text, no tool)
# on the host and inside a sealed roost session, N times (default 5) interleaved, against a
# fake model (bench/fakellm): on the host Codex calls it directly, in the session through
# the session's inference gateway. Prints the medians and the ratio sealed/host.
# Run as root from anywhere, with codex installed (make agent-clis): bench/agents.sh, or N=9.
set -euo pipefail
export LC_ALL=C

N=${N:-5}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

if [ "$(id -u)" -ne 0 ]; then
	echo "bench/agents.sh: run as root (sealed sessions need it)" >&2
	exit 1
fi
codex=$(command -v codex) || { echo "bench/agents.sh: no codex on PATH (make agent-clis)" >&2; exit 1; }
# Codex's node launcher execs the native binary of its platform package, beneath its own.
launcher=$(readlink -f "$codex")
vendor=$(ls -d "$(dirname "$(dirname "$launcher")")"/node_modules/@openai/codex-linux-*/vendor | head -1)

tmp=$(mktemp -d /tmp/roostbench.XXXXXX)
chmod 711 "$tmp"
roostd_pid= fake_pid=
cleanup() {
	set +e
	if [ -n "$roostd_pid" ]; then
		for id in $(./bin/roostctl ps -q 2>/dev/null); do ./bin/roostctl kill "$id" >/dev/null 2>&1; done
		kill -TERM "$roostd_pid" 2>/dev/null
		wait "$roostd_pid" 2>/dev/null
	fi
	if [ -n "$fake_pid" ]; then
		kill -TERM "$fake_pid" 2>/dev/null
		wait "$fake_pid" 2>/dev/null
	fi
	awk -v d="$tmp/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== building"
make build >/dev/null
go build -o "$tmp/fakellm" ./bench/fakellm

# exec: FAKE_PID is then the fake's own pid, which cleanup ends (a subshell's would leave the
# fake running, holding whatever descriptors it inherited).
coproc FAKE { exec "$tmp/fakellm" --api-key sk-operator; }
fake_pid=$FAKE_PID
read -r fake_url <&"${FAKE[0]}"
echo sk-operator >"$tmp/llm.key"
chmod 600 "$tmp/llm.key"
printf 'inference:\n  upstreams:\n    - name: openai\n      format: openai\n      url: %s\n      api_key_file: %s\n' \
	"$fake_url" "$tmp/llm.key" >"$tmp/roostd.yaml"

# The episode, the same on the host and in the session but for where OPENAI_BASE_URL points.
episode='codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -c model_provider=roost -c "model_providers.roost={name=\"roost\",base_url=\"$OPENAI_BASE_URL\",env_key=\"OPENAI_API_KEY\",wire_api=\"responses\"}" -m fake-coder "say hello" </dev/null'

capsule=$tmp/capsule
mkdir -p "$capsule/bin"
printf '%s\n' "name: bench-codex" "version: 0.1.0" "run:" "  command: [bin/run.sh]" \
	"inference:" "  upstream: openai" "capabilities:" "  containment: sealed" \
	"  shell: {allow: [\"@shell\", \"@node\", \"$codex\", \"$vendor\"]}" >"$capsule/capsule.yaml"
printf '%s\n' '#!/bin/sh' 'set -eu' 't0=$(date +%s%N)' \
	"$episode >answer 2>log || { cat log >&2; exit 1; }" \
	't1=$(date +%s%N)' 'echo "codex-us: $(((t1 - t0) / 1000))"' 'cat answer' >"$capsule/bin/run.sh"
chmod 755 "$capsule/bin/run.sh"

echo "== starting roostd"
state=$tmp/state
mkdir -p "$state"
./bin/roostd --state-dir "$state" --socket "$tmp/s" --metrics-addr "" --config "$tmp/roostd.yaml" >"$tmp/roostd.log" 2>&1 &
roostd_pid=$!
export ROOST_SOCKET=$tmp/s
for _ in $(seq 100); do
	[ -S "$tmp/s" ] && break
	kill -0 "$roostd_pid" 2>/dev/null || { cat "$tmp/roostd.log" >&2; exit 1; }
	sleep 0.1
done

run_host() {
	local dir=$tmp/host-$1 t0 t1 out
	mkdir -p "$dir/home"
	t0=${EPOCHREALTIME/./}
	out=$(cd "$dir" && HOME=$dir/home OPENAI_BASE_URL=$fake_url/v1 OPENAI_API_KEY=sk-operator sh -c "$episode" 2>"$dir/log") ||
		{ cat "$dir/log" >&2; exit 1; }
	t1=${EPOCHREALTIME/./}
	grep -q 'hello from the fake' <<<"$out" || { echo "host codex printed: $out" >&2; exit 1; }
	echo $((t1 - t0)) >>"$tmp/host.us"
	rm -rf "$dir"
}
run_sealed() {
	local t0 t1 out
	t0=${EPOCHREALTIME/./}
	out=$(./bin/roostctl run "$capsule") || { echo "roostctl run: $out" >&2; exit 1; }
	t1=${EPOCHREALTIME/./}
	grep -q 'hello from the fake' <<<"$out" || { echo "the session printed: $out" >&2; exit 1; }
	echo $((t1 - t0)) >>"$tmp/e2e.us"
	sed -n 's/^codex-us: //p' <<<"$out" >>"$tmp/sealed.us"
	./bin/roostctl rm "$(./bin/roostctl ps --all -q | head -1)" >/dev/null
}

echo "== warm-up (untimed)"
run_host warm
run_sealed
rm -f "$tmp"/*.us

echo "== $N episodes each, interleaved"
for i in $(seq "$N"); do
	if [ $((i % 2)) -eq 1 ]; then
		run_host "$i"; run_sealed
	else
		run_sealed; run_host "$i"
	fi
	printf '  %d: host %d ms, sealed %d ms (codex exec), %d ms (roostctl run)\n' "$i" \
		$(($(tail -1 "$tmp/host.us") / 1000)) $(($(tail -1 "$tmp/sealed.us") / 1000)) $(($(tail -1 "$tmp/e2e.us") / 1000))
done

median() {
	sort -n "$1" | awk '{ v[NR] = $1 } END {
		med = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		printf "%.0f\n", med / 1000 }'
}
host=$(median "$tmp/host.us")
sealed=$(median "$tmp/sealed.us")
e2e=$(median "$tmp/e2e.us")

echo
echo "codex exec (no tool), N=$N, $(nproc) CPUs, $(uname -r), $(codex --version), roost $(git describe --tags --always --dirty 2>/dev/null || echo '?')"
echo
printf '%-52s %10s\n' "what" "median ms"
printf '%-52s %10s\n' "host: codex exec against the fake directly" "$host"
printf '%-52s %10s\n' "sealed: codex exec inside the session (gateway)" "$sealed"
printf '%-52s %10s\n' "sealed: roostctl run end to end (stage..wait)" "$e2e"
echo
echo "sealed/host (codex exec): $(awk -v a="$sealed" -v b="$host" 'BEGIN { printf "%.2f", a / b }')   (target: within 2x)"
