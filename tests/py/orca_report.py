"""Reads the agent's ORCA load report with the xds protos (`xds-protos` from
PyPI, not ours), as gRPC's and Envoy's weighted round robin would.

Usage: orca_report.py HOST:PORT  (the agent serves model "dense")
Sends 20 requests with tritonclient, then one ModelInfer with grpclib to read
its trailing metadata. Prints "orca report OK".
"""
import asyncio
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from grpclib.client import Channel
from grpclib.const import Cardinality
from tritonclient.grpc import service_pb2
from xds.data.orca.v3 import orca_load_report_pb2

target = sys.argv[1]
client = grpcclient.InferenceServerClient(url=target)
x = np.zeros((1, 16), dtype=np.float32)
for _ in range(20):
    inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(x)
    client.infer("dense", [inp])

req = service_pb2.ModelInferRequest(model_name="dense")
req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
req.raw_input_contents.append(x.tobytes())


async def trailers_of_one_infer():
    # grpcio's core consumes endpoint-load-metrics-bin itself (its weighted
    # round robin reads it) and does not hand it to the application; grpclib,
    # another gRPC implementation, shows the trailers as sent.
    host, port = target.rsplit(":", 1)
    channel = Channel(host, int(port))
    try:
        async with channel.request(
            "/inference.GRPCInferenceService/ModelInfer",
            Cardinality.UNARY_UNARY,
            service_pb2.ModelInferRequest,
            service_pb2.ModelInferResponse,
        ) as stream:
            await stream.send_message(req, end=True)
            await stream.recv_message()
            await stream.recv_trailing_metadata()
            return stream.trailing_metadata
    finally:
        channel.close()


trailers = asyncio.run(trailers_of_one_infer())
assert "endpoint-load-metrics-bin" in trailers, trailers
raw = trailers["endpoint-load-metrics-bin"]
assert isinstance(raw, bytes), type(raw)
report = orca_load_report_pb2.OrcaLoadReport.FromString(raw)
assert report.rps_fractional > 0, report
assert 0 < report.application_utilization <= 1, report
metrics = dict(report.named_metrics)
assert set(metrics) == {"inflight", "queued", "busy", "weight"}, metrics
assert metrics["busy"] == report.application_utilization, metrics
assert metrics["weight"] == float(trailers["infermesh-weight"]), (metrics, trailers)
print("orca report OK", report)
