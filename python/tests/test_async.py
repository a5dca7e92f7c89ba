"""The asyncio variant: many calls at once with gather, spread over the
nodes, each answer right; a cancelled call leaves nothing in flight."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import infermesh
from conftest import dense_expected, dense_input, env, wait_for_nodes

CALLS = 64


def test_gather_spreads_calls_and_every_answer_is_right() -> None:
    nodes = set(env("INFERMESH_NODES").split(","))

    async def main() -> None:
        async with infermesh.AsyncClient(
            env("INFERMESH_REGISTRY"), service=env("INFERMESH_SERVICE")
        ) as client:
            wait_for_nodes(client)
            xs = [dense_input(1 + i % 3, seed=i) for i in range(CALLS)]
            outs = await asyncio.gather(*(client.infer("dense", {"INPUT0": x}) for x in xs))
            for x, out in zip(xs, outs):
                np.testing.assert_allclose(out["OUTPUT0"], dense_expected(x), rtol=1e-5, atol=1e-6)
            stats = client.node_stats()
            assert set(stats) == nodes and all(s["attempts"] > 0 for s in stats.values()), stats
            assert sum(s["attempts"] for s in stats.values()) == CALLS, stats
            # Errors arrive as the same exceptions.
            with pytest.raises(infermesh.ModelNotFoundError):
                await client.infer("no-such-model", {"INPUT0": xs[0]})

    asyncio.run(main())


def test_cancelling_a_call_leaves_nothing_in_flight() -> None:
    async def main() -> None:
        async with infermesh.AsyncClient(env("INFERMESH_SLOW_REGISTRY")) as client:
            x = dense_input(1, seed=0)
            task = asyncio.ensure_future(client.infer("dense", {"INPUT0": x}))
            # Wait until the call is on the node, then cancel it.
            while not any(s["inflight"] for s in client.node_stats().values()):
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            while any(s["inflight"] for s in client.node_stats().values()):
                await asyncio.sleep(0.01)
            stats = client.node_stats()
            assert sum(s["attempts"] for s in stats.values()) == 1
            assert sum(s["failures"] for s in stats.values()) == 0, "a cancellation is no failure"

    asyncio.run(main())


def test_one_client_serves_successive_event_loops() -> None:
    client = infermesh.AsyncClient(env("INFERMESH_REGISTRY"), service=env("INFERMESH_SERVICE"))
    wait_for_nodes(client)
    x = dense_input(1, seed=5)
    for _ in range(2):
        out = asyncio.run(client.infer("dense", {"INPUT0": x}))
        np.testing.assert_allclose(out["OUTPUT0"], dense_expected(x), rtol=1e-5, atol=1e-6)
    client.close()
