"""grpc.health.v1 against the agent with grpcio-health-checking (not ours).

Usage: health_probe.py HOST:PORT  (the agent serves model "dense" and is ready)
Checks: overall, the OIP service name and a model are SERVING; an unknown
name is NOT_FOUND; Watch sends SERVING first. Prints "grpc health OK".
"""
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

target = sys.argv[1]
SERVING = health_pb2.HealthCheckResponse.SERVING

with grpc.insecure_channel(target) as channel:
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ["", "inference.GRPCInferenceService", "dense"]:
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert resp.status == SERVING, (service, resp)
    try:
        stub.Check(health_pb2.HealthCheckRequest(service="no-such-model"), timeout=10)
        raise AssertionError("an unknown service must be NOT_FOUND")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    first = next(watch)
    assert first.status == SERVING, first
    watch.cancel()
print("grpc health OK")
