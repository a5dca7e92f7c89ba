"""What the package does without a fleet: datatype mapping both ways, BYTES
serialization, argument checks. Outputs are decoded from arrays standing in
for the response's buffers (any object with `__array_interface__`)."""

from __future__ import annotations

import numpy as np
import pytest

import infermesh
from infermesh import _decode, _prepare

DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


@pytest.mark.parametrize("datatype", sorted(DTYPES))
def test_outputs_decode_to_their_numpy_dtype_in_place(datatype: str) -> None:
    want = (np.arange(12) % 3).astype(DTYPES[datatype]).reshape(3, 4)
    raw = want.view(np.uint8).reshape(-1)
    out = _decode([("OUT", datatype, [3, 4], raw)])["OUT"]
    assert out.dtype == want.dtype and out.shape == (3, 4)
    np.testing.assert_array_equal(out, want)
    assert np.shares_memory(out, raw), "decoded without a copy"


def test_contiguous_inputs_are_passed_as_they_are() -> None:
    x = np.ones((4, 16), np.float32)
    [(name, a)] = _prepare({"INPUT0": x})
    assert name == "INPUT0" and a is x


def test_strided_and_big_endian_inputs_are_made_contiguous_native() -> None:
    x = np.arange(64, dtype=np.float32).reshape(4, 16)
    [(_, a)] = _prepare({"A": x[:, ::2]})
    assert a.flags.c_contiguous
    np.testing.assert_array_equal(a, x[:, ::2])
    be = x.astype(">f4")
    [(_, b)] = _prepare({"B": be})
    assert b.dtype == np.dtype("<f4") and b.dtype.isnative
    np.testing.assert_array_equal(b, x)


def test_bytes_round_trip() -> None:
    values = np.array([[b"a", b""], [b"hello", "\u00e9t\u00e9".encode()]], dtype=object)
    [(name, raw, datatype, shape)] = _prepare({"S": values})
    assert (name, datatype, shape) == ("S", "BYTES", [2, 2])
    assert raw.dtype == np.uint8
    assert raw.tobytes()[:5] == b"\x01\x00\x00\x00a"
    out = _decode([("S", "BYTES", [2, 2], raw)])["S"]
    assert out.shape == (2, 2) and out.tolist() == values.tolist()
    with pytest.raises(infermesh.ServerError):
        _decode([("S", "BYTES", [2, 2], raw[:-1])])


@pytest.mark.parametrize(
    "inputs",
    [
        {"X": np.ones(3, np.complex64)},
        {"X": np.array(["2020-01-01"], dtype="datetime64[D]")},
        {1: np.ones(3, np.float32)},
        [("X", np.ones(3))],
        {"X": np.array([1, object()], dtype=object)},
    ],
)
def test_unsupported_inputs_raise_invalid_argument(inputs: object) -> None:
    with pytest.raises(infermesh.InvalidArgumentError) as e:
        _prepare(inputs)  # type: ignore[arg-type]
    assert e.value.code == "INVALID_ARGUMENT"


def test_bad_arguments_raise_before_anything_is_sent() -> None:
    with pytest.raises(infermesh.RegistryError) as e:
        infermesh.Client("http://nope", service="s")
    assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(infermesh.InvalidArgumentError):
        infermesh.Client("static://127.0.0.1:1", deadline=-1)
    with pytest.raises(infermesh.InvalidArgumentError):
        infermesh.Client("static://127.0.0.1:1", max_attempts=0)
    with pytest.raises(infermesh.InvalidArgumentError):
        infermesh.Client("static://127.0.0.1:1", tls={"ca": "x"})  # type: ignore[arg-type]
    with pytest.raises(infermesh.InvalidArgumentError, match="/nonexistent/ca.pem"):
        infermesh.Client("static://127.0.0.1:1", tls=infermesh.TLS("/nonexistent/ca.pem"))
    with infermesh.Client("static://127.0.0.1:1") as c:
        with pytest.raises(infermesh.InvalidArgumentError):
            c.infer("", {"X": np.ones(1, np.float32)})
        with pytest.raises(infermesh.InvalidArgumentError):
            c.infer("m", {"X": np.ones(1, np.float32)}, timeout=float("nan"))
        with pytest.raises(infermesh.InvalidArgumentError):
            c.infer("m", {"X": np.ones(1, np.float32)}, outputs="Y")
    with pytest.raises(infermesh.ClosedError):
        c.infer("m", {"X": np.ones(1, np.float32)})


def test_exceptions_form_one_hierarchy() -> None:
    for cls in (
        infermesh.RegistryError,
        infermesh.UnavailableError,
        infermesh.ResourceExhaustedError,
        infermesh.ModelNotFoundError,
        infermesh.DeadlineExceededError,
        infermesh.InvalidArgumentError,
        infermesh.ServerError,
        infermesh.ClosedError,
    ):
        assert issubclass(cls, infermesh.InfermeshError)
        assert cls.__module__ == "infermesh"
    assert issubclass(infermesh.ResourceExhaustedError, infermesh.UnavailableError)


def test_a_client_made_before_fork_refuses_in_the_child_and_a_new_one_works() -> None:
    import os

    parent = infermesh.Client("static://127.0.0.1:1")
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 only if both behave
        code = 1
        try:
            try:
                parent.infer("m", {"X": np.ones(1, np.float32)})
            except infermesh.ClosedError:
                child = infermesh.Client("static://127.0.0.1:1", max_attempts=1)
                try:
                    child.infer("m", {"X": np.ones(1, np.float32)}, timeout=5)
                except infermesh.UnavailableError:
                    code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    parent.close()


def test_the_package_type_checks_strictly_against_its_stubs() -> None:
    # The front is checked against `_native.pyi` as a user's code would be.
    import pathlib
    import subprocess
    import sys

    package = pathlib.Path(__file__).resolve().parents[1] / "infermesh"
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(package)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
