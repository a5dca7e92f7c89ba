#!/usr/bin/env bash
# Python callers of one agent: the `infermesh` package against NVIDIA's
# `tritonclient.grpc`, same process style (closed-loop threads), same agent
# (`--threads 2`) fronting one test worker serving `identity` (OUTPUT0 =
# INPUT0, no compute), tensors of 1 KiB and 16 MiB in and the same out, at
# concurrency 1 and 16. Release builds; the package is installed with
# `pip install ./python` into target/py-bench (with tritonclient[grpc]).
# Usage: scripts/bench-python.sh [DURATION_S]   (default 5 s per run)
#        SIZES="16777216" CONCS="1 4" MODES="infermesh-leased tritonclient-shm" \
#          scripts/bench-python.sh 5          (a subset, interleaved the same way)
#        ROUNDS=3 ...                           (every cell 3 times, interleaved)
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-5}
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=$PWD/target/release
venv=$PWD/target/py-bench
if ! "$venv/bin/python" -c 'import maturin, numpy, tritonclient.grpc' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet 'maturin>=1.5,<2' numpy 'tritonclient[grpc]'
fi
PATH="$venv/bin:$PATH" "$venv/bin/pip" install --quiet --no-build-isolation --force-reinstall --no-deps ./python
. scripts/lib.sh
oip=$(port); admin=$(port)
"$bin/infermesh" agent --listen "127.0.0.1:$oip" --admin-listen "127.0.0.1:$admin" --threads 2 \
  --worker "$bin/infermesh-testworker --listen 127.0.0.1:{port} --model identity" \
  2>/tmp/infermesh-bench-python-agent.log &
agent=$!
trap 'kill -TERM $agent 2>/dev/null; wait $agent 2>/dev/null' EXIT
for _ in $(seq 600); do
  "$venv/bin/python" -c "
import sys, tritonclient.grpc as g
sys.exit(0 if g.InferenceServerClient('127.0.0.1:$oip').is_model_ready('identity') else 1)" 2>/dev/null && break
  sleep 0.1
done
printf '%-17s %9s %4s %9s %9s %9s %12s\n' mode size conc req/s 'p50 ms' 'p99 ms' 'cpu ms/call'
for _ in $(seq "${ROUNDS:-1}"); do
for size in ${SIZES:-1024 16777216}; do
  for conc in ${CONCS:-1 16}; do
    for mode in ${MODES:-infermesh-shm infermesh-leased infermesh-async infermesh-grpc tritonclient tritonclient-shm}; do
      "$venv/bin/python" scripts/bench_python.py "127.0.0.1:$oip" "$mode" "$size" "$conc" "$duration" |
        python3 -c '
import json, sys
r = json.load(sys.stdin)
print("%-17s %9d %4d %9.0f %9.3f %9.3f %12.3f" % (r["mode"], r["size_bytes"], r["concurrency"],
      r["throughput_rps"], r["p50_ms"], r["p99_ms"], r["cpu_ms_per_call"]))'
    done
  done
done
done
