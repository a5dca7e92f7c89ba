"""Fixtures of the infermesh package's tests.

The tests run against real agents and a real ZooKeeper started by the Rust
integration test `tests/tests/python_package.rs`, which passes their
addresses in environment variables; a test whose fleet is not described
there is skipped (that test asserts none is).
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional, TypeVar

import numpy as np
import pytest

T = TypeVar("T")

# How long a test waits for a condition the fleet reaches on its own
# (membership arriving from ZooKeeper) before failing.
PATIENCE_S = 60.0


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.skip(f"{name} is not set: run through `cargo test -p infermesh-tests --test python_package`")
    return value


def eventually(what: str, check: Callable[[], Optional[T]]) -> T:
    """Polls `check` until it returns something other than None."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        value = check()
        if value is not None:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.02)


def dense_expected(x: np.ndarray) -> np.ndarray:
    """The test worker's `dense` model: W[i][j] = ((i*4 + j) * 37 mod 29) / 14 - 1,
    b[j] = (j - 1.5) / 10, y = tanh(x W / 4 + b)."""
    i = np.arange(16)[:, None]
    j = np.arange(4)[None, :]
    w = (((i * 4 + j) * 37) % 29).astype(np.float32) / np.float32(14) - np.float32(1)
    b = (np.arange(4, dtype=np.float32) - np.float32(1.5)) / np.float32(10)
    return np.tanh(x @ w / np.float32(4) + b)


def dense_input(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 16)).astype(np.float32)


def wait_for_nodes(client: object, model: str = "dense") -> None:
    """Waits until `client` knows every node of INFERMESH_NODES with `model`
    ready (membership arrives from ZooKeeper after the client starts)."""
    nodes = set(env("INFERMESH_NODES").split(","))
    eventually(
        f"the client sees {sorted(nodes)} with {model} ready",
        lambda: True
        if {n.node_id for n in client.nodes() if (model, True) in n.models} == nodes  # type: ignore[attr-defined]
        else None,
    )
