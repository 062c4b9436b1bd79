"""dtype tables and argument checks shared by the primitives (errors name op, argument, expected, got)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...common.te_dtype import DType as _TEDType

FP8_DTYPES = (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float8_e4m3fnuz, jnp.float8_e5m2fnuz)
HIGH_PRECISION = (jnp.float32, jnp.float16, jnp.bfloat16)
# recipe.Format names -> jnp dtypes
FORMAT_DTYPES = {
    "e4m3": jnp.float8_e4m3fn,
    "e5m2": jnp.float8_e5m2,
    "e4m3fnuz": jnp.float8_e4m3fnuz,
    "e5m2fnuz": jnp.float8_e5m2fnuz,
}
F32_0 = (0,)


def dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def is_fp8(dtype) -> bool:
    return any(np.dtype(dtype) == np.dtype(d) for d in FP8_DTYPES)


def fp8_max(dtype) -> float:
    return float(jnp.finfo(dtype).max)


def check_dtype(op: str, arg: str, dtype, allowed: Sequence) -> None:
    if not any(np.dtype(dtype) == np.dtype(a) for a in allowed):
        names = ", ".join(dtype_name(a) for a in allowed)
        raise TypeError(
            f"te_lite::{op}: argument '{arg}': expected dtype in {{{names}}}, got {dtype_name(dtype)}"
        )


def check_shape(op: str, arg: str, shape, expected, what: str = "") -> None:
    if tuple(shape) != tuple(expected):
        raise ValueError(
            f"te_lite::{op}: argument '{arg}': expected shape {tuple(expected)}{what}, "
            f"got {tuple(shape)}"
        )


def check_min_ndim(op: str, arg: str, shape, ndim: int) -> None:
    if len(shape) < ndim:
        raise ValueError(
            f"te_lite::{op}: argument '{arg}': expected at least {ndim} dims, got shape "
            f"{tuple(shape)}"
        )


def check_scalar_f32(op: str, arg: str, x) -> None:
    if np.dtype(x.dtype) != np.dtype(jnp.float32) or int(np.prod(x.shape)) != 1:
        raise ValueError(
            f"te_lite::{op}: argument '{arg}': expected a float32 array with one element, got "
            f"{dtype_name(x.dtype)} of shape {tuple(x.shape)}"
        )


def fp8_dtype_of(op: str, arg: str, dtype):
    """Canonical jnp FP8 dtype; accepts jnp dtypes or their names."""
    if isinstance(dtype, str):
        if dtype in FORMAT_DTYPES:
            return FORMAT_DTYPES[dtype]
        dtype = getattr(jnp, dtype, dtype)
    try:
        d = np.dtype(dtype)
    except TypeError:
        d = None
    for f in FP8_DTYPES:
        if d == np.dtype(f):
            return f
    names = ", ".join(dtype_name(f) for f in FP8_DTYPES)
    raise TypeError(f"te_lite::{op}: argument '{arg}': expected an FP8 dtype in {{{names}}}, got {dtype!r}")


def as_scalar(x):
    """A one-element array as shape [1] (other sizes pass through for the checks to name)."""
    return x.reshape(1) if int(np.prod(x.shape)) == 1 else x


DType = _TEDType  # TE-JAX's transformer_engine_jax.DType (common/te_dtype.py)


_TE_TO_JAX = {
    DType.kByte: jnp.uint8, DType.kInt16: jnp.int16, DType.kInt32: jnp.int32,
    DType.kInt64: jnp.int64, DType.kFloat32: jnp.float32, DType.kFloat16: jnp.float16,
    DType.kBFloat16: jnp.bfloat16, DType.kFloat8E4M3: jnp.float8_e4m3fn,
    DType.kFloat8E5M2: jnp.float8_e5m2, DType.kFloat8E8M0: jnp.float8_e8m0fnu,
    DType.kFloat4E2M1: jnp.float4_e2m1fn,
}


def te_dtype_to_jax_dtype(te_dtype) -> Any:
    """TE-JAX's helper: DType -> the jnp dtype."""
    if not isinstance(te_dtype, DType):
        raise TypeError(f"te_dtype_to_jax_dtype: argument 'te_dtype': expected a DType, got "
                        f"{te_dtype!r}")
    if te_dtype not in _TE_TO_JAX:
        raise NotImplementedError(f"te_dtype_to_jax_dtype: {te_dtype.name} has no JAX dtype in "
                                  "transformer_engine_lite")
    return _TE_TO_JAX[te_dtype]


def jax_dtype_to_te_dtype(jax_dtype) -> DType:
    """TE-JAX's helper: a jnp dtype -> DType (ValueError for one TE has no DType for)."""
    d = np.dtype(jax_dtype)
    for te, jd in _TE_TO_JAX.items():
        if d == np.dtype(jd):
            return te
    raise ValueError(f"jax_dtype_to_te_dtype: argument 'jax_dtype': expected one of "
                     f"{[dtype_name(v) for v in _TE_TO_JAX.values()]}, got {dtype_name(d)}")


def get_cudnn_version() -> tuple[int, int, int]:
    """TE-JAX's cuDNN version query. transformer_engine_lite links no cuDNN (its norms and
    attention are its own kernels), so this is (0, 0, 0): "no cuDNN". TE's tests read a version
    below 9.10 as "the MXFP8 norm is not fused with its cast" — true here too: the norm's float32
    output is quantized by a separate MXFP8 kernel."""
    return (0, 0, 0)


def get_device_compute_capability(gpu_id: int = 0) -> int:
    """TE-JAX's compute-capability query, as TE's int (major * 10 + minor: 90 for sm_90) of local
    device `gpu_id`. A device without one (the CPU backend this library runs on, or a ROCm GPU,
    whose JAX devices carry no CUDA compute capability) answers 0, so TE's "sm_90 or newer" gates
    read as "not a Hopper", which is what such a device is."""
    devices = jax.local_devices()
    if isinstance(gpu_id, bool) or not isinstance(gpu_id, (int, np.integer)) or not (
            0 <= int(gpu_id) < len(devices)):
        raise ValueError(f"get_device_compute_capability: argument 'gpu_id': expected an int in "
                         f"[0, {len(devices)}), got {gpu_id!r}")
    cc = getattr(devices[int(gpu_id)], "compute_capability", None)  # "9.0" on CUDA devices
    if not isinstance(cc, str) or "." not in cc:
        return 0
    major, minor = cc.split(".", 1)
    return int(major) * 10 + int(minor)


def get_min_device_compute_capability() -> int:
    """TE-JAX's helper: the smallest get_device_compute_capability over the local devices."""
    return min(get_device_compute_capability(i) for i in range(len(jax.local_devices())))


def get_all_device_compute_capability() -> tuple[int, ...]:
    """TE-JAX's helper: get_device_compute_capability of every local device, in order."""
    return tuple(get_device_compute_capability(i) for i in range(len(jax.local_devices())))
