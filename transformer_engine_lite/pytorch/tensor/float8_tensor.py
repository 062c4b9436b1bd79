"""Float8Tensor (per-tensor scaled FP8) and its quantizers: delayed (given scale and amax buffers)
and current scaling (scale from this tensor's amax). Bytes come from torch.ops.te_lite.quantize,
the same kernel the modules use."""

from __future__ import annotations

from typing import Any

import torch

from ..dynamo.quantizer_opaque import register_value_opaque_quantizer
from ..quantization import ops
from ..tex import DType
from ._quantizer_value import flatten_context, unflatten_kwargs
from .quantized_tensor import (
    QuantizedTensor,
    Quantizer,
    fp8_torch_dtype,
    infer_view_shape,
    to_dtype_enum,
)

__all__ = ["Float8CurrentScalingQuantizer", "Float8Quantizer", "Float8Tensor"]


class Float8Tensor(QuantizedTensor):
    """FP8 data with one fp32 scale_inv: value = fp8(_data) * _scale_inv.

    _data: uint8 bytes of the FP8 values (TE's storage type); _fp8_dtype: DType; _scale_inv: [1]
    fp32; _transpose / _transpose_invalid: TE's cached column-wise copy (made on demand here).
    """

    @staticmethod
    def __new__(
        cls,
        *,
        shape: Any = None,
        dtype: torch.dtype = torch.float32,
        data: torch.Tensor | None,
        fp8_scale_inv: torch.Tensor,
        fp8_dtype: Any,
        data_transpose: torch.Tensor | None = None,
        quantizer: Quantizer | None = None,
        requires_grad: bool = False,
        **_: Any,
    ) -> Float8Tensor:
        if data is None and shape is None:
            raise ValueError("Float8Tensor: shape: expected a shape when data is None, got None")
        shape = tuple(data.shape) if shape is None else tuple(shape)
        device = (data if data is not None else fp8_scale_inv).device
        self = super().__new__(cls, shape, dtype, device=device, requires_grad=requires_grad)
        if data is not None and data.dtype != torch.uint8:
            data = data.view(torch.uint8)
        self._data = data
        self._fp8_dtype = to_dtype_enum(fp8_torch_dtype("Float8Tensor", fp8_dtype))
        self._scale_inv = fp8_scale_inv
        self._transpose = data_transpose
        self._transpose_invalid = data_transpose is None
        self._quantizer = quantizer
        return self

    @property
    def fp8_torch_dtype(self) -> torch.dtype:
        return fp8_torch_dtype("Float8Tensor", self._fp8_dtype)

    def fp8_data(self) -> torch.Tensor:
        """The FP8 values as a torch float8 tensor (a view of _data)."""
        return self._data.view(self.fp8_torch_dtype)

    def _dequantize(self, dtype: torch.dtype | None) -> torch.Tensor:
        if self._data is None:
            raise RuntimeError(
                "Float8Tensor.dequantize: this tensor holds no FP8 data (_data is None)"
            )
        out = ops().dequantize(self.fp8_data().reshape(-1), self._scale_inv, dtype or self.dtype)
        return out.reshape(self.shape)

    # ------------------------------------------------------------------ usages (TE's storage API)
    # TE keeps a transposed copy (_transpose) only where FP8 GEMMs take the TN layout alone; the
    # lite's GEMM takes any layout (utils.is_non_tn_fp8_gemm_supported() is True), so, as TE does
    # there, _data serves both usages and no transpose is kept.
    def get_data_tensors(
        self, rowwise_data: bool = True, columnwise_data: bool = True
    ) -> Any:
        """TE's: (_data, _transpose), or the one asked for."""
        if rowwise_data and columnwise_data:
            return self._data, self._transpose
        if rowwise_data:
            return self._data
        if columnwise_data:
            return self._transpose
        raise ValueError(
            "Float8Tensor.get_data_tensors: expected rowwise_data or columnwise_data, got neither"
        )

    def get_usages(self) -> dict[str, bool]:
        return {"rowwise": self._data is not None, "columnwise": self._data is not None}

    def update_usage(
        self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None
    ) -> None:
        """TE's, where the GEMM takes any layout: _data serves both usages, so it is kept
        whatever is asked (TE drops it only where a transpose can serve column-wise use); asking
        for a usage when _data is gone is an error (FP8 data cannot be regenerated)."""
        if (rowwise_usage or columnwise_usage) and self._data is None:
            raise RuntimeError(
                "Float8Tensor.update_usage: cannot generate FP8 data, it was dropped"
            )
        self._transpose = None
        self._transpose_invalid = True

    # ----------------------------------------------------- ops that keep the quantized form
    def _quantized_op(self, func: Any, args: Any, kwargs: Any) -> Any:
        aten = torch.ops.aten
        if self._data is None or func not in (aten.view.default, aten.split.Tensor):
            return NotImplemented
        if func is aten.view.default:
            shape = infer_view_shape("Float8Tensor.view", args[1], self.numel())
            return self._like(self._data.view(shape))
        # split (chunk): the pieces view this tensor's bytes and share its scale, as torch's do.
        split_size = args[1]
        dim = kwargs.get("dim", args[2] if len(args) > 2 else 0)
        return [self._like(d) for d in self._data.split(split_size, dim)]

    def _like(self, data: torch.Tensor) -> Float8Tensor:
        """This tensor's type, scale and quantizer over other bytes (a view or a piece)."""
        return type(self)(
            shape=data.shape,
            dtype=self.dtype,
            data=data,
            fp8_scale_inv=self._scale_inv,
            fp8_dtype=self._fp8_dtype,
            quantizer=self._quantizer,
        )

    def _assign_from(self, other: QuantizedTensor) -> None:
        assert isinstance(other, Float8Tensor)
        if self._data is None:  # dropped by update_usage: take the new bytes
            self._data = other._data
        else:
            self._data.copy_(other._data)
        self._scale_inv.copy_(other._scale_inv)
        self._transpose_invalid = True

    _INNER = ("_data", "_scale_inv")

    def _inner_names(self) -> list[str]:
        return list(self._INNER)

    def _with_inner(self, inner: dict[str, torch.Tensor | None]) -> Float8Tensor:
        return type(self)(
            shape=self.shape,
            dtype=self.dtype,
            data=inner["_data"],
            fp8_scale_inv=inner["_scale_inv"],
            fp8_dtype=self._fp8_dtype,
            quantizer=self._quantizer,
        )

    # torch.compile: a traceable wrapper subclass (AOTAutograd flattens it into these tensors).
    # The context is TE's dict; it carries the quantizer only when it is a value quantizer
    # (current scaling): a delayed-scaling one holds buffers, and traced code never re-quantizes
    # a parameter with it.
    def __tensor_flatten__(self) -> tuple[list[str], dict[str, Any]]:
        q = self._quantizer
        kwargs = {
            "fp8_dtype": self._fp8_dtype,
            "fake_dtype": self.dtype,
            "quantizer": None if q is None else q._context_quantizer(),
        }
        return ["_data", "_scale_inv"], flatten_context(self, kwargs)

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: dict[str, Any], outer_size: Any, outer_stride: Any
    ) -> Float8Tensor:
        cls, kw, requires_grad = unflatten_kwargs("Float8Tensor", ctx)
        return cls(
            shape=outer_size,
            dtype=kw["fake_dtype"],
            data=inner["_data"],
            fp8_scale_inv=inner["_scale_inv"],
            fp8_dtype=kw["fp8_dtype"],
            quantizer=kw.get("quantizer"),
            requires_grad=requires_grad,
        )

    def __reduce_ex__(self, protocol: int) -> Any:
        # torch.save / torch.load(weights_only=True): plain tensors and values only (the rebuild
        # function is registered as a safe global in tensor/__init__.py).
        q = self._quantizer
        return (
            rebuild_float8_tensor,
            (
                self._data,
                self._scale_inv,
                str(self.fp8_torch_dtype).replace("torch.", ""),
                tuple(self.shape),
                self.dtype,
                None if q is None else q.state(),
            ),
        )

    def _shallow_copy(self) -> Float8Tensor:
        return type(self)(
            shape=self.shape,
            dtype=self.dtype,
            data=self._data,
            fp8_scale_inv=self._scale_inv,
            fp8_dtype=self._fp8_dtype,
            data_transpose=self._transpose,
            quantizer=self._quantizer,
        )


def _wrap(
    src: torch.Tensor,
    data: torch.Tensor,
    scale_inv: torch.Tensor,
    fp8: torch.dtype,
    quantizer: Quantizer,
) -> Float8Tensor:
    """The Float8Tensor of `src` quantized to flat `data` by `quantizer`."""
    return Float8Tensor(
        shape=src.shape,
        dtype=src.dtype,
        data=data.reshape(src.shape),
        fp8_scale_inv=scale_inv,
        fp8_dtype=fp8,
        quantizer=quantizer,
    )


def rebuild_float8_tensor(
    data: torch.Tensor,
    scale_inv: torch.Tensor,
    fp8_dtype: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    quantizer_state: dict[str, Any] | None,
) -> Float8Tensor:
    """Unpickling target of Float8Tensor (see __reduce_ex__)."""
    return Float8Tensor(
        shape=shape,
        dtype=dtype,
        data=data,
        fp8_scale_inv=scale_inv,
        fp8_dtype=getattr(torch, fp8_dtype),
        quantizer=None if quantizer_state is None else quantizer_from_state(quantizer_state),
    )


def quantizer_from_state(state: dict[str, Any]) -> Quantizer:
    """The quantizer that Quantizer.state() described (checkpoint loading)."""
    kind, fp8 = state.get("kind"), getattr(torch, str(state.get("fp8_dtype")), None)
    usage = {"rowwise": state.get("rowwise", True), "columnwise": state.get("columnwise", True)}
    if kind == "delayed":
        return Float8Quantizer(
            state["scale"], state["amax"], fp8, **usage, update_margin=state.get("update_margin")
        )
    if kind == "current":
        return Float8CurrentScalingQuantizer(
            fp8, **usage, force_pow_2_scales=state["pow2"], amax_epsilon=state["eps"]
        )
    if kind == "mxfp8":
        from .mxfp8_tensor import MXFP8Quantizer

        return MXFP8Quantizer(fp8, **usage)
    raise ValueError(
        f"quantizer_from_state: kind: expected 'delayed', 'current' or 'mxfp8', got {kind!r}"
    )


class _PerTensorPrimitives:
    """Data-free allocation of a Float8Tensor (one uint8 copy of the values, whatever the usages:
    the transpose is made on demand; one fp32 scale_inv)."""

    def inner_tensor_specs(
        self, shape: tuple[int, ...]
    ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"_data": (tuple(shape), torch.uint8), "_scale_inv": ((1,), torch.float32)}

    def storage_metadata(self, fake_dtype: torch.dtype) -> dict[str, Any]:
        return {
            "cls": Float8Tensor,
            "nontensor_kwargs": {
                "fp8_dtype": self.dtype,
                "fake_dtype": fake_dtype,
                "quantizer": self._context_quantizer(),
            },
        }


class Float8Quantizer(_PerTensorPrimitives, Quantizer):
    """Delayed scaling: quantize with the given `scale` ([1] or scalar fp32); the amax of each
    quantized tensor is folded into `amax` (running max, as TE's cast kernel does).

    update_margin (TE-lite, used for FP8 weight parameters): each quantization sets `amax` to this
    tensor's amax (a one-entry history), and update_scale() - run by the module's forward under
    delayed scaling, TE's recipe update point, and by FusedAdam after its step - sets `scale` to
    (fp8_max / amax) / 2^update_margin. So, as in TE, a parameter keeps the initial scale 1.0
    until a forward has run (a copy_ of checkpoint values right after quantized_model_init is
    quantized with scale 1.0), and each later re-quantization uses the scale of the values before
    it. None (default): TE's behaviour, the scale is left to its owner."""

    def __init__(
        self,
        scale: torch.Tensor,
        amax: torch.Tensor,
        fp8_dtype: Any,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
        update_margin: float | None = None,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.update_margin = update_margin
        for name, t in (("scale", scale), ("amax", amax)):
            if not isinstance(t, torch.Tensor) or t.numel() != 1 or t.dtype != torch.float32:
                got = (
                    f"{t.dtype} with {t.numel()} elements"
                    if isinstance(t, torch.Tensor)
                    else type(t).__name__
                )
                raise ValueError(
                    f"Float8Quantizer: {name}: expected a 1-element float32 tensor, got {got}"
                )
        self.scale, self.amax = scale, amax
        self.dtype = to_dtype_enum(fp8_torch_dtype("Float8Quantizer", fp8_dtype))

    def state(self) -> dict[str, Any]:
        return {
            **self._usage_state("delayed"),
            "scale": self.scale,
            "amax": self.amax,
            "update_margin": self.update_margin,
        }

    def _quantize(self, tensor: torch.Tensor) -> Float8Tensor:
        fp8 = fp8_torch_dtype("Float8Quantizer", self.dtype)
        data, amax, scale_inv = ops().quantize(
            tensor.contiguous().reshape(-1), self.scale.reshape(1), fp8
        )
        with torch.no_grad():
            if self.update_margin is None:
                self.amax.copy_(torch.maximum(self.amax.reshape(1), amax).reshape(self.amax.shape))
            else:
                self.amax.copy_(amax.reshape(self.amax.shape))
        return _wrap(tensor, data, scale_inv, fp8, self)

    @torch.no_grad()
    def update_scale(self) -> None:
        """scale = (fp8_max / amax) / 2^update_margin (a no-op without update_margin)."""
        if self.update_margin is None:
            return
        fp8 = fp8_torch_dtype("Float8Quantizer", self.dtype)
        scale, _ = ops().compute_scale_from_amax(self.amax.reshape(1), fp8, 0.0, False)
        self.scale.copy_((scale / 2.0**self.update_margin).reshape(self.scale.shape))


class Float8CurrentScalingQuantizer(_PerTensorPrimitives, Quantizer):
    """Current scaling: scale = fp8_max / amax(tensor) (epsilon floor, optional power of two).

    A torch.compile value quantizer: its value is the annotated fields below (plus the usages);
    device and amax_reduction_group are not part of it (a rebuilt one has neither)."""

    dtype: DType
    with_amax_reduction: bool
    force_pow_2_scales: bool
    amax_epsilon: float

    def __init__(
        self,
        fp8_dtype: Any,
        device: Any = None,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
        use_existing_amax: bool = False,
        with_amax_reduction: bool = False,
        amax_reduction_group: Any = None,
        force_pow_2_scales: bool = False,
        amax_epsilon: float = 0.0,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if use_existing_amax:
            raise NotImplementedError(
                "Float8CurrentScalingQuantizer: use_existing_amax=True is not supported by "
                "transformer_engine_lite (the amax is always computed from the tensor)"
            )
        self.dtype = to_dtype_enum(fp8_torch_dtype("Float8CurrentScalingQuantizer", fp8_dtype))
        self.device = torch.device(device) if device is not None else None
        self.with_amax_reduction = bool(with_amax_reduction)
        self.amax_reduction_group = amax_reduction_group
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.amax_epsilon = float(amax_epsilon)

    def copy(self) -> Float8CurrentScalingQuantizer:
        # Through the constructor: torch.compile traces that (TensorSpec copies inside graphs).
        new = Float8CurrentScalingQuantizer(
            self.dtype,
            getattr(self, "device", None),
            rowwise=self.rowwise_usage,
            columnwise=self.columnwise_usage,
            with_amax_reduction=self.with_amax_reduction,
            amax_reduction_group=getattr(self, "amax_reduction_group", None),
            force_pow_2_scales=self.force_pow_2_scales,
            amax_epsilon=self.amax_epsilon,
        )
        new.internal, new.optimize_for_gemm = self.internal, self.optimize_for_gemm
        return new

    def state(self) -> dict[str, Any]:
        return {
            **self._usage_state("current"),
            "pow2": self.force_pow_2_scales,
            "eps": self.amax_epsilon,
        }

    def _quantize(self, tensor: torch.Tensor) -> Float8Tensor:
        te = ops()
        fp8 = fp8_torch_dtype("Float8CurrentScalingQuantizer", self.dtype)
        x = tensor.contiguous().reshape(-1)
        amax = te.compute_amax(x)
        if (
            self.with_amax_reduction
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        ):
            torch.distributed.all_reduce(
                amax,
                op=torch.distributed.ReduceOp.MAX,
                group=getattr(self, "amax_reduction_group", None),
            )
        scale, _ = te.compute_scale_from_amax(amax, fp8, self.amax_epsilon, self.force_pow_2_scales)
        data, _, scale_inv = te.quantize(x, scale, fp8)
        return _wrap(tensor, data, scale_inv, fp8, self)

    def _rebuild_derived_state(self) -> None:
        # Rebuilt from a value key (__fx_repr__): the attributes outside the value.
        self.device = None


register_value_opaque_quantizer(Float8CurrentScalingQuantizer)
