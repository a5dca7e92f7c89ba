"""Calls an infermesh agent with NVIDIA's own `tritonclient` (gRPC) and checks
the numbers against the test worker's documented `dense` math.

Usage: python triton_interop.py HOST:PORT
"""

import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
from dense import expected


def main(url: str) -> None:
    client = grpcclient.InferenceServerClient(url=url)
    assert client.is_server_live(), "server live"
    assert client.is_server_ready(), "server ready"
    assert client.is_model_ready("dense"), "model ready"

    meta = client.get_model_metadata("dense")
    assert meta.name == "dense", meta
    assert meta.inputs[0].name == "INPUT0" and meta.inputs[0].datatype == "FP32", meta
    assert list(meta.inputs[0].shape) == [-1, 16], meta
    assert list(meta.outputs[0].shape) == [-1, 4], meta

    config = client.get_model_config("dense").config
    assert config.input[0].name == "INPUT0", config
    assert list(config.output[0].dims) == [-1, 4], config

    x = np.random.default_rng(7).standard_normal((5, 16)).astype(np.float32)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    result = client.infer("dense", [inp], outputs=[out], request_id="interop-1")
    y = result.as_numpy("OUTPUT0")
    assert y.shape == (5, 4), y.shape
    np.testing.assert_allclose(y, expected(x), rtol=1e-5, atol=1e-6)
    assert result.get_response().id == "interop-1"

    stats = client.get_inference_statistics("dense")
    assert stats.model_stats[0].inference_count >= 5, stats

    # A wrong shape is refused with a clear error, and the server keeps serving.
    bad = grpcclient.InferInput("INPUT0", [2, 15], "FP32")
    bad.set_data_from_numpy(np.zeros((2, 15), dtype=np.float32))
    try:
        client.infer("dense", [bad])
        raise AssertionError("a wrong shape must be refused")
    except InferenceServerException as e:
        assert "INVALID_ARGUMENT" in str(e.status()), e
    assert client.is_server_ready()
    print("tritonclient interop OK")


if __name__ == "__main__":
    main(sys.argv[1])
