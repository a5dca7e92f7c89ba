"""TLS to an agent that requires client certificates (mTLS), found through
ZooKeeper: the record says it serves TLS, so the client reaches it only over
TLS, with the CA (and the client certificate) of ``tls=`` or of the
``INFERMESH_TLS_*`` environment."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import infermesh
from conftest import dense_expected, dense_input, env, wait_for_nodes


def tls_files() -> infermesh.TLS:
    return infermesh.TLS(
        ca=pathlib.Path(env("INFERMESH_TEST_CA")),
        cert=env("INFERMESH_TEST_CERT"),
        key=env("INFERMESH_TEST_KEY"),
    )


def client(tls: infermesh.TLS | None) -> infermesh.Client:
    return infermesh.Client(env("INFERMESH_REGISTRY"), service=env("INFERMESH_SERVICE"), tls=tls)


def test_calls_go_over_mtls_with_the_tls_settings() -> None:
    with client(tls_files()) as c:
        wait_for_nodes(c)
        for i in range(20):
            x = dense_input(2, i)
            out = c.infer("dense", {"INPUT0": x})["OUTPUT0"]
            np.testing.assert_allclose(out, dense_expected(x), rtol=1e-5, atol=1e-6)
        assert c.node_stats()["tls-a"]["failures"] == 0


def test_the_environment_gives_the_tls_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    files = tls_files()
    monkeypatch.setenv("INFERMESH_TLS_CA", str(files.ca))
    monkeypatch.setenv("INFERMESH_TLS_CERT", str(files.cert))
    monkeypatch.setenv("INFERMESH_TLS_KEY", str(files.key))
    with client(None) as c:
        wait_for_nodes(c)
        x = dense_input(1, 7)
        np.testing.assert_allclose(
            c.infer("dense", {"INPUT0": x})["OUTPUT0"], dense_expected(x), rtol=1e-5, atol=1e-6
        )


def test_without_a_client_certificate_the_agent_refuses() -> None:
    with client(infermesh.TLS(ca=env("INFERMESH_TEST_CA"))) as c:
        wait_for_nodes(c)
        with pytest.raises(infermesh.UnavailableError) as e:
            c.infer("dense", {"INPUT0": dense_input(1, 1)}, timeout=5.0)
        # The message names the cause: the TLS alert (CertificateRequired)
        # or, when the request was already on its way (TLS 1.3 refuses a
        # client after its handshake), the connection the agent closed.
        assert "CertificateRequired" in str(e.value) or "closed" in str(e.value), e.value
        assert e.value.code == "UNAVAILABLE"


def test_without_tls_settings_the_node_is_skipped_not_sent_plaintext() -> None:
    with client(None) as c:
        wait_for_nodes(c)
        with pytest.raises(infermesh.UnavailableError) as e:
            c.infer("dense", {"INPUT0": dense_input(1, 1)}, timeout=5.0)
        assert e.value.code == "UNAVAILABLE"
        assert c.node_stats().get("tls-a", {}).get("attempts", 0) == 0


def test_a_lone_certificate_is_refused_when_the_client_is_built() -> None:
    with pytest.raises(infermesh.InvalidArgumentError, match="both"):
        infermesh.Client(
            "static://127.0.0.1:1",
            tls=infermesh.TLS(ca=env("INFERMESH_TEST_CA"), cert=env("INFERMESH_TEST_CERT")),
        )
