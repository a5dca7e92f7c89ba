"""Triton's system shared memory example flow (simple_grpc_shm_client.py) with
NVIDIA's own `tritonclient` against an infermesh agent: create regions with
tritonclient.utils.shared_memory, register them, infer with inputs and outputs
in shared memory, check the numbers, unregister. Also: a reference past the
end of a region is refused with INVALID_ARGUMENT, and another connection
cannot use or see this one's regions.

Usage: python triton_shm.py HOST:PORT
"""

import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from dense import expected


def main(url: str) -> None:
    client = grpcclient.InferenceServerClient(url=url)
    client.unregister_system_shared_memory()

    x = np.random.default_rng(11).standard_normal((3, 16)).astype(np.float32)
    in_bytes = x.size * x.itemsize
    out_bytes = 3 * 4 * 4
    in_handle = shm.create_shared_memory_region("input_data", "/infermesh_test_input", in_bytes)
    out_handle = shm.create_shared_memory_region("output_data", "/infermesh_test_output", out_bytes)
    try:
        shm.set_shared_memory_region(in_handle, [x])
        client.register_system_shared_memory("input_data", "/infermesh_test_input", in_bytes)
        client.register_system_shared_memory("output_data", "/infermesh_test_output", out_bytes)
        status = client.get_system_shared_memory_status()
        names = sorted(r for r in status.regions)
        assert names == ["input_data", "output_data"], status

        inp = grpcclient.InferInput("INPUT0", [3, 16], "FP32")
        inp.set_shared_memory("input_data", in_bytes)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("output_data", out_bytes)
        result = client.infer("dense", [inp], outputs=[out])
        meta = result.get_output("OUTPUT0")
        assert list(meta.shape) == [3, 4], meta
        y = shm.get_contents_as_numpy(out_handle, np.float32, [3, 4])
        np.testing.assert_allclose(y, expected(x), rtol=1e-5, atol=1e-6)

        # Out of bounds: 16 bytes more than the region holds.
        bad = grpcclient.InferInput("INPUT0", [3, 16], "FP32")
        bad.set_shared_memory("input_data", in_bytes, offset=16)
        try:
            client.infer("dense", [bad], outputs=[out])
            raise AssertionError("an out-of-bounds reference was accepted")
        except InferenceServerException as e:
            assert "INVALID_ARGUMENT" in str(e.status()), e

        # Another connection neither sees nor uses these regions. (gRPC
        # shares one connection between clients of a process unless told not
        # to: regions belong to connections, so ask for a separate one.)
        other = grpcclient.InferenceServerClient(
            url=url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
        )
        assert len(other.get_system_shared_memory_status().regions) == 0
        try:
            other.infer("dense", [inp], outputs=[out])
            raise AssertionError("another connection used this one's region")
        except InferenceServerException as e:
            assert "INVALID_ARGUMENT" in str(e.status()), e

        client.unregister_system_shared_memory("input_data")
        client.unregister_system_shared_memory("output_data")
        assert len(client.get_system_shared_memory_status().regions) == 0
    finally:
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)
    print("tritonclient shared-memory flow: OK")


if __name__ == "__main__":
    main(sys.argv[1])
