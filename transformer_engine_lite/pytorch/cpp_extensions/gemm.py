"""general_gemm: TE's GEMM entry with quantized operands, over torch.ops.te_lite.gemm."""

from __future__ import annotations

from typing import Any

import torch

from ..custom_recipes.gemm import custom_gemm
from ..quantization import ops
from ..tensor import (
    Float8BlockwiseQTensor,
    Float8Tensor,
    MXFP8Tensor,
    NVFP4Tensor,
    QuantizedTensor,
    Quantizer,
)
from ..tensor.storage.hybrid_tensor_storage import HybridQuantizedTensorStorage
from ..tensor.utils import is_custom

__all__ = ["general_gemm", "generic_gemm"]

_MX_GEMM_DTYPE = torch.bfloat16


def _operand(name: str, t: Any, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(data, scale_inv) for te_lite.gemm. MXFP8 operands enter dequantized to bf16 (exact; the
    core GEMM takes per-tensor scales), from the copy TE would use: row-wise blocks where the GEMM
    contracts along the tensor's last dim, column-wise otherwise (falling back to the other)."""
    if isinstance(t, Float8Tensor):
        return t.fp8_data(), t._scale_inv
    if isinstance(t, MXFP8Tensor):
        use_col = (not rowwise and t._columnwise_data is not None) or t._rowwise_data is None
        fp8 = t.fp8_data_dtype()
        data = t._columnwise_data if use_col else t._rowwise_data
        s = t._scale_grid(use_col)  # compact (a GEMM-swizzled grid unswizzled)
        out = ops().dequantize_mxfp8(data.view(fp8), s, use_col, _MX_GEMM_DTYPE)
        return out.reshape(t.shape), None
    if isinstance(t, Float8BlockwiseQTensor):
        # Float8BlockScaling: the copy TE's GEMM reads (as MXFP8), dequantized to fp32 (exact for
        # power-of-two scales; one rounding otherwise), then an fp32-accumulating GEMM.
        use_col = (not rowwise and t._columnwise_data is not None) or t._rowwise_data is None
        view = t._shallow_copy()
        view.update_usage(rowwise_usage=not use_col, columnwise_usage=use_col)
        return view._dequantize_nd(torch.float32), None
    if isinstance(t, NVFP4Tensor):
        # NVFP4: the copy TE's GEMM reads, dequantized to fp32 as stored (TE's dequantize
        # arithmetic: e2m1 * (e4m3 scale * amax / 2688) in fp32); a column-wise copy keeps its
        # random Hadamard transform, which cancels in the wgrad GEMM (both operands carry it).
        use_col = (not rowwise and t._columnwise_data is not None) or t._rowwise_data is None
        return t._dequantize_copy(use_col, torch.float32), None
    if isinstance(t, QuantizedTensor):
        return t.dequantize(), None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"general_gemm: {name}: expected a torch.Tensor, got {type(t).__name__}")
    return t, None


def general_gemm(A: Any, B: Any, *args: Any, **kwargs: Any):
    """D = op(B) @ op(A) (+ bias, GELU epilogue) in TE's column-major naming: layout "TN" gives
    B @ A^T (A is the weight [out, in], B the input [tokens, in]), "NN" B @ A, "NT" B^T @ A.
    Operands may be Float8Tensor / MXFP8Tensor. out_dtype: default A's (nominal) dtype.
    quantization_params: quantize D with this quantizer (returns a QuantizedTensor). out /
    accumulate / alpha / beta: D = [GELU](alpha * product + bias) + beta * out (beta default 1
    with accumulate; alpha does not scale the bias, as TE), written into out.
    Returns (D, bias_grad, gelu_input, extra_output) as TE.
    use_split_accumulator is a GPU FP8 option (the CPU GEMM always accumulates in FP32).
    Two Float8BlockwiseQTensors: TE's block-scaled GEMM contract holds (alignment, 1D/2D pairs,
    epilogues none / bias / DGELU, no E5M2 x E5M2; block_gemm.check_block_gemm_contract), and, as
    TE's general_gemm, use_split_accumulator is taken as True (tex.generic_gemm refuses False).
    Userbuffer overlap (ub, ub_type, extra_output, bulk_overlap) is not supported.
    workspace: TE 2.8's cuBLAS scratch argument (module.base.get_workspace()), third positional
    there and gone in later TE: accepted by keyword, or in the third place followed by TE 2.8's
    order (out_dtype, quantization_params, ...), positionally or by keyword; no GEMM here needs
    it (oneDNN and our cuBLASLt path allocate their own)."""
    # A tensor in the third place is TE 2.8's workspace: the arguments after it are then in the
    # same order as ours (a *args wrapper, so quantization_params may still come by keyword).
    if args and isinstance(args[0], torch.Tensor):
        if "workspace" in kwargs:
            raise TypeError("general_gemm: workspace given twice (positionally and by keyword)")
        kwargs["workspace"], args = args[0], args[1:]
    layout = kwargs["layout"] if "layout" in kwargs else (args[7] if len(args) > 7 else "TN")
    both_block = isinstance(A, Float8BlockwiseQTensor) and isinstance(B, Float8BlockwiseQTensor)
    # TE's general_gemm takes three layouts; TT: a column-wise (transposed) block-scaled B with a
    # row-wise A, as TE's block GEMM takes. tex.generic_gemm (TE's C++ GEMM) takes all four.
    if layout not in ("TN", "NN", "NT") and not (both_block and layout == "TT"):
        raise ValueError(f"general_gemm: layout: expected 'TN', 'NN' or 'NT' ('TT' for two "
                         f"Float8BlockwiseQTensors), got {layout!r}")
    return _general_gemm(A, B, *args, **kwargs)


def _general_gemm(
    A: torch.Tensor,
    B: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    quantization_params: Quantizer | None = None,
    gelu: bool = False,
    gelu_in: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float | None = None,
    accumulate: bool = False,
    layout: str = "TN",
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    use_split_accumulator: bool = False,
    grad: bool = False,
    ub: Any = None,
    ub_type: Any = None,
    extra_output: torch.Tensor | None = None,
    bulk_overlap: bool = False,
    workspace: torch.Tensor | None = None,
    *,
    split_accumulator_checked: bool = False,
) -> tuple[Any, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """general_gemm with the workspace, if any, by keyword. split_accumulator_checked:
    use_split_accumulator is tex.generic_gemm's explicit flag, which TE passes on to cuBLAS (its
    general_gemm forces it True for block-scaled operands, so there it is never refused)."""
    if workspace is not None and not isinstance(workspace, torch.Tensor):
        raise TypeError(f"general_gemm: workspace: expected a torch.Tensor, got {type(workspace).__name__}")
    if isinstance(layout, str) and len(layout) == 2:
        # A hybrid operand enters as the sub-storage of the direction the GEMM reads (TE's):
        # A row-wise when transposed, B row-wise when not.
        A = hybrid_direction("A", A, layout[0] == "T")
        B = hybrid_direction("B", B, layout[1] != "T")
    if is_custom(A) or is_custom(B):
        # Custom quantizers' tensors (custom_recipes references): the quantizer's qgemm, as TE's
        # general_gemm; the epilogue options it has no equivalent for are refused.
        if alpha != 1.0 or beta not in (None, 1, 1.0):
            raise NotImplementedError(f"general_gemm: alpha / beta (got {alpha!r}, {beta!r}) are "
                                      "not implemented for custom quantizers' GEMMs")
        if ub is not None or ub_type is not None or extra_output is not None or bulk_overlap:
            raise NotImplementedError("general_gemm: userbuffer communication overlap is not "
                                      "supported by transformer_engine_lite")
        return custom_gemm(A, B, workspace, out_dtype, quantization_params, gelu, gelu_in,
                           accumulate, layout, out, bias, use_split_accumulator, grad)
    if ub is not None or ub_type is not None or extra_output is not None or bulk_overlap:
        raise NotImplementedError(
            "general_gemm: userbuffer communication overlap (ub, ub_type, extra_output, "
            "bulk_overlap) is not supported by transformer_engine_lite"
        )
    both_block = isinstance(A, Float8BlockwiseQTensor) and isinstance(B, Float8BlockwiseQTensor)
    if layout not in ("TN", "NN", "NT", "TT"):
        raise ValueError(f"general_gemm: layout: expected 'TN', 'NN', 'NT' or 'TT', got "
                         f"{layout!r}")
    transa, transb = layout[0] == "T", layout[1] == "T"
    if both_block:
        from .block_gemm import block_scaled_gemm, check_block_gemm_contract

        dtype = out_dtype or (out.dtype if out is not None else A.dtype)
        nonempty = check_block_gemm_contract(
            A, transa, B, transb, dtype, bias, bool(gelu), bool(grad),
            bool(use_split_accumulator) if split_accumulator_checked else None)
        # After the contract the only epilogues left are none, bias, and DGELU (gelu and grad).
        if (nonempty and quantization_params is None and alpha == 1.0
                and beta in (None, 1, 1.0) and (out is not None or not accumulate)):
            dgelu_in = None
            if gelu:
                if gelu_in is None:
                    raise ValueError("general_gemm: gelu_in: expected the GELU input for the "
                                     "DGELU epilogue (gelu=True, grad=True), got None")
                dgelu_in = gelu_in
            d = block_scaled_gemm(A, transa, B, transb, dtype, bias, out, accumulate, dgelu_in)
            return d, None, (gelu_in if gelu else None), None
    if isinstance(A, NVFP4Tensor) and isinstance(B, NVFP4Tensor) and not gelu \
            and not (grad and bias is not None):
        d = _nvfp4_gemm(A, transa, B, transb, out_dtype, alpha, beta, accumulate, out, bias)
        if d is not None:
            if quantization_params is not None:
                d = quantization_params(d)
            return d, None, None, None
    a, a_si = _operand("A", A, transa)
    b, b_si = _operand("B", B, not transb)
    fp32_kinds = (Float8BlockwiseQTensor, NVFP4Tensor)
    if (isinstance(A, fp32_kinds) or isinstance(B, fp32_kinds)) \
            and a_si is None and b_si is None and a.dtype != b.dtype:
        a, b = a.float(), b.float()  # a block-scaled operand is fp32: the pair must match
    dtype = (
        out_dtype if out_dtype is not None else (A.dtype if isinstance(A, torch.Tensor) else None)
    )
    if out is not None and out_dtype is None:
        dtype = out.dtype
    if not accumulate and beta not in (None, 0, 0.0):
        raise ValueError(f"general_gemm: beta: expected None or 0 without accumulate, got {beta!r}")
    if accumulate and out is None:
        raise ValueError("general_gemm: out: expected a tensor to accumulate into, got None")
    if (
        accumulate
        and not gelu
        and not grad
        and quantization_params is None
        and out.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and dtype == out.dtype
        and out.is_contiguous()
    ):
        # One fused GEMM: out = beta * out + alpha * product + bias, rounded once (the core's
        # nvte_cublas_gemm_scaled).
        ops().gemm_accumulate_(
            out, a, a_si, transa, b, b_si, transb, bias, float(alpha),
            1.0 if beta is None else float(beta),
        )
        return out, None, None, None
    # alpha scales the product before bias and GELU, as TE's "D = GELU(alpha*AB + bias)".
    d, pre_gelu, bias_grad, _, _ = ops().gemm(
        a, a_si, transa, b, b_si, transb, dtype, bias, gelu, grad, gelu_in, None, float(alpha)
    )
    if out is not None:
        if tuple(out.shape) != tuple(d.shape):
            raise ValueError(
                f"general_gemm: out: expected shape {tuple(d.shape)}, got {tuple(out.shape)}"
            )
        if accumulate:
            if beta not in (None, 1, 1.0):
                out.mul_(float(beta))
            out.add_(d.to(out.dtype))
        else:
            out.copy_(d)
        d = out
    if quantization_params is not None:
        d = quantization_params(d)
    gelu_input = pre_gelu if gelu and not grad else None
    return d, (bias_grad if grad and bias is not None else None), gelu_input, None


def hybrid_direction(name: str, t: Any, rowwise: bool) -> Any:
    """t, or for a hybrid tensor its sub-storage of that direction (an error when dropped)."""
    if not isinstance(t, HybridQuantizedTensorStorage):
        return t
    usage = "rowwise" if rowwise else "columnwise"
    sub = t.rowwise_sub_storage if rowwise else t.columnwise_sub_storage
    if sub is None:
        raise RuntimeError(f"general_gemm: {name}: GEMM requested the {usage} representation of a "
                           f"HybridQuantizedTensor, but it is unavailable. Ensure {usage}_usage is "
                           "enabled and the representation has not been dropped by update_usage().")
    return sub


def _nvfp4_gemm(A: Any, transa: bool, B: Any, transb: bool, out_dtype: torch.dtype | None,
                alpha: float, beta: float | None, accumulate: bool, out: torch.Tensor | None,
                bias: torch.Tensor | None) -> torch.Tensor | None:
    """Two NVFP4 operands: the FP4 tensor core's order (nvfp4_gemm.py) from the copies whose
    16-blocks run along the contracted dim (A's row-wise copy when transa, B's when not transb);
    None when a needed copy is missing (the caller then contracts what is held, dequantized).
    Epilogue: alpha * product + beta * out + bias in fp32, one rounding (TE's cuBLAS order)."""
    from .nvfp4_gemm import nvfp4_epilogue, nvfp4_k_operand, nvfp4_sequential_gemm

    a, b = nvfp4_k_operand(A, not transa), nvfp4_k_operand(B, transb)
    if a is None or b is None:
        return None
    dtype = out_dtype if out_dtype is not None else (out.dtype if out is not None else A.dtype)
    if accumulate and out is None:
        raise ValueError("general_gemm: out: expected a tensor to accumulate into, got None")
    if not accumulate and beta not in (None, 0, 0.0):
        raise ValueError(f"general_gemm: beta: expected None or 0 without accumulate, got {beta!r}")
    y = nvfp4_sequential_gemm(b, a, float(alpha))
    if not transb and B.dim() > 2:  # [..., K] @ W^T keeps the leading dims
        y = y.reshape(*B.shape[:-1], y.shape[-1])
    if out is not None and out.numel() != y.numel():
        raise ValueError(f"general_gemm: out: expected shape {tuple(y.shape)}, got "
                         f"{tuple(out.shape)}")
    return nvfp4_epilogue(y, dtype, bias, out, accumulate, beta)


def generic_gemm(
    A: Any, transA: bool, B: Any, transB: bool, D: torch.Tensor | None, quantizer: Any,
    output_dtype: Any, bias: torch.Tensor | None, bias_type: Any, gelu: bool,
    gelu_in: torch.Tensor | None, grad: bool, workspace: torch.Tensor | None, workspace_size: int,
    accumulate: bool, use_split_accumulator: bool, comm_overlap: Any = None, comm_type: Any = None,
    extra_output: torch.Tensor | None = None, bulk_overlap: bool = False, alpha: float = 1.0,
    beta: float | None = None,
) -> list[Any]:
    """TE's tex.generic_gemm (the pybind GEMM under general_gemm), same arguments in the same order:
    D = op(B) @ op(A) in TE's column-major naming (transA=True, transB=False: B @ A^T), written
    into D when given. output_dtype / bias_type are TE DTypes (bias_type must be the bias's dtype
    when there is a bias). workspace / workspace_size are cuBLAS scratch, not needed here.
    Returns [D, bias_grad, gelu_input, extra_output]."""
    from ..tex import dtype_to_torch, torch_to_dtype

    out_dtype = dtype_to_torch(output_dtype, "generic_gemm: output_dtype")
    if bias is not None and bias.numel():
        if dtype_to_torch(bias_type, "generic_gemm: bias_type") != bias.dtype:
            raise ValueError(f"generic_gemm: bias_type: expected the bias dtype "
                             f"{torch_to_dtype(bias.dtype)!r}, got {bias_type!r}")
    else:
        bias = None
    layout = ("T" if transA else "N") + ("T" if transB else "N")
    d, bias_grad, gelu_input, extra = _general_gemm(
        A, B, out_dtype, quantizer, bool(gelu), gelu_in, alpha, beta, bool(accumulate), layout,
        D, bias, bool(use_split_accumulator), bool(grad), comm_overlap, comm_type, extra_output,
        bulk_overlap, workspace, split_accumulator_checked=True,
    )
    return [d, bias_grad, gelu_input, extra]
