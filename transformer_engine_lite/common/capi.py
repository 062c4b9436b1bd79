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
    "nvte_cublas_gemm": [_T, _T, _T, _T, _T, _b, _b, _b, _T, _b, _b, _i, _S],
}
for _act in ("gelu", "qgelu", "relu", "srelu", "silu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu"):
    _SIGNATURES[f"nvte_{_act}"] = [_T, _T, _S]
    _SIGNATURES[f"nvte_d{_act}"] = [_T, _T, _T, _S]
for _sm in ("scaled", "scaled_upper_triang_masked", "scaled_aligned_causal_masked"):
    _SIGNATURES[f"nvte_{_sm}_softmax_forward"] = [_T, _T, _f, _S]
    _SIGNATURES[f"nvte_{_sm}_softmax_backward"] = [_T, _T, _T, _f, _S]
_SIGNATURES["nvte_scaled_masked_softmax_forward"] = [_T, _T, _T, _f, _S]
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
