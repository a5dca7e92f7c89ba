#!/usr/bin/env bash
# What a hop in front of one worker costs: `infermesh bench` against one test
# worker directly, through the infermesh agent, through HAProxy (`proto h2` on
# both sides) and through nginx (`grpc_pass`), in one run, interleaved, with
# 1 KiB and 1 MiB tensors at concurrency 1 and 16 (SIZES="1048576 16777216"
# for the large-tensor rows of issue 27).
#
# Every proxy gets the same CPU budget: one thread/worker process each
# (AGENT_THREADS / PEER_THREADS to change). Each cell is measured ROUNDS times
# (interleaved, so drift hits every target alike) and the median round is
# reported. Prints one JSON line per run and the table used in BENCHMARKS.md:
# throughput as a ratio of direct, and added p50/p99 over direct.
#
#   scripts/bench-peers.sh                       # full table, ~4 min
#   BENCH_DURATION=3s ROUNDS=1 scripts/bench-peers.sh
#   SIZES=1024 CONCS=1 scripts/bench-peers.sh    # one row
#
# BIN=DIR takes infermesh and infermesh-testworker from DIR instead of
# building them (a host without Rust).
#
# PROBE_TIMEOUT=5s gives the agent's liveness probe of the worker that long
# (default 1s): before probes ran on a thread of their own, a late probe at
# 16 MiB × 16 made the agent restart the busy worker as hung (BENCHMARKS.md,
# issue 27). HAProxy and nginx probe nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${BENCH_DURATION:-5s}
rounds=${ROUNDS:-3}
sizes=${SIZES:-1024 1048576}
concs=${CONCS:-1 16}
agent_threads=${AGENT_THREADS:-1}
probe_timeout=${PROBE_TIMEOUT:-}
peer_threads=${PEER_THREADS:-1}

. scripts/lib.sh
need haproxy haproxy
need nginx nginx
if [ -z "${BIN:-}" ]; then
  cargo build --release --locked -q -p infermesh -p infermesh-testworker
  bin=target/release
else
  bin=$BIN
fi
scratch

wport=$(port); oport=$(port); aport=$(port); hport=$(port); nport=$(port)
agent_config=()
if [ -n "$probe_timeout" ]; then
  printf '[sentinel]\nprobe_timeout = "%s"\n' "$probe_timeout" >"$work/agent.toml"
  agent_config=(--config "$work/agent.toml")
fi
"$bin/infermesh-testworker" --listen "127.0.0.1:$wport" 2>/dev/null &
pids+=($!)
"$bin/infermesh" agent "${agent_config[@]}" --listen "127.0.0.1:$oport" --admin-listen "127.0.0.1:$aport" --node-id bench \
  --threads "$agent_threads" --worker "$bin/infermesh-testworker --listen 127.0.0.1:{port}" 2>/dev/null &
pids+=($!)

haproxy_h2_cfg "$work/haproxy.cfg" "$hport" "$peer_threads" "  server w 127.0.0.1:$wport proto h2"
haproxy -f "$work/haproxy.cfg" -db >"$work/haproxy.log" 2>&1 &
pids+=($!)

mkdir -p "$work/nginx"
cat >"$work/nginx.conf" <<CFG
worker_processes $peer_threads;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $work/nginx;
  proxy_temp_path $work/nginx;
  fastcgi_temp_path $work/nginx;
  uwsgi_temp_path $work/nginx;
  scgi_temp_path $work/nginx;
  client_max_body_size 0;
  grpc_buffer_size 2m;
  upstream w { server 127.0.0.1:$wport; keepalive 64; }
  server {
    listen 127.0.0.1:$nport http2;
    location / { grpc_pass grpc://w; }
  }
}
CFG
nginx -c "$work/nginx.conf" -p "$work" >/dev/null 2>&1 &
pids+=($!)

targets="direct agent haproxy nginx"
addr() {
  case $1 in
    direct) echo "127.0.0.1:$wport" ;; agent) echo "127.0.0.1:$oport" ;;
    haproxy) echo "127.0.0.1:$hport" ;; nginx) echo "127.0.0.1:$nport" ;;
  esac
}
out="$work/runs"
for round in $(seq "$rounds"); do
  for size in $sizes; do
    for conc in $concs; do
      for t in $targets; do
        line=$("$bin/infermesh" bench --target "$(addr "$t")" --concurrency "$conc" --size-bytes "$size" \
          --duration "$duration" --warmup 1s --wait-ready 30s --json | tail -n 1)
        echo "$t $line" | tee -a "$out"
      done
    done
  done
done

python3 - "$out" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    target, js = line.split(" ", 1)
    r = json.loads(js)
    runs.setdefault((r["size_bytes"], r["concurrency"], target), []).append(r)

def median_run(rs):
    rs = sorted(rs, key=lambda r: r["throughput_rps"])
    return rs[len(rs) // 2]

cells = {k: median_run(v) for k, v in runs.items()}
peers = ["agent", "haproxy", "nginx"]
print()
print("| tensor | conc | direct rps | " + " | ".join(f"{p} ratio" for p in peers)
      + " | " + " | ".join(f"{p} +p50 µs" for p in peers)
      + " | " + " | ".join(f"{p} +p99 µs" for p in peers) + " | agent ≥ HAProxy | agent ≥ nginx |")
print("|---|---|---|" + "---|" * (3 * len(peers) + 2))
for size, conc in sorted({(s, c) for (s, c, _) in cells}):
    d = cells[(size, conc, "direct")]
    ratio = {p: cells[(size, conc, p)]["throughput_rps"] / d["throughput_rps"] for p in peers}
    p50 = {p: 1000 * (cells[(size, conc, p)]["latency_ms"]["p50"] - d["latency_ms"]["p50"]) for p in peers}
    p99 = {p: 1000 * (cells[(size, conc, p)]["latency_ms"]["p99"] - d["latency_ms"]["p99"]) for p in peers}
    met = {p: ratio["agent"] >= ratio[p] and p50["agent"] <= p50[p] for p in ("haproxy", "nginx")}
    name = {1024: "1 KiB", 1048576: "1 MiB", 16777216: "16 MiB"}.get(size, f"{size} B")
    print(f"| {name} | {conc} | {d['throughput_rps']:.0f} | "
          + " | ".join(f"{ratio[p]:.2f}" for p in peers) + " | "
          + " | ".join(f"{p50[p]:.0f}" for p in peers) + " | "
          + " | ".join(f"{p99[p]:.0f}" for p in peers) + " | "
          + " | ".join("yes" if met[p] else "no" for p in ("haproxy", "nginx")) + " |")
PY
