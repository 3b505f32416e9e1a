#!/usr/bin/env bash
# Compares a sealed roost session, cold and warm (a second roostd with --warm-pool
# $WARM_POOL, default 4), warm again from a client that stays connected (bench/apirun, as an
# SDK or a parent capsule calls roostd: no client process start), with `runc run` and `bwrap`
# running /usr/bin/true on the same composed root, N times (default 30) interleaved, and
# prints median and p90 per tool, then sessions/s at 1, 4 and 8 concurrent callers.
# Run as root from anywhere: bench/sealed.sh, or N=100 bench/sealed.sh.
# PROFILE=1 bench/sealed.sh says instead where each tool's CPU goes: by process, user and
# kernel, and by phase (perf; bench/cpuprof.py).
set -euo pipefail
export LC_ALL=C

N=${N:-30}
WARM_POOL=${WARM_POOL:-4}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

if [ "$(id -u)" -ne 0 ]; then
	echo "bench/sealed.sh: run as root (sealed sessions and runc need it)" >&2
	exit 1
fi

tmp=$(mktemp -d /tmp/roostbench.XXXXXX)
# Sessions run as unprivileged uids that pass through here to their workdirs.
chmod 711 "$tmp"
roostd_pid=
warmd_pid=
cleanup() {
	set +e
	[ -n "${API_PID:-}" ] && kill "$API_PID" 2>/dev/null
	for pid in $roostd_pid $warmd_pid; do
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	if [ -d "$tmp/runc" ]; then
		for id in $(runc --root "$tmp/runc" list -q 2>/dev/null); do
			runc --root "$tmp/runc" delete -f "$id" >/dev/null 2>&1
		done
	fi
	# cgroupfs directories go with rmdir only, leaves first.
	find /sys/fs/cgroup -maxdepth 3 -depth -type d -path '*/roostbench*' -exec rmdir {} + 2>/dev/null
	# roostd's nosuid,nodev binds of the session trees outlive it by design.
	awk -v d="$tmp/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== building"
make build >/dev/null
go build -tags seccomp -o "$tmp/bundle-tool" ./bench/bundle
go build -o "$tmp/apirun" ./bench/apirun
if ! command -v runc >/dev/null || ! command -v bwrap >/dev/null || ! command -v curl >/dev/null; then
	apt-get install -y -qq runc bubblewrap curl >/dev/null ||
		{ apt-get update -qq && apt-get install -y -qq runc bubblewrap curl >/dev/null; }
fi

# The capsule: /usr/bin/true, sealed, every other grant at its default.
capsule=$tmp/capsule
mkdir -p "$capsule" "$tmp/work" "$tmp/bundles" "$tmp/runc"
cp bench/capsules/true/capsule.yaml "$capsule/"

echo "== starting roostd, and a second one with --warm-pool $WARM_POOL"
mkdir -p "$tmp/state" "$tmp/warm"
# Each roostd on a host holds a block of ids of its own (it sweeps what it frees): the two
# split the default block.
printf 'sessions:\n  ids:\n    first: %d\n    slots: 2048\n' $((0x70000000)) >"$tmp/cold.yaml"
printf 'sessions:\n  ids:\n    first: %d\n    slots: 2046\n' $((0x78000000)) >"$tmp/warm.yaml"
./bin/roostd --config "$tmp/cold.yaml" --state-dir "$tmp/state" --socket "$tmp/s" --metrics-addr "" >"$tmp/roostd.log" 2>&1 &
roostd_pid=$!
# The warm daemon's /metrics says how many sandboxes wait (see settle).
warm_metrics=127.0.0.1:$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
./bin/roostd --config "$tmp/warm.yaml" --state-dir "$tmp/warm" --socket "$tmp/sw" --metrics-addr "$warm_metrics" --warm-pool "$WARM_POOL" >"$tmp/warmd.log" 2>&1 &
warmd_pid=$!
export ROOST_SOCKET=$tmp/s
for _ in $(seq 100); do
	[ -S "$tmp/s" ] && [ -S "$tmp/sw" ] && break
	kill -0 "$roostd_pid" 2>/dev/null || { cat "$tmp/roostd.log" >&2; exit 1; }
	kill -0 "$warmd_pid" 2>/dev/null || { cat "$tmp/warmd.log" >&2; exit 1; }
	sleep 0.1
done
# grep -q would stop reading early, and pipefail would count roostctl's SIGPIPE: keep the
# report whole first.
doctor=$(./bin/roostctl doctor)
if ! grep -q '^sealed  *yes' <<<"$doctor"; then
	echo "$doctor" >&2
	echo "bench/sealed.sh: roostd cannot run sealed sessions on this host" >&2
	exit 1
fi

# The connected client: a line in starts a session, "<us> <id>" comes out.
coproc API { "$tmp/apirun" --socket "$tmp/sw" --capsule "$capsule"; }

# runc's root: what roost composes for a session, in a state dir of the bench's own.
rootfs=$("$tmp/bundle-tool" --state-dir "$tmp/bundle-state" --init "$repo/bin/roost-init" \
	--capsule "$capsule" --workdir "$tmp/work" --out "$tmp/bundle")

# bwrap cannot take an OCI spec; these are the same mounts by hand.
bwrap_args=(--unshare-all --die-with-parent --new-session --cap-drop ALL --hostname roost
	--ro-bind /usr /usr)
for d in bin sbin lib lib64; do
	if [ -L "$rootfs/$d" ]; then
		bwrap_args+=(--symlink "$(readlink "$rootfs/$d")" "/$d")
	elif [ -d "/$d" ]; then
		bwrap_args+=(--ro-bind "/$d" "/$d")
	fi
done
bwrap_args+=(--ro-bind "$rootfs/etc" /etc)
for e in /etc/ssl/certs /etc/pki/tls/certs /etc/alternatives; do
	[ -d "$e" ] && bwrap_args+=(--ro-bind "$e" "$e")
done
bwrap_args+=(--ro-bind "$repo/bin/roost-init" /.roost/roost-init
	--proc /proc --dev /dev --tmpfs /tmp --bind "$tmp/work" /work --ro-bind "$capsule" /capsule
	--remount-ro / --chdir /)

# Each tool appends its microseconds to $tmp/<tool>.us. The clock is $EPOCHREALTIME: timing
# with $(date +%s%N) forks twice and adds about 2 ms here, as much as the floor itself.
run_roost() {
	local t0=${EPOCHREALTIME/./}
	./bin/roostctl run "$capsule"
	echo "$t0 ${EPOCHREALTIME/./}" >>"$tmp/roost.span"
}
run_warm() {
	local t0=${EPOCHREALTIME/./}
	ROOST_SOCKET=$tmp/sw ./bin/roostctl run "$capsule"
	echo "$t0 ${EPOCHREALTIME/./}" >>"$tmp/warm.span"
}
run_runc() {
	local b=$tmp/bundles/$1
	mkdir -p "$b"
	sed "s#\"cgroupsPath\": \"/roostbench/runc\"#\"cgroupsPath\": \"/roostbench/runc-$1\"#" \
		"$tmp/bundle/config.json" >"$b/config.json"
	local t0 t1
	t0=${EPOCHREALTIME/./}
	runc --root "$tmp/runc" run --bundle "$b" "roostbench-$1" </dev/null
	t1=${EPOCHREALTIME/./}
	echo $((t1 - t0)) >>"$tmp/runc.us"
	runc --root "$tmp/runc" delete -f "roostbench-$1" >/dev/null 2>&1 || true
}
run_api() {
	local us id stage launch wait
	echo go >&"${API[1]}"
	read -r us id stage launch wait <&"${API[0]}"
	case $us in
	'' | error:*)
		echo "bench/sealed.sh: apirun: $us $id" >&2
		exit 1
		;;
	esac
	# The client's own clock: bash's pipe round trip is not the session's.
	echo "$us" >>"$tmp/api.us"
	echo "$id" >>"$tmp/api.ids"
	echo "$stage" >>"$tmp/api-stage.us"
	echo "$launch" >>"$tmp/api-launch.us"
	echo "$wait" >>"$tmp/api-wait.us"
}
run_bwrap() { bwrap "${bwrap_args[@]}" /usr/bin/true; }
run_floor() { /usr/bin/true; }
timed() {
	local t0 t1
	t0=${EPOCHREALTIME/./}
	"run_$1"
	t1=${EPOCHREALTIME/./}
	echo $((t1 - t0)) >>"$tmp/$1.us"
}
# settle waits, untimed, until the warm daemon's pool is full again and the tail of the last
# run (its teardown) is done, so that no tool is timed while another's background work
# (above all a sandbox being made) takes the CPUs.
settle() {
	local i n
	for i in $(seq 200); do
		n=$(curl -s "http://$warm_metrics/metrics" | awk '/^roost_warm_sandboxes / { print $2 }')
		[ "${n:-0}" -ge "$WARM_POOL" ] && break
		sleep 0.02
	done
	sleep 0.03
}
measure() {
	settle
	case $1 in
	runc) run_runc "$2" ;;
	api) run_api ;;
	*) timed "$1" ;;
	esac
}

tools=(roost warm api runc bwrap floor)
echo "== warm-up (untimed)"
for t in "${tools[@]}"; do measure "$t" warmup; done
rm -f "$tmp"/*.us

rm -f "$tmp"/*.span "$tmp/api.ids"
./bin/roostctl prune -f >/dev/null
ROOST_SOCKET=$tmp/sw ./bin/roostctl prune -f >/dev/null
if [ "${PROFILE:-0}" = 1 ]; then
	# Where the CPU goes instead of how long it takes: each tool's N sessions one after
	# another under perf, every task below this shell sorted by what it is (bench/cpuprof.py).
	mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
	if ! command -v perf >/dev/null; then
		apt-get install -y -qq linux-perf >/dev/null ||
			{ apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null; }
	fi
	offset=$(python3 -c 'import time; print(time.clock_gettime(time.CLOCK_REALTIME) - time.clock_gettime(time.CLOCK_MONOTONIC))')
	# PROFILE_TOOLS picks the tools; PROFILE_GRAPH=1 records call graphs too (perf report -g).
	for t in ${PROFILE_TOOLS:-roost warm api runc}; do
		rm -f "$tmp/roost.span" "$tmp/warm.span"
		settle
		python3 bench/cpuprof.py snapshot $$ cold="$roostd_pid" warm="$warmd_pid" >"$tmp/$t.tasks"
		perf record -q -a -m 16M -k CLOCK_MONOTONIC -e sched:sched_stat_runtime -e sched:sched_process_fork \
			-e cpu-clock/freq=2000/ ${PROFILE_GRAPH:+--call-graph fp} -o "$tmp/$t.perf" 2>"$tmp/perf.log" &
		perf_pid=$!
		sleep 0.5
		for i in $(seq "$N"); do measure "$t" "p$i"; done
		settle
		kill -INT "$perf_pid"
		wait "$perf_pid" || true
		own=bench spans= events=
		case $t in
		roost) own=cold spans=$tmp/roost.span ;;
		warm) own=warm spans=$tmp/warm.span ;;
		api) own=warm ;;
		esac
		if [ "$t" = roost ]; then ./bin/roostctl events --json >"$tmp/$t.events"; fi
		if [ "$t" = warm ]; then ROOST_SOCKET=$tmp/sw ./bin/roostctl events --json >"$tmp/$t.events"; fi
		echo
		echo "== $t: CPU per session, $N sessions one after another (perf: sched_stat_runtime, cpu-clock samples)"
		perf script -i "$tmp/$t.perf" -F comm,pid,tid,time,event,trace,ip 2>/dev/null |
			python3 bench/cpuprof.py report --tasks "$tmp/$t.tasks" --n "$N" --offset "$offset" --own "$own" \
				${spans:+--spans "$spans"} ${spans:+--events "$tmp/$t.events"}
		# PROFILE_OUT=DIR keeps the recordings (perf report -i DIR/roost.perf --sort comm,dso,sym).
		if [ -n "${PROFILE_OUT:-}" ]; then mkdir -p "$PROFILE_OUT" && cp "$tmp/$t.perf" "$tmp/$t.tasks" "$PROFILE_OUT/"; fi
	done
	exit 0
fi
echo "== $N iterations, interleaved"
start=${EPOCHREALTIME/./}
for i in $(seq "$N"); do
	# Rotate the order so no tool always runs right after another.
	for k in "${!tools[@]}"; do
		measure "${tools[$(((i + k) % ${#tools[@]}))]}" "$i"
	done
done
elapsed=$(((${EPOCHREALTIME/./} - start) / 1000))

# stats FILE: median and p90 (nearest rank) in ms.
stats() {
	sort -n "$1" | awk '{ v[NR] = $1 } END {
		med = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		r = int(0.9 * NR); if (r < 0.9 * NR) r++
		printf "%.2f %.2f\n", med / 1000, v[r] / 1000 }'
}
# Where a roost start goes, from the registry's own event times (staged, launching, running,
# exited) and the caller's clock around each roostctl run.
phases() { # SOCKET SPANS [IDS: sessions to leave out]
ROOST_SOCKET=$1 ./bin/roostctl events --json | python3 -c '
import json, sys, datetime, statistics
def t(s):
    s = s.rstrip("Z"); base, _, frac = s.partition(".")
    return datetime.datetime.fromisoformat(base).replace(tzinfo=datetime.timezone.utc).timestamp() + float("0." + (frac or "0"))
skip = set(open(sys.argv[2]).read().split()) if len(sys.argv) > 2 else set()
ev = {}
for line in sys.stdin:
    e = json.loads(line)
    if e["session_id"] not in skip:
        ev.setdefault(e["session_id"], {})[e["type"]] = t(e["time"])
spans = [tuple(int(x) / 1e6 for x in l.split()) for l in open(sys.argv[1])]
first = min(t0 for t0, _ in spans)
sessions = sorted((v for v in ev.values() if v.get("session.staged", 0) >= first and "session.exited" in v), key=lambda v: v["session.staged"])
rows = {"roostctl start + Stage RPC (to staged)": [], "staged -> launching (Launch RPC)": [],
        "launching -> running (container, roost-init, program)": [], "running -> exited (program, its end recorded)": [],
        "exited -> roostctl exit (Wait, output, exit)": []}
for (t0, t1), v in zip(spans, sessions):
    rows["roostctl start + Stage RPC (to staged)"].append(v["session.staged"] - t0)
    rows["staged -> launching (Launch RPC)"].append(v["session.launching"] - v["session.staged"])
    rows["launching -> running (container, roost-init, program)"].append(v["session.running"] - v["session.launching"])
    rows["running -> exited (program, its end recorded)"].append(v["session.exited"] - v["session.running"])
    rows["exited -> roostctl exit (Wait, output, exit)"].append(t1 - v["session.exited"])
for k, xs in rows.items():
    print("%-54s %8.2f" % (k, statistics.median(xs) * 1000))
' "$2" ${3:+"$3"}
}
cold_phases=$(phases "$tmp/s" "$tmp/roost.span")
warm_phases=$(phases "$tmp/sw" "$tmp/warm.span" "$tmp/api.ids")
# Timed runs and the warm-up, the connected client's left out.
warm_count=$(ROOST_SOCKET=$tmp/sw ./bin/roostctl ps -a --filter capsule=bench-true --format '{{.id}} {{.warm}}' |
	grep -v -F -f "$tmp/api.ids" | grep -c ' true$' || true)
api_count=$(ROOST_SOCKET=$tmp/sw ./bin/roostctl ps -a --filter capsule=bench-true --format '{{.id}} {{.warm}}' |
	grep -F -f "$tmp/api.ids" | grep -c ' true$' || true)

read -r roost_med roost_p90 < <(stats "$tmp/roost.us")
read -r warm_med warm_p90 < <(stats "$tmp/warm.us")
read -r api_med api_p90 < <(stats "$tmp/api.us")
read -r runc_med runc_p90 < <(stats "$tmp/runc.us")
read -r bwrap_med bwrap_p90 < <(stats "$tmp/bwrap.us")
read -r floor_med floor_p90 < <(stats "$tmp/floor.us")
read -r api_stage _ < <(stats "$tmp/api-stage.us")
read -r api_launch _ < <(stats "$tmp/api-launch.us")
read -r api_wait _ < <(stats "$tmp/api-wait.us")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo
echo "sealed start of /usr/bin/true, N=$N, $(nproc) CPUs, $(uname -r), roost $(git describe --tags --always --dirty 2>/dev/null || echo '?')"
echo "$(runc --version | head -1), $(bwrap --version)"
echo
printf '%-46s %10s %10s\n' "what" "median ms" "p90 ms"
printf '%-46s %10s %10s\n' "roostctl run, cold (stage+launch+wait)" "$roost_med" "$roost_p90"
printf '%-46s %10s %10s\n' "roostctl run, warm (--warm-pool $WARM_POOL)" "$warm_med" "$warm_p90"
printf '%-46s %10s %10s\n' "warm, from a connected API client" "$api_med" "$api_p90"
printf '%-46s %10s %10s\n' "runc run (same root, mounts, cgroup, seccomp)" "$runc_med" "$runc_p90"
printf '%-46s %10s %10s\n' "bwrap (same mounts; no cgroup, no seccomp)" "$bwrap_med" "$bwrap_p90"
printf '%-46s %10s %10s\n' "floor: /usr/bin/true exec'd from bash" "$floor_med" "$floor_p90"
echo
echo "roost-cold/runc (medians):  $(ratio "$roost_med" "$runc_med")"
echo "roost-warm/bwrap (medians): $(ratio "$warm_med" "$bwrap_med")"
echo "roost-warm/runc (medians):  $(ratio "$warm_med" "$runc_med")"
echo "roost-warm API client/bwrap (medians): $(ratio "$api_med" "$bwrap_med")"
echo "warm starts: $warm_count of the $((N + 1)) warm runs found a sandbox ready, $api_count of the API client's $N"
echo
printf '%-54s %8s\n' "roostctl run cold, by phase (medians of the $N above)" "ms"
echo "$cold_phases"
printf '%-54s %8s\n' "roostctl run warm, by phase" "ms"
echo "$warm_phases"
printf '%-54s %8s\n' "warm from a connected API client, by call (medians)" "ms"
printf '%-54s %8s\n' "Stage" "$api_stage"
printf '%-54s %8s\n' "Launch (returns once the program runs)" "$api_launch"
printf '%-54s %8s\n' "Wait (the program, its end recorded)" "$api_wait"
# Throughput: sessions (containers) of /usr/bin/true started and ended per second by P
# concurrent callers, each running its share of THROUGHPUT_N (default 4*N) starts.
TN=${THROUGHPUT_N:-$((4 * N))}
roost_one() { ./bin/roostctl run "$capsule" >/dev/null; }
warm_one() { ROOST_SOCKET=$tmp/sw ./bin/roostctl run "$capsule" >/dev/null; }
runc_one() {
	local b=$tmp/bundles/tp-$1
	mkdir -p "$b"
	sed "s#\"cgroupsPath\": \"/roostbench/runc\"#\"cgroupsPath\": \"/roostbench/tp-$1\"#" \
		"$tmp/bundle/config.json" >"$b/config.json"
	runc --root "$tmp/runc" run --bundle "$b" "roostbench-tp-$1" </dev/null
	runc --root "$tmp/runc" delete -f "roostbench-tp-$1" >/dev/null 2>&1 || true
	rm -rf "$b"
}
floor_one() { /usr/bin/true; }
export -f roost_one warm_one runc_one floor_one
export capsule tmp
# The CPU time the whole machine has spent (user, nice, system, irq, softirq), in clock
# ticks: a throughput run's share of it says what one session costs, and so how many per
# second this machine's CPUs could give at best.
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
hz=$(getconf CLK_TCK)
per_second() { # TOOL P: "sessions/s CPU-ms-per-session"
	local t0 t1 b0 b1
	b0=$(busy_ticks)
	t0=${EPOCHREALTIME/./}
	seq "$TN" | xargs -P "$2" -I{} bash -c "${1}_one {}"
	t1=${EPOCHREALTIME/./}
	b1=$(busy_ticks)
	awk -v n="$TN" -v us=$((t1 - t0)) -v ticks=$((b1 - b0)) -v hz="$hz" \
		'BEGIN { printf "%.1f %.1f\n", n / (us / 1e6), ticks * 1000 / hz / n }'
}
declare -A rate cpu
for p in 1 4 8; do
	for t in roost warm runc floor; do
		settle
		read -r "rate[$t$p]" "cpu[$t$p]" < <(per_second "$t" "$p")
	done
done
# What the CPUs allow at best: each session's CPU time spread over all of them.
ceiling() { awk -v c="$1" -v n="$(nproc)" 'BEGIN { printf "%.1f", n * 1000 / c }'; }


echo
printf '%-46s %10s %10s %10s\n' "sessions/s, $TN starts of /usr/bin/true" "P=1" "P=4" "P=8"
declare -A label=([roost]="roostctl run (sealed, cold)"
	[warm]="roostctl run (sealed, --warm-pool $WARM_POOL)"
	[runc]="runc run + delete"
	[floor]="caller alone (xargs, bash, /usr/bin/true)")
for t in roost warm runc floor; do
	printf '%-46s %10s %10s %10s\n' "${label[$t]}" "${rate[${t}1]}" "${rate[${t}4]}" "${rate[${t}8]}"
done
echo
printf '%-46s %10s %10s\n' "CPU per session at P=8 (whole machine)" "ms" "ceiling/s"
for t in roost warm runc floor; do
	printf '%-46s %10s %10s\n' "${label[$t]}" "${cpu[${t}8]}" "$(ceiling "${cpu[${t}8]}")"
done
echo "(ceiling: $(nproc) CPUs' time divided by one session's, a warm daemon's refills included;"
echo " no concurrency can pass it)"

echo
echo "runc runs the program directly as the container's init; roost runs it under roost-init"
echo "and roost-exec and records the session (registry, events, records) around it."
echo "bwrap cannot apply cgroup limits, roost's seccomp filter, noexec on /work or tmpfs sizes;"
echo "roost and runc map the same user namespace (root inside = an unprivileged host range); bwrap makes its own (--unshare-all)."
echo "timed loop: ${elapsed} ms"
