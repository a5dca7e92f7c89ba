"""Real CUDA faults without a compiler: two raw kernels in PTX, which the
driver compiles when loaded, launched through the CUDA driver API with ctypes.

- ``wild_store``: one thread stores through a pointer nothing maps (0x10).
  The GPU's MMU faults, the driver logs Xid 31 naming the process, and the
  CUDA context is lost for good: "an illegal memory access was encountered"
  on this and every later call (a sticky error; only a new process recovers).
- ``spin``: one thread spins reading the SM's cycle counter (``%clock64``)
  until the GPU's nanosecond timer (``%globaltimer``) has passed a deadline.
  Every later kernel on the stream waits behind it, so inference stalls
  while the process and its RPC threads are fine; the hang ends by itself
  and leaves the GPU clean. The deadline is in wall time (``%globaltimer``)
  rather than in cycles, so it holds whatever the clock rate.

Both run on the caller's stream in the CUDA primary context, the one
PyTorch uses, so they hit the process's real context. Nothing here needs
PyTorch; ``libcuda.so.1`` comes with the NVIDIA driver.
"""

import ctypes

PTX = b"""
.version 6.0
.target sm_52
.address_size 64

.visible .entry wild_store(.param .u64 addr)
{
    .reg .u64 %rd<2>;
    .reg .u32 %r<2>;
    ld.param.u64 %rd1, [addr];
    mov.u32 %r1, 12345;
    st.global.u32 [%rd1], %r1;
    ret;
}

.visible .entry spin(.param .u64 nanoseconds)
{
    .reg .u64 %rd<6>;
    .reg .pred %p1;
    ld.param.u64 %rd1, [nanoseconds];
    mov.u64 %rd2, %globaltimer;
    add.u64 %rd3, %rd2, %rd1;
SPIN:
    mov.u64 %rd4, %clock64;
    mov.u64 %rd5, %globaltimer;
    setp.lt.u64 %p1, %rd5, %rd3;
    @%p1 bra SPIN;
    ret;
}
"""

# An address no process or CUDA allocation maps: the null page.
WILD_ADDRESS = 0x10


class CudaDriverError(RuntimeError):
    """A CUDA driver API call failed."""


class Kernels:
    """The two fault kernels, loaded into the primary context of one device."""

    def __init__(self, device_ordinal: int):
        self._cuda = ctypes.CDLL("libcuda.so.1")
        c = self._cuda
        c.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        c.cuLaunchKernel.argtypes = [
            ctypes.c_void_p,  # CUfunction
            ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,  # grid
            ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,  # block
            ctypes.c_uint,  # shared memory bytes
            ctypes.c_void_p,  # CUstream
            ctypes.POINTER(ctypes.c_void_p),  # kernel parameters
            ctypes.POINTER(ctypes.c_void_p),  # extra
        ]
        self._check(c.cuInit(0), "cuInit")
        device = ctypes.c_int()
        self._check(c.cuDeviceGet(ctypes.byref(device), device_ordinal), "cuDeviceGet")
        context = ctypes.c_void_p()
        self._check(
            c.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
            "cuDevicePrimaryCtxRetain",
        )
        self._check(c.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        module = ctypes.c_void_p()
        self._check(c.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)), "cuModuleLoadData")
        self._functions = {}
        for name in (b"wild_store", b"spin"):
            function = ctypes.c_void_p()
            self._check(
                c.cuModuleGetFunction(ctypes.byref(function), module, name),
                "cuModuleGetFunction",
            )
            self._functions[name] = function
        self._context = context

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            text = ctypes.c_char_p()
            self._cuda.cuGetErrorString(code, ctypes.byref(text))
            message = text.value.decode() if text.value else "unknown error"
            raise CudaDriverError(f"{what}: CUDA error {code}: {message}")

    def _launch(self, name: bytes, stream: int, argument: int) -> None:
        # The context is current per thread: gRPC handlers run on many.
        self._check(self._cuda.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
        value = ctypes.c_uint64(argument)
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(value), ctypes.c_void_p))
        self._check(
            self._cuda.cuLaunchKernel(
                self._functions[name], 1, 1, 1, 1, 1, 1, 0,
                ctypes.c_void_p(stream), params, None,
            ),
            "cuLaunchKernel",
        )

    def wild_store(self, stream: int) -> None:
        """Queues a store through a wild pointer on ``stream``."""
        self._launch(b"wild_store", stream, WILD_ADDRESS)

    def spin(self, stream: int, seconds: float) -> None:
        """Queues a kernel that spins for ``seconds`` on ``stream``."""
        self._launch(b"spin", stream, int(seconds * 1e9))
