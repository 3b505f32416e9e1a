#!/usr/bin/env bash
# Compares `make -j2` of a 150-file C tree (the tree test/e2e/workloads_test.go builds with
# make -j8) on the host and inside a sealed roost session, N times (default 5) interleaved,
# and prints the medians and the ratio sealed/host.
# Run as root from anywhere: bench/workloads.sh, or N=9 J=4 bench/workloads.sh.
set -euo pipefail
export LC_ALL=C

N=${N:-5}
J=${J:-2}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

if [ "$(id -u)" -ne 0 ]; then
	echo "bench/workloads.sh: run as root (sealed sessions need it)" >&2
	exit 1
fi

tmp=$(mktemp -d /tmp/roostbench.XXXXXX)
# Sessions run as unprivileged uids that pass through here to their workdirs.
chmod 711 "$tmp"
roostd_pid=
cleanup() {
	set +e
	if [ -n "$roostd_pid" ]; then
		for id in $(./bin/roostctl ps -q 2>/dev/null); do ./bin/roostctl kill "$id" >/dev/null 2>&1; done
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

# The tree: 150 small C files, a main.c calling each, a Makefile with one object per file.
# The same generator as manyC in test/e2e/workloads_test.go.
gen_tree() {
	mkdir -p "$1"
	(
		cd "$1"
		i=0
		while [ $i -lt 150 ]; do
			printf 'int f%d(int x) { int s = 0; for (int k = 0; k < x; k++) s += k * %d; return s %% 1000 + %d; }\n' $i $i $i >f$i.c
			i=$((i + 1))
		done
		{
			echo '#include <stdio.h>'
			i=0; while [ $i -lt 150 ]; do echo "int f$i(int);"; i=$((i + 1)); done
			echo 'int main(void) { long t = 0;'
			i=0; while [ $i -lt 150 ]; do echo "t += f$i(10);"; i=$((i + 1)); done
			printf '%s\n' 'printf("many: %d objects linked, total %ld\n", 150, t); return 0; }'
		} >main.c
		printf 'SRCS := $(wildcard f*.c) main.c\nOBJS := $(SRCS:.c=.o)\nprog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n%%.o: %%.c\n\t$(CC) -O2 -c $< -o $@\n' >Makefile
	)
}

# The capsule holds the tree; its program copies it into the workdir and times make there.
capsule=$tmp/capsule
gen_tree "$capsule/tree"
mkdir -p "$capsule/bin"
cat >"$capsule/capsule.yaml" <<'EOF'
name: bench-make
version: 0.1.0
run:
  command: [bin/run.sh]
capabilities:
  containment: sealed
  filesystem: {workdir_exec: true}
  shell: {allow: ["@shell", "@make", "@gcc"]}
EOF
cat >"$capsule/bin/run.sh" <<EOF
#!/bin/sh
set -eu
cp -R "\$ROOST_CAPSULE_DIR/tree" tree
cd tree
t0=\$(date +%s%N)
make -j$J -s
t1=\$(date +%s%N)
echo "make-us: \$(((t1 - t0) / 1000))"
./prog
EOF
chmod 755 "$capsule/bin/run.sh"

echo "== starting roostd"
state=$tmp/state
mkdir -p "$state"
./bin/roostd --state-dir "$state" --socket "$tmp/s" --metrics-addr "" >"$tmp/roostd.log" 2>&1 &
roostd_pid=$!
export ROOST_SOCKET=$tmp/s
for _ in $(seq 100); do
	[ -S "$tmp/s" ] && break
	kill -0 "$roostd_pid" 2>/dev/null || { cat "$tmp/roostd.log" >&2; exit 1; }
	sleep 0.1
done
# grep -q would stop reading early, and pipefail would count roostctl's SIGPIPE: keep the
# report whole first.
doctor=$(./bin/roostctl doctor)
if ! grep -q '^sealed  *yes' <<<"$doctor"; then
	echo "$doctor" >&2
	echo "bench/workloads.sh: roostd cannot run sealed sessions on this host" >&2
	exit 1
fi
want=$(awk 'BEGIN { for (i = 0; i < 150; i++) t += (45 * i) % 1000 + i; printf "many: 150 objects linked, total %d", t }')

# Each appends microseconds: host.us (make), sealed.us (make inside the session), e2e.us
# (roostctl run: stage, launch, copy, make, run, wait).
run_host() {
	local dir=$tmp/host-$1 t0 t1 out
	cp -R "$capsule/tree" "$dir"
	t0=${EPOCHREALTIME/./}
	(cd "$dir" && make -j"$J" -s)
	t1=${EPOCHREALTIME/./}
	out=$("$dir/prog")
	[ "$out" = "$want" ] || { echo "host build printed: $out" >&2; exit 1; }
	echo $((t1 - t0)) >>"$tmp/host.us"
	rm -rf "$dir"
}
run_sealed() {
	local t0 t1 out
	t0=${EPOCHREALTIME/./}
	out=$(./bin/roostctl run "$capsule") || { echo "roostctl run: $out" >&2; exit 1; }
	t1=${EPOCHREALTIME/./}
	grep -qxF "$want" <<<"$out" || { echo "the session printed: $out" >&2; exit 1; }
	echo $((t1 - t0)) >>"$tmp/e2e.us"
	sed -n 's/^make-us: //p' <<<"$out" >>"$tmp/sealed.us"
	# Drop the session and its workdir.
	./bin/roostctl rm "$(./bin/roostctl ps --all -q | head -1)" >/dev/null
}

echo "== warm-up (untimed)"
run_host warm
run_sealed
rm -f "$tmp"/*.us

echo "== $N iterations of make -j$J, interleaved"
for i in $(seq "$N"); do
	# Alternate which goes first.
	if [ $((i % 2)) -eq 1 ]; then
		run_host "$i"; run_sealed
	else
		run_sealed; run_host "$i"
	fi
	printf '  %d: host %d ms, sealed %d ms (make), %d ms (roostctl run)\n' "$i" \
		$(($(tail -1 "$tmp/host.us") / 1000)) $(($(tail -1 "$tmp/sealed.us") / 1000)) $(($(tail -1 "$tmp/e2e.us") / 1000))
done

# median FILE: in ms.
median() {
	sort -n "$1" | awk '{ v[NR] = $1 } END {
		med = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		printf "%.0f\n", med / 1000 }'
}
host=$(median "$tmp/host.us")
sealed=$(median "$tmp/sealed.us")
e2e=$(median "$tmp/e2e.us")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

echo
echo "make -j$J of 150 C files + link, N=$N, $(nproc) CPUs, $(uname -r), $(gcc --version | head -1), roost $(git describe --tags --always --dirty 2>/dev/null || echo '?')"
echo
printf '%-52s %10s\n' "what" "median ms"
printf '%-52s %10s\n' "host: make in a fresh copy" "$host"
printf '%-52s %10s\n' "sealed: make inside the session (date +%s%N)" "$sealed"
printf '%-52s %10s\n' "sealed: roostctl run end to end (stage..wait)" "$e2e"
echo
echo "sealed/host (make):       $(ratio "$sealed" "$host")   (target: within 5 %)"
echo "sealed/host (end to end): $(ratio "$e2e" "$host")"
echo
echo "The session runs as an unprivileged uid range in its own user namespace, under seccomp,"
echo "in a cgroup (cpu $(./bin/roostctl explain "$capsule" | awk '$1 == "resources.cgroup_cpu_percent" { print $2 }') %); its TMPDIR is a tmpfs, the host's is $(df --output=fstype /tmp | tail -1)."
