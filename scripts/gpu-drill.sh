#!/usr/bin/env bash
# GPU fault drill (issue 25): the agent with two PyTorch workers
# (examples/torch-worker) sharing one real GPU, NVML telemetry, default
# sentinel settings (but a 1 s stable period, as scripts/drill.sh), load
# through the agent, and `infermesh drill` injecting real CUDA faults into
# one worker at a time:
#   device-assert    out-of-bounds index on a CUDA tensor (sticky; Xid 43)
#   illegal-address  a kernel storing through a wild pointer (sticky; Xid 31)
#   spin             a kernel spinning 15 s (inference stalls, probes pass)
# It prints the drill's table (detection, serving again, failures after
# detection, collateral restarts of the other worker: must be 0), then what
# the agent counted: Xids and whom they were blamed on, restarts by reason,
# spawn-to-ready of the PyTorch workers, and each worker's GPU memory.
#
# Needs: an NVIDIA GPU and driver, Python 3 with torch (CUDA build), numpy,
# grpcio and grpcio-tools (`pip install -r examples/torch-worker/requirements.txt`;
# PYTHON=... picks the interpreter), and the infermesh binary (built here
# with cargo unless BIN names a directory holding it). Reading the driver's
# Xid lines from /dev/kmsg (to blame an Xid on its worker) needs root or
# CAP_SYSLOG; without it the script says so and the drill still runs, with
# Xids unattributed. Takes a few minutes (COUNT injections per fault).
# On a host without grpcio-tools, INFERMESH_OIP_STUBS names a directory of
# OIP stubs generated elsewhere (see examples/torch-worker/torch_worker.py).
#
# Environment: COUNT (default 5), GPU (default 0), PYTHON (default python3),
# BIN (default: target/release after `cargo build --release`), PATIENCE
# (default 120s, per injection), FAULTS
# (default "device-assert illegal-address spin"). DEVICE=numpy runs the
# workers without PyTorch or a GPU (no fault takes effect): a dry run of the
# script itself.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${COUNT:-5}
gpu=${GPU:-0}
python=${PYTHON:-python3}
faults=${FAULTS:-device-assert illegal-address spin}
device=${DEVICE:-cuda}

fail() { echo "gpu-drill: $*" >&2; exit 1; }

if [ "$device" = numpy ]; then
  gpu_backend=off
  "$python" -c 'import grpc, numpy' || fail "Python requirements missing: pip install grpcio grpcio-tools numpy, or set PYTHON"
else
  gpu_backend=nvml
  { command -v nvidia-smi >/dev/null && nvidia-smi -L; } || echo "gpu-drill: nvidia-smi not found; going on (NVML is what the agent uses)" >&2
  "$python" - <<'PY' || fail "Python requirements missing: pip install -r examples/torch-worker/requirements.txt (and a CUDA build of torch), or set PYTHON"
import os, grpc, numpy, torch
try:
    import grpc_tools
except ImportError:
    assert os.environ.get("INFERMESH_OIP_STUBS"), "no grpcio-tools and no INFERMESH_OIP_STUBS (stubs generated elsewhere)"
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s): {torch.cuda.get_device_name(0)}")
PY
fi

if [ -z "${BIN:-}" ]; then
  cargo build --release --locked -q -p infermesh
  bin=target/release
else
  bin=$BIN
fi
[ -x "$bin/infermesh" ] || fail "no infermesh binary in $bin"
. scripts/lib.sh
scratch
oip=$(port); admin=$(port)
token="$work/token"
head -c 32 /dev/urandom | base64 > "$token"
worker="$python $PWD/examples/torch-worker/torch_worker.py --listen 127.0.0.1:{port} --device $device"
{
  printf 'listen = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n' "$oip" "$admin"
  printf '[sentinel]\nstable_period = "1s"\n'
  printf '[gpu]\nbackend = "%s"\n' "$gpu_backend"
  for id in g0 g1; do
    printf '[[workers]]\nid = "%s"\ncommand = "%s"\ngpu = %s\nmodels = ["dense"]\n' "$id" "$worker" "$gpu"
  done
} > "$work/agent.toml"
log="$work/agent.log"
RUST_LOG=info "$bin/infermesh" agent --config "$work/agent.toml" --admin-token-file "$token" 2>"$log" &
pids+=($!)
trap 'for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; cp "$log" /tmp/infermesh-gpu-drill-agent.log 2>/dev/null; rm -rf "$work"' EXIT

status() { "$bin/infermesh" status --admin "127.0.0.1:$admin" --admin-token-file "$token" "$@"; }
# Both PyTorch workers up (CUDA init takes seconds).
"$bin/infermesh" bench --target "127.0.0.1:$oip" --duration 2s --warmup 0s --wait-ready 300s >/dev/null \
  || fail "the agent's workers did not become ready; see /tmp/infermesh-gpu-drill-agent.log"
status
grep -q "Xid attribution off" "$log" && echo "gpu-drill: NOTE: /dev/kmsg is not readable: Xids cannot be blamed on a worker (run as root or with CAP_SYSLOG)" >&2

fault_args=()
for f in $faults; do fault_args+=(--fault "$f"); done
echo
echo "== infermesh drill: $count injection(s) of each of: $faults (GPU $gpu, two workers) =="
set +e
"$bin/infermesh" drill --target "127.0.0.1:$oip" --admin "127.0.0.1:$admin" --admin-token-file "$token" \
  --count "$count" --concurrency 4 --patience "${PATIENCE:-120s}" "${fault_args[@]}" --json | tee "$work/drill.out"
drill=${PIPESTATUS[0]}
set -e

echo
echo "== what the agent counted =="
metrics=$("$python" -c "import urllib.request,sys; print(urllib.request.urlopen('http://127.0.0.1:$admin/metrics').read().decode())")
grep -E '^infermesh_(gpu_xids_total|gpu_xid_attributions_total|worker_restarts_total|worker_faults_total)\{' <<<"$metrics" | grep -v ' 0$' || true
echo
echo "== per-worker GPU use (NVML process lists) =="
grep -E '^infermesh_worker_gpu_(memory_bytes|utilization_ratio)\{' <<<"$metrics" || echo "(none reported)"
echo
echo "== spawn-to-ready of the current processes, stall faults =="
status --json > "$work/status.json"
"$python" - "$work/status.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("kernel log:", s.get("kernel_log"))
for w in s["workers"]:
    fault = w["last_fault"] or "-"
    print(f"{w['id']}: state {w['state']}, restarts {w['restarts']}, spawn-to-ready {w['startup_ms']} ms, last fault: {fault}")
    for e in w["events"]:
        if e["kind"] in ("fault", "suspect", "abort_in_flight"):
            print(f"    {e['kind']}: {e['detail']}")
PY
echo
echo "agent log: /tmp/infermesh-gpu-drill-agent.log (copied at exit)"
exit "$drill"
