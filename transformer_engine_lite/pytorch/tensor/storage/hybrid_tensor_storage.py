"""TE's HybridQuantizedTensorStorage: a rowwise and a columnwise sub-storage made by two different
quantizers (tensor/hybrid_tensor.py's HybridQuantizer), without the torch.Tensor wrapper.

A sub-storage is what its sub-quantizer returned: a quantized tensor of any format (Float8Tensor,
MXFP8Tensor, Float8BlockwiseQTensor, NVFP4Tensor, a custom quantizer's tensor) holding that one
direction, or, for IdentityQuantizer (high precision), the plain tensor itself. A GEMM reads the
sub-storage of the direction it needs (cpp_extensions/gemm.py), so each direction may use its own
format. Either may be None once update_usage dropped it (or when it was never requested).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..quantized_tensor import QuantizedTensor, QuantizedTensorStorage, Quantizer

__all__ = ["HybridQuantizedTensorStorage", "check_hybrid_parent", "sub_dequantize"]


def check_hybrid_parent(owner: str, quantizer: Any) -> Quantizer:
    """The parent quantizer of a hybrid storage, checked (TE's TypeError)."""
    if not isinstance(quantizer, Quantizer) or not (
        hasattr(quantizer, "rowwise_quantizer") and hasattr(quantizer, "columnwise_quantizer")
    ):
        raise TypeError(f"{owner} requires a parent HybridQuantizer (with rowwise_quantizer and "
                        f"columnwise_quantizer); got {type(quantizer).__name__}.")
    return quantizer


def sub_dequantize(sub: Any, dtype: torch.dtype) -> torch.Tensor:
    """A sub-storage's values: a quantized one dequantized, a high-precision one converted."""
    if isinstance(sub, QuantizedTensor):
        return sub._dequantize(dtype)
    if isinstance(sub, torch.Tensor):
        return sub.to(dtype)
    return sub.dequantize(dtype=dtype)


def _sub_buffers(sub: Any) -> list[torch.Tensor | None]:
    """A sub-storage's buffers in its own order (what prepare_for_saving hands out)."""
    if isinstance(sub, QuantizedTensor):
        return [getattr(sub, n) for n in sub._inner_names()]
    if isinstance(sub, torch.Tensor):
        return [sub]
    return list(sub.prepare_for_saving()[0])


class HybridQuantizedTensorStorage(QuantizedTensorStorage):
    """_rowwise_storage / _columnwise_storage (None when absent) and the parent HybridQuantizer
    (a copy, as TE: later usage changes on the caller's quantizer leave this one alone)."""

    _rowwise_storage: Any
    _columnwise_storage: Any
    _quantizer: Quantizer

    def __init__(self, *, rowwise_storage: Any, columnwise_storage: Any, quantizer: Quantizer,
                 fake_dtype: torch.dtype | None = None) -> None:
        self._set_hybrid_fields("HybridQuantizedTensorStorage", rowwise_storage,
                                columnwise_storage, quantizer)
        self._dtype = fake_dtype if fake_dtype is not None else torch.float32

    def _set_hybrid_fields(self, owner: str, row: Any, col: Any, quantizer: Any) -> None:
        check_hybrid_parent(owner, quantizer)
        self._rowwise_storage = row
        self._columnwise_storage = col
        self._quantizer = quantizer.copy()

    def _nominal_dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def rowwise_sub_storage(self) -> Any:
        """The sub-storage holding the rowwise representation (None when absent)."""
        return self._rowwise_storage

    @property
    def columnwise_sub_storage(self) -> Any:
        """The sub-storage holding the columnwise representation (None when absent)."""
        return self._columnwise_storage

    def _present(self) -> Any:
        sub = self._rowwise_storage if self._rowwise_storage is not None \
            else self._columnwise_storage
        if sub is None:
            raise RuntimeError(f"{type(self).__name__} has no data (both sub-storages dropped)")
        return sub

    def get_usages(self) -> dict[str, bool]:
        return {"rowwise": self._rowwise_storage is not None,
                "columnwise": self._columnwise_storage is not None}

    def update_usage(self, rowwise_usage: bool | None = None,
                     columnwise_usage: bool | None = None) -> None:
        """Drop a direction (False); asking for one that was dropped is an error (a storage
        cannot rebuild it). Both requests are checked before either is applied."""
        for want, sub, name in ((rowwise_usage, self._rowwise_storage, "rowwise"),
                                (columnwise_usage, self._columnwise_storage, "columnwise")):
            if want and sub is None:
                raise RuntimeError(f"Requested {name} usage, but {type(self).__name__} has no "
                                   f"{name} sub-storage")
        if rowwise_usage is not None and not rowwise_usage:
            self._rowwise_storage = None
        if columnwise_usage is not None and not columnwise_usage:
            self._columnwise_storage = None

    def clear(self) -> None:
        """Free both sub-storages' buffers (TE's clear: they become empty)."""
        for sub in (self._rowwise_storage, self._columnwise_storage):
            if isinstance(sub, QuantizedTensor):
                for n in sub._inner_names():
                    t = getattr(sub, n)
                    if t is not None:
                        setattr(sub, n, t.new_empty((0,)))
            elif isinstance(sub, torch.Tensor):
                sub.data = sub.new_empty((0,))
            elif sub is not None:
                sub.clear()

    def prepare_for_saving(self) -> tuple[list[torch.Tensor | None], HybridQuantizedTensorStorage]:
        """(the rowwise sub-storage's buffers, then the columnwise one's; self)."""
        tensors: list[torch.Tensor | None] = []
        for sub in (self._rowwise_storage, self._columnwise_storage):
            if sub is not None:
                tensors.extend(_sub_buffers(sub))
        return tensors, self

    def restore_from_saved(self, tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Put prepare_for_saving's buffers back (in its order); returns the ones left over."""
        tensors = list(tensors)
        for attr in ("_rowwise_storage", "_columnwise_storage"):
            sub = getattr(self, attr)
            if sub is None:
                continue
            if isinstance(sub, QuantizedTensor):
                names = sub._inner_names()
                setattr(self, attr, sub._with_inner(dict(zip(names, tensors[: len(names)]))))
                tensors = tensors[len(names):]
            elif isinstance(sub, torch.Tensor):
                setattr(self, attr, tensors[0])
                tensors = tensors[1:]
            else:
                tensors = sub.restore_from_saved(tensors)
        return tensors

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The values, from the rowwise sub-storage when present, else the columnwise one (TE)."""
        return sub_dequantize(self._present(), dtype or self._nominal_dtype())

    def get_data_tensors(self, rowwise_data: bool = True, columnwise_data: bool = True) -> Any:
        """The rowwise sub-storage's data tensors followed by the columnwise one's (a tuple)."""
        out: tuple[Any, ...] = ()
        for want, sub in ((rowwise_data, self._rowwise_storage),
                          (columnwise_data, self._columnwise_storage)):
            if not want or sub is None:
                continue
            got = sub if isinstance(sub, torch.Tensor) and not isinstance(
                sub, QuantizedTensorStorage) else sub.get_data_tensors()
            out += got if isinstance(got, tuple) else (got,)
        return out

    def size(self, *args: Any, **kwargs: Any) -> Any:
        return self._present().size(*args, **kwargs)

    @property
    def device(self) -> torch.device:
        return self._present().device

    def view(self, *shape: Any) -> HybridQuantizedTensorStorage:
        """Each sub-storage viewed (an identity view keeps them as they are)."""
        flat = shape[0] if len(shape) == 1 and isinstance(shape[0], Iterable) else shape
        row, col = self._rowwise_storage, self._columnwise_storage
        if list(flat) != list(self.size()):
            row = row.view(*shape) if row is not None else None
            col = col.view(*shape) if col is not None else None
        return HybridQuantizedTensorStorage(rowwise_storage=row, columnwise_storage=col,
                                            quantizer=self._quantizer,
                                            fake_dtype=self._nominal_dtype())

    def get_metadata(self) -> dict[str, Any]:
        """The constructor's arguments (TE's make_like / serialization metadata)."""
        return {"rowwise_storage": self._rowwise_storage,
                "columnwise_storage": self._columnwise_storage,
                "quantizer": self._quantizer, "fake_dtype": self._nominal_dtype()}

    def _sub_names(self) -> tuple[str, str]:
        return tuple(type(s).__name__ if s is not None else "None"  # type: ignore[return-value]
                     for s in (self._rowwise_storage, self._columnwise_storage))

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        row, col = self._sub_names()
        return (f"{type(self).__name__}(rowwise={row}, columnwise={col}, "
                f"dtype={self._nominal_dtype()})")
