#!/usr/bin/env bash
# Instructions per request of a hop, counted by callgrind: the agent and
# HAProxy (`proto h2` both sides, one thread) in front of one test worker,
# 1 KiB tensors at concurrency 16 (CONC, SIZE to change). Unlike wall-clock
# runs on a shared VM, the count repeats to within about 0.5%, so it tells a
# change of a few percent in the hop's user-space work; it counts neither
# the kernel nor cache misses (scripts/bench-peers.sh measures those).
# valgrind slows the proxy ~50x, so requests are fewer than in a real run.
#
#   scripts/bench-instructions.sh            # agent and HAProxy, ~1 min
#   TARGETS=agent scripts/bench-instructions.sh
#   AGENT_ARGS="--config x.toml" scripts/bench-instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
conc=${CONC:-16}
size=${SIZE:-1024}
duration=${BENCH_DURATION:-5s}
targets=${TARGETS:-agent haproxy}
. scripts/lib.sh
need valgrind valgrind
need haproxy haproxy
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=$PWD/target/release
scratch

# Counts the instructions of process $1 while `infermesh bench` runs against
# $2 (after a warm-up), and prints them per request.
count() {
  local pid=$1 target=$2 name=$3
  "$bin/infermesh" bench --target "$target" --concurrency "$conc" --size-bytes "$size" \
    --duration 2s --wait-ready 120s >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  local line
  # No warm-up in the counted run (the run before warmed up): its requests
  # would be counted in the instructions and not in `requests` (bench's
  # default 1 s), inflating the figure by a fifth and by however fast that
  # second ran — most of the run-to-run spread of earlier figures.
  line=$("$bin/infermesh" bench --target "$target" --concurrency "$conc" --size-bytes "$size" \
    --duration "$duration" --warmup 0s --json | tail -n 1)
  callgrind_control -d "$pid" >/dev/null 2>&1
  local file
  file=$(ls -t "$work/$name.out"* | head -n 1)
  python3 - "$name" "$line" "$file" <<'PY'
import json, re, sys
name, line, path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
total = 0
for l in open(path):
    m = re.match(r"summary: (\d+)", l)
    if m:
        total = int(m.group(1))
n = line["requests"]
print(f"{name}: {n} requests, {total / n / 1000:.1f}k instructions per request")
PY
}

for t in $targets; do
  case $t in
    agent)
      oport=$(port); aport=$(port)
      # shellcheck disable=SC2086
      valgrind --tool=callgrind --callgrind-out-file="$work/agent.out" \
        "$bin/infermesh" agent --listen "127.0.0.1:$oport" --admin-listen "127.0.0.1:$aport" \
        --node-id bench --threads 1 ${AGENT_ARGS:-} \
        --worker "$bin/infermesh-testworker --listen 127.0.0.1:{port}" 2>"$work/agent.log" &
      pids+=($!)
      count $! "127.0.0.1:$oport" agent
      ;;
    haproxy)
      wport=$(port); hport=$(port)
      "$bin/infermesh-testworker" --listen "127.0.0.1:$wport" 2>/dev/null &
      pids+=($!)
      haproxy_h2_cfg "$work/haproxy.cfg" "$hport" 1 "  server w 127.0.0.1:$wport proto h2"
      valgrind --tool=callgrind --callgrind-out-file="$work/haproxy.out" \
        haproxy -f "$work/haproxy.cfg" -db >"$work/haproxy.log" 2>&1 &
      pids+=($!)
      count $! "127.0.0.1:$hport" haproxy
      ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
  esac
done
