#!/usr/bin/env bash
# MPS shares on a real GPU (issue 26): two workers started by the agent on
# one GPU with mps_thread_percentage 25 and 75. Checks `--check-config`
# without a daemon (must fail, 78), with one (must pass) and after the
# daemon quit (must fail: it leaves its socket behind); then starts the
# agent, and each worker first measures its own fp16 matmul rate for 4 s
# (examples/torch-worker/mps_probe.py, both at once) before serving. The
# rates and the SMs each worker sees show whether the shares took effect.
#
# Needs: an NVIDIA GPU, nvidia-cuda-mps-control, root (it starts and stops
# the host's MPS control daemon in the default pipe directory: do not run
# it where MPS is in use), Python 3 with a CUDA build of torch and grpcio,
# and the infermesh binary (BIN: a directory holding it; default: built
# here). INFERMESH_OIP_STUBS as in scripts/gpu-drill.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
fail() { echo "gpu-mps: $*" >&2; exit 1; }
command -v nvidia-cuda-mps-control >/dev/null || fail "no nvidia-cuda-mps-control on this host: MPS cannot be started here"
[ ! -S /tmp/nvidia-mps/control ] || ! echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1 \
  || fail "an MPS daemon already runs here; this script starts and stops its own"
if [ -z "${BIN:-}" ]; then
  cargo build --release --locked -q -p infermesh
  bin=$PWD/target/release/infermesh
else
  bin=$(cd "$BIN" && pwd)/infermesh
fi
. scripts/lib.sh
scratch
oip=$(port); admin=$(port)
export MPS_PROBE_OUT="$work/probe.txt"
worker="sh -c '$python $PWD/examples/torch-worker/mps_probe.py; exec $python $PWD/examples/torch-worker/torch_worker.py --listen 127.0.0.1:{port} --device cuda'"
{
  printf 'listen = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n[gpu]\nbackend = "nvml"\n' "$oip" "$admin"
  for share in 25 75; do
    printf '[[workers]]\nid = "share%s"\ncommand = "%s"\ngpu = 0\nmodels = ["dense"]\nmps_thread_percentage = %s\n' \
      "$share" "${worker//\"/\\\"}" "$share"
  done
} > "$work/agent.toml"
check() {
  set +e; "$bin" agent --config "$work/agent.toml" --check-config >"$work/check.out" 2>&1; local rc=$?; set -e
  echo "--check-config $1: exit $rc (want $2)"; [ "$rc" = "$2" ] || { cat "$work/check.out"; fail "--check-config $1 exited $rc"; }
}
check "without an MPS daemon" 78
nvidia-cuda-mps-control -d
trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true; for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"' EXIT
check "with the daemon" 0
RUST_LOG=info "$bin" agent --config "$work/agent.toml" 2>"$work/agent.log" &
pids+=($!)
"$bin" bench --target "127.0.0.1:$oip" --duration 3s --warmup 0s --wait-ready 300s | sed -n 2p
grep "MPS does not serve" "$work/agent.log" && fail "the running agent says MPS does not serve the GPU"
echo "workers' rates (both at once, each under its share):"
cat "$MPS_PROBE_OUT"
kill -TERM "${pids[@]}"; wait 2>/dev/null || true; pids=()
echo quit | nvidia-cuda-mps-control
echo "one process alone, no share, for scale:"
MPS_PROBE_OUT= "$python" examples/torch-worker/mps_probe.py
check "after the daemon quit (its socket stays)" 78
