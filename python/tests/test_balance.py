"""Balancing across the nodes of a service found in ZooKeeper."""

from __future__ import annotations

import numpy as np

import infermesh
from conftest import dense_expected, dense_input, env, wait_for_nodes

CALLS = 300


def test_sequential_calls_are_answered_right_by_the_fleet() -> None:
    """Calls one after another, each answered right by a node of the service.

    Whether every node gets some is not asserted here: with one call at a
    time, power-of-two-choices sends each to the node with the lower latency
    estimate, and a node not yet asked starts at the balancer's
    ``default_rtt`` (5 ms), which a loopback answer undercuts — so sequential
    calls may all land on the nodes answered first. Spreading is asserted
    where it is promised, with calls at once (``test_async.py``, and
    ``client_registry.rs`` in Rust)."""
    nodes = set(env("INFERMESH_NODES").split(","))
    with infermesh.Client(env("INFERMESH_REGISTRY"), service=env("INFERMESH_SERVICE")) as client:
        wait_for_nodes(client)
        x = dense_input(2, seed=3)
        for _ in range(CALLS):
            out = client.infer("dense", {"INPUT0": x}, outputs=["OUTPUT0"])
            np.testing.assert_allclose(out["OUTPUT0"], dense_expected(x), rtol=1e-5, atol=1e-6)
        stats = client.node_stats()
        assert stats and set(stats) <= nodes, stats
        assert sum(s["attempts"] for s in stats.values()) == CALLS, stats
        assert all(s["failures"] == 0 for s in stats.values()), stats
        print("attempts per node:", {n: s["attempts"] for n, s in sorted(stats.items())})
