"""Failover: an agent killed (SIGKILL) while several threads call the
service; no call fails, and the calls after it go to the other nodes."""

from __future__ import annotations

import os
import signal
import threading
from typing import Dict, List

import numpy as np

import infermesh
from conftest import dense_expected, dense_input, env, wait_for_nodes

THREADS = 4
# Calls each thread makes before the kill, and after it.
BEFORE = 25
AFTER = 50


def test_no_call_fails_when_an_agent_is_killed_mid_load() -> None:
    nodes = set(env("INFERMESH_NODES").split(","))
    victim = env("INFERMESH_KILL_NODE")
    victim_pid = int(env("INFERMESH_KILL_PID"))
    with infermesh.Client(
        env("INFERMESH_REGISTRY"), service=env("INFERMESH_SERVICE"), deadline=10.0
    ) as client:
        wait_for_nodes(client)
        x = dense_input(1, seed=11)
        want = dense_expected(x)
        warmed = threading.Barrier(THREADS + 1)
        killed = threading.Event()
        failures: List[BaseException] = []
        done: Dict[str, int] = {"before": 0, "after": 0}
        lock = threading.Lock()

        def call() -> None:
            try:
                out = client.infer("dense", {"INPUT0": x})
                np.testing.assert_allclose(out["OUTPUT0"], want, rtol=1e-5, atol=1e-6)
            except BaseException as e:  # noqa: BLE001 - every failure counts
                with lock:
                    failures.append(e)

        def load() -> None:
            for _ in range(BEFORE):
                call()
            warmed.wait()
            # The other threads keep calling while the agent dies.
            killed.wait()
            for _ in range(AFTER):
                call()
            with lock:
                done["after"] += AFTER

        threads = [threading.Thread(target=load) for _ in range(THREADS)]
        for t in threads:
            t.start()
        warmed.wait()
        before = client.node_stats()
        assert all(before.get(n, {}).get("attempts", 0) > 0 for n in nodes), before
        # Calls in flight while it dies: a burst from this thread too.
        burst = threading.Thread(target=lambda: [call() for _ in range(AFTER)])
        burst.start()
        os.kill(victim_pid, signal.SIGKILL)
        killed.set()
        for t in threads:
            t.join()
        burst.join()
        assert not failures, f"{len(failures)} calls failed, first: {failures[0]!r}"
        assert done["after"] == THREADS * AFTER
        after = client.node_stats()
        survivors = sum(after[n]["attempts"] - before[n]["attempts"] for n in nodes - {victim})
        assert survivors >= THREADS * AFTER, (before, after)
        print("before kill:", before)
        print("after kill:", after)
