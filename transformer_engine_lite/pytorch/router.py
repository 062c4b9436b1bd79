"""Fused MoE router functions (TE's ``transformer_engine.pytorch.router``), over the core's
``nvte_fused_*`` router ops (``torch.ops.te_lite.fused_*``; math in ``fused_router.h``).

Precision (as TE): logits are read as fp32 and every score, sum and normalization is fp32;
``scores`` of the aux-loss path and the saved intermediate are fp32; probs and gradients are written
in the input's dtype. Top-k order: higher score first, ties to the lower expert index
(torch.topk's); NaN scores rank lowest. ``routing_map`` is a bool tensor shaped like ``logits``.

Not implemented (``NotImplementedError`` naming the argument, values TE accepts): a
``routing_map_format`` other than ``"bytemap"``, dense ``topk_indices`` outputs, Quantile Balancing
(``qb_*``).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from . import te_lite_ops  # noqa: F401  (loads the extension: torch.ops.te_lite.*)

__all__ = [
    "fused_topk_with_score_function",
    "fused_compute_score_for_moe_aux_loss",
    "fused_moe_aux_loss",
]

_SCORE_FUNCTIONS = {"sigmoid": 0, "softmax": 1, "sqrtsoftplus": 2}
_LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _score_function(score_function: str) -> int:
    if not isinstance(score_function, str) or score_function not in _SCORE_FUNCTIONS:
        raise ValueError(
            "score_function: expected 'softmax', 'sigmoid' or 'sqrtsoftplus', "
            f"got {score_function!r}"
        )
    return _SCORE_FUNCTIONS[score_function]


def _check_tensor(name: str, t: object, dtypes: tuple[torch.dtype, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name}: expected dtype in {{{names}}}, got {t.dtype}")


def _check_int(name: str, v: object, low: int, high: Optional[int] = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if v < low or (high is not None and v > high):
        bound = f"{low} <= {name}" + (f" <= {high}" if high is not None else "")
        raise ValueError(f"{name}: expected {bound}, got {v}")
    return v


def _check_routing_map_format(routing_map_format: object) -> None:
    # TE: RoutingMapFormat.BYTEMAP (0) or "bytemap"; BITMAP_U8 is not implemented here.
    if routing_map_format in (0, "bytemap") or getattr(routing_map_format, "name", None) == (
        "BYTEMAP"
    ):
        return
    if routing_map_format in (1, "bitmap_u8"):
        raise NotImplementedError(
            "routing_map_format: 'bitmap_u8' is not implemented (routing maps are bool bytemaps)"
        )
    raise ValueError(
        f"routing_map_format: expected 'bytemap' or 'bitmap_u8', got {routing_map_format!r}"
    )


class FusedTopkScoreFunction(torch.autograd.Function):
    """Fused top-k with a score function ("softmax", "sigmoid", "sqrtsoftplus")."""

    @staticmethod
    def forward(
        ctx,
        logits: torch.Tensor,
        topk: int,
        use_pre_softmax: bool,
        num_groups: Optional[int],
        group_topk: Optional[int],
        scaling_factor: Optional[float],
        score_function: str,
        expert_bias: Optional[torch.Tensor],
    ):
        score = _score_function(score_function)
        pre = bool(use_pre_softmax) and score == _SCORE_FUNCTIONS["softmax"]
        sf = 1.0 if scaling_factor is None else float(scaling_factor)
        probs, routing_map, intermediate = torch.ops.te_lite.fused_topk_with_score_function_fwd(
            logits,
            topk,
            pre,
            -1 if num_groups is None else num_groups,
            -1 if group_topk is None else group_topk,
            sf,
            score,
            expert_bias,
        )
        ctx.mark_non_differentiable(routing_map)
        ctx.save_for_backward(routing_map, intermediate)
        ctx.router = (topk, pre, sf, score)
        return probs, routing_map

    @staticmethod
    def backward(ctx, grad_probs, _grad_map):
        routing_map, intermediate = ctx.saved_tensors
        topk, pre, sf, score = ctx.router
        grad_logits = torch.ops.te_lite.fused_topk_with_score_function_bwd(
            routing_map, intermediate, grad_probs.contiguous(), topk, pre, sf, score
        )
        return grad_logits, None, None, None, None, None, None, None


def fused_topk_with_score_function(
    logits: torch.Tensor,
    topk: int,
    use_pre_softmax: bool,
    num_groups: Optional[int],
    group_topk: Optional[int],
    scaling_factor: Optional[float],
    score_function: str,
    expert_bias: Optional[torch.Tensor],
    routing_map_format: Union[str, int] = "bytemap",
    topk_indices: Optional[torch.Tensor] = None,
    qb_histogram: Optional[torch.Tensor] = None,
    qb_bin_bounds: Optional[torch.Tensor] = None,
    qb_histogram_mode: Optional[str] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing with a score function (TE's signature).

    ``logits`` [..., num_experts] in fp32 / bf16 / fp16. Softmax: ``use_pre_softmax`` takes the
    softmax over all experts before the top-k, otherwise over the k selected logits. Sigmoid and
    sqrtsoftplus (sqrt(softplus(x))): top-k of score + ``expert_bias`` (fp32 [num_experts]; the
    bias only selects), probs = the unbiased scores normalized by their sum when ``topk > 1``.
    ``num_groups`` / ``group_topk``: group-limited top-k (DeepSeek-V3: groups ranked by the sum of
    their ``topk // group_topk`` best scores). ``scaling_factor`` multiplies probs.

    Returns ``(probs, routing_map)``: probs in logits' dtype, 0 where not routed; routing_map bool.
    Differentiable w.r.t. ``logits``.
    """
    _check_tensor("logits", logits, _LOGITS_DTYPES)
    if logits.dim() < 1:
        raise ValueError(f"logits: expected at least 1 dim, got shape {tuple(logits.shape)}")
    num_experts = logits.shape[-1]
    _check_int("topk", topk, 1, num_experts)
    score = _score_function(score_function)
    if (num_groups is None) != (group_topk is None):
        raise ValueError(
            "num_groups, group_topk: expected both or neither, got "
            f"num_groups={num_groups!r}, group_topk={group_topk!r}"
        )
    if num_groups is not None:
        _check_int("num_groups", num_groups, 1, num_experts)
        _check_int("group_topk", group_topk, 1, num_groups)
        if num_experts % num_groups != 0:
            raise ValueError(
                f"num_groups: expected a divisor of num_experts ({num_experts}), got {num_groups}"
            )
        if topk % group_topk != 0 or topk // group_topk > num_experts // num_groups:
            raise ValueError(
                f"topk: expected a multiple of group_topk ({group_topk}) of at most "
                f"group_topk * group size ({group_topk * (num_experts // num_groups)}), got {topk}"
            )
    if scaling_factor is not None and not isinstance(scaling_factor, (int, float)):
        raise TypeError(
            f"scaling_factor: expected a float or None, got {type(scaling_factor).__name__}"
        )
    if expert_bias is not None:
        if score == _SCORE_FUNCTIONS["softmax"]:
            raise ValueError(
                "expert_bias: expected None with score_function 'softmax' (the bias applies to "
                "'sigmoid' and 'sqrtsoftplus')"
            )
        _check_tensor("expert_bias", expert_bias, (torch.float32,))
        if tuple(expert_bias.shape) != (num_experts,):
            raise ValueError(
                f"expert_bias: expected shape ({num_experts},), got {tuple(expert_bias.shape)}"
            )
    _check_routing_map_format(routing_map_format)
    if topk_indices is not None:
        raise NotImplementedError("topk_indices: dense top-k index outputs are not implemented")
    for name, value in (
        ("qb_histogram", qb_histogram),
        ("qb_bin_bounds", qb_bin_bounds),
        ("qb_histogram_mode", qb_histogram_mode),
    ):
        if value is not None:
            raise NotImplementedError(f"{name}: Quantile Balancing is not implemented")
    return FusedTopkScoreFunction.apply(
        logits,
        topk,
        use_pre_softmax,
        num_groups,
        group_topk,
        scaling_factor,
        score_function,
        expert_bias,
    )


class FusedComputeScoresForMoEAuxLoss(torch.autograd.Function):
    """Scores and routing map for the MoE auxiliary loss."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, topk: int, score_function: str):
        score = _score_function(score_function)
        scores, routing_map, intermediate = torch.ops.te_lite.fused_score_for_moe_aux_loss_fwd(
            logits, topk, score
        )
        ctx.mark_non_differentiable(routing_map)
        ctx.save_for_backward(intermediate)
        ctx.router = (topk, score, logits.dtype)
        return routing_map, scores

    @staticmethod
    def backward(ctx, _grad_map, grad_scores):
        (intermediate,) = ctx.saved_tensors
        topk, score, dtype = ctx.router
        grad_logits = torch.ops.te_lite.fused_score_for_moe_aux_loss_bwd(
            intermediate, grad_scores.float().contiguous(), topk, score, dtype
        )
        return grad_logits, None, None


def fused_compute_score_for_moe_aux_loss(
    logits: torch.Tensor,
    topk: int,
    score_function: str,
    routing_map_format: Union[str, int] = "bytemap",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores for the aux loss (TE's signature): softmax over all experts, or sigmoid /
    sqrtsoftplus normalized by their sum over all experts, in fp32; and the top-k of those scores.

    Returns ``(routing_map, scores)`` (TE's order): routing_map bool, scores fp32, both shaped like
    ``logits``. Differentiable w.r.t. ``logits``.
    """
    _check_tensor("logits", logits, _LOGITS_DTYPES)
    if logits.dim() < 1:
        raise ValueError(f"logits: expected at least 1 dim, got shape {tuple(logits.shape)}")
    _check_int("topk", topk, 1, logits.shape[-1])
    _score_function(score_function)
    _check_routing_map_format(routing_map_format)
    return FusedComputeScoresForMoEAuxLoss.apply(logits, topk, score_function)


class FusedAuxLoss(torch.autograd.Function):
    """Switch-Transformer load-balancing loss."""

    @staticmethod
    def forward(ctx, probs, tokens_per_expert, total_num_tokens, num_experts, topk, coeff):
        aux_loss, const_buf = torch.ops.te_lite.fused_moe_aux_loss_fwd(
            probs, tokens_per_expert, total_num_tokens, num_experts, topk, float(coeff)
        )
        ctx.save_for_backward(const_buf, tokens_per_expert)
        ctx.shape = tuple(probs.shape)
        return aux_loss

    @staticmethod
    def backward(ctx, grad_aux_loss):
        const_buf, tokens_per_expert = ctx.saved_tensors
        grad_probs = torch.ops.te_lite.fused_moe_aux_loss_bwd(
            const_buf, tokens_per_expert, grad_aux_loss.contiguous(), *ctx.shape
        )
        return grad_probs, None, None, None, None, None


def fused_moe_aux_loss(
    probs: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    total_num_tokens: Union[int, torch.Tensor],
    num_experts: int,
    topk: int,
    coeff: float,
) -> torch.Tensor:
    """Auxiliary load-balancing loss (TE's signature):
    ``coeff * num_experts / (topk * total_num_tokens**2) * sum(probs.sum(0) * tokens_per_expert)``.

    ``probs`` [num_tokens, num_cols] in fp32 / bf16 / fp16 (num_cols a multiple of num_experts);
    ``tokens_per_expert`` [num_cols] in int16/int32/int64/fp32/bf16; ``total_num_tokens`` an int or
    a one-element integer tensor (read on the host). Returns a 0-dim tensor in probs' dtype,
    differentiable w.r.t. ``probs``.
    """
    _check_tensor("probs", probs, _LOGITS_DTYPES)
    if probs.dim() != 2:
        raise ValueError(f"probs: expected 2 dims, got shape {tuple(probs.shape)}")
    _check_tensor(
        "tokens_per_expert",
        tokens_per_expert,
        (torch.int16, torch.int32, torch.int64, torch.float32, torch.bfloat16),
    )
    if tuple(tokens_per_expert.shape) != (probs.shape[1],):
        raise ValueError(
            f"tokens_per_expert: expected shape ({probs.shape[1]},) (the columns of probs), got "
            f"{tuple(tokens_per_expert.shape)}"
        )
    if isinstance(total_num_tokens, torch.Tensor):
        if total_num_tokens.numel() != 1 or total_num_tokens.is_floating_point():
            raise TypeError(
                "total_num_tokens: expected an int or a one-element integer tensor, got "
                f"{total_num_tokens.dtype} of shape {tuple(total_num_tokens.shape)}"
            )
        total_num_tokens = int(total_num_tokens.item())
    _check_int("total_num_tokens", total_num_tokens, 1, 2**31 - 1)
    _check_int("num_experts", num_experts, 1)
    if probs.shape[1] % num_experts != 0:
        raise ValueError(
            f"num_experts: expected a divisor of probs' {probs.shape[1]} columns, got {num_experts}"
        )
    _check_int("topk", topk, 1)
    if isinstance(coeff, bool) or not isinstance(coeff, (int, float)):
        raise TypeError(f"coeff: expected a float, got {type(coeff).__name__}")
    return FusedAuxLoss.apply(probs, tokens_per_expert, total_num_tokens, num_experts, topk, coeff)
