#!/usr/bin/env bash
# weight = "auto" vs hand-set correct weights (issues 14 and 26): a ZooKeeper
# and three agents with default settings (no max_inflight, no weight), each
# with one test worker of 4 slots × 2 ms, 4 × 5 ms and 2 × 20 ms (true
# capacities 2,000, 800 and 100 requests/s: 20 : 8 : 1).
#   0. Each agent alone, saturated (4 callers a slot): its capacity.
#   1. The fleet with those capacities pinned (--weight N), then with
#      weight = "auto", alternating, ROUNDS times: CALLERS closed-loop callers
#      through the client library (weighted P2C over ZooKeeper); a warm-up run
#      first (connections, slow start and, for auto, the learning), then the
#      measured run. Prints throughput per run, auto / pinned, the weights the
#      records advertise and each worker's learned limit (its /metrics).
# MODEL_CONFIG=0 (the default) makes the workers answer ModelConfig with
# UNIMPLEMENTED, like a server that does not say how many requests it runs
# at once: the agents learn it from latencies. MODEL_CONFIG=1 lets them start
# from the worker's instance_group count (Triton's ModelConfig).
# Needs Debian's zookeeper package (.ci/run installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${BENCH_DURATION:-10s}
rounds=${ROUNDS:-2}
callers=${CALLERS:-16}
model_config=${MODEL_CONFIG:-0}
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=$PWD/target/release
. scripts/lib.sh
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

start_zookeeper "$dir"
ms=(2 5 20)
slots=(4 4 2)
extra=$([ "$model_config" = 1 ] || echo --no-model-config)
declare -A oip admin apid

start_fleet() { # service weight-of-node-0 weight-of-node-1 weight-of-node-2
  local service=$1; shift
  for i in 0 1 2; do
    local o a; o=$(port); a=$(port); oip[$i]=$o; admin[$i]=$a
    printf '[[workers]]\ncommand = "%s --listen 127.0.0.1:{port} --service-time-ms %s --concurrency %s %s"\n' \
      "$bin/infermesh-testworker" "${ms[$i]}" "${slots[$i]}" "$extra" > "$dir/$service-$i.toml"
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
# limits I: the worker's learned limit, concurrency, unloaded latency and capacity.
limits() {
  curl -s "http://127.0.0.1:${admin[$1]}/metrics" | python3 -c '
import sys, re
v = {}
for line in sys.stdin:
    m = re.match(r"infermesh_worker_(concurrency_limit|concurrency|unloaded_latency_seconds|capacity)\{[^}]*\} (\S+)", line)
    if m: v[m.group(1)] = float(m.group(2))
print("limit %d, concurrency %.2f, unloaded %.2f ms, capacity %.0f/s" % (v.get("concurrency_limit", 0), v.get("concurrency", 0),
      1000 * v.get("unloaded_latency_seconds", 0), v.get("capacity", 0)))'
}

echo "== capacity of each node alone (4 callers a slot, $duration; workers ${extra:-with ModelConfig})"
start_fleet alone auto auto auto
cap=()
for i in 0 1 2; do
  c=$("$bin/infermesh" bench --target "127.0.0.1:${oip[$i]}" --concurrency $((4 * ${slots[$i]})) --duration "$duration" --json | rps)
  cap+=("$c")
  echo "node-${ms[$i]}ms (${slots[$i]} slots): $c req/s; learned: $(limits "$i")"
done
stop_fleet

declare -A total
for r in $(seq "$rounds"); do
  for mode in pinned auto; do
    if [ "$mode" = pinned ]; then start_fleet "pinned-$r" "${cap[0]}" "${cap[1]}" "${cap[2]}"; else start_fleet "auto-$r" auto auto auto; fi
    "$bin/infermesh" bench --registry "$registry" --service "$mode-$r" --concurrency "$callers" --duration "$duration" \
      --warmup 0s --wait-ready 30s >/dev/null
    out=$("$bin/infermesh" bench --registry "$registry" --service "$mode-$r" --concurrency "$callers" \
      --duration "$duration" --warmup 0s --json)
    t=$(echo "$out" | rps)
    weights=$("$bin/infermesh" nodes --registry "$registry" --service "$mode-$r" --json 2>/dev/null |
      python3 -c 'import json,sys; ns={n["id"]: n["weight"] for n in json.load(sys.stdin)["nodes"]}; w=[ns.get(f"node-{m}ms", 0) for m in (2, 5, 20)]; print(" ".join(f"{x:.1f}" for x in w) + (f" (ratio {w[0]/w[2]:.1f} : {w[1]/w[2]:.1f} : 1)" if w[2] else ""))' 2>/dev/null || echo "?")
    echo "round $r $mode: $t req/s; requests per node: $(echo "$out" | per_node); weights 2/5/20 ms: $weights"
    if [ "$mode" = auto ]; then
      for i in 0 1 2; do echo "  node-${ms[$i]}ms learned: $(limits "$i")"; done
    fi
    total[$mode]=$(python3 -c "print(${total[$mode]:-0} + $t)")
    stop_fleet
  done
done
python3 -c "c=[${cap[0]}, ${cap[1]}, ${cap[2]}]; print(f'true ratio alone: {c[0]/c[2]:.1f} : {c[1]/c[2]:.1f} : 1')"
python3 -c "p=${total[pinned]}; a=${total[auto]}; print(f'mean pinned {p/$rounds:.1f} req/s, auto {a/$rounds:.1f} req/s: auto / pinned = {100*a/p:.1f}%')"
