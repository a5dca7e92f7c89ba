"""What computes the ``dense`` model and makes the faults.

The ``dense`` model is the test worker's (``testworker/src/dense.rs``,
``tests/py/dense.py``): FP32 ``[batch, 16]`` -> FP32 ``[batch, 4]``,

    W[i][j] = ((i * 4 + j) * 37 mod 29) / 14 - 1,   b[j] = (j - 1.5) / 10
    y = tanh(x @ W / 4 + b)

- ``TorchBackend`` runs it with PyTorch on a CUDA device (or on the CPU), and
  answers the drill's faults with real CUDA faults: ``device-assert`` (an
  out-of-bounds index on a CUDA tensor: a device-side assert, sticky),
  ``illegal-address`` (a kernel storing through a wild pointer: Xid 31,
  sticky) and ``spin`` (a kernel spinning for a bounded time: a stall that
  ends by itself). See ``cuda_faults.py``.
- ``NumpyBackend`` computes the same with numpy and makes no faults: the
  server's protocol side runs and is tested where PyTorch is not installed
  (CI).
"""

import numpy as np

IN_FEATURES = 16
OUT_FEATURES = 4
FAULTS = ("device-assert", "illegal-address", "spin")


class FaultUnsupported(Exception):
    """This backend cannot make that fault."""


def weights():
    i = np.arange(IN_FEATURES)[:, None]
    j = np.arange(OUT_FEATURES)[None, :]
    w = (((i * OUT_FEATURES + j) * 37) % 29).astype(np.float32) / np.float32(14) - np.float32(1)
    b = (np.arange(OUT_FEATURES, dtype=np.float32) - np.float32(1.5)) / np.float32(10)
    return w, b


class NumpyBackend:
    platform = "numpy"

    def __init__(self):
        self.w, self.b = weights()

    def forward(self, x: np.ndarray) -> np.ndarray:
        return np.tanh(x @ self.w / np.float32(4) + self.b).astype(np.float32)

    def fault(self, kind: str, seconds: float) -> None:
        raise FaultUnsupported(f"the numpy backend makes no CUDA faults ('{kind}'): run with --device cuda")


class TorchBackend:
    def __init__(self, device: str):
        import torch

        self.torch = torch
        # Plain FP32 matmul, as the reference computes it (no TF32).
        torch.backends.cuda.matmul.allow_tf32 = False
        self.device = torch.device(device)
        self.platform = f"pytorch_{self.device.type}"
        w, b = weights()
        self.w = torch.from_numpy(w).to(self.device)
        self.b = torch.from_numpy(b).to(self.device)
        self.kernels = None
        if self.device.type == "cuda":
            from cuda_faults import Kernels

            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            torch.cuda.set_device(index)
            self.kernels = Kernels(index)
        # Initialize CUDA and the kernels now, not on the first request.
        self.forward(np.zeros((1, IN_FEATURES), dtype=np.float32))

    def forward(self, x: np.ndarray) -> np.ndarray:
        t = self.torch.from_numpy(x).to(self.device, non_blocking=False)
        y = self.torch.tanh(t @ self.w / 4 + self.b)
        return y.cpu().numpy()

    def fault(self, kind: str, seconds: float) -> None:
        torch = self.torch
        if self.kernels is None:
            raise FaultUnsupported(f"'{kind}' is a CUDA fault: run with --device cuda")
        stream = torch.cuda.current_stream().cuda_stream
        if kind == "device-assert":
            values = torch.zeros(4, device=self.device)
            index = torch.tensor([1 << 20], device=self.device)
            values[index].sum().item()  # raises: device-side assert triggered
        elif kind == "illegal-address":
            self.kernels.wild_store(stream)
            torch.cuda.synchronize()  # raises: an illegal memory access
        elif kind == "spin":
            # Queued: this request's own inference (and every other one on
            # the stream) waits behind it; the call returns at once.
            self.kernels.spin(stream, seconds)
        else:
            raise ValueError(f"unknown fault '{kind}' (expected one of: {', '.join(FAULTS)})")

    def memory_bytes(self) -> int:
        if self.device.type != "cuda":
            return 0
        return int(self.torch.cuda.memory_reserved(self.device))
