#!/usr/bin/env bash
# Where a leased 16 MiB shared-memory request's time goes at concurrency 1
# (issue 27): one agent with one test worker serving `identity`, driven by
# `infermesh bench --transport shm --leased`, with `perf stat` on the bench,
# the agent and the worker for a few seconds in the middle of the run. At
# concurrency 1 the three take turns, so each one's CPU time divided by the
# requests in the window is its share of one request, and the cycle
# (1 / req/s) minus their sum is time nobody ran: wake-ups and waiting for
# a core. Load from other processes lengthens every share, so read the
# rows of one run together.
# Usage: scripts/bench-shm-timeline.sh [ROUNDS]      (default 3)
#        PLACES="free one split" SIZE=16777216 scripts/bench-shm-timeline.sh 2
# PLACES: `free` (the scheduler places all three), `one` (all on CPU 1),
# `split` (the bench on CPU 0, agent and worker on CPU 1), `rsplit` (the
# other way round).
# Columns: the bench's memcpy of the same size (its own measurement), the
# cell's req/s and % of that memcpy (input + output bytes, as
# bench-transport.sh counts), then CPU ms per request of each process,
# their sum, the cycle left over, context switches per request, and
# requests that fell back to gRPC or failed (must be 0).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
size=${SIZE:-16777216}
. scripts/lib.sh
need perf linux-perf
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=${CARGO_TARGET_DIR:-$PWD/target}/release
scratch
cell() { # PLACE AGENT_CPUS BENCH_CPUS
  local place=$1 oip admin agent bench worker p stats=()
  oip=$(port); admin=$(port)
  taskset -c "$2" "$bin/infermesh" agent --listen "127.0.0.1:$oip" --admin-listen "127.0.0.1:$admin" \
    --threads 2 --worker "$bin/infermesh-testworker --listen 127.0.0.1:{port} --model identity" \
    2>"$work/agent.log" &
  agent=$!; pids+=("$agent")
  taskset -c "$3" "$bin/infermesh" bench --target "127.0.0.1:$oip" --model identity --transport shm \
    --leased --size-bytes "$size" --concurrency 1 --duration 6s --warmup 1s --wait-ready 60s --json \
    >"$work/bench.json" 2>"$work/bench.err" &
  bench=$!
  # Ready, warmed up and measuring by then: the agent starts in about a second.
  sleep 3.5
  worker=$(pgrep -n -f "^$bin/infermesh-testworker")
  for p in bench agent worker; do
    eval "timeout -s INT 2 perf stat -e task-clock,context-switches -p \$$p -o $work/$p.stat &"
    stats+=($!)
  done
  wait "${stats[@]}" 2>/dev/null || true
  wait "$bench" || true
  kill -TERM "$agent"; wait "$agent" 2>/dev/null || true
  PLACE=$place WORK=$work python3 -c '
import json, os, re
w = os.environ["WORK"]
r = json.load(open(w + "/bench.json"))
rps = r["throughput_rps"]; memcpy = r["memcpy_bytes_per_s"]
cpu, cs = {}, {}
for p in ("bench", "agent", "worker"):
    t = open(w + "/" + p + ".stat").read()
    num = lambda pattern: float(re.search(pattern, t).group(1).replace(",", ""))
    cpu[p] = num(r"([\d.,]+)\s+msec task-clock")
    cs[p] = num(r"([\d,]+)\s+context-switches")
    if p == "worker":
        secs = num(r"([\d.]+) seconds time elapsed")
n = rps * secs
per = {p: cpu[p] / n for p in cpu}
total = sum(per.values())
bad = sum(v["fallbacks"] for v in r["paths"].values()) + r["errors"]
print("%-6s %7.2f %8.1f %8.1f %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f %6.1f %6d" % (os.environ["PLACE"],
      r["size_bytes"] / memcpy * 1e3, rps, 100 * 2 * r["bytes_per_s"] / memcpy, 1e3 / rps,
      per["bench"], per["agent"], per["worker"], total, 1e3 / rps - total, sum(cs.values()) / n, bad))'
}
printf "%-6s %7s %8s %8s %6s %6s %6s %6s %6s %6s %6s %6s\n" place "memcpy" req/s "% memcpy" cycle \
  bench agent worker sum "left" cs/req fb+err
for round in $(seq "$rounds"); do
  echo "# round $round, load $(cut -d' ' -f1-3 /proc/loadavg)"
  for place in ${PLACES:-free one split}; do
    case $place in
      free) cell free 0-1 0-1 ;;
      one) cell one 1 1 ;;
      split) cell split 1 0 ;;
      rsplit) cell rsplit 0 1 ;;
    esac
  done
done
