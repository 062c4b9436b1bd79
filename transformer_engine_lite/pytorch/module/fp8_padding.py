"""te.Fp8Padding / te.Fp8Unpadding: pad each GroupedLinear split to the quantization alignment
(16 rows for per-tensor FP8, 32 for MXFP8, a CustomRecipe's quantization_alignment, as TE) and
remove the padding again. Zero rows are appended at the end of each split; both directions are
differentiable torch ops."""

from __future__ import annotations

import torch

from ..fp8 import FP8GlobalStateManager
from ..quantization import get_align_size_for_quantization

__all__ = ["Fp8Padding", "Fp8Unpadding", "align_size_for_recipe"]


def align_size_for_recipe() -> int:
    """TE's rule for the active autocast's recipe: 32 rows for MXFP8, 16 for per-tensor FP8, a
    CustomRecipe's quantization_alignment (see quantization.get_align_size_for_quantization)."""
    return get_align_size_for_quantization(FP8GlobalStateManager.get_fp8_recipe())


def _check(owner: str, inp: torch.Tensor, m_splits: list[int], n: int, rows: int | None) -> None:
    if (
        not isinstance(m_splits, (list, tuple))
        or len(m_splits) != n
        or any(not isinstance(m, int) or m < 0 for m in m_splits)
    ):
        raise ValueError(f"{owner}: m_splits: expected {n} ints >= 0 (num_gemms), got {m_splits!r}")
    if not isinstance(inp, torch.Tensor) or inp.dim() != 2:
        got = tuple(inp.shape) if isinstance(inp, torch.Tensor) else type(inp).__name__
        raise ValueError(f"{owner}: inp: expected a 2-D tensor [tokens, features], got {got}")
    if rows is not None and inp.shape[0] != rows:
        raise ValueError(
            f"{owner}: inp: expected {rows} rows for m_splits {list(m_splits)}, got {inp.shape[0]}"
        )


class _PaddingBase(torch.nn.Module):
    def __init__(self, num_gemms: int, align_size: int | None = None) -> None:
        super().__init__()
        if not isinstance(num_gemms, int) or num_gemms < 1:
            raise ValueError(
                f"{type(self).__name__}: num_gemms: expected an int >= 1, got {num_gemms!r}"
            )
        if align_size is not None and (not isinstance(align_size, int) or align_size < 1):
            raise ValueError(
                f"{type(self).__name__}: align_size: expected None or an int >= 1, "
                f"got {align_size!r}"
            )
        self.num_gemms = num_gemms
        self.align_size = align_size

    def _padded(self, m_splits: list[int]) -> list[int]:
        if self.align_size is None:
            self.align_size = align_size_for_recipe()  # fixed at the first forward, as TE
        a = self.align_size
        return [(m + a - 1) // a * a for m in m_splits]


class Fp8Padding(_PaddingBase):
    """forward(inp [tokens, features], m_splits) -> (padded inp, padded m_splits)."""

    def forward(self, inp: torch.Tensor, m_splits: list[int]) -> tuple[torch.Tensor, list[int]]:
        rows = sum(m_splits) if isinstance(m_splits, (list, tuple)) else None
        _check("Fp8Padding", inp, m_splits, self.num_gemms, rows)
        padded = self._padded(list(m_splits))
        if padded == list(m_splits):
            return inp, list(m_splits)
        parts = []
        for part, m, p in zip(torch.split(inp, list(m_splits)), m_splits, padded):
            parts.append(torch.nn.functional.pad(part, (0, 0, 0, p - m)) if p > m else part)
        return torch.cat(parts, 0), padded


class Fp8Unpadding(_PaddingBase):
    """forward(padded inp, m_splits) -> inp without the padding rows (m_splits: the original
    split sizes, before padding)."""

    def forward(self, inp: torch.Tensor, m_splits: list[int]) -> torch.Tensor:
        ok = isinstance(m_splits, (list, tuple))
        padded = self._padded(list(m_splits)) if ok else None
        _check("Fp8Unpadding", inp, m_splits, self.num_gemms, sum(padded) if ok else None)
        if padded == list(m_splits):
            return inp
        parts = [part[:m] for part, m in zip(torch.split(inp, padded), m_splits)]
        return torch.cat(parts, 0)
