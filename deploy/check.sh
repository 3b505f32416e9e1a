#!/usr/bin/env bash
# deploy/check.sh: validates the operator assets in deploy/ (run from anywhere; CI runs it).
#   - promtool check rules   deploy/prometheus/alerts.yaml
#   - promtool check config  a temporary prometheus.yml made of deploy/prometheus/scrape.yaml
#                            and the rules, as an operator would assemble it
#   - promtool test rules    deploy/prometheus/alerts_test.yaml (synthetic series: the alerts fire)
#   - the Grafana dashboard deploy/grafana/roost.json is valid JSON of the expected shape
#   - every metric named in the dashboard, the alerts and their tests exists in
#     pkg/metrics/metrics.go (histogram _bucket/_sum/_count map to their histogram) or is one of
#     the Go/process collectors' standard metrics; a deprecated roost metric is refused.
#   - systemd-analyze verify  deploy/systemd/roostd.service with the fleet drop-in
#                            roostd.service.d/roostd-fleet.conf, and deploy/systemd/etcd's
#                            roost-etcd@.service as its three members e0, e1, e2: any
#                            warning fails. (The Kubernetes manifests, the Nomad job and the
#                            flags all of them give roostd and roost-etcd are checked by
#                            deploy/deploytest, a Go test that make unit runs.)
# promtool comes from Debian's prometheus package; it is installed with apt when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

DEPLOY=deploy
RULES=$DEPLOY/prometheus/alerts.yaml
RULES_TEST=$DEPLOY/prometheus/alerts_test.yaml
SCRAPE=$DEPLOY/prometheus/scrape.yaml
DASHBOARD=$DEPLOY/grafana/roost.json
METRICS_GO=pkg/metrics/metrics.go
# Every non-test file of pkg/metrics names metrics; metrics.go's name is the one said.
METRICS_ALL=$(ls pkg/metrics/*.go | grep -v '_test\.go$')

fail() { echo "deploy/check: $*" >&2; exit 1; }

if ! command -v promtool >/dev/null; then
  echo "deploy/check: installing promtool (Debian package prometheus)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -qq --no-install-recommends prometheus ||
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends prometheus; }
fi
command -v promtool >/dev/null || fail "promtool is not installed (apt-get install prometheus)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== promtool check rules $RULES"
promtool check rules "$RULES"

echo "== promtool check config (scrape.yaml + alerts.yaml)"
# Prometheus 2.42 (Debian 12) has no scrape_config_files: the scrape file is a top-level
# scrape_configs fragment, appended to a minimal prometheus.yml as an operator would.
{
  printf 'global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n'
  printf 'rule_files:\n  - %s\n' "$PWD/$RULES"
  cat "$SCRAPE"
} >"$tmp/prometheus.yml"
promtool check config "$tmp/prometheus.yml"
grep -qE '^[[:space:]]*-[[:space:]]*job_name:[[:space:]]*"?roost"?[[:space:]]*$' "$SCRAPE" ||
  fail "$SCRAPE: no job_name roost, which the alerts select (job=\"roost\")"

echo "== promtool test rules $RULES_TEST"
promtool test rules "$RULES_TEST"

echo "== dashboard $DASHBOARD"
if command -v python3 >/dev/null; then
  python3 - "$DASHBOARD" "$tmp/dashboard_rules.yaml" <<'EOF'
import json, sys
path = sys.argv[1]
try:
    d = json.load(open(path))
except ValueError as e:
    sys.exit(f"deploy/check: {path}: invalid JSON: {e}")
errs = []
if not isinstance(d.get("schemaVersion"), int):
    errs.append("no schemaVersion")
if not d.get("uid") or not d.get("title"):
    errs.append("no uid or title")
names = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
if names.get("DS_PROMETHEUS", {}).get("type") != "datasource":
    errs.append("no datasource variable DS_PROMETHEUS")
if "instance" not in names:
    errs.append("no instance variable")
ids = set()
def walk(panels):
    for p in panels:
        yield p
        yield from walk(p.get("panels", []))
for p in walk(d.get("panels", [])):
    title = p.get("title", "?")
    if p.get("id") in ids:
        errs.append(f"panel {title!r}: duplicate id {p.get('id')}")
    ids.add(p.get("id"))
    if p.get("type") == "row":
        continue
    if (p.get("datasource") or {}).get("uid") != "${DS_PROMETHEUS}":
        errs.append(f"panel {title!r}: datasource is not ${{DS_PROMETHEUS}}")
    if not p.get("targets") or not all(t.get("expr") for t in p["targets"]):
        errs.append(f"panel {title!r}: a target without expr")
if errs:
    sys.exit("deploy/check: " + path + ":\n  " + "\n  ".join(errs))
print(f"  valid: {len(ids)} panels")
# Every query as a recording rule, Grafana's variables substituted, so that promtool parses
# the dashboard's PromQL too (JSON strings are YAML strings).
subst = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "${job}": ".+",
         "$job": ".+", "${instance}": ".+", "$instance": ".+"}
exprs = []
for p in walk(d.get("panels", [])):
    exprs += [(p.get("title", "?"), t["expr"]) for t in p.get("targets", []) if t.get("expr")]
exprs += [(a.get("name", "?"), a["expr"]) for a in d.get("annotations", {}).get("list", []) if a.get("expr")]
with open(sys.argv[2], "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (title, e) in enumerate(exprs):
        for k in sorted(subst, key=len, reverse=True):
            e = e.replace(k, subst[k])
        out.write(f"      - record: dashboard:expr{i}\n        expr: {json.dumps(e)}\n")
EOF
  echo "== promtool check rules: the dashboard's queries"
  promtool check rules "$tmp/dashboard_rules.yaml" >/dev/null ||
    { promtool check rules "$tmp/dashboard_rules.yaml" || true; fail "$DASHBOARD: a query promtool cannot parse (above)"; }
  echo "  ok: $(grep -c 'record:' "$tmp/dashboard_rules.yaml") queries parse"
elif command -v jq >/dev/null; then
  jq empty "$DASHBOARD" || fail "$DASHBOARD: invalid JSON"
else
  fail "neither python3 nor jq to check $DASHBOARD"
fi

echo "== metric names against $METRICS_GO"
[ -f "$METRICS_GO" ] || fail "$METRICS_GO not found"
# roost's metrics: every "roost_…" string literal in metrics.go is a metric name.
cat $METRICS_ALL | grep -oE '"roost_[a-z0-9_]+"' | tr -d '"' | sort -u >"$tmp/known"
# Histograms, whose series are <name>_bucket, _sum and _count.
cat $METRICS_ALL | grep -A2 'HistogramOpts{' | grep -oE '"roost_[a-z0-9_]+"' | tr -d '"' | sort -u >"$tmp/histograms"
# Deprecated names: a Name whose Help starts with "Deprecated".
awk 'match($0, /Name: *"roost_[a-z0-9_]+"/) { n = substr($0, RSTART, RLENGTH); sub(/^Name: *"/, "", n); sub(/"$/, "", n) }
     /Help: *"Deprecated/ && n != "" { print n }' $METRICS_ALL | sort -u >"$tmp/deprecated"
[ -s "$tmp/known" ] || fail "found no roost_ metric names in $METRICS_GO"
# The standard collectors roostd registers (collectors.NewGoCollector, NewProcessCollector).
standard='^(up|go_goroutines|go_threads|go_info|go_sched_gomaxprocs_threads|go_gc_duration_seconds(_sum|_count)?|go_memstats_[a-z0-9_]+|process_(cpu_seconds_total|open_fds|max_fds|virtual_memory_bytes|virtual_memory_max_bytes|resident_memory_bytes|start_time_seconds|network_receive_bytes_total|network_transmit_bytes_total))$'
bad=0
for f in "$DASHBOARD" "$RULES" "$RULES_TEST"; do
  # Names as PromQL writes them: roost_/go_/process_ not preceded by a name character.
  names=$(grep -oE '(^|[^A-Za-z0-9_])(roost|go|process)_[A-Za-z0-9_]+' "$f" | sed -E 's/^[^A-Za-z]//' | sort -u || true)
  for n in $names; do
    base=$n
    if ! grep -qxF "$n" "$tmp/known"; then
      case $n in
        *_bucket | *_sum | *_count)
          h=${n%_*}
          grep -qxF "$h" "$tmp/histograms" && base=$h ;;
      esac
    fi
    if grep -qxF "$base" "$tmp/known"; then
      if grep -qxF "$base" "$tmp/deprecated"; then
        echo "deploy/check: $f: $n is deprecated in $METRICS_GO: use its replacement" >&2
        bad=1
      fi
    elif ! [[ $n =~ $standard ]]; then
      echo "deploy/check: $f: unknown metric $n (not in $METRICS_GO, not a standard go_/process_ metric)" >&2
      bad=1
    fi
  done
done
[ "$bad" -eq 0 ] || exit 1
# Not an error: roost metrics the dashboard does not show yet.
while read -r m; do
  grep -qxF "$m" "$tmp/deprecated" && continue
  grep -qE "(^|[^A-Za-z0-9_])$m(_bucket|_sum|_count)?([^A-Za-z0-9_]|$)" "$DASHBOARD" ||
    echo "deploy/check: note: $m is not on the dashboard" >&2
done <"$tmp/known"
echo "  ok: $(wc -l <"$tmp/known") roost metrics known"

echo "== systemd-analyze verify: roostd.service + roostd-fleet.conf, roost-etcd@{e0,e1,e2}.service"
command -v systemd-analyze >/dev/null || fail "systemd-analyze is missing (apt-get install systemd)"
# A root of the host's own units (for multi-user.target, network-online.target and the
# like) with roost's installed as make install and the drop-in's instructions put them;
# the commands are stand-ins, since verify checks only that they are executable.
root=$tmp/root
mkdir -p "$root/lib/systemd/system" "$root/etc/systemd/system/roostd.service.d" "$root/usr/local/bin"
cp -a /lib/systemd/system/. "$root/lib/systemd/system/"
cp "$DEPLOY/systemd/roostd.service" "$root/lib/systemd/system/"
cp "$DEPLOY/systemd/roostd.service.d/roostd-fleet.conf" "$root/etc/systemd/system/roostd.service.d/"
cp "$DEPLOY/systemd/etcd/roost-etcd@.service" "$root/etc/systemd/system/"
for b in roostd roost-etcd; do install -m 0755 /bin/true "$root/usr/local/bin/$b"; done
verify() {
  local out
  out=$(systemd-analyze verify --root="$root" --man=no --generators=no "$@" 2>&1) ||
    { echo "$out" >&2; fail "systemd-analyze verify $* failed"; }
  [ -z "$out" ] || { echo "$out" >&2; fail "systemd-analyze verify $* warned"; }
}
verify "$root/lib/systemd/system/roostd.service"
for m in e0 e1 e2; do
  [ -f "$DEPLOY/systemd/etcd/$m.env" ] || fail "$DEPLOY/systemd/etcd/$m.env is missing"
  verify "roost-etcd@$m.service"
done
echo "  ok"

echo "deploy/check: ok"
