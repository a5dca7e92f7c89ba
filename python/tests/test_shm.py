"""Shared memory to the local agent: with `local_node` set to the agent's
node id, the client's ladder sends every call through a POSIX shared-memory
region (the agent's transport counter shows it, checked by the Rust test)."""

from __future__ import annotations

import numpy as np

import infermesh
from conftest import env

CALLS = 50


def test_calls_to_the_local_agent_use_shared_memory() -> None:
    node = env("INFERMESH_LOCAL_NODE")
    with infermesh.Client(f"static://{node}", local_node=node) as client:
        for i in range(CALLS):
            x = np.full((16, 1024), i, dtype=np.float32)  # 64 KiB
            out = client.infer("identity", {"INPUT0": x})["OUTPUT0"]
            assert out.shape == x.shape and out.dtype == np.float32
            np.testing.assert_array_equal(out, x)
            assert not out.flags.writeable, "outputs are read-only views"
        paths = client.path_counters()
        assert paths["shm"]["successes"] == CALLS, paths
        assert paths["shm"]["fallbacks"] == 0 and paths["grpc"]["attempts"] == 0, paths


def test_without_local_node_the_same_calls_go_inline() -> None:
    node = env("INFERMESH_REMOTE_NODE")
    with infermesh.Client(f"static://{node}") as client:
        x = np.arange(16 * 1024, dtype=np.float32).reshape(16, 1024)
        for _ in range(CALLS):
            np.testing.assert_array_equal(client.infer("identity", {"INPUT0": x})["OUTPUT0"], x)
        paths = client.path_counters()
        assert paths["grpc"]["successes"] == CALLS and paths["shm"]["attempts"] == 0, paths
