"""general_grouped_gemm_for_grouped_tensor: TE main's grouped GEMM over GroupedTensor operands.

Group i computes out_i = alpha_i * op(B_i) op(A_i) + beta_i * out_i (TE's column-major naming,
as general_gemm: "TN" is B_i @ A_i^T), then adds bias_i (scaled per output row by bias_scale when
given). Each group is general_gemm on the members (views of the grouped buffers, so out is
written in place); the GEMM result is rounded to out's dtype before the bias is added in fp32 and
rounded again, which is what TE's grouped kernel does (its bias epilogue runs on the stored
output). A member with no rows contributes nothing: its output keeps beta * out (zeros without
accumulate), as an empty sum.
"""

from __future__ import annotations

from typing import Any, List, Optional, Union

import torch

from ..tensor import QuantizedTensor
from ..tensor.storage.grouped_tensor_storage import GroupedTensorStorage
from .gemm import general_gemm

__all__ = ["general_grouped_gemm_for_grouped_tensor"]

_OWNER = "general_grouped_gemm_for_grouped_tensor"


def _members(name: str, v: Any) -> list:
    if isinstance(v, GroupedTensorStorage):
        return v.split_into_quantized_tensors()
    if isinstance(v, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in v):
        return list(v)
    raise TypeError(f"{_OWNER}: {name}: expected a GroupedTensor or a list of tensors, got "
                    f"{type(v).__name__}")


def _per_group(name: str, v: Optional[torch.Tensor], n: int, default: float) -> list[float]:
    if v is None:
        return [default] * n
    if not isinstance(v, torch.Tensor) or v.numel() not in (1, n):
        got = f"{v.numel()} elements" if isinstance(v, torch.Tensor) else type(v).__name__
        raise ValueError(f"{_OWNER}: {name}: expected a tensor of 1 or {n} (num_tensors) "
                         f"elements, got {got}")
    vals = [float(x) for x in v.reshape(-1).tolist()]
    return vals * n if len(vals) == 1 else vals


def general_grouped_gemm_for_grouped_tensor(
    A: Any,
    B: Any,
    out: Any,
    *,
    layout: str = "TN",
    accumulate: bool = False,
    use_split_accumulator: bool = False,
    bias: Any = None,
    bias_scale: Optional[torch.Tensor] = None,
    grad: bool = False,
    alpha: Optional[torch.Tensor] = None,
    beta: Optional[torch.Tensor] = None,
) -> Union[GroupedTensorStorage, List[torch.Tensor]]:
    """See the module docstring. A: GroupedTensor or list (discrete weights); B: GroupedTensor;
    out: GroupedTensor or list (discrete wgrad outputs; not with a list A). bias: GroupedTensor
    (or list) of [1, N] members; bias_scale: fp32 [rows of out] (TE's per-token bias scale).
    alpha / beta: fp32 tensors of 1 or num_tensors values (default 1 and accumulate ? 1 : 0).
    use_split_accumulator: the CPU GEMM always accumulates in fp32. Returns out."""
    if layout not in ("TN", "NN", "NT"):
        raise ValueError(f"{_OWNER}: layout: expected 'TN', 'NN' or 'NT', got {layout!r}")
    if grad:
        raise NotImplementedError(f"{_OWNER}: grad=True (a bias-gradient epilogue) is not "
                                  "supported, as in TE")
    if isinstance(A, (list, tuple)) and isinstance(out, (list, tuple)):
        raise ValueError(f"{_OWNER}: A and out are both lists (discrete); expected at most one")
    if not isinstance(B, GroupedTensorStorage):
        raise TypeError(f"{_OWNER}: B: expected a GroupedTensor, got {type(B).__name__}")
    if isinstance(out, (list, tuple)) and bias is not None:
        raise ValueError(f"{_OWNER}: bias: not supported when out is a list (discrete out); "
                         "add the bias after the GEMM")
    if bias_scale is not None and bias is None:
        raise ValueError(f"{_OWNER}: bias_scale: given without a bias")
    a, b, d = _members("A", A), _members("B", B), _members("out", out)
    n = B.num_tensors
    for name, lst in (("A", a), ("out", d)):
        if len(lst) != n:
            raise ValueError(f"{_OWNER}: {name}: expected {n} members (B's num_tensors), got "
                             f"{len(lst)}")
    biases = None if bias is None else _members("bias", bias)
    if biases is not None and len(biases) != n:
        raise ValueError(f"{_OWNER}: bias: expected {n} members, got {len(biases)}")
    alphas = _per_group("alpha", alpha, n, 1.0)
    betas = _per_group("beta", beta, n, 1.0 if accumulate else 0.0)
    if bias_scale is not None:
        rows = sum(int(t.shape[0]) for t in d)
        if bias_scale.dim() != 1 or bias_scale.numel() != rows:
            raise ValueError(f"{_OWNER}: bias_scale: expected a 1-D tensor of {rows} values (the "
                             f"output rows), got shape {tuple(bias_scale.shape)}")
    row = 0
    for i in range(n):
        out_i = d[i]
        if isinstance(out_i, QuantizedTensor):
            raise NotImplementedError(f"{_OWNER}: out: a quantized output is not supported")
        # contraction length: B_i's dim that op(B_i) contracts over
        k = b[i].shape[0] if layout[1] == "T" else b[i].shape[-1]
        if out_i.numel() and k == 0:
            out_i.mul_(betas[i]) if betas[i] != 0.0 else out_i.zero_()
        elif out_i.numel():
            general_gemm(a[i], b[i], out_dtype=out_i.dtype, alpha=alphas[i],
                         beta=betas[i] if betas[i] != 0.0 else None,
                         accumulate=betas[i] != 0.0, layout=layout, out=out_i,
                         use_split_accumulator=use_split_accumulator)
        m = int(out_i.shape[0])
        if biases is not None and out_i.numel():
            add = biases[i].reshape(1, -1).float()
            if bias_scale is not None:
                add = add * bias_scale[row:row + m].reshape(-1, 1).float()
            out_i.copy_((out_i.float() + add).to(out_i.dtype))
        row += m
    return out
