"""TE's HybridQuantizer and HybridQuantizedTensor: one format for the rowwise representation and
another for the columnwise one (e.g. MXFP8 rows for the forward GEMM, NVFP4 columns for the
backward GEMMs), for CustomRecipe factories (custom_recipes/quantizer_factory_zoo.py).

HybridQuantizer(rowwise_quantizer=, columnwise_quantizer=, columnwise_source=) pins each
sub-quantizer to its direction (set_usage; it takes ownership of them, so they must be distinct
objects) and quantizes with each the direction the parent's usage asks for. columnwise_source
"rowwise_dequantized" quantizes the columnwise copy from the rowwise result's values instead of
the input (forward / backward operands then represent the same numbers). The bytes of each
sub-storage are exactly those the sub-quantizer alone makes. A GEMM reads the sub-storage of the
direction it contracts (cpp_extensions/gemm.py), so its two operands must share a format there.
"""

from __future__ import annotations

from typing import Any

import torch

from .quantized_tensor import QuantizedTensor, Quantizer, check_hp_input, noop_skips
from .storage.hybrid_tensor_storage import HybridQuantizedTensorStorage, sub_dequantize

__all__ = ["HybridQuantizedTensor", "HybridQuantizer"]

aten = torch.ops.aten
_SOURCES = ("original", "rowwise_dequantized")


class HybridQuantizer(Quantizer):
    """Quantizer composing a rowwise and a columnwise quantizer (see the module docstring)."""

    rowwise_quantizer: Quantizer
    columnwise_quantizer: Quantizer
    columnwise_source: str

    def __init__(self, *, rowwise_quantizer: Quantizer, columnwise_quantizer: Quantizer,
                 columnwise_source: str = "original") -> None:
        super().__init__(rowwise=True, columnwise=True)
        from ..quantization import DelayedScalingRequest

        for role, q in (("rowwise", rowwise_quantizer), ("columnwise", columnwise_quantizer)):
            if isinstance(q, DelayedScalingRequest):
                # TE: delayed scaling inside a hybrid is future work there too
                raise TypeError(f"HybridQuantizer does not support nested QuantizerRequest "
                                f"objects yet; got {type(q).__name__} for the {role} direction. "
                                "Pass a concrete Quantizer instance instead.")
            if not isinstance(q, Quantizer):
                raise TypeError(f"HybridQuantizer requires concrete Quantizer instances for both "
                                f"directions, but the {role} argument is {type(q).__name__}.")
        if rowwise_quantizer is columnwise_quantizer:
            raise ValueError("HybridQuantizer requires distinct rowwise and columnwise quantizer "
                             "instances (each is pinned to its direction); construct two")
        if columnwise_source not in _SOURCES:
            raise ValueError(f"HybridQuantizer columnwise_source must be one of {_SOURCES}, got "
                             f"{columnwise_source!r}.")
        self.rowwise_quantizer = rowwise_quantizer
        self.columnwise_quantizer = columnwise_quantizer
        self.columnwise_source = columnwise_source
        rowwise_quantizer.set_usage(rowwise=True, columnwise=False)
        columnwise_quantizer.set_usage(rowwise=False, columnwise=True)

    def __repr__(self) -> str:
        return (f"HybridQuantizer(rowwise_usage={self.rowwise_usage}, "
                f"columnwise_usage={self.columnwise_usage}, "
                f"columnwise_source={self.columnwise_source!r}, internal={self.internal}, )")

    def copy(self) -> HybridQuantizer:
        """A copy with copies of both sub-quantizers (usage changes stay local), as TE's."""
        new = HybridQuantizer(rowwise_quantizer=self.rowwise_quantizer.copy(),
                              columnwise_quantizer=self.columnwise_quantizer.copy(),
                              columnwise_source=self.columnwise_source)
        new.set_usage(rowwise=self.rowwise_usage, columnwise=self.columnwise_usage)
        new.internal = self.internal
        new.optimize_for_gemm = self.optimize_for_gemm
        return new

    def state(self) -> dict[str, Any]:
        return {"kind": "hybrid", "rowwise": self.rowwise_usage,
                "columnwise": self.columnwise_usage, "columnwise_source": self.columnwise_source,
                "rowwise_quantizer": self.rowwise_quantizer.state(),
                "columnwise_quantizer": self.columnwise_quantizer.state()}

    # Module / FSDP2 code sets these on the parent; the sub-quantizer that runs reads them.
    @property
    def with_amax_reduction(self) -> bool:
        return any(getattr(q, "with_amax_reduction", False)
                   for q in (self.rowwise_quantizer, self.columnwise_quantizer))

    @with_amax_reduction.setter
    def with_amax_reduction(self, value: bool) -> None:
        for q in (self.rowwise_quantizer, self.columnwise_quantizer):
            if hasattr(q, "with_amax_reduction"):
                q.with_amax_reduction = value

    @property
    def amax_reduction_group(self) -> Any:
        got = None
        for q in (self.rowwise_quantizer, self.columnwise_quantizer):
            g = getattr(q, "amax_reduction_group", None)
            if g is not None and got is not None and g is not got:
                raise RuntimeError("HybridQuantizer sub-quantizers have inconsistent "
                                   "amax_reduction_group values.")
            got = g if g is not None else got
        return got

    @amax_reduction_group.setter
    def amax_reduction_group(self, value: Any) -> None:
        for q in (self.rowwise_quantizer, self.columnwise_quantizer):
            if hasattr(q, "amax_reduction_group"):
                q.amax_reduction_group = value

    def is_requantization_safe(self) -> bool:
        """Whether quantizing the same values again reproduces every requested representation."""
        safe = lambda q: getattr(q, "is_requantization_safe", lambda: True)()  # noqa: E731
        if self.rowwise_usage and not safe(self.rowwise_quantizer):
            return False
        if self.columnwise_usage and not safe(self.columnwise_quantizer):
            return False
        return not (self.columnwise_usage and self.columnwise_source == "rowwise_dequantized"
                    and not safe(self.rowwise_quantizer))

    def _get_compatible_recipe(self) -> Any:
        from ...common.recipe import CustomRecipe  # hybrids come only from CustomRecipe factories

        return CustomRecipe

    # ------------------------------------------------------------------------------ quantize
    @staticmethod
    def _sub_quantize(q: Quantizer, tensor: torch.Tensor) -> Any:
        out = q._quantize(tensor)
        # IdentityQuantizer hands the input back: keep it out of the autograd graph, as any
        # quantized copy is.
        return out.detach() if out is tensor else out

    def _columnwise_src(self, tensor: torch.Tensor, row: Any) -> torch.Tensor:
        if self.columnwise_source == "original":
            return tensor
        if row is None:
            row = self._sub_quantize(self.rowwise_quantizer, tensor)
        return sub_dequantize(row, tensor.dtype)

    def _quantize(self, tensor: torch.Tensor) -> Any:
        row = self._sub_quantize(self.rowwise_quantizer, tensor) if self.rowwise_usage else None
        col = None
        if self.columnwise_usage:
            col = self._sub_quantize(self.columnwise_quantizer, self._columnwise_src(tensor, row))
        if self.internal:
            return HybridQuantizedTensorStorage(rowwise_storage=row, columnwise_storage=col,
                                                quantizer=self, fake_dtype=tensor.dtype)
        return HybridQuantizedTensor(shape=tensor.shape, dtype=tensor.dtype, device=tensor.device,
                                     rowwise_storage=row, columnwise_storage=col, quantizer=self)

    def update_quantized(self, src: torch.Tensor, dst: Any, *,
                         noop_flag: torch.Tensor | None = None) -> Any:
        """Quantize src into dst's sub-storages in place: each direction the parent's usage asks
        for and dst holds."""
        owner = "HybridQuantizer.update_quantized"
        if not isinstance(dst, HybridQuantizedTensorStorage):
            raise ValueError(f"HybridQuantizer can only update HybridQuantizedTensorStorage, got "
                             f"{type(dst).__name__}")
        if noop_flag is not None and noop_skips(owner, noop_flag):
            return dst
        check_hp_input(owner, src)
        if tuple(src.shape) != tuple(dst.size()):
            raise ValueError(f"{owner}: src: expected shape {tuple(dst.size())}, got "
                             f"{tuple(src.shape)}")
        row = None
        if self.rowwise_usage and dst._rowwise_storage is not None:
            dst._rowwise_storage = _update_sub(self.rowwise_quantizer, src, dst._rowwise_storage)
            row = dst._rowwise_storage
        if self.columnwise_usage and dst._columnwise_storage is not None:
            dst._columnwise_storage = _update_sub(self.columnwise_quantizer,
                                                  self._columnwise_src(src, row),
                                                  dst._columnwise_storage)
        return dst

    def make_empty(self, shape: Any, *, dtype: torch.dtype = torch.float32, device: Any = None,
                   requires_grad: bool = False) -> Any:
        """A hybrid tensor of `shape` holding zeros in each direction the usage asks for."""
        zeros = torch.zeros(tuple(shape), dtype=dtype, device=device)
        out = self._quantize(zeros)
        if isinstance(out, torch.Tensor):
            out.requires_grad_(requires_grad)
        return out


def _update_sub(q: Quantizer, src: torch.Tensor, sub: Any) -> Any:
    if isinstance(sub, QuantizedTensor):
        q.update_quantized(src, sub)
        return sub
    if isinstance(sub, torch.Tensor):  # high precision (IdentityQuantizer): the values
        with torch.no_grad():
            sub.copy_(src)
        return sub
    return q.update_quantized(src, sub)


class HybridQuantizedTensor(QuantizedTensor, HybridQuantizedTensorStorage):
    """A torch.Tensor of the nominal shape and dtype over a hybrid storage (see the module
    docstring); torch ops without a hybrid implementation run on its dequantized values."""

    @staticmethod
    def __new__(cls, *, shape: Any, dtype: torch.dtype, rowwise_storage: Any,
                columnwise_storage: Any, quantizer: Quantizer, requires_grad: bool = False,
                device: Any = None, **_: Any) -> HybridQuantizedTensor:
        ref = rowwise_storage if rowwise_storage is not None else columnwise_storage
        if device is None and ref is not None:
            device = ref.device
        self = super().__new__(cls, shape, dtype, device=device, requires_grad=requires_grad)
        self._set_hybrid_fields("HybridQuantizedTensor", rowwise_storage, columnwise_storage,
                                quantizer)
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # __new__ set everything

    size = torch.Tensor.size
    device = torch.Tensor.device  # type: ignore[assignment]
    view = torch.Tensor.view  # type: ignore[assignment]

    def _nominal_dtype(self) -> torch.dtype:
        return self.dtype

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        row, col = self._sub_names()
        return f"HybridQuantizedTensor(rowwise={row}, columnwise={col}, dtype={self.dtype})"

    def _dequantize(self, dtype: torch.dtype | None) -> torch.Tensor:
        return sub_dequantize(self._present(), dtype or self.dtype).reshape(self.shape)

    def _like(self, row: Any, col: Any, shape: Any = None, device: Any = None) -> Any:
        return HybridQuantizedTensor(shape=self.shape if shape is None else shape,
                                     dtype=self.dtype, rowwise_storage=row,
                                     columnwise_storage=col, quantizer=self._quantizer,
                                     device=device)

    def _shallow_copy(self) -> HybridQuantizedTensor:
        # new sub-storage objects over the same buffers, so dropping a direction (or offloading)
        # on the copy leaves this tensor whole (TE's detach)
        return self._like(*(s.detach() if s is not None else None
                            for s in (self._rowwise_storage, self._columnwise_storage)))

    def _assign_from(self, other: QuantizedTensor) -> None:
        assert isinstance(other, HybridQuantizedTensor)
        self._rowwise_storage, self._columnwise_storage = (other._rowwise_storage,
                                                           other._columnwise_storage)

    # Buffers of both sub-storages, named "<direction>.<the sub-storage's name>" (cpu_offload
    # pushes and rebuilds a quantized tensor by these names).
    def _inner_names(self) -> list[str]:
        names = []
        for d in ("rowwise", "columnwise"):
            sub = getattr(self, f"_{d}_storage")
            if isinstance(sub, QuantizedTensor):
                names += [f"{d}.{n}" for n in sub._inner_names()]
            elif sub is not None:
                names.append(f"{d}.")
        return names

    def __getattr__(self, name: str) -> Any:
        # only the dotted buffer names reach here (real attributes are found first)
        d, sep, inner = name.partition(".")
        if sep and d in ("rowwise", "columnwise"):
            sub = object.__getattribute__(self, f"_{d}_storage")
            return sub if inner == "" else getattr(sub, inner)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def _with_inner(self, inner: dict[str, torch.Tensor | None]) -> HybridQuantizedTensor:
        subs = []
        for d in ("rowwise", "columnwise"):
            sub = getattr(self, f"_{d}_storage")
            if isinstance(sub, QuantizedTensor):
                sub = sub._with_inner({n: inner[f"{d}.{n}"] for n in sub._inner_names()})
            elif sub is not None:
                sub = inner[f"{d}."]
            subs.append(sub)
        ref = subs[0] if subs[0] is not None else subs[1]
        return self._like(*subs, device=None if ref is None else ref.device)

    def __reduce_ex__(self, protocol: int) -> Any:
        # each sub-storage pickles itself (its bytes and scales); unpickling does not re-quantize
        return (_rebuild_hybrid, (self._rowwise_storage, self._columnwise_storage,
                                  self._quantizer, self.dtype, tuple(self.shape)))

    def contiguous(self, memory_format: torch.memory_format = torch.contiguous_format) -> Any:
        return self  # the sub-storages' buffers are contiguous

    def _quantized_op(self, func: Any, args: Any, kwargs: Any) -> Any:
        row, col = self._rowwise_storage, self._columnwise_storage
        if func is aten.view.default:
            shape = list(args[1])
            if shape == list(self.shape):
                return self._shallow_copy()
            got = [s.view(shape) if s is not None else None for s in (row, col)]
            if all(g is None or isinstance(g, QuantizedTensor) or not isinstance(s, QuantizedTensor)
                   for g, s in zip(got, (row, col))):
                ref = got[0] if got[0] is not None else got[1]
                return self._like(*got, shape=ref.shape)
            return NotImplemented  # a sub-storage cannot take this view: the base refuses it
        if func is aten._to_copy.default and kwargs.get("dtype") in (None, self.dtype):
            device = torch.device(kwargs.get("device") or self.device)
            moved = [s.to(device, non_blocking=bool(kwargs.get("non_blocking")), copy=True)
                     if s is not None else None for s in (row, col)]
            if kwargs.get("pin_memory") and device.type == "cpu":
                moved = [_pin(s) for s in moved]
            return self._like(*moved, device=device)
        if func is aten.clone.default:
            return self._like(*(s.clone() if s is not None else None for s in (row, col)))
        if func is aten.copy_.default:
            src = args[1]
            if isinstance(src, HybridQuantizedTensor):
                if src.get_usages() != self.get_usages():
                    raise NotImplementedError(
                        f"HybridQuantizedTensor.copy_ requires matching rowwise/columnwise "
                        f"usages, but source has {src.get_usages()} and destination has "
                        f"{self.get_usages()}. Copy from a high-precision tensor instead.")
                for mine, theirs in ((row, src._rowwise_storage), (col, src._columnwise_storage)):
                    if mine is not None:
                        with torch.no_grad():
                            mine.copy_(theirs)
                return self
            return NotImplemented  # the base quantizes a plain source with this tensor's quantizer
        if func is aten.split.Tensor and (args[2] if len(args) > 2 else kwargs.get("dim", 0)) == 0:
            pieces = [torch.split(s, args[1], dim=0) if s is not None else None for s in (row, col)]
            for s, ps in zip((row, col), pieces):
                # a quantized sub-storage that could only split dequantized: no hybrid pieces
                if isinstance(s, QuantizedTensor) and not all(
                        isinstance(p, QuantizedTensor) for p in ps):
                    return NotImplemented
            n = len(pieces[0] if pieces[0] is not None else pieces[1])
            out = []
            for i in range(n):
                r = pieces[0][i] if pieces[0] is not None else None
                c = pieces[1][i] if pieces[1] is not None else None
                out.append(self._like(r, c, shape=(r if r is not None else c).shape))
            return out
        return NotImplemented


def _pin(t: Any) -> Any:
    if t is None:
        return None
    if isinstance(t, QuantizedTensor):
        return t._with_inner({n: (b.pin_memory() if (b := getattr(t, n)) is not None else None)
                              for n in t._inner_names()})
    return t.pin_memory()


def _rebuild_hybrid(row: Any, col: Any, quantizer: HybridQuantizer, dtype: torch.dtype,
                    shape: tuple[int, ...]) -> HybridQuantizedTensor:
    """Unpickle a HybridQuantizedTensor (its __reduce_ex__)."""
    return HybridQuantizedTensor(shape=shape, dtype=dtype, rowwise_storage=row,
                                 columnwise_storage=col, quantizer=quantizer)
