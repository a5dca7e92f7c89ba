"""Type stubs of the Rust extension `infermesh._native` (private: use the
`infermesh` package's `Client` / `AsyncClient`)."""

from typing import Any, Dict, List, Optional, Tuple, Union

class InfermeshError(Exception):
    code: str

class RegistryError(InfermeshError): ...
class UnavailableError(InfermeshError): ...
class ResourceExhaustedError(UnavailableError): ...
class ModelNotFoundError(InfermeshError): ...
class DeadlineExceededError(InfermeshError): ...
class InvalidArgumentError(InfermeshError): ...
class ServerError(InfermeshError): ...
class ClosedError(InfermeshError): ...

class Buffer:
    """Read-only bytes of one output; `numpy.asarray(buffer)` views them."""

    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    def __len__(self) -> int: ...

class RegionBuffer:
    """Bytes of a leased shared-memory region (an input's window, writable);
    `numpy.asarray(buffer)` views them. Holds the region."""

    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    def __len__(self) -> int: ...

class Lease:
    def inputs(self) -> List[Tuple[str, str, List[int], RegionBuffer]]: ...

class Completions:
    def __init__(self) -> None: ...
    def fileno(self) -> int: ...
    def take(self) -> List[Tuple[int, bool, Any]]: ...

class Call:
    def cancel(self) -> None: ...

# (name, array) or, for BYTES, (name, serialized uint8 array, "BYTES", shape).
Input = Union[Tuple[str, Any], Tuple[str, Any, str, List[int]]]
# (name, datatype, shape, buffer)
Output = Tuple[str, str, List[int], Buffer]

class NativeClient:
    def __init__(
        self,
        registry: str,
        service: str,
        local_node: Optional[str] = None,
        deadline: Optional[float] = None,
        max_attempts: Optional[int] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
    ) -> None: ...
    def infer(
        self,
        model: str,
        inputs: List[Input],
        outputs: Optional[List[str]] = None,
        timeout: Optional[float] = None,
    ) -> List[Output]: ...
    def infer_async(
        self,
        model: str,
        inputs: List[Input],
        outputs: Optional[List[str]],
        timeout: Optional[float],
        completions: Completions,
        id: int,
    ) -> Call: ...
    def lease(
        self,
        model: str,
        inputs: List[Tuple[str, str, List[int]]],
        outputs: List[Tuple[str, Optional[int]]],
    ) -> Lease: ...
    def infer_leased(self, lease: Lease, timeout: Optional[float] = None) -> List[Output]: ...
    def infer_leased_async(
        self,
        lease: Lease,
        timeout: Optional[float],
        completions: Completions,
        id: int,
    ) -> Call: ...
    def shm_counters(self) -> Dict[str, int]: ...
    def nodes(self) -> List[Dict[str, Any]]: ...
    def node_stats(self) -> Dict[str, Dict[str, int]]: ...
    def path_counters(self) -> Dict[str, Dict[str, int]]: ...
    def close(self) -> None: ...
