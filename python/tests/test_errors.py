"""Errors raised as the documented exceptions, against real agents."""

from __future__ import annotations

import socket

import numpy as np
import pytest

import infermesh
from conftest import dense_input, env, wait_for_nodes

X = dense_input(1, seed=1)


@pytest.fixture()
def client() -> infermesh.Client:
    with infermesh.Client(
        env("INFERMESH_REGISTRY"), service=env("INFERMESH_SERVICE"), max_attempts=2
    ) as c:
        wait_for_nodes(c)
        yield c


def test_unknown_model_raises_model_not_found(client: infermesh.Client) -> None:
    with pytest.raises(infermesh.ModelNotFoundError) as e:
        client.infer("no-such-model", {"INPUT0": X})
    assert e.value.code == "NOT_FOUND"


@pytest.mark.parametrize(
    "inputs",
    [
        {"WRONG": X},  # unknown input name
        {"INPUT0": X.astype(np.float64)},  # wrong datatype
        {"INPUT0": np.ones((1, 15), np.float32)},  # wrong shape
        {"INPUT0": X, "EXTRA": X},  # an input too many
    ],
)
def test_bad_inputs_raise_invalid_argument(client: infermesh.Client, inputs: dict) -> None:
    with pytest.raises(infermesh.InvalidArgumentError) as e:
        client.infer("dense", inputs)
    assert e.value.code == "INVALID_ARGUMENT"
    # The client is still good.
    assert client.infer("dense", {"INPUT0": X})["OUTPUT0"].shape == (1, 4)


def test_a_call_past_its_timeout_raises_deadline_exceeded() -> None:
    # The slow agent's worker holds every request for longer than the whole
    # test suite takes; the call's timeout ends it.
    with infermesh.Client(env("INFERMESH_SLOW_REGISTRY")) as client:
        with pytest.raises(infermesh.DeadlineExceededError) as e:
            client.infer("dense", {"INPUT0": X}, timeout=0.2)
        assert e.value.code == "DEADLINE_EXCEEDED"
    with infermesh.Client(env("INFERMESH_SLOW_REGISTRY"), deadline=0.2) as client:
        with pytest.raises(infermesh.DeadlineExceededError):
            client.infer("dense", {"INPUT0": X})


def test_no_reachable_node_raises_unavailable() -> None:
    # A port nobody listens on.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with infermesh.Client(f"static://127.0.0.1:{port}", max_attempts=2) as client:
        with pytest.raises(infermesh.UnavailableError) as e:
            client.infer("dense", {"INPUT0": X})
        assert e.value.code == "UNAVAILABLE"


def test_an_unreachable_registry_is_named() -> None:
    # Nothing listens there: the error says the registry is unreachable and
    # names it, not that no node is registered.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    registry = f"zk://127.0.0.1:{port}/infermesh"
    with infermesh.Client(registry, deadline=2) as client:
        with pytest.raises(infermesh.UnavailableError) as e:
            client.infer("dense", {"INPUT0": X})
    assert e.value.code == "UNAVAILABLE"
    assert "unreachable" in str(e.value) and registry in str(e.value), str(e.value)


def test_an_empty_service_raises_unavailable() -> None:
    registry = env("INFERMESH_REGISTRY")
    with infermesh.Client(registry, service="nobody-registers-this") as client:
        with pytest.raises(infermesh.UnavailableError) as e:
            client.infer("dense", {"INPUT0": X})
        assert "no node" in str(e.value)
