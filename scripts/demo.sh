#!/usr/bin/env bash
# The main job, on one machine: build, start one agent fronting two test
# workers (emulated GPUs, 1 ms service time), drive load through the agent
# with `infermesh bench`, show the agent's metrics, then stop it with SIGTERM.
#
# Ports: OIP on $INFERMESH_PORT (default 8001), admin on $INFERMESH_ADMIN_PORT (8002).
set -euo pipefail
cd "$(dirname "$0")/.."

oip_port=${INFERMESH_PORT:-8001}
admin_port=${INFERMESH_ADMIN_PORT:-8002}
duration=${DEMO_DURATION:-10s}

cargo build --release --locked -p infermesh -p infermesh-testworker
bin=target/release

worker="infermesh-testworker --listen 127.0.0.1:{port} --service-time-ms 1 --concurrency 8"
"$bin/infermesh" agent \
  --listen "127.0.0.1:$oip_port" --admin-listen "127.0.0.1:$admin_port" --node-id demo-node \
  --worker "$worker" --worker "$worker" &
agent=$!
trap 'kill -TERM "$agent" 2>/dev/null || true; wait "$agent" 2>/dev/null || true' EXIT

echo "== bench through the agent: 16 concurrent callers, 1 KiB tensors, $duration"
"$bin/infermesh" bench --target "127.0.0.1:$oip_port" --model dense \
  --concurrency 16 --size-bytes 1024 --duration "$duration" --wait-ready 60s

echo
echo "== agent metrics (http://127.0.0.1:$admin_port/metrics), excerpt"
python3 - "$admin_port" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
for line in text.splitlines():
    if line.startswith(("infermesh_requests_total", "infermesh_weight", "infermesh_worker_state")) and not line.endswith(" 0"):
        print(line)
PY

echo
echo "== stopping the agent (SIGTERM: drain in-flight, stop workers)"
kill -TERM "$agent"
wait "$agent"
trap - EXIT
echo "done"
