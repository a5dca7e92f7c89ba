"""Balancing across the nodes of a service found in ZooKeeper."""

from __future__ import annotations

import numpy as np

import infermesh
from conftest import dense_expected, dense_input, env, wait_for_nodes

CALLS = 300


def test_every_node_gets_traffic_and_every_answer_is_right() -> None:
    nodes = set(env("INFERMESH_NODES").split(","))
    with infermesh.Client(env("INFERMESH_REGISTRY"), service=env("INFERMESH_SERVICE")) as client:
        wait_for_nodes(client)
        x = dense_input(2, seed=3)
        for _ in range(CALLS):
            out = client.infer("dense", {"INPUT0": x}, outputs=["OUTPUT0"])
            np.testing.assert_allclose(out["OUTPUT0"], dense_expected(x), rtol=1e-5, atol=1e-6)
        stats = client.node_stats()
        assert set(stats) == nodes, stats
        assert sum(s["attempts"] for s in stats.values()) == CALLS, stats
        assert all(s["attempts"] > 0 and s["failures"] == 0 for s in stats.values()), stats
        print("attempts per node:", {n: s["attempts"] for n, s in sorted(stats.items())})
