"""infermesh: the infermesh client library for Python.

A :class:`Client` finds the agents of a service (``zk://`` registry or a
``static://`` list), sends each call to the best node (the local one while it
is healthy and not overloaded, otherwise power-of-two-choices by load),
retries on another node within the call's deadline when one fails, and uses
shared memory to the local agent (``local_node``). Inputs and outputs are
numpy arrays::

    import numpy as np
    import infermesh

    with infermesh.Client("static://127.0.0.1:8001", service="default") as client:
        out = client.infer("dense", {"INPUT0": np.ones((1, 16), np.float32)})
        print(out["OUTPUT0"])

To the local node the arrays cross through shared memory. To skip the
copy of the inputs into it, lease a region and build them there; outputs
are read where the worker wrote them (see :meth:`Client.lease`)::

    lease = client.lease("identity", {"INPUT0": ((4096, 1024), np.float32)})
    lease.inputs["INPUT0"][...] = 0.5   # written in shared memory
    out = client.infer_leased(lease)    # read-only arrays over it

:class:`AsyncClient` is the asyncio variant (``await client.infer(...)``).
Every error is an :class:`InfermeshError`; see the subclasses below.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._native import (
    ClosedError,
    DeadlineExceededError,
    InfermeshError,
    InvalidArgumentError,
    ModelNotFoundError,
    RegistryError,
    ResourceExhaustedError,
    ServerError,
    UnavailableError,
)

__all__ = [
    "AsyncClient",
    "Client",
    "ClosedError",
    "DeadlineExceededError",
    "InfermeshError",
    "InvalidArgumentError",
    "Lease",
    "ModelNotFoundError",
    "Node",
    "RegistryError",
    "ResourceExhaustedError",
    "ServerError",
    "TLS",
    "UnavailableError",
]

# OIP datatype <-> numpy dtype (little-endian, as the protocol's raw form).
_NUMPY: Dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_KINDS = "biuf"  # numpy kinds sent as they are
_BYTES_KINDS = "OSU"  # object, bytes, str: sent as BYTES


@dataclass(frozen=True)
class Node:
    """A node of the service as the registry advertises it."""

    node_id: str
    grpc: str
    zone: str
    host: str
    state: str
    weight: float
    models: Tuple[Tuple[str, bool], ...]


def _invalid(msg: str) -> InvalidArgumentError:
    e = InvalidArgumentError(msg)
    e.code = "INVALID_ARGUMENT"
    return e


def _serialize_bytes(name: str, a: np.ndarray) -> np.ndarray:
    """A BYTES tensor's raw form: each element as a 4-byte little-endian
    length and its bytes, in row-major order."""
    parts: List[bytes] = []
    for v in a.reshape(-1):
        if isinstance(v, str):
            b = v.encode("utf-8")
        elif isinstance(v, (bytes, bytearray, memoryview, np.bytes_)):
            b = bytes(v)
        else:
            raise _invalid(f"input '{name}': BYTES elements must be bytes or str, got {type(v).__name__}")
        parts.append(len(b).to_bytes(4, "little"))
        parts.append(b)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def _deserialize_bytes(name: str, raw: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    data = raw.tobytes()
    items: List[bytes] = []
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise ServerError(f"output '{name}': malformed BYTES contents")
        n = int.from_bytes(data[pos : pos + 4], "little")
        pos += 4
        if pos + n > len(data):
            raise ServerError(f"output '{name}': malformed BYTES contents")
        items.append(data[pos : pos + n])
        pos += n
    out = np.empty(len(items), dtype=object)
    out[:] = items
    try:
        return out.reshape(tuple(shape))
    except ValueError:
        raise ServerError(f"output '{name}': {len(items)} BYTES elements for shape {list(shape)}") from None


def _prepare(inputs: Mapping[str, Any]) -> List[Tuple[Any, ...]]:
    """The native layer's inputs: C-contiguous, native-endian arrays, read
    there without a copy (an array that already is one is not copied here
    either)."""
    if not isinstance(inputs, Mapping):
        raise _invalid("inputs must be a dict of name -> numpy array")
    out: List[Tuple[Any, ...]] = []
    for name, value in inputs.items():
        if not isinstance(name, str):
            raise _invalid(f"input names must be str, got {type(name).__name__}")
        a = np.asarray(value)
        kind = a.dtype.kind
        if kind in _BYTES_KINDS:
            out.append((name, _serialize_bytes(name, a), "BYTES", list(a.shape)))
            continue
        if kind not in _KINDS or a.dtype.itemsize > 8:
            raise _invalid(
                f"input '{name}': dtype {a.dtype} has no OIP datatype "
                "(bool, int8..int64, uint8..uint64, float16/32/64, or bytes/str for BYTES)"
            )
        if not a.dtype.isnative:
            a = a.astype(a.dtype.newbyteorder("="))
        out.append((name, np.ascontiguousarray(a)))
    return out


def _decode(outs: List[Tuple[str, str, List[int], Any]]) -> Dict[str, np.ndarray]:
    """Outputs as numpy arrays viewing the response's bytes (read-only)."""
    result: Dict[str, np.ndarray] = {}
    for name, datatype, shape, buf in outs:
        raw = np.asarray(buf)
        if datatype == "BYTES":
            result[name] = _deserialize_bytes(name, raw, shape)
            continue
        dtype = _NUMPY.get(datatype)
        if dtype is None:
            raise ServerError(f"output '{name}': datatype {datatype} has no numpy dtype")
        result[name] = raw.view(dtype).reshape(tuple(shape))
    return result


_DATATYPE: Dict[np.dtype, str] = {d: name for name, d in _NUMPY.items()}


class Lease:
    """A region of the client's shared memory leased for one call (made by
    :meth:`Client.lease`). ``inputs`` maps each input's name to a writable
    numpy array over its window in the region: fill it in place, then send
    the lease with :meth:`Client.infer_leased`. A lease is sent once.

    The region goes back to the client's pool when the last array over it
    (an input, or an output of the call) is gone; it is never reused while
    one lives. Do not write the inputs while the call runs."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.inputs: Dict[str, np.ndarray] = {}
        for name, datatype, shape, buf in native.inputs():
            raw = np.asarray(buf)
            self.inputs[name] = raw.view(_NUMPY[datatype]).reshape(tuple(shape))


def _lease_specs(
    inputs: Mapping[str, Any], outputs: Optional[Union[Sequence[str], Mapping[str, int]]]
) -> Tuple[List[Tuple[str, str, List[int]]], List[Tuple[str, Optional[int]]]]:
    if not isinstance(inputs, Mapping):
        raise _invalid("inputs must be a dict of name -> (shape, dtype)")
    specs: List[Tuple[str, str, List[int]]] = []
    for name, spec in inputs.items():
        if not isinstance(name, str):
            raise _invalid(f"input names must be str, got {type(name).__name__}")
        try:
            shape, dtype = spec
            dtype = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)
            datatype = _DATATYPE[dtype]
            dims = [int(d) for d in shape]
        except (TypeError, ValueError, KeyError):
            raise _invalid(
                f"input '{name}': give (shape, dtype) with a fixed-size numpy dtype, got {spec!r}"
            ) from None
        specs.append((name, datatype, dims))
    outs: List[Tuple[str, Optional[int]]] = []
    if isinstance(outputs, Mapping):
        outs = [(str(n), None if b is None else int(b)) for n, b in outputs.items()]
    elif outputs is not None:
        outs = [(n, None) for n in _names(outputs) or []]
    return specs, outs


def _nodes(native: Any) -> List[Node]:
    return [
        Node(
            node_id=d["node_id"],
            grpc=d["grpc"],
            zone=d["zone"],
            host=d["host"],
            state=d["state"],
            weight=d["weight"],
            models=tuple(tuple(m) for m in d["models"]),
        )
        for d in native.nodes()
    ]


@dataclass(frozen=True)
class TLS:
    """TLS to the agents whose registry records say they serve it.

    :param ca: PEM file of the CA that signed the agents' certificates (each
        agent's certificate must name its address as an IP SAN, or its
        registered host name).
    :param cert: PEM client certificate, for agents that require one (mTLS).
    :param key: PEM private key of ``cert``; give both or neither.

    Files are read when the client is built; a missing or unreadable file, a
    lone ``cert`` or ``key`` or a mismatched pair raise
    :class:`InvalidArgumentError` there. Nodes that serve plaintext are still
    reached in plaintext; a node that serves TLS is never reached without it.
    """

    ca: Union[str, "os.PathLike[str]"]
    cert: Optional[Union[str, "os.PathLike[str]"]] = None
    key: Optional[Union[str, "os.PathLike[str]"]] = None


class Client:
    """A client of one service of the fleet. Thread-safe; calls from many
    threads share its connections and balancing state.

    :param registry: ``zk://host:port[,host:port...][/chroot]`` or
        ``static://host:port[,host:port...]`` (node ids are then the addresses).
    :param service: the service name the agents register under.
    :param local_node: this host's node id: preferred while healthy, and
        reached through shared memory.
    :param deadline: seconds for each call, retries included (default 10).
    :param max_attempts: attempts per call, the first included (default 3).
    :param tls: a :class:`TLS` (CA, and client certificate and key for mTLS)
        for agents that serve TLS. ``None`` (the default) uses the
        environment's ``INFERMESH_TLS_CA``, ``INFERMESH_TLS_CERT`` and
        ``INFERMESH_TLS_KEY`` if set, as the CLI does; without any, nodes that
        serve TLS are skipped (with a warning in the log).
    """

    def __init__(
        self,
        registry: str = "static://127.0.0.1:8001",
        service: str = "default",
        local_node: Optional[str] = None,
        deadline: Optional[float] = None,
        max_attempts: Optional[int] = None,
        tls: Optional[TLS] = None,
    ) -> None:
        ca = cert = key = None
        if tls is not None:
            if not isinstance(tls, TLS):
                raise _invalid("tls must be an infermesh.TLS(ca, cert=None, key=None)")
            if tls.ca is None:
                raise _invalid("TLS needs the CA file (ca)")
            ca, cert, key = _path(tls.ca), _path(tls.cert), _path(tls.key)
        self._native = _native.NativeClient(
            registry, service, local_node, deadline, max_attempts, ca, cert, key
        )

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
    ) -> Dict[str, np.ndarray]:
        """Runs ``model`` on ``inputs`` (name -> array) and returns its
        outputs (name -> read-only array); ``outputs`` names the ones wanted
        (default: all), ``timeout`` bounds this call in seconds (within the
        client's deadline). The GIL is released while the call waits."""
        outs = self._native.infer(model, _prepare(inputs), _names(outputs), timeout)
        return _decode(outs)

    def lease(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Optional[Union[Sequence[str], Mapping[str, int]]] = None,
    ) -> Lease:
        """Leases a region of the client's shared memory for one call to
        ``model``, to build its inputs in place (no copy into shared memory
        on the way to the local node). ``inputs`` maps each input's name to
        ``(shape, dtype)``; ``outputs`` names the outputs wanted (or maps
        each to the bytes to reserve for it; by default the inputs' total
        size, at least 64 KiB). Raises :class:`ResourceExhaustedError` when
        the pool is full."""
        specs, outs = _lease_specs(inputs, outputs)
        return Lease(self._native.lease(model, specs, outs))

    def infer_leased(self, lease: Lease, timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        """Sends a :class:`Lease` whose inputs are filled; returns its outputs
        as read-only arrays (over the region when shared memory carried the
        call, without a copy)."""
        if not isinstance(lease, Lease):
            raise _invalid("infer_leased takes a Lease from Client.lease")
        return _decode(self._native.infer_leased(lease._native, timeout))

    def shm_counters(self) -> Dict[str, int]:
        """The shared-memory pool's counters: regions ``created``, ``leased``
        now (a lease, or any array over a region, holds one), ``reused``,
        ``retired``, ``exhausted`` (leases refused), ``total_bytes``."""
        return self._native.shm_counters()

    def nodes(self) -> List[Node]:
        """The nodes known now."""
        return _nodes(self._native)

    def node_stats(self) -> Dict[str, Dict[str, int]]:
        """Per node: attempts sent, failures, timeouts, attempts in flight."""
        return self._native.node_stats()

    def path_counters(self) -> Dict[str, Dict[str, int]]:
        """Per transport path (shm, rdma, grpc): attempts, successes,
        failures, fallbacks to the next path."""
        return self._native.path_counters()

    def close(self) -> None:
        """Stops discovery and closes connections; later calls raise
        :class:`ClosedError`."""
        self._native.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _path(p: Optional[Union[str, "os.PathLike[str]"]]) -> Optional[str]:
    return None if p is None else os.fspath(p)


def _names(outputs: Optional[Sequence[str]]) -> Optional[List[str]]:
    if outputs is None:
        return None
    if isinstance(outputs, str):
        raise _invalid("outputs must be a list of names, not a str")
    return list(outputs)


class AsyncClient(Client):
    """The asyncio variant: ``await client.infer(...)``. Calls run on the
    library's own threads; results wake the event loop through a socket it
    watches and complete the callers' futures on the loop's thread.
    Cancelling the awaiting task cancels the call. Use one client per event
    loop (a client moved to another loop drops the calls pending on the
    first)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The event loop this client completes calls on, its completion
        # queue, and the futures waiting, by call id.
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._completions: Any = None
        self._pending: Dict[int, "asyncio.Future[Any]"] = {}
        self._next_id = 0

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is loop:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._completions.fileno())
        self._completions = _native.Completions()
        self._pending = {}
        self._loop = loop
        loop.add_reader(self._completions.fileno(), self._drain, self._completions, self._pending)

    @staticmethod
    def _drain(completions: Any, pending: Dict[int, "asyncio.Future[Any]"]) -> None:
        for call_id, ok, value in completions.take():
            fut = pending.pop(call_id, None)
            if fut is None or fut.done():
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    async def infer(  # type: ignore[override]
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
    ) -> Dict[str, np.ndarray]:
        """As :meth:`Client.infer`, awaited."""
        loop = asyncio.get_running_loop()
        self._attach(loop)
        call_id = self._next_id
        self._next_id += 1
        fut: "asyncio.Future[Any]" = loop.create_future()
        call = self._native.infer_async(
            model, _prepare(inputs), _names(outputs), timeout, self._completions, call_id
        )
        self._pending[call_id] = fut
        try:
            outs = await fut
        except asyncio.CancelledError:
            self._pending.pop(call_id, None)
            call.cancel()
            raise
        return _decode(outs)

    async def infer_leased(  # type: ignore[override]
        self, lease: Lease, timeout: Optional[float] = None
    ) -> Dict[str, np.ndarray]:
        """As :meth:`Client.infer_leased`, awaited."""
        if not isinstance(lease, Lease):
            raise _invalid("infer_leased takes a Lease from Client.lease")
        loop = asyncio.get_running_loop()
        self._attach(loop)
        call_id = self._next_id
        self._next_id += 1
        fut: "asyncio.Future[Any]" = loop.create_future()
        call = self._native.infer_leased_async(lease._native, timeout, self._completions, call_id)
        self._pending[call_id] = fut
        try:
            outs = await fut
        except asyncio.CancelledError:
            self._pending.pop(call_id, None)
            call.cancel()
            raise
        return _decode(outs)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._completions.fileno())
        self._loop = None
        super().close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
