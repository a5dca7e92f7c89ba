#!/usr/bin/env bash
# Two tenants sharing one node (issue 26). One agent, one test worker serving
# `hi` and `lo` (SLOTS slots × SERVICE_MS ms a request); `hi` belongs to tenant
# `high` (priority 1, half the node), `lo` to `low` (priority 20, the other half).
#   0. The node's capacity: closed loop on `lo` alone (4 callers a slot).
#   1. `high` alone, open loop at HIGH × capacity: its p99 and failures.
#   2. The same with `low` flooding at FLOOD × capacity (open loop) at once:
#      high's p99 (issue 26's target: at most 1.5× its p99 alone) and failures;
#      low's throughput and how many of its requests were shed.
#      Steps 1 and 2 alternate ROUNDS times (default 3): on a shared machine a
#      p99 moves with the other work, and the median ratio says more than one.
#   3. `low`'s flood alone (high quiet): its throughput against the capacity
#      (the idle share is lent).
#   4. Step 2 again on an agent without [[tenants]] (first come, first served):
#      what the tenants change.
# Every load goes straight to the agent (no client library, so no retry hides
# a failure), one HTTP/2 connection per load. The agent's queue holds QUEUE
# requests per model (default 64): below the connection's 256 streams, so that
# the flood overflows the agent's queue (and is shed) instead of waiting in the
# client for a stream. Prints a table and, last, one JSON line.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${BENCH_DURATION:-20s}
service_ms=${SERVICE_MS:-10}
slots=${SLOTS:-4}
high=${HIGH:-0.25}
flood=${FLOOD:-3}
queue=${QUEUE:-64}
rounds=${ROUNDS:-3}
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=$PWD/target/release
. scripts/lib.sh
scratch

start_agent() { # NAME TENANTS(0|1): starts an agent, sets oip and admin
  local name=$1 tenants=$2
  oip=$(port); admin=$(port)
  {
    printf '[queue]\ncapacity = %s\n' "$queue"
    if [ "$tenants" = 1 ]; then
      printf '[[tenants]]\nname = "high"\nmodels = ["hi"]\npriority = 1\nshare = 0.5\n'
      printf '[[tenants]]\nname = "low"\nmodels = ["lo"]\npriority = 20\nshare = 0.5\n'
    fi
    printf '[[workers]]\ncommand = "%s --listen 127.0.0.1:{port} --model hi --model lo --service-time-ms %s --concurrency %s"\n' \
      "$bin/infermesh-testworker" "$service_ms" "$slots"
  } > "$work/$name.toml"
  "$bin/infermesh" agent --config "$work/$name.toml" --listen "127.0.0.1:$oip" \
    --admin-listen "127.0.0.1:$admin" 2>"$work/$name.log" &
  agent_pid=$!
  pids+=("$agent_pid")
  "$bin/infermesh" bench --target "127.0.0.1:$oip" --model hi --duration 200ms --warmup 0s --wait-ready 60s >/dev/null
}
stop_agent() { kill "$agent_pid"; wait "$agent_pid" 2>/dev/null || true; }
bench() { "$bin/infermesh" bench --target "127.0.0.1:$oip" --json "$@" 2>/dev/null | tail -1; }
field() { python3 -c 'import json,sys; j=json.loads(sys.argv[1]); v=eval(sys.argv[2], {}, {"j": j}); print(v)' "$1" "$2"; }
metric() { curl -s "http://127.0.0.1:$admin/metrics" | awk -v s="$1" 'index($0, s" ") == 1 { print $2 }'; }

echo "== worker: $slots slots × $service_ms ms; high at ${high}× capacity, low flooding at ${flood}×, $duration each"
start_agent tenants 1
cap_json=$(bench --model lo --concurrency $((8 * slots)) --warmup 3s --duration 10s)
cap=$(field "$cap_json" 'round(j["throughput_rps"], 1)')
high_rate=$(python3 -c "print(round($cap * $high, 1))")
flood_rate=$(python3 -c "print(round($cap * $flood, 1))")
echo "capacity (closed loop on lo, 8 callers a slot): $cap req/s -> high $high_rate req/s, flood $flood_rate req/s"

run_pair() { # sets high_json and low_json: the flood and high's steady load at once
  bench --model lo --rate "$flood_rate" --warmup 2s --duration "$(( ${duration%s} + 4 ))s" > "$work/low.json" &
  local low_pid=$!
  sleep 1
  high_json=$(bench --model hi --rate "$high_rate" --warmup 2s --duration "$duration")
  wait "$low_pid"
  low_json=$(cat "$work/low.json")
}

p99() { field "$1" 'j["latency_ms"]["p99"]'; }
ratios=()
for r in $(seq "$rounds"); do
  alone_json=$(bench --model hi --rate "$high_rate" --warmup 2s --duration "$duration")
  run_pair
  tenants_high_json=$high_json
  tenants_low_json=$low_json
  ratios+=("$(python3 -c "print(round($(p99 "$tenants_high_json") / $(p99 "$alone_json"), 2))")")
  echo "round $r: high p99 alone $(p99 "$alone_json") ms, under the flood $(p99 "$tenants_high_json") ms (${ratios[-1]}x); high errors $(field "$tenants_high_json" 'j["errors"]') and $(field "$alone_json" 'j["errors"]') alone"
done
shed_low=$(metric 'infermesh_tenant_shed_total{tenant="low",reason="queue_full"}')
shed_high=0
for r in queue_full evicted rate; do
  n=$(metric "infermesh_tenant_shed_total{tenant=\"high\",reason=\"$r\"}")
  shed_high=$((shed_high + ${n:-0}))
done
low_alone_json=$(bench --model lo --rate "$flood_rate" --warmup 2s --duration "$duration")
stop_agent

start_agent fifo 0
run_pair
fifo_high_json=$high_json
fifo_low_json=$low_json
stop_agent

row() { # LABEL JSON
  printf '%-42s %9s %9s %9s %9s %8s %s\n' "$1" \
    "$(field "$2" 'round(j["throughput_rps"], 1)')" "$(field "$2" 'j["latency_ms"]["p50"]')" \
    "$(field "$2" 'j["latency_ms"]["p99"]')" "$(field "$2" 'j["latency_ms"]["p999"]')" \
    "$(field "$2" 'j["errors"]')" "$(field "$2" '" ".join(f"{k}={v}" for k, v in j["errors_by_code"].items())')"
}
echo "last round, and the rest:"
printf '%-42s %9s %9s %9s %9s %8s %s\n' run "ok req/s" "p50 ms" "p99 ms" "p999 ms" errors "by code"
row "high alone" "$alone_json"
row "high, low flooding (tenants)" "$tenants_high_json"
row "low flooding, high steady (tenants)" "$tenants_low_json"
row "low flooding, high quiet (tenants)" "$low_alone_json"
row "high, low flooding (no tenants: FIFO)" "$fifo_high_json"
row "low flooding, high steady (no tenants)" "$fifo_low_json"
ratio=$(python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "${ratios[@]}")
fifo_ratio=$(python3 -c "print(round($(field "$fifo_high_json" 'j["latency_ms"]["p99"]') / $(field "$alone_json" 'j["latency_ms"]["p99"]'), 2))")
lent=$(python3 -c "print(round($(field "$low_alone_json" 'j["throughput_rps"]') / $cap, 3))")
echo "high p99 under the flood / alone: median ${ratio}x of rounds (${ratios[*]}) with tenants (target <= 1.5); ${fifo_ratio}x without (last round's alone)"
echo "low's throughput with high quiet: ${lent} of the capacity; low shed (queue full) $shed_low, high shed $shed_high"
python3 -c 'import json,sys; print(json.dumps({"capacity_rps": float(sys.argv[1]), "high_rate_rps": float(sys.argv[2]), "flood_rate_rps": float(sys.argv[3]), "high_p99_ratio": float(sys.argv[4]), "fifo_high_p99_ratio": float(sys.argv[5]), "low_quiet_share_of_capacity": float(sys.argv[6]), "high_errors": json.loads(sys.argv[7])["errors"], "high_alone_errors": json.loads(sys.argv[8])["errors"]}))' \
  "$cap" "$high_rate" "$flood_rate" "$ratio" "$fifo_ratio" "$lent" "$tenants_high_json" "$alone_json"
