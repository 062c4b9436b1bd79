"""TE's DType enum as its front ends expose it (`transformer_engine_torch.DType`,
`transformer_engine_jax.DType`): the names and values of TE's C enum, which tests and user code
compare against. One definition for both front ends here. It is not this library's C API enum
(common/capi.py's DType), whose value 10 is E4M3 FNUZ where TE's is E2M1."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["DType"]


class DType(IntEnum):
    kByte = 0
    kInt16 = 1
    kInt32 = 2
    kInt64 = 3
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat8E8M0 = 9
    # NVFP4's element type: torch stores it as uint8 (two E2M1 per byte, TE's storage), JAX as
    # jnp.float4_e2m1fn (TE-JAX's).
    kFloat4E2M1 = 10
