"""Measures this process's fp16 matmul rate for 4 s and appends it, with
its MPS share and the SMs it sees, to $MPS_PROBE_OUT (stdout when unset).
scripts/gpu-mps.sh runs it in each agent-started worker before the worker
serves, so both measure at the same time, each under its share."""
import os, time, torch
pct = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "unset")
lim = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "unset")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < 4.0:
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    n += 10
dt = time.perf_counter() - t0
tflops = n * 2 * 8192**3 / dt / 1e12
sm = torch.cuda.get_device_properties(0).multi_processor_count
line = f"pid {os.getpid()} share {pct}% memlimit {lim} SMs seen {sm}: {tflops:.1f} TFLOP/s fp16 ({n} matmuls in {dt:.2f} s)\n"
if os.environ.get("MPS_PROBE_OUT"):
    with open(os.environ["MPS_PROBE_OUT"], "a") as f:
        f.write(line)
else:
    print(line, end="")
