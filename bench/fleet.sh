#!/usr/bin/env bash
# What a fleet costs a caller: a sealed session placed and launched through a remote entry
# node (roostctl --server https://ENTRY run --node OWNER: placement's directory read and
# reservation Txn, the stage and launch forwarded over node-to-node mTLS, the wait routed)
# beside the same run on the owner node's socket and on its own listener, cold (no sandbox
# made ahead) and warm (the owner keeps --warm-pool $WARM_POOL); and a Get routed through the
# entry node beside one asked of the owner. N runs of each (default 30), interleaved; prints
# p50 and p99 (nearest rank) per path. Every number is a whole roostctl process, as an
# operator's shell pays it.
# Run as root from anywhere: bench/fleet.sh, or N=100 bench/fleet.sh.
set -euo pipefail
export LC_ALL=C

N=${N:-30}
WARM_POOL=${WARM_POOL:-4}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

if [ "$(id -u)" -ne 0 ]; then
	echo "bench/fleet.sh: run as root (sealed sessions need it)" >&2
	exit 1
fi

tmp=$(mktemp -d /tmp/roostfleet.XXXXXX)
chmod 711 "$tmp"
pids=()
cleanup() {
	set +e
	[ -n "${get_id:-}" ] && ROOST_SOCKET=$tmp/cold.sock ./bin/roostctl kill "$get_id" >/dev/null 2>&1
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	awk -v d="$tmp/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

echo "== building"
make build >/dev/null

echo "== one etcd member, three roostd nodes: entry, cold, warm (--warm-pool $WARM_POOL)"
etcd_client=127.0.0.1:$(port)
etcd_peer=127.0.0.1:$(port)
./bin/roost-etcd --name e0 --data-dir "$tmp/etcd" --listen-client-urls "http://$etcd_client" --advertise-client-urls "http://$etcd_client" \
	--listen-peer-urls "http://$etcd_peer" --initial-advertise-peer-urls "http://$etcd_peer" --initial-cluster "e0=http://$etcd_peer" \
	--log-level warn >"$tmp/etcd.log" 2>&1 &
pids+=($!)

./bin/roostctl certs init "$tmp/tls" --server-name 127.0.0.1 --client ops:operator \
	--client entry:node --client cold:node --client warm:node >/dev/null
declare -A addr sock
first=$((0x70000000))
for n in entry cold warm; do
	addr[$n]=127.0.0.1:$(port)
	sock[$n]=$tmp/$n.sock
	cat >"$tmp/$n.yaml" <<EOF
sessions:
  ids:
    first: $first
    slots: 512
remote:
  listen: ${addr[$n]}
  tls_cert: $tmp/tls/server.pem
  tls_key: $tmp/tls/server-key.pem
  client_ca: $tmp/tls/ca.pem
  clients:
    - {common_name: ops, role: operator}
    - {common_name: entry, role: node}
    - {common_name: cold, role: node}
    - {common_name: warm, role: node}
EOF
	first=$((first + 0x02000000))
	extra=()
	[ "$n" = warm ] && extra=(--warm-pool "$WARM_POOL")
	./bin/roostd --config "$tmp/$n.yaml" --state-dir "$tmp/$n" --socket "${sock[$n]}" --metrics-addr "" \
		--fleet-etcd "http://$etcd_client" --node-name "$n" \
		--fleet-node-cert "$tmp/tls/$n.pem" --fleet-node-key "$tmp/tls/$n-key.pem" "${extra[@]}" >"$tmp/$n.log" 2>&1 &
	pids+=($!)
done
remote() { # remote NODE ARGS...: roostctl through NODE's listener, as ops
	local n=$1
	shift
	./bin/roostctl --server "https://${addr[$n]}" --tls-ca "$tmp/tls/ca.pem" --tls-cert "$tmp/tls/client.pem" --tls-key "$tmp/tls/client-key.pem" "$@"
}
for _ in $(seq 300); do
	if remote entry fleet nodes --json 2>/dev/null | grep -c '"reachable": true' | grep -qx 3; then
		break
	fi
	sleep 0.1
done
remote entry fleet nodes

capsule=$tmp/capsule
mkdir -p "$capsule"
cat >"$capsule/capsule.yaml" <<'EOF'
name: bench-true
version: 0.1.0
run:
  command: ["/usr/bin/true"]
capabilities:
  containment: sealed
EOF

# settle waits until the warm node has its sandboxes again (its directory entry says so),
# so that every warm run finds one.
settle() {
	for _ in $(seq 200); do
		remote entry fleet nodes --json | grep -q "\"a default capsule\": $WARM_POOL" && return
		sleep 0.05
	done
}

# Each path appends its microseconds to $tmp/<path>.us.
timed() { # timed PATH CMD...
	local name=$1
	shift
	local t0=${EPOCHREALTIME/./}
	"$@" >/dev/null
	echo $((${EPOCHREALTIME/./} - t0)) >>"$tmp/$name.us"
}

echo "== warming up"
for n in cold warm; do
	ROOST_SOCKET=${sock[$n]} ./bin/roostctl run --node "$n" "$capsule" >/dev/null
	remote entry run --node "$n" "$capsule" >/dev/null
done
# The session Get asks for runs through the whole bench; the rest are removed as they end.
mkdir -p "$tmp/sleeper"
printf 'name: bench-sleep\nversion: 0.1.0\nrun:\n  command: ["/bin/sleep", "3600"]\n' >"$tmp/sleeper/capsule.yaml"
get_id=$(ROOST_SOCKET=${sock[cold]} ./bin/roostctl run -d --node cold "$tmp/sleeper")

echo "== $N interleaved runs of each path"
for i in $(seq "$N"); do
	timed cold-socket env ROOST_SOCKET="${sock[cold]}" ./bin/roostctl run --node cold "$capsule"
	timed cold-owner-tcp remote cold run --node cold "$capsule"
	timed cold-via-entry remote entry run --node cold "$capsule"
	settle
	timed warm-socket env ROOST_SOCKET="${sock[warm]}" ./bin/roostctl run --node warm "$capsule"
	settle
	timed warm-owner-tcp remote warm run --node warm "$capsule"
	settle
	timed warm-via-entry remote entry run --node warm "$capsule"
	timed get-owner remote cold inspect "$get_id"
	timed get-via-entry remote entry inspect "$get_id"
	# Ended sessions go, so no registry grows over the run.
	for n in cold warm; do
		ROOST_SOCKET=${sock[$n]} ./bin/roostctl ps -q --filter status=exited 2>/dev/null |
			xargs -r env ROOST_SOCKET="${sock[$n]}" ./bin/roostctl rm >/dev/null 2>&1 || true
	done
done

echo
printf '%-16s %10s %10s\n' path p50_ms p99_ms
for p in cold-socket cold-owner-tcp cold-via-entry warm-socket warm-owner-tcp warm-via-entry get-owner get-via-entry; do
	sort -n "$tmp/$p.us" | awk -v p="$p" '{ a[NR] = $1 } END {
		i50 = int((NR * 50 + 99) / 100); i99 = int((NR * 99 + 99) / 100)
		printf "%-16s %10.1f %10.1f\n", p, a[i50] / 1000, a[i99] / 1000 }'
done
