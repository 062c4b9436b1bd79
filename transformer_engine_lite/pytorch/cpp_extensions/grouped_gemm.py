"""general_grouped_gemm: TE's grouped GEMM entry (one GEMM per group, e.g. MoE experts).

Each group is general_gemm on its operands, written into its slice of the output, so a grouped
call is bit for bit the per-group calls (TE's cuBLAS grouped path promises the same). The
GroupedTensor entry is grouped_tensor_gemm.general_grouped_gemm_for_grouped_tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from ..tensor import QuantizedTensor
from .gemm import general_gemm

__all__ = ["general_grouped_gemm"]


def _check_list(name: str, v: Any, n: int | None) -> list[Any]:
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"general_grouped_gemm: {name}: expected a list, got {type(v).__name__}")
    if n is not None and len(v) != n:
        raise ValueError(f"general_grouped_gemm: {name}: expected {n} entries (one per GEMM), "
                         f"got {len(v)}")
    return list(v)


def general_grouped_gemm(
    A: list[Any],
    B: list[Any],
    out: list[torch.Tensor],
    quantization_params: list[Any],
    out_dtype: torch.dtype,
    layout: str = "TN",
    m_splits: list[int] | None = None,
    gelu: bool = False,
    grad: bool = False,
    accumulate: bool = False,
    bias: list[torch.Tensor] | None = None,
    use_bias: bool = False,
    use_split_accumulator: bool = False,
    D_dtype: Any = None,
    single_output: bool = False,
) -> tuple[list[torch.Tensor], list[Any], list[Any]]:
    """out[i] = general_gemm(A[i], B[i], layout, ...) for every group (TE's argument order).

    single_output: out is [one tensor] whose consecutive row blocks of m_splits are the groups'
    outputs. grad with use_bias: the bias gradients (B's column sums) are returned; without grad,
    use_bias adds bias[i]. gelu: GELU epilogue, pre-activations returned as gelu_input. Output
    dtype: out's (TE: out_dtype is superseded by out[0].dtype, D_dtype by nothing else here).
    Returns (out, bias or bias gradients, gelu_input)."""
    A = _check_list("A", A, None)
    n = len(A)
    B = _check_list("B", B, n)
    quantization_params = _check_list("quantization_params", quantization_params, n)
    out = _check_list("out", out, 1 if single_output else n)
    if layout not in ("TN", "NN", "NT"):
        raise ValueError(f"general_grouped_gemm: layout: expected 'TN', 'NN' or 'NT', got {layout!r}")
    if D_dtype is not None:
        from ..tex import dtype_to_torch

        if dtype_to_torch(D_dtype, "D_dtype") != out[0].dtype:
            raise NotImplementedError(
                f"general_grouped_gemm: D_dtype {D_dtype} differing from out's dtype "
                f"({out[0].dtype}) is not supported by transformer_engine_lite")
    if use_bias:
        if grad:
            bias = [None] * n
        else:
            bias = _check_list("bias", bias, n)
    if single_output:
        if m_splits is None:
            raise ValueError("general_grouped_gemm: m_splits: expected a list of row counts "
                             "with single_output=True, got None")
        m_splits = _check_list("m_splits", m_splits, n)
        if sum(m_splits) != out[0].shape[0]:
            raise ValueError(f"general_grouped_gemm: m_splits: expected entries summing to out's "
                             f"{out[0].shape[0]} rows, got {m_splits}")
        views = list(torch.split(out[0], m_splits, dim=0))
    else:
        views = out
    gelu_input: list[Any] = [None] * n
    for i in range(n):
        if use_bias and grad:
            # the bias gradient: column sums of the output gradient B[i] (fp32 sums, as cuBLAS's
            # bias-gradient epilogue), zeros for an empty group
            dy = B[i].dequantize() if isinstance(B[i], QuantizedTensor) else B[i]
            bias[i] = dy.float().sum(0).to(views[i].dtype)
        if views[i].numel() == 0:
            continue  # an empty group (its output has no elements; a wgrad of 0 rows is zeroed)
        _, _, pre, _ = general_gemm(
            A[i], B[i], out_dtype=views[i].dtype, quantization_params=quantization_params[i],
            gelu=gelu, accumulate=accumulate, layout=layout, out=views[i],
            bias=bias[i] if use_bias and not grad else None, grad=grad,
            use_split_accumulator=use_split_accumulator,
        )
        gelu_input[i] = pre
    # TE returns single_output's out as the list it was given, except on its row-scaled NVFP4
    # path (per-GEMM loop), which returns the tensor itself.
    row_scaled = any(getattr(t, "_row_scaled_nvfp4", False) for t in (*A, *B))
    if single_output:
        out = out[0] if row_scaled else out[:1]
    return out, (bias if use_bias else [None] * n), gelu_input
