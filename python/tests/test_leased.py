"""Leased shared memory (issue 27): a call's inputs are numpy arrays over a
region of the client's pool, filled in place; its outputs are read-only
arrays over the same region, which stays out of the pool until the last
array over it is gone (the agent's transport counter, checked by the Rust
test, shows every local call took shared memory)."""

from __future__ import annotations

import asyncio
import gc

import numpy as np
import pytest

import infermesh
from conftest import env

CALLS = 20
SHAPE = (16, 1024)  # 64 KiB


def test_inputs_built_in_place_and_outputs_viewed_in_place() -> None:
    node = env("INFERMESH_LOCAL_NODE")
    with infermesh.Client(f"static://{node}", local_node=node) as client:
        for i in range(CALLS):
            lease = client.lease("identity", {"INPUT0": (SHAPE, np.float32)}, outputs=["OUTPUT0"])
            x = lease.inputs["INPUT0"]
            assert x.shape == SHAPE and x.dtype == np.float32 and x.flags.writeable
            x[...] = i
            out = client.infer_leased(lease)["OUTPUT0"]
            np.testing.assert_array_equal(out, np.full(SHAPE, i, np.float32))
            assert not out.flags.writeable, "outputs are read-only views"
        paths = client.path_counters()
        assert paths["shm"]["successes"] == CALLS, paths
        assert paths["grpc"]["attempts"] == 0, paths


def test_an_output_keeps_its_region_from_reuse_until_dropped() -> None:
    node = env("INFERMESH_LOCAL_NODE")
    with infermesh.Client(f"static://{node}", local_node=node) as client:
        lease = client.lease("identity", {"INPUT0": (SHAPE, np.float32)}, outputs=["OUTPUT0"])
        lease.inputs["INPUT0"][...] = 7
        out = client.infer_leased(lease)["OUTPUT0"]
        del lease
        gc.collect()
        assert client.shm_counters()["leased"] == 1, "the output holds its region"
        # The plain form's outputs are views of a region too (when listed:
        # unlisted outputs come back inline).
        x = np.full(SHAPE, 3, np.float32)
        plain = client.infer("identity", {"INPUT0": x}, outputs=["OUTPUT0"])["OUTPUT0"]
        counters = client.shm_counters()
        assert counters["leased"] == 2 and counters["created"] == 2, counters
        np.testing.assert_array_equal(out, np.full(SHAPE, 7, np.float32))
        np.testing.assert_array_equal(plain, x)
        kept = out[3:5]  # a slice of a view holds the region too
        del out, plain
        gc.collect()
        assert client.shm_counters()["leased"] == 1
        del kept
        gc.collect()
        assert client.shm_counters()["leased"] == 0, "dropped: released"
        client.infer("identity", {"INPUT0": x}, outputs=["OUTPUT0"])
        counters = client.shm_counters()
        assert counters["created"] == 2 and counters["reused"] >= 1, counters


def test_a_lease_is_sent_once_and_checked() -> None:
    node = env("INFERMESH_LOCAL_NODE")
    with infermesh.Client(f"static://{node}", local_node=node) as client:
        lease = client.lease("identity", {"INPUT0": (SHAPE, np.float32)})
        client.infer_leased(lease)
        with pytest.raises(infermesh.InvalidArgumentError):
            client.infer_leased(lease)
        with pytest.raises(infermesh.InvalidArgumentError):
            client.lease("identity", {"INPUT0": (SHAPE, object)})
        with pytest.raises(infermesh.InvalidArgumentError):
            client.lease("identity", {"INPUT0": ((-1, 4), np.float32)})


def test_a_leased_call_to_a_remote_node_goes_inline() -> None:
    node = env("INFERMESH_REMOTE_NODE")
    with infermesh.Client(f"static://{node}") as client:
        lease = client.lease("identity", {"INPUT0": (SHAPE, np.float32)})
        lease.inputs["INPUT0"][...] = np.arange(SHAPE[0] * SHAPE[1], dtype=np.float32).reshape(SHAPE)
        out = client.infer_leased(lease)["OUTPUT0"]
        np.testing.assert_array_equal(out, lease.inputs["INPUT0"])
        paths = client.path_counters()
        assert paths["grpc"]["successes"] == 1 and paths["shm"]["attempts"] == 0, paths


def test_async_leased_calls() -> None:
    node = env("INFERMESH_LOCAL_NODE")

    async def main() -> None:
        async with infermesh.AsyncClient(f"static://{node}", local_node=node) as client:
            leases = []
            for i in range(4):
                lease = client.lease("identity", {"INPUT0": (SHAPE, np.float32)})
                lease.inputs["INPUT0"][...] = i
                leases.append(lease)
            outs = await asyncio.gather(*(client.infer_leased(lease) for lease in leases))
            for i, out in enumerate(outs):
                np.testing.assert_array_equal(out["OUTPUT0"], np.full(SHAPE, i, np.float32))

    asyncio.run(main())
