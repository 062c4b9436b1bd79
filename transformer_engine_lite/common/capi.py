"""ctypes binding of the C API, for scripts, benchmarks and tests that run without a framework
extension. Arrays are torch tensors or NumPy arrays (ml_dtypes for bf16/FP8), used in place.

    from transformer_engine_lite.common import capi
    out = capi.Tensor(q, scale=scale, amax=amax, scale_inv=scale_inv)
    capi.call("nvte_quantize", capi.Tensor(x), out, None)

Failures raise NVTEError subclasses carrying the library's message (op, argument, expected, got).
"""

from __future__ import annotations

import ctypes
from enum import IntEnum
from typing import Any

from . import get_lib


class DType(IntEnum):
    Byte = 0
    Int16 = 1
    Int32 = 2
    Int64 = 3
    Float32 = 4
    Float16 = 5
    BFloat16 = 6
    Float8E4M3 = 7
    Float8E5M2 = 8
    Float8E8M0 = 9
    Float8E4M3FNUZ = 10
    Float8E5M2FNUZ = 11


class ScalingMode(IntEnum):
    DELAYED_TENSOR_SCALING = 0
    MXFP8_1D_SCALING = 1


class TensorParam(IntEnum):
    RowwiseData = 0
    ColumnwiseData = 1
    Scale = 2
    Amax = 3
    RowwiseScaleInv = 4
    ColumnwiseScaleInv = 5


class Status(IntEnum):
    SUCCESS = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    INTERNAL = 3


class NVTEError(RuntimeError):
    """A failed nvte_* call; `status` is the library's NVTEStatus."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = Status(status)


class NVTEInvalidArgument(NVTEError, ValueError):
    pass


class NVTEUnsupported(NVTEError, NotImplementedError):
    pass


MAX_NDIM = 8


class NVTEShape(ctypes.Structure):
    _fields_ = [("data", ctypes.c_size_t * MAX_NDIM), ("ndim", ctypes.c_size_t)]


class NVTEBasicTensor(ctypes.Structure):
    _fields_ = [("data_ptr", ctypes.c_void_p), ("dtype", ctypes.c_int), ("shape", NVTEShape)]


_T = ctypes.c_void_p  # NVTETensor
_S = ctypes.c_void_p  # NVTEStream
_f, _b, _i = ctypes.c_float, ctypes.c_bool, ctypes.c_int

# Argument types of every op (all return NVTEStatus).
_SIGNATURES: dict[str, list[Any]] = {
    "nvte_quantize": [_T, _T, _S],
    "nvte_dequantize": [_T, _T, _S],
    "nvte_compute_amax": [_T, _T, _S],
    "nvte_compute_scale_from_amax": [_T, ctypes.c_void_p, _S],
    "nvte_transpose": [_T, _T, _S],
    "nvte_cast_transpose": [_T, _T, _S],
    "nvte_delayed_scaling_recipe_amax_and_scale_update": [
        _T, _T, _T, _T, ctypes.c_char_p, _i, _f, _S],
    "nvte_layernorm_fwd": [_T, _T, _T, _f, _T, _T, _T, _T, _i, _b, _S],
    "nvte_layernorm_bwd": [_T, _T, _T, _T, _T, _T, _T, _T, _T, _i, _b, _S],
    "nvte_rmsnorm_fwd": [_T, _T, _f, _T, _T, _T, _i, _b, _S],
    "nvte_rmsnorm_bwd": [_T, _T, _T, _T, _T, _T, _T, _i, _b, _S],
    "nvte_rmsnorm_bwd_add": [_T, _T, _T, _T, _T, _T, _T, _T, _i, _b, _S],
    "nvte_cublas_gemm": [_T, _T, _T, _T, _T, _b, _b, _b, _T, _b, _b, _i, _S],
    "nvte_cublas_gemm_scaled": [_T, _T, _T, _T, _T, _b, _b, _b, _T, _f, _f, _b, _i, _S],
    "nvte_nvfp4_block_gemm": [_T, _T, _T, _S],
    "nvte_ordered_batched_gemm": [_T, _T, _T, _b, _b, _S],
}
for _act in ("gelu", "qgelu", "relu", "srelu", "silu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu",
             "glu"):
    _SIGNATURES[f"nvte_{_act}"] = [_T, _T, _S]
    _SIGNATURES[f"nvte_d{_act}"] = [_T, _T, _T, _S]
_SIGNATURES["nvte_clamped_swiglu"] = [_T, _T, _f, _f, _S]
_SIGNATURES["nvte_clamped_dswiglu"] = [_T, _T, _T, _f, _f, _S]
_SIGNATURES["nvte_clamped_swiglu_v2"] = [_T, _T, _f, _f, _f, _S]
_SIGNATURES["nvte_clamped_dswiglu_v2"] = [_T, _T, _T, _f, _f, _f, _S]
for _sm in ("scaled", "scaled_upper_triang_masked", "scaled_aligned_causal_masked"):
    _SIGNATURES[f"nvte_{_sm}_softmax_forward"] = [_T, _T, _f, _S]
    _SIGNATURES[f"nvte_{_sm}_softmax_backward"] = [_T, _T, _T, _f, _S]
_SIGNATURES["nvte_scaled_masked_softmax_forward"] = [_T, _T, _T, _f, _S]
# Fused attention (fused_attn.h): sizes, 64-bit windows, enums as int.
_z, _l = ctypes.c_size_t, ctypes.c_int64
_SIGNATURES["nvte_fused_attn_fwd"] = [
    _T, _T, _T, _T, _T, _T, _T, _T, _T, _z, _z, _b, _f, _f, _i, _i, _i, _l, _l, _T, _S]
_SIGNATURES["nvte_fused_attn_bwd"] = [
    _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _z, _z, _f, _f, _i, _i, _i, _l, _l,
    _b, _T, _S]
# *_softmax: TE's SoftmaxOffset / dSoftmaxOffset tensors and softmax_type (attention sinks).
_SIGNATURES["nvte_fused_attn_fwd_softmax"] = [
    _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _z, _z, _b, _f, _f, _i, _i, _i, _i, _l, _l, _T, _S]
_SIGNATURES["nvte_fused_attn_bwd_softmax"] = [
    _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _z, _z, _f, _f, _i, _i, _i,
    _i, _l, _l, _b, _T, _S]
_SIGNATURES["nvte_fused_attn_fwd_qkvpacked"] = [
    _T, _T, _T, _T, _T, _T, _z, _b, _f, _f, _i, _i, _i, _l, _l, _T, _S]
_SIGNATURES["nvte_fused_attn_bwd_qkvpacked"] = [
    _T, _T, _T, _T, _T, _T, _T, _T, _T, _z, _f, _f, _i, _i, _i, _l, _l, _b, _T, _S]
_SIGNATURES["nvte_fused_attn_fwd_kvpacked"] = [
    _T, _T, _T, _T, _T, _T, _T, _T, _z, _z, _b, _f, _f, _i, _i, _i, _l, _l, _T, _S]
_SIGNATURES["nvte_fused_attn_bwd_kvpacked"] = [
    _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _z, _z, _f, _f, _i, _i, _i, _l, _l, _b, _T, _S]
_SIGNATURES["nvte_fused_attn_dropout_mask"] = [_T, _f, _T, _S]
_SIGNATURES["nvte_scaled_masked_softmax_backward"] = [_T, _T, _T, _f, _S]


def _lib() -> ctypes.CDLL:
    lib = get_lib()
    if not getattr(lib, "_capi_ready", False):
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes = argtypes
                fn.restype = ctypes.c_int
        lib.nvte_create_tensor.restype = ctypes.c_void_p
        lib.nvte_create_tensor.argtypes = [ctypes.c_int]
        lib.nvte_destroy_tensor.argtypes = [ctypes.c_void_p]
        lib.nvte_set_tensor_param.argtypes = [
            ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.POINTER(NVTEBasicTensor)]
        lib.nvte_set_tensor_param.restype = ctypes.c_int
        lib.nvte_get_tensor_param.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.nvte_get_tensor_param.restype = NVTEBasicTensor
        lib.nvte_set_tensor_device.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.nvte_get_last_error.restype = ctypes.c_char_p
        lib.nvte_create_quantization_config.restype = ctypes.c_void_p
        lib.nvte_destroy_quantization_config.argtypes = [ctypes.c_void_p]
        lib.nvte_set_quantization_config_attribute.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        lib._capi_ready = True
    return lib


def check(status: int) -> None:
    """Raises the NVTEError matching a non-zero status, with the library's message."""
    if status == Status.SUCCESS:
        return
    msg = _lib().nvte_get_last_error().decode()
    cls = {Status.INVALID_ARGUMENT: NVTEInvalidArgument, Status.UNSUPPORTED: NVTEUnsupported}.get(
        Status(status), NVTEError)
    raise cls(status, msg)


def call(name: str, *args: Any) -> None:
    """Calls nvte_<op> with Tensor/QuantizationConfig/None/scalar arguments; raises on failure."""
    fn = getattr(_lib(), name)
    conv = [a.handle if isinstance(a, (Tensor, QuantizationConfig)) else a for a in args]
    check(fn(*conv))


# ---------------------------------------------------------------- arrays -> NVTEBasicTensor
def _torch_dtypes() -> dict:
    try:
        import torch
    except ImportError:
        return {}
    table = {
        torch.float32: DType.Float32, torch.float16: DType.Float16, torch.bfloat16: DType.BFloat16,
        torch.uint8: DType.Byte, torch.int16: DType.Int16, torch.int32: DType.Int32,
        torch.int64: DType.Int64, torch.bool: DType.Byte,
    }
    for name, dt in (("float8_e4m3fn", DType.Float8E4M3), ("float8_e5m2", DType.Float8E5M2),
                     ("float8_e4m3fnuz", DType.Float8E4M3FNUZ),
                     ("float8_e5m2fnuz", DType.Float8E5M2FNUZ), ("float8_e8m0fnu", DType.Float8E8M0)):
        if hasattr(torch, name):
            table[getattr(torch, name)] = dt
    return table


def _numpy_dtype(arr) -> DType:
    name = str(arr.dtype)
    table = {"float32": DType.Float32, "float16": DType.Float16, "bfloat16": DType.BFloat16,
             "uint8": DType.Byte, "int16": DType.Int16, "int32": DType.Int32, "int64": DType.Int64,
             "bool": DType.Byte, "float8_e4m3fn": DType.Float8E4M3, "float8_e5m2": DType.Float8E5M2,
             "float8_e4m3fnuz": DType.Float8E4M3FNUZ, "float8_e5m2fnuz": DType.Float8E5M2FNUZ,
             "float8_e8m0fnu": DType.Float8E8M0}
    if name not in table:
        raise TypeError(f"array dtype: expected one of {sorted(table)}, got {name}")
    return table[name]


_EMPTY_TENSOR_STORAGE = (ctypes.c_ubyte * 64)()


def describe(arr, dtype: DType | None = None) -> tuple[NVTEBasicTensor, bool]:
    """(NVTEBasicTensor, on_gpu) for a contiguous torch tensor or NumPy array. `dtype` overrides the
    element type (e.g. a uint8 buffer holding FP8 bytes)."""
    bt = NVTEBasicTensor()
    on_gpu = False
    if hasattr(arr, "data_ptr"):  # torch.Tensor
        if not arr.is_contiguous():
            raise ValueError(f"tensor: expected a contiguous tensor, got strides {arr.stride()}")
        ptr, shape = arr.data_ptr(), tuple(arr.shape)
        on_gpu = arr.device.type != "cpu"
        inferred = _torch_dtypes().get(arr.dtype)
        if inferred is None and dtype is None:
            raise TypeError(f"tensor dtype: unsupported {arr.dtype}")
    else:  # NumPy
        if not arr.flags["C_CONTIGUOUS"]:
            raise ValueError("array: expected a C-contiguous array")
        ptr, shape = arr.ctypes.data, tuple(arr.shape)
        inferred = _numpy_dtype(arr) if dtype is None else None
    if len(shape) > MAX_NDIM:
        raise ValueError(f"tensor: expected at most {MAX_NDIM} dims, got {len(shape)}")
    if not ptr and 0 in shape:
        # An empty tensor is present but has no storage; the core reads a null pointer as "absent",
        # so it gets an address that is never dereferenced.
        ptr = ctypes.addressof(_EMPTY_TENSOR_STORAGE)
    bt.data_ptr = ptr or None
    bt.dtype = int(dtype if dtype is not None else inferred)
    bt.shape.ndim = len(shape)
    for i, d in enumerate(shape):
        bt.shape.data[i] = d
    return bt, on_gpu


class Tensor:
    """An NVTETensor handle over caller-owned arrays (kept alive by this object)."""

    def __init__(self, data=None, dtype: DType | None = None, *, columnwise=None, scale=None,
                 amax=None, scale_inv=None, columnwise_scale_inv=None,
                 scaling_mode: ScalingMode = ScalingMode.DELAYED_TENSOR_SCALING) -> None:
        lib = _lib()
        self._lib = lib
        self.handle = ctypes.c_void_p(lib.nvte_create_tensor(int(scaling_mode)))
        if not self.handle:
            raise MemoryError("nvte_create_tensor failed")
        self._keep = []
        on_gpu = False
        for param, arr, dt in ((TensorParam.RowwiseData, data, dtype),
                               (TensorParam.ColumnwiseData, columnwise, dtype),
                               (TensorParam.Scale, scale, None), (TensorParam.Amax, amax, None),
                               (TensorParam.RowwiseScaleInv, scale_inv, None),
                               (TensorParam.ColumnwiseScaleInv, columnwise_scale_inv, None)):
            if arr is None:
                continue
            if param in (TensorParam.RowwiseScaleInv, TensorParam.ColumnwiseScaleInv) and \
                    scaling_mode == ScalingMode.MXFP8_1D_SCALING:
                dt = DType.Float8E8M0
            bt, gpu = describe(arr, dt)
            on_gpu |= gpu
            self._keep.append(arr)
            check(lib.nvte_set_tensor_param(ctypes.byref(self.handle), int(param), ctypes.byref(bt)))
        if on_gpu:
            check(lib.nvte_set_tensor_device(self.handle, 1))

    def shape(self) -> tuple[int, ...]:
        bt = self._lib.nvte_get_tensor_param(self.handle, int(TensorParam.RowwiseData))
        return tuple(bt.shape.data[i] for i in range(bt.shape.ndim))

    def param(self, which: TensorParam) -> NVTEBasicTensor:
        return self._lib.nvte_get_tensor_param(self.handle, int(which))

    def __del__(self) -> None:
        if getattr(self, "handle", None):
            self._lib.nvte_destroy_tensor(self.handle)
            self.handle = None


# ---------------------------------------------------------------- attention backend selection
class NVTEFusedAttnConfig(ctypes.Structure):
    """fused_attn.h's NVTEFusedAttnConfig (enums as int)."""

    _fields_ = [("device", ctypes.c_int), ("q_dtype", ctypes.c_int), ("kv_dtype", ctypes.c_int),
                ("qkv_layout", ctypes.c_int), ("bias_type", ctypes.c_int),
                ("attn_mask_type", ctypes.c_int), ("dropout", ctypes.c_float),
                ("num_attn_heads", ctypes.c_size_t), ("num_gqa_groups", ctypes.c_size_t),
                ("max_seqlen_q", ctypes.c_size_t), ("max_seqlen_kv", ctypes.c_size_t),
                ("head_dim_qk", ctypes.c_size_t), ("head_dim_v", ctypes.c_size_t),
                ("window_size_left", ctypes.c_int64), ("window_size_right", ctypes.c_int64)]


class NVTEFusedAttnPlatform(ctypes.Structure):
    """fused_attn.h's NVTEFusedAttnPlatform: the build / GPU a selection assumes."""

    _fields_ = [("is_rocm", ctypes.c_bool), ("has_ck", ctypes.c_bool),
                ("has_aotriton", ctypes.c_bool), ("has_flash", ctypes.c_bool),
                ("gpu_arch", ctypes.c_char_p), ("aotriton_archs", ctypes.c_char_p)]


NUM_FUSED_ATTN_BACKENDS = 4  # NVTE_NUM_FUSED_ATTN_BACKENDS; the enum values index reasons


def _attn_enum_names(fn_name: str, count: int) -> tuple[str, ...]:
    fn = getattr(_lib(), fn_name)
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_char_p
    return tuple(fn(i).decode() for i in range(count))


def qkv_layout_names() -> tuple[str, ...]:
    """Layout names indexed by NVTE_QKV_Layout value ("sb3hd", ..., "thd_thd_thd")."""
    return _attn_enum_names("nvte_qkv_layout_name", 15)


def mask_type_names() -> tuple[str, ...]:
    """Mask names indexed by NVTE_Mask_Type value ("no_mask", ..., "padding_causal_bottom_right")."""
    return _attn_enum_names("nvte_mask_type_name", 6)


def bias_type_names() -> tuple[str, ...]:
    """Bias names indexed by NVTE_Bias_Type value ("no_bias", ..., "alibi")."""
    return _attn_enum_names("nvte_bias_type_name", 4)


def fused_attn_backend_names() -> tuple[str, ...]:
    """Backend names indexed by NVTE_Fused_Attn_Backend value 0.. ("aotriton", "ck", ...)."""
    return _attn_enum_names("nvte_fused_attn_backend_name", NUM_FUSED_ATTN_BACKENDS)


def fused_attn_backend_reasons(config: NVTEFusedAttnConfig,
                               platform: NVTEFusedAttnPlatform | None = None
                               ) -> tuple[int, tuple[str, ...]]:
    """nvte_fused_attn_backend_reasons: (selected backend value, -1 if none; per-backend reasons
    indexed by value, "" = eligible)."""
    fn = _lib().nvte_fused_attn_backend_reasons
    fn.argtypes = [ctypes.POINTER(NVTEFusedAttnConfig), ctypes.POINTER(NVTEFusedAttnPlatform),
                   ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_char_p)]
    fn.restype = ctypes.c_int
    selected = ctypes.c_int(-1)
    reasons = (ctypes.c_char_p * NUM_FUSED_ATTN_BACKENDS)()
    check(fn(ctypes.byref(config), ctypes.byref(platform) if platform is not None else None,
             ctypes.byref(selected), reasons))
    return selected.value, tuple((r or b"").decode() for r in reasons)


def get_fused_attn_backend(config: NVTEFusedAttnConfig) -> int:
    """nvte_get_fused_attn_backend for this build on config.device: the selected backend value.
    Raises NVTEInvalidArgument for a malformed config and NVTEUnsupported (its message lists every
    backend and why) when nothing is eligible."""
    lib = _lib()
    fn = lib.nvte_get_fused_attn_backend
    fn.argtypes = [_i, _i, _i, _i, _i, _f] + [ctypes.c_size_t] * 6 + [ctypes.c_int64] * 2 + [_i]
    fn.restype = ctypes.c_int
    c = config
    backend = fn(c.q_dtype, c.kv_dtype, c.qkv_layout, c.bias_type, c.attn_mask_type, c.dropout,
                 c.num_attn_heads, c.num_gqa_groups, c.max_seqlen_q, c.max_seqlen_kv,
                 c.head_dim_qk, c.head_dim_v, c.window_size_left, c.window_size_right, c.device)
    if backend < 0:
        check(lib.nvte_get_last_status())
    return backend


class QuantizationConfig:
    """NVTEQuantizationConfig: current-scaling options."""

    def __init__(self, force_pow_2_scales: bool = False, amax_epsilon: float = 0.0) -> None:
        lib = _lib()
        self._lib = lib
        self.handle = ctypes.c_void_p(lib.nvte_create_quantization_config())
        flag = ctypes.c_bool(force_pow_2_scales)
        eps = ctypes.c_float(amax_epsilon)
        check(lib.nvte_set_quantization_config_attribute(
            self.handle, 0, ctypes.byref(flag), ctypes.sizeof(flag)))
        check(lib.nvte_set_quantization_config_attribute(
            self.handle, 1, ctypes.byref(eps), ctypes.sizeof(eps)))

    def __del__(self) -> None:
        if getattr(self, "handle", None):
            self._lib.nvte_destroy_quantization_config(self.handle)
            self.handle = None
