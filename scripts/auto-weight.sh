#!/usr/bin/env bash
# weight = "auto" vs hand-set correct weights (issue 14): a ZooKeeper and three
# agents, each with one single-slot test worker of 2, 5 and 20 ms per request.
#   0. Each agent alone, saturated (4 callers for its one slot): its capacity.
#   1. The fleet with those capacities pinned (--weight N), then with
#      --weight auto, alternating, ROUNDS times: 16 closed-loop callers through
#      the client library (weighted P2C over ZooKeeper); a warm-up run first
#      (connections, slow start and, for auto, the estimates), then the
#      measured run. Prints throughput per run and auto / pinned.
# MAX_INFLIGHT (default 1) is the agents' max_inflight per worker: 1 matches
# the workers' one slot; 64 (the agent's default) overstates their parallelism,
# the case README "Live capacity" warns about.
# Needs Debian's zookeeper package (.ci/run installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${BENCH_DURATION:-10s}
rounds=${ROUNDS:-2}
callers=${CALLERS:-16}
max_inflight=${MAX_INFLIGHT:-1}
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=$PWD/target/release
. scripts/lib.sh
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

start_zookeeper "$dir"
ms=(2 5 20)
declare -A oip apid

start_fleet() { # service weight-of-node-0 weight-of-node-1 weight-of-node-2
  local service=$1; shift
  for i in 0 1 2; do
    local o a; o=$(port); a=$(port); oip[$i]=$o
    printf '[[workers]]\ncommand = "%s --listen 127.0.0.1:{port} --service-time-ms %s --concurrency 1"\nmax_inflight = %s\n' \
      "$bin/infermesh-testworker" "${ms[$i]}" "$max_inflight" > "$dir/$service-$i.toml"
    "$bin/infermesh" agent --config "$dir/$service-$i.toml" --node-id "node-${ms[$i]}ms" \
      --listen "127.0.0.1:$o" --admin-listen "127.0.0.1:$a" \
      --registry "$registry" --service "$service" --weight "$1" \
      2>"$dir/$service-$i.log" &
    apid[$i]=$!
    pids+=($!)
    shift
  done
  for i in 0 1 2; do
    "$bin/infermesh" bench --target "127.0.0.1:${oip[$i]}" --duration 100ms --warmup 0s --wait-ready 60s >/dev/null
  done
}
stop_fleet() {
  for i in 0 1 2; do kill "${apid[$i]}" 2>/dev/null || true; wait "${apid[$i]}" 2>/dev/null || true; done
}
rps() { python3 -c 'import json,sys; print(round(json.loads(sys.stdin.read().strip().splitlines()[-1])["throughput_rps"],1))'; }
per_node() { python3 -c 'import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); n=j.get("requests_by_node") or {}; print(" ".join(f"{k}={v}" for k,v in sorted(n.items())))'; }

echo "== capacity of each node alone (4 callers, $duration)"
start_fleet alone auto auto auto
cap=()
for i in 0 1 2; do
  c=$("$bin/infermesh" bench --target "127.0.0.1:${oip[$i]}" --concurrency 4 --duration "$duration" --json | rps)
  cap+=("$c")
  echo "node-${ms[$i]}ms: $c req/s"
done
stop_fleet

declare -A total runs
for r in $(seq "$rounds"); do
  for mode in pinned auto; do
    if [ "$mode" = pinned ]; then start_fleet "pinned-$r" "${cap[0]}" "${cap[1]}" "${cap[2]}"; else start_fleet "auto-$r" auto auto auto; fi
    "$bin/infermesh" bench --registry "$registry" --service "$mode-$r" --concurrency "$callers" --duration "$duration" \
      --warmup 0s --wait-ready 30s >/dev/null
    out=$("$bin/infermesh" bench --registry "$registry" --service "$mode-$r" --concurrency "$callers" \
      --duration "$duration" --warmup 0s --json)
    t=$(echo "$out" | rps)
    weights=$("$bin/infermesh" nodes --registry "$registry" --service "$mode-$r" --json 2>/dev/null |
      python3 -c 'import json,sys; print(" ".join(n["id"] + "=" + format(n["weight"], ".1f") for n in sorted(json.load(sys.stdin)["nodes"], key=lambda n: n["id"])))' 2>/dev/null || echo "?")
    echo "round $r $mode: $t req/s; requests per node: $(echo "$out" | per_node); weights: $weights"
    total[$mode]=$(python3 -c "print(${total[$mode]:-0} + $t)")
    stop_fleet
  done
done
python3 -c "p=${total[pinned]}; a=${total[auto]}; print(f'mean pinned {p/$rounds:.1f} req/s, auto {a/$rounds:.1f} req/s: auto / pinned = {100*a/p:.1f}%')"
