#!/usr/bin/env bash
# Transport benchmark: one agent fronting a test worker that serves `identity`
# (OUTPUT0 = INPUT0, no compute), driven by `infermesh bench --transport` with
# tensors of 4 KiB, 1 MiB and 16 MiB in and the same out: shared memory
# through leased regions (`--leased`: the input written into a region for
# each request, the output left where the worker wrote it, a view dropped
# unread), shared memory through the
# simple API (the library copies in and out), gRPC inline through the agent,
# and a plain memcpy of the same size. Cells interleaved, one agent.
# Usage: scripts/bench-transport.sh [DURATION]   (default 5s per run)
#        SIZES="16777216" CONCS="1 4" ROUNDS=3 scripts/bench-transport.sh 4s
#        MODES="leased grpc" ...       (a subset; default "leased shm grpc")
# `--transport shm` sends every request through shared memory, however small
# (the library's default sends requests under 32 KiB inline).
# Columns: `MiB/s io` counts input + output bytes (what a memcpy-equivalent
# transport moves), `% memcpy` is that against one thread's memcpy of the
# same size measured by the same bench process.
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
printf "%-6s %6s %9s %4s %9s %10s %8s %9s %9s %12s %8s %6s\n" round mode size conc req/s "MiB/s io" "% memcpy" \
  "p50 ms" "p99 ms" "memcpy MiB/s" fallback errors
for round in $(seq "${ROUNDS:-1}"); do
  for size in ${SIZES:-4096 1048576 16777216}; do
    for conc in ${CONCS:-1}; do
      for mode in ${MODES:-leased shm grpc}; do
        case $mode in
          leased) flags=(--transport shm --leased) ;;
          *) flags=(--transport "$mode") ;;
        esac
        ("$bin/infermesh" bench --target "127.0.0.1:$oip" --model identity "${flags[@]}" \
          --size-bytes "$size" --concurrency "$conc" --duration "$duration" --warmup 1s \
          --wait-ready 60s --json 2>>/tmp/infermesh-bench-transport-bench.log || true) |
          ROUND=$round MODE=$mode python3 -c '
import json, os, sys
r = json.load(sys.stdin)
fb = sum(v["fallbacks"] for v in r["paths"].values())
err = r["errors"]
io = 2 * r["bytes_per_s"]
print("%-6s %6s %9d %4d %9.1f %10.0f %8.1f %9.3f %9.3f %12.0f %8d %6d" % (os.environ["ROUND"],
      os.environ["MODE"], r["size_bytes"], r["concurrency"], r["throughput_rps"], io / 2**20,
      100 * io / r["memcpy_bytes_per_s"], r["latency_ms"]["p50"], r["latency_ms"]["p99"],
      r["memcpy_bytes_per_s"] / 2**20, fb, err))'
      done
    done
  done
done
