#!/usr/bin/env bash
# Real-run balancing figures (issue 4): a ZooKeeper and three agents on loopback
# with test workers of different speeds, advertising weights that match their
# capacity. Load (16 closed-loop callers, 1 KiB) goes
#   1. through the client library (local-less weighted P2C over ZooKeeper), then
#   2. round robin over the same three agents, then
#   3. through HAProxy `balance leastconn` over the same agents with the same
#      weights (issue 12), then
#   4. through the client library again while one agent is SIGKILLed midway:
#      time from the kill to the client's last attempt on it, and errors.
# Needs Debian's zookeeper and haproxy packages (.ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${BENCH_DURATION:-8s}
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=$PWD/target/release
. scripts/lib.sh
now_ms() { python3 -c 'import time; print(int(time.time()*1000))'; }
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

start_zookeeper "$dir"

declare -A oip
start_agent() { # name weight worker-flags
  local o a; o=$(port); a=$(port); oip[$1]=$o
  "$bin/infermesh" agent --node-id "$1" --listen "127.0.0.1:$o" --admin-listen "127.0.0.1:$a" \
    --registry "$registry" --service fleet --weight "$2" \
    --worker "infermesh-testworker --listen 127.0.0.1:{port} $3" 2>"$dir/$1.log" &
  pids+=($!)
}
# Capacity = slots / service time: fast 4/2ms, mid 4/5ms, slow 2/20ms.
# HAProxy weights are integers: the same weights × 10.
start_agent node-fast 4.0 "--service-time-ms 2 --concurrency 4"
start_agent node-mid 1.6 "--service-time-ms 5 --concurrency 4"
start_agent node-slow 0.2 "--service-time-ms 20 --concurrency 2"

for n in node-fast node-mid node-slow; do
  "$bin/infermesh" bench --target "127.0.0.1:${oip[$n]}" --duration 200ms --warmup 0s --wait-ready 60s >/dev/null
done

echo "== weighted P2C through the client library"
"$bin/infermesh" bench --registry "$registry" --service fleet --concurrency 16 --duration "$duration" --wait-ready 30s --json > "$dir/p2c.txt"
echo "== round robin over the same agents"
"$bin/infermesh" bench --target "127.0.0.1:${oip[node-fast]},127.0.0.1:${oip[node-mid]},127.0.0.1:${oip[node-slow]}" \
  --concurrency 16 --duration "$duration" --json > "$dir/rr.txt"

echo "== HAProxy balance leastconn over the same agents, same weights"
hport=$(port)
haproxy_h2_cfg "$dir/haproxy.cfg" "$hport" 2 "  balance leastconn
  server fast 127.0.0.1:${oip[node-fast]} proto h2 weight 40
  server mid 127.0.0.1:${oip[node-mid]} proto h2 weight 16
  server slow 127.0.0.1:${oip[node-slow]} proto h2 weight 2"
haproxy -f "$dir/haproxy.cfg" -db >"$dir/haproxy.log" 2>&1 &
pids+=($!)
"$bin/infermesh" bench --target "127.0.0.1:$hport" --wait-ready 10s --concurrency 16 --duration "$duration" --json \
  > "$dir/lc.txt"

echo "== client library while node-mid is SIGKILLed after 3 s"
"$bin/infermesh" bench --registry "$registry" --service fleet --concurrency 16 --duration "$duration" --warmup 0s --json > "$dir/kill.txt" &
bench=$!
sleep 3
mid_pid=$(pgrep -f -- "--node-id node-mid" | head -n1)
kill -9 "$mid_pid"
killed=$(now_ms)
wait $bench
python3 - "$dir" "$killed" <<'PY'
import json, sys
d, killed = sys.argv[1], int(sys.argv[2])
last = lambda f: json.loads(open(f"{d}/{f}").read().strip().splitlines()[-1])
p2c, rr, lc, k = last("p2c.txt"), last("rr.txt"), last("lc.txt"), last("kill.txt")
print()
print("| policy | req/s | p50 ms | p99 ms | p999 ms | errors |")
print("|---|---|---|---|---|---|")
for name, r in (("weighted P2C (client library)", p2c), ("HAProxy leastconn", lc), ("round robin", rr)):
    l = r["latency_ms"]
    print(f"| {name} | {r['throughput_rps']:.0f} | {l['p50']:.2f} | {l['p99']:.2f} | {l['p999']:.2f} | {r['errors']} |")
print(f"\nP2C p99 / round-robin p99 = {p2c['latency_ms']['p99'] / rr['latency_ms']['p99']:.2f}")
print(f"P2C p99 / HAProxy leastconn p99 = {p2c['latency_ms']['p99'] / lc['latency_ms']['p99']:.2f}; "
      f"throughput ratio {p2c['throughput_rps'] / lc['throughput_rps']:.2f}")
print("P2C requests by node:", p2c.get("requests_by_node"))
mid_last = k["last_attempt_unix_ms_by_node"].get("node-mid")
print(f"\nkill test: errors {k['errors']} {k['errors_by_code']}; requests by node {k.get('requests_by_node')}")
if mid_last:
    print(f"time from SIGKILL to the client's last attempt on node-mid: {mid_last - killed} ms")
PY
