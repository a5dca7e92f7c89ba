#!/usr/bin/env python3
"""A small PyTorch inference server speaking the Open Inference Protocol
(KServe v2 gRPC, the project's ``proto/``), for running the infermesh agent
against real GPU faults.

It serves the ``dense`` model (see ``backends.py``) on a CUDA device, and a
request whose string parameter ``infermesh_fault`` names a fault makes it
for real, as ``infermesh drill`` asks:

- ``device-assert``: an out-of-bounds index on a CUDA tensor. PyTorch raises
  ``CUDA error: device-side assert triggered``; the context stays broken, so
  every later request fails the same way (answered INTERNAL, printed on
  stderr, as Triton does) until the process is replaced.
- ``illegal-address``: a kernel storing through a wild pointer. The driver
  logs Xid 31 naming this process; sticky like the above.
- ``spin``: a kernel spinning for ``infermesh_fault_seconds`` (default 15)
  seconds. Inference stalls (every request queues behind it on the GPU)
  while ServerLive and ModelReady keep answering; then it recovers by itself.

``--device cpu`` runs the model with PyTorch on the CPU, ``--device numpy``
without PyTorch at all (no faults): the protocol side, for hosts without a
GPU. Needs grpcio and grpcio-tools (the stubs are generated from the
project's protos at start) and numpy; PyTorch for ``cuda``/``cpu``.

    python3 torch_worker.py --listen 127.0.0.1:9001 --device cuda
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from backends import FAULTS, IN_FEATURES, OUT_FEATURES, FaultUnsupported  # noqa: E402

FAULT_PARAMETER = "infermesh_fault"
FAULT_SECONDS_PARAMETER = "infermesh_fault_seconds"
DEFAULT_SPIN_SECONDS = 15.0
MAX_MESSAGE_BYTES = 64 << 20


def load_stubs(proto_dir: Path):
    """Generates the OIP stubs from the project's protos into a temporary
    directory and imports them. On a host without grpcio-tools, the
    directory named by INFERMESH_OIP_STUBS (holding `inference/*_pb2*.py`
    generated elsewhere, e.g. by `python -m grpc_tools.protoc`) is imported
    instead."""
    prebuilt = os.environ.get("INFERMESH_OIP_STUBS")
    if prebuilt:
        sys.path.insert(0, prebuilt)
        from inference import grpc_service_pb2, grpc_service_pb2_grpc

        return grpc_service_pb2, grpc_service_pb2_grpc
    try:
        from grpc_tools import protoc
        import grpc_tools
    except ImportError:
        raise SystemExit(
            "grpcio-tools is not installed: pip install grpcio-tools, or set INFERMESH_OIP_STUBS "
            "to a directory of stubs generated on another host"
        )

    out = Path(tempfile.mkdtemp(prefix="torch-worker-stubs-"))
    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    sources = [str(proto_dir / "inference" / name) for name in ("grpc_service.proto", "model_config.proto")]
    code = protoc.main(
        ["grpc_tools.protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}"]
        + sources
    )
    if code != 0:
        raise SystemExit(f"generating the OIP stubs from {proto_dir} failed (protoc exit {code})")
    sys.path.insert(0, str(out))
    from inference import grpc_service_pb2, grpc_service_pb2_grpc

    # Imported: the files are no longer needed.
    shutil.rmtree(out, ignore_errors=True)
    sys.path.remove(str(out))
    return grpc_service_pb2, grpc_service_pb2_grpc


def make_servicer(pb, pb_grpc, grpc, backend, models):
    class Worker(pb_grpc.GRPCInferenceServiceServicer):
        def ServerLive(self, request, context):
            return pb.ServerLiveResponse(live=True)

        def ServerReady(self, request, context):
            return pb.ServerReadyResponse(ready=True)

        def ModelReady(self, request, context):
            return pb.ModelReadyResponse(ready=request.name in models)

        def ServerMetadata(self, request, context):
            return pb.ServerMetadataResponse(name="torch-worker", version="1", extensions=[])

        def RepositoryIndex(self, request, context):
            return pb.RepositoryIndexResponse(
                models=[pb.RepositoryIndexResponse.ModelIndex(name=m, version="1", state="READY") for m in models]
            )

        def ModelMetadata(self, request, context):
            if request.name not in models:
                context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model '{request.name}'")
            tensor = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(
                name=request.name,
                versions=["1"],
                platform=backend.platform,
                inputs=[tensor(name="INPUT0", datatype="FP32", shape=[-1, IN_FEATURES])],
                outputs=[tensor(name="OUTPUT0", datatype="FP32", shape=[-1, OUT_FEATURES])],
            )

        def ModelInfer(self, request, context):
            if request.model_name not in models:
                context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model '{request.model_name}'")
            x, raw = decode(request, context, grpc)
            fault = parameter(request, FAULT_PARAMETER)
            if fault is not None:
                if not isinstance(fault, str) or fault not in FAULTS:
                    context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"{FAULT_PARAMETER}: expected one of {', '.join(FAULTS)}",
                    )
                seconds = parameter(request, FAULT_SECONDS_PARAMETER)
                seconds = float(seconds) if isinstance(seconds, (int, float)) else DEFAULT_SPIN_SECONDS
                print(f"fault injected: {fault}", file=sys.stderr, flush=True)
                try:
                    backend.fault(fault, seconds)
                except FaultUnsupported as e:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
                except Exception as e:  # the CUDA error itself
                    self.fail(context, grpc, e)
            try:
                y = backend.forward(x)
            except Exception as e:
                self.fail(context, grpc, e)
            out = pb.ModelInferResponse.InferOutputTensor(name="OUTPUT0", datatype="FP32", shape=list(y.shape))
            response = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
            if raw:
                response.raw_output_contents.append(y.astype("<f4").tobytes())
            else:
                out.contents.fp32_contents.extend(y.ravel().tolist())
            response.outputs.append(out)
            return response

        def fail(self, context, grpc, error):
            # Like Triton: the CUDA error on stderr (the agent's fault
            # patterns read it) and in an INTERNAL answer.
            message = f"{type(error).__name__}: {error}".strip()
            print(message, file=sys.stderr, flush=True)
            context.abort(grpc.StatusCode.INTERNAL, message)

    return Worker()


def parameter(request, name):
    p = request.parameters.get(name)
    if p is None:
        return None
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def decode(request, context, grpc):
    """The request's one input as a float32 [batch, 16] array, and whether
    it came as raw bytes (the answer uses the same form)."""
    if len(request.inputs) != 1:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "expected exactly one input, INPUT0")
    tensor = request.inputs[0]
    shape = list(tensor.shape)
    if tensor.datatype != "FP32" or len(shape) != 2 or shape[1] != IN_FEATURES or shape[0] < 0:
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"INPUT0 must be FP32 [batch, {IN_FEATURES}], got {tensor.datatype} {shape}",
        )
    raw = len(request.raw_input_contents) > 0
    if raw:
        data = request.raw_input_contents[0]
        if len(data) != shape[0] * IN_FEATURES * 4:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"INPUT0 has {len(data)} bytes for shape {shape}")
        x = np.frombuffer(data, dtype="<f4").astype(np.float32)
    else:
        values = tensor.contents.fp32_contents
        if len(values) != shape[0] * IN_FEATURES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"INPUT0 has {len(values)} values for shape {shape}")
        x = np.asarray(values, dtype=np.float32)
    return x.reshape(shape[0], IN_FEATURES), raw


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_listen = f"127.0.0.1:{os.environ.get('INFERMESH_WORKER_PORT', '9001')}"
    parser.add_argument("--listen", default=default_listen, help="host:port to serve OIP gRPC on")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, cpu, or numpy (no PyTorch, no faults)")
    parser.add_argument("--model", action="append", help="model names served (default: dense)")
    parser.add_argument("--threads", type=int, default=32, help="gRPC handler threads")
    parser.add_argument("--proto-dir", default=str(HERE.parent.parent / "proto" / "proto"))
    args = parser.parse_args()
    models = args.model or ["dense"]

    import grpc

    pb, pb_grpc = load_stubs(Path(args.proto_dir))
    started = time.monotonic()
    if args.device == "numpy":
        from backends import NumpyBackend

        backend = NumpyBackend()
    else:
        from backends import TorchBackend

        backend = TorchBackend(args.device)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=args.threads),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(make_servicer(pb, pb_grpc, grpc, backend, models), server)
    if server.add_insecure_port(args.listen) == 0:
        raise SystemExit(f"cannot listen on {args.listen}")
    server.start()
    print(
        f"torch-worker serving {', '.join(models)} on {args.listen} ({backend.platform}, "
        f"pid {os.getpid()}, ready {time.monotonic() - started:.2f}s after start)",
        file=sys.stderr,
        flush=True,
    )
    server.wait_for_termination()


if __name__ == "__main__":
    main()
