"""Calls an infermesh agent that serves TLS and requires client certificates
with NVIDIA's `tritonclient` (gRPC with ssl=True, and HTTP over https), and
checks that a client without a certificate is refused.

Usage: python triton_tls.py GRPC_HOST:PORT HTTP_HOST:PORT CA CERT KEY
"""

import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from dense import expected


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def main(grpc_url: str, http_url: str, ca: str, cert: str, key: str) -> None:
    x = np.random.default_rng(11).standard_normal((3, 16)).astype(np.float32)

    client = grpcclient.InferenceServerClient(
        url=grpc_url,
        ssl=True,
        root_certificates=ca,
        private_key=key,
        certificate_chain=cert,
    )
    assert client.is_server_ready(), "server ready over TLS"
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("dense", [inp], request_id="tls-1")
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected(x), rtol=1e-5, atol=1e-6)
    print("grpc over mTLS OK")

    # Trusting the CA but presenting no certificate: refused.
    anonymous = grpcclient.InferenceServerClient(url=grpc_url, ssl=True, root_certificates=ca)
    try:
        anonymous.is_server_ready()
        raise AssertionError("a client without a certificate must be refused")
    except InferenceServerException as e:
        assert "UNAVAILABLE" in str(e.status()), e
    print("grpc without a client certificate refused")

    http = httpclient.InferenceServerClient(
        url=http_url,
        ssl=True,
        ssl_options={"ca_certs": ca, "certfile": cert, "keyfile": key},
    )
    assert http.is_server_ready(), "HTTP server ready over TLS"
    hin = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    hin.set_data_from_numpy(x, binary_data=True)
    result = http.infer("dense", [hin])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected(x), rtol=1e-5, atol=1e-6)
    print("http over mTLS OK")


if __name__ == "__main__":
    main(*sys.argv[1:6])
