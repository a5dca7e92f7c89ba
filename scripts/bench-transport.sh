#!/usr/bin/env bash
# Transport benchmark: one agent fronting a test worker that serves `identity`
# (OUTPUT0 = INPUT0, no compute), driven by `infermesh bench --transport` with
# tensors of 4 KiB, 1 MiB and 16 MiB in and the same out: shared memory vs
# gRPC inline through the agent, and a plain memcpy of the same size.
# Usage: scripts/bench-transport.sh [DURATION]   (default 5s per run)
#        SIZES="1024 4096 16384 65536" scripts/bench-transport.sh 3s   (other sizes)
# `--transport shm` sends every request through shared memory, however small
# (the library's default sends requests under 32 KiB inline).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-5s}
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=$PWD/target/release
. scripts/lib.sh
oip=$(port); admin=$(port)
"$bin/infermesh" agent --listen "127.0.0.1:$oip" --admin-listen "127.0.0.1:$admin" --threads 2 \
  --worker "$bin/infermesh-testworker --listen 127.0.0.1:{port} --model identity" \
  2>/tmp/infermesh-bench-transport-agent.log &
agent=$!
trap 'kill -TERM $agent 2>/dev/null; wait $agent 2>/dev/null' EXIT
printf '%-5s %9s %9s %11s %9s %9s %12s %8s\n' path size req/s 'MiB/s in' 'p50 ms' 'p99 ms' 'memcpy MiB/s' fallback
for size in ${SIZES:-4096 1048576 16777216}; do
  for t in shm grpc; do
    "$bin/infermesh" bench --target "127.0.0.1:$oip" --model identity --transport "$t" \
      --size-bytes "$size" --duration "$duration" --warmup 1s --wait-ready 60s --json 2>/dev/null | tail -1 |
      python3 -c '
import json, sys
r = json.load(sys.stdin)
fb = sum(v["fallbacks"] for v in r["paths"].values())
print("%-5s %9d %9.0f %11.0f %9.3f %9.3f %12.0f %8d" % (r["transport"], r["size_bytes"], r["throughput_rps"],
      r["bytes_per_s"] / 2**20, r["latency_ms"]["p50"], r["latency_ms"]["p99"], r["memcpy_bytes_per_s"] / 2**20, fb))'
  done
done
