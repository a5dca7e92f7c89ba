"""Python callers of one agent: `infermesh` against `tritonclient.grpc`.

Closed loop: CONCURRENCY threads each call the agent's `identity` model
(OUTPUT0 = INPUT0, no compute) with an FP32 tensor of SIZE bytes for
DURATION seconds after a warm-up, and the calls' latencies are recorded.
Modes:

- infermesh-shm: `infermesh.Client` with the agent as its local node (the
  shared-memory path); one client shared by the threads.
- infermesh-leased: the same client; each call leases a region
  (`client.lease`), writes the input into it (one copy, as tritonclient-shm
  writes its region) and reads the output where the worker wrote it
  (`infer_leased`: read-only arrays over the region).
- infermesh-grpc: the same without `local_node` (tensors inline over gRPC).
- infermesh-async: `infermesh.AsyncClient` with the agent as its local node,
  CONCURRENCY tasks on one event loop in one thread.
- tritonclient: `tritonclient.grpc.InferenceServerClient`, inline tensors,
  `set_data_from_numpy` / `as_numpy`; one client per thread.
- tritonclient-shm: tritonclient with its own system shared memory
  (regions registered once per thread, inputs written with
  `set_shared_memory_region`, outputs read with `get_contents_as_numpy`).

Usage: python bench_python.py HOST:PORT MODE SIZE CONCURRENCY DURATION
Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Callable, List

import numpy as np


def make_call(mode: str, url: str, x: np.ndarray, index: int, shared: dict) -> Callable[[], np.ndarray]:
    if mode == "infermesh-leased":
        client = shared["client"]
        spec = {"INPUT0": (x.shape, np.float32)}

        def call_leased() -> np.ndarray:
            lease = client.lease("identity", spec, outputs=["OUTPUT0"])
            lease.inputs["INPUT0"][...] = x
            return client.infer_leased(lease)["OUTPUT0"]

        return call_leased
    if mode.startswith("infermesh"):
        client = shared["client"]
        # OUTPUT0 listed, as tritonclient's calls list it: on the shm path
        # the output then comes back through the region too.
        return lambda: client.infer("identity", {"INPUT0": x}, outputs=["OUTPUT0"])["OUTPUT0"]
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=url)
    if mode == "tritonclient":
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        out = grpcclient.InferRequestedOutput("OUTPUT0")

        def call() -> np.ndarray:
            inp.set_data_from_numpy(x)
            return client.infer("identity", [inp], outputs=[out]).as_numpy("OUTPUT0")

        return call
    import tritonclient.utils.shared_memory as shm

    nbytes = x.nbytes
    key = f"/infermesh_bench_{index}_{id(shared)}"
    in_h = shm.create_shared_memory_region(f"in{index}", key + "_in", nbytes)
    out_h = shm.create_shared_memory_region(f"out{index}", key + "_out", nbytes)
    shared.setdefault("handles", []).extend([in_h, out_h])
    client.register_system_shared_memory(f"in{index}", key + "_in", nbytes)
    client.register_system_shared_memory(f"out{index}", key + "_out", nbytes)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_shared_memory(f"in{index}", nbytes)
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(f"out{index}", nbytes)

    def call_shm() -> np.ndarray:
        shm.set_shared_memory_region(in_h, [x])
        client.infer("identity", [inp], outputs=[out])
        return shm.get_contents_as_numpy(out_h, np.float32, list(x.shape))

    return call_shm


def summary(mode: str, x: np.ndarray, concurrency: int, duration: float, lat: List[float], cpu: float) -> dict:
    all_lat = np.array(lat)
    return {
        "mode": mode,
        "size_bytes": x.nbytes,
        "concurrency": concurrency,
        "calls": int(all_lat.size),
        "throughput_rps": all_lat.size / duration,
        "p50_ms": float(np.percentile(all_lat, 50) * 1e3),
        "p99_ms": float(np.percentile(all_lat, 99) * 1e3),
        "cpu_ms_per_call": cpu * 1e3 / max(all_lat.size, 1),
    }


def run_async(url: str, x: np.ndarray, concurrency: int, duration: float, warmup: float) -> dict:
    import asyncio

    import infermesh

    lat: List[float] = []

    async def main() -> float:
        async with infermesh.AsyncClient(f"static://{url}", local_node=url, max_attempts=1) as client:
            out = await client.infer("identity", {"INPUT0": x}, outputs=["OUTPUT0"])
            np.testing.assert_array_equal(out["OUTPUT0"], x)
            begin = time.perf_counter()
            warm_end = begin + warmup
            end = warm_end + duration
            cpu0 = time.process_time()

            async def task() -> None:
                while True:
                    t0 = time.perf_counter()
                    await client.infer("identity", {"INPUT0": x}, outputs=["OUTPUT0"])
                    t1 = time.perf_counter()
                    if t0 >= warm_end:
                        lat.append(t1 - t0)
                    if t1 >= end:
                        return

            await asyncio.gather(*(task() for _ in range(concurrency)))
            return time.process_time() - cpu0

    cpu = asyncio.run(main())
    return summary("infermesh-async", x, concurrency, duration, lat, cpu)


def main() -> None:
    url, mode, size, concurrency, duration = sys.argv[1:6]
    size, concurrency, duration = int(size), int(concurrency), float(duration)
    warmup = min(1.0, duration / 4)
    x = np.random.default_rng(0).standard_normal(size // 4).astype(np.float32).reshape(1, -1)
    shared: dict = {}
    if mode.startswith("infermesh"):
        import infermesh

        local = url if mode in ("infermesh-shm", "infermesh-leased") else None
        # One node: nowhere to retry, so one attempt with the whole deadline
        # (with more, an attempt past its per-attempt timeout would end the
        # call at once, as no other node is left to try).
        shared["client"] = infermesh.Client(f"static://{url}", local_node=local, max_attempts=1)
    if mode == "infermesh-async":
        print(json.dumps(run_async(url, x, concurrency, duration, warmup)))
        return
    calls = [make_call(mode, url, x, i, shared) for i in range(concurrency)]
    for call in calls:
        np.testing.assert_array_equal(call(), x)

    lat: List[List[float]] = [[] for _ in range(concurrency)]
    start = threading.Barrier(concurrency + 1)
    t = {}

    def worker(i: int) -> None:
        call = calls[i]
        mine = lat[i]
        start.wait()
        begin = t["begin"]
        warm_end = begin + warmup
        end = warm_end + duration
        while True:
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            if t0 >= warm_end:
                mine.append(t1 - t0)
            if t1 >= end:
                break

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    t["cpu0"] = time.process_time()
    for th in threads:
        th.start()
    t["begin"] = time.perf_counter()
    start.wait()
    for th in threads:
        th.join()
    # CPU of the whole process (the library's own threads included) per
    # call, warm-up included: what the client costs the caller.
    cpu = time.process_time() - t["cpu0"]
    total_calls = sum(len(v) for v in lat)
    all_lat = np.array([v for l in lat for v in l])
    result = {
        "mode": mode,
        "size_bytes": size,
        "concurrency": concurrency,
        "calls": int(all_lat.size),
        "throughput_rps": all_lat.size / duration,
        "p50_ms": float(np.percentile(all_lat, 50) * 1e3),
        "p99_ms": float(np.percentile(all_lat, 99) * 1e3),
        "cpu_ms_per_call": cpu * 1e3 / max(total_calls, 1),
    }
    if mode in ("infermesh-shm", "infermesh-leased"):
        paths = shared["client"].path_counters()
        result["shm_calls"] = paths["shm"]["successes"]
        result["grpc_calls"] = paths["grpc"]["attempts"]
    if "client" in shared:
        shared["client"].close()
    if "handles" in shared:
        import tritonclient.utils.shared_memory as shm

        for h in shared["handles"]:
            shm.destroy_shared_memory_region(h)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
