"""Calls the agent's KServe v2 HTTP/REST port with NVIDIA's `tritonclient.http`
(not ours): health, metadata, and inference with binary tensors (tritonclient's
default) and with JSON tensors, checked against the test worker's `dense` math.

Usage: triton_http.py HOST:PORT  (the agent's --http-listen address)
"""
import sys

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from dense import expected


client = httpclient.InferenceServerClient(url=sys.argv[1])
assert client.is_server_live()
assert client.is_server_ready()
assert client.is_model_ready("dense")
assert not client.is_model_ready("no-such-model")
meta = client.get_model_metadata("dense")
assert meta["name"] == "dense", meta
assert meta["inputs"][0]["name"] == "INPUT0" and meta["inputs"][0]["shape"] == [-1, 16], meta
server = client.get_server_metadata()
assert server["name"] == "infermesh-agent", server

x = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)
for binary in [True, False]:
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer("dense", [inp], outputs=[out], request_id=f"http-{binary}")
    y = result.as_numpy("OUTPUT0")
    assert y.shape == (3, 4), y.shape
    np.testing.assert_allclose(y, expected(x), rtol=1e-5, atol=1e-6)
    assert result.get_response()["id"] == f"http-{binary}"

# No outputs named: all of them, as JSON.
inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
inp.set_data_from_numpy(x, binary_data=False)
result = client.infer("dense", [inp])
np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected(x), rtol=1e-5, atol=1e-6)

bad = httpclient.InferInput("INPUT0", [2, 15], "FP32")
bad.set_data_from_numpy(np.zeros((2, 15), dtype=np.float32))
try:
    client.infer("dense", [bad])
    raise AssertionError("a wrong shape must be refused")
except InferenceServerException as e:
    assert "INPUT0" in str(e), e
try:
    client.infer("no-such-model", [inp])
    raise AssertionError("an unknown model must be refused")
except InferenceServerException as e:
    assert "no-such-model" in str(e), e
assert client.is_server_ready()
print("tritonclient.http OK")
