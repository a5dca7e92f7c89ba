#!/usr/bin/env bash
# Measures what the agent hop adds: `infermesh bench` directly against one
# test worker (--service-time-ms 0) vs through an agent fronting that same
# kind of worker, at concurrency 1 and 16, with 1 KiB and 1 MiB tensors.
# Prints one JSON line per run and a summary table (used in BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${BENCH_DURATION:-5s}
threads=${AGENT_THREADS:+--threads $AGENT_THREADS}   # agent runtime threads (default: one per core)
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=target/release
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wport=$(port); oport=$(port); aport=$(port)
"$bin/infermesh-testworker" --listen "127.0.0.1:$wport" 2>/dev/null &
worker=$!
"$bin/infermesh" agent --listen "127.0.0.1:$oport" --admin-listen "127.0.0.1:$aport" --node-id bench $threads \
  --worker "infermesh-testworker --listen 127.0.0.1:{port}" 2>/dev/null &
agent=$!
trap 'kill $worker 2>/dev/null; kill -TERM $agent 2>/dev/null; wait 2>/dev/null' EXIT

out=$(mktemp)
for size in 1024 1048576; do
  for conc in 1 16; do
    for target in direct agent; do
      addr=$([ $target = direct ] && echo "127.0.0.1:$wport" || echo "127.0.0.1:$oport")
      line=$("$bin/infermesh" bench --target "$addr" --concurrency $conc --size-bytes $size \
        --duration "$duration" --warmup 1s --wait-ready 30s --json | tail -n 1)
      echo "$target $line" | tee -a "$out"
    done
  done
done
python3 - "$out" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    target, js = line.split(" ", 1)
    r = json.loads(js)
    rows[(r["size_bytes"], r["concurrency"], target)] = r
print()
print("| tensor | conc | direct rps | agent rps | ratio | direct p50 ms | agent p50 ms | added p50 µs | direct p99 ms | agent p99 ms | added p99 µs |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (size, conc, t) in sorted(rows):
    if t != "agent":
        continue
    d, a = rows[(size, conc, "direct")], rows[(size, conc, "agent")]
    name = "1 KiB" if size == 1024 else "1 MiB"
    print(f"| {name} | {conc} | {d['throughput_rps']:.0f} | {a['throughput_rps']:.0f} | {a['throughput_rps']/d['throughput_rps']:.2f} "
          f"| {d['latency_ms']['p50']:.3f} | {a['latency_ms']['p50']:.3f} | {1000*(a['latency_ms']['p50']-d['latency_ms']['p50']):.0f} "
          f"| {d['latency_ms']['p99']:.3f} | {a['latency_ms']['p99']:.3f} | {1000*(a['latency_ms']['p99']-d['latency_ms']['p99']):.0f} |")
PY
