#!/usr/bin/env bash
# The adaptive concurrency limit through a `slow` fault (issue 26): one agent
# with default settings and one test worker of 4 slots × 2 ms that does not
# say how many it runs at once (--no-model-config); 16 closed-loop callers
# for DURATION; after FAULT_AFTER requests the worker's service time becomes
# 10× (the test worker's `slow` fault: 20 ms). Every 250 ms the agent's
# /metrics are read; prints a table of the limit, learned concurrency,
# unloaded latency and capacity over time (rows where something changed).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${DURATION:-30s}
fault_after=${FAULT_AFTER:-20000}
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=$PWD/target/release
. scripts/lib.sh
scratch
o=$(port); a=$(port)
printf '[[workers]]\ncommand = "%s --listen 127.0.0.1:{port} --service-time-ms 2 --concurrency 4 --no-model-config --fault slow --fault-after %s"\n' \
  "$bin/infermesh-testworker" "$fault_after" > "$work/agent.toml"
"$bin/infermesh" agent --config "$work/agent.toml" --listen "127.0.0.1:$o" --admin-listen "127.0.0.1:$a" 2>"$work/agent.log" &
pids+=($!)
"$bin/infermesh" bench --target "127.0.0.1:$o" --duration 100ms --warmup 0s --wait-ready 60s >/dev/null
python3 - "$a" >"$work/trace" <<'PY' &
import re, sys, time, urllib.request
start = time.time()
while True:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=1).read().decode()
    except Exception:
        break
    v = {}
    for m in re.finditer(r"^infermesh_(worker_concurrency_limit|worker_concurrency|worker_unloaded_latency_seconds|worker_capacity)\{[^}]*\} (\S+)$", text, re.M):
        v[m.group(1)] = float(m.group(2))
    served = sum(float(x) for x in re.findall(r'^infermesh_requests_total\{[^}]*code="Ok"[^}]*\} (\S+)$', text, re.M))
    print(f"{time.time() - start:.2f} {v.get('worker_concurrency_limit', 0):.0f} {v.get('worker_concurrency', 0):.2f} "
          f"{1000 * v.get('worker_unloaded_latency_seconds', 0):.2f} {v.get('worker_capacity', 0):.0f} {served:.0f}", flush=True)
    time.sleep(0.25)
PY
pids+=($!)
"$bin/infermesh" bench --target "127.0.0.1:$o" --concurrency 16 --duration "$duration" --warmup 0s | grep -E "throughput|p50"
sleep 0.5
python3 - "$work/trace" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
print("| t (s) | limit | concurrency | unloaded (ms) | capacity (req/s) | served (req/s, last 0.25 s) |")
print("|---|---|---|---|---|---|")
last = None
prev = None
for r in rows:
    t, limit, conc, unl, cap, served = float(r[0]), r[1], r[2], r[3], r[4], float(r[5])
    rate = "" if prev is None or t == prev[0] else f"{(served - prev[1]) / (t - prev[0]):.0f}"
    prev = (t, served)
    key = (limit, conc, unl, cap)
    if key != last:
        print(f"| {t:.2f} | {limit} | {conc} | {unl} | {cap} | {rate} |")
        last = key
PY
