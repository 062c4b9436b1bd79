"""TE's backend modules (transformer_engine.pytorch.attention.dot_product_attention.backends).

UnfusedDotProductAttention here has TE's constructor and forward (the module TE's tests and users
build directly); it normalizes TE's arguments the way DotProductAttention does and runs this
library's unfused backend (attention/backends.py, whose canonical form DotProductAttention uses).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from .. import backends as _impl
from ..backends import FlashAttention
from ..inputs import check_bias, normalize_mask_type, resolve_sequences
from .utils import _LAYOUTS, check_set_window_size

__all__ = ["FlashAttention", "UnfusedDotProductAttention"]

_OWNER = "UnfusedDotProductAttention"


class UnfusedDotProductAttention(_impl.UnfusedDotProductAttention):
    """Attention as framework math, with TE's constructor: softmax_scale, attention_type ('self'
    or 'cross': how a padding attention_mask is given), attention_dropout (applied in training
    mode, with the flash kernel's keep mask), attention_dropout_ctx (a callable giving the context
    dropout seeds are drawn in, e.g. an RNG tracker's fork), layer_number (kept, as TE). Only
    softmax_type='vanilla' and return_max_logit=False (NotImplementedError otherwise)."""

    def __init__(
        self,
        softmax_scale: float,
        attention_type: str = "self",
        attention_dropout: float = 0.0,
        attention_dropout_ctx: Callable[[], Any] | None = nullcontext,
        layer_number: int | None = None,
        softmax_type: str = "vanilla",
        return_max_logit: bool | None = False,
    ) -> None:
        if not isinstance(softmax_scale, (int, float)) or isinstance(softmax_scale, bool):
            raise ValueError(f"{_OWNER}: softmax_scale: expected a float, got {softmax_scale!r}")
        if attention_type not in ("self", "cross"):
            raise ValueError(
                f"{_OWNER}: attention_type: expected 'self' or 'cross', got {attention_type!r}"
            )
        if not isinstance(attention_dropout, (int, float)) or not 0.0 <= attention_dropout < 1.0:
            raise ValueError(
                f"{_OWNER}: attention_dropout: expected [0, 1), got {attention_dropout!r}"
            )
        if softmax_type != "vanilla":
            raise NotImplementedError(
                f"{_OWNER}: softmax_type={softmax_type!r} is not supported (only 'vanilla')"
            )
        if return_max_logit:
            raise NotImplementedError(f"{_OWNER}: return_max_logit=True is not supported")
        super().__init__(float(softmax_scale), float(attention_dropout))
        self.attention_type = attention_type
        self.attention_dropout_ctx = attention_dropout_ctx
        self.layer_number = layer_number
        self.softmax_type = softmax_type
        self.return_max_logit = bool(return_max_logit)

    def forward(  # type: ignore[override]
        self,
        _alibi_cache: dict[str, Any] | None,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        qkv_layout: str = "sbh3d",
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        attn_mask_type: str = "causal",
        attention_mask: Any = None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        inference_params: Any = None,
        softmax_offset: torch.Tensor | None = None,
        fp8: bool = False,
        fp8_meta: dict[str, Any] | None = None,
        quantizers: Any = None,
        fp8_output: bool = False,
    ) -> torch.Tensor:
        """TE's call: output [s, b, h * d_v] (sbhd layouts), [b, s, h * d_v] (bshd) or
        [t, h * d_v] (thd). _alibi_cache is TE's ALiBi cache dict; it is not needed here (the
        ALiBi bias is computed in the call) and is left untouched."""
        given = {
            "inference_params": inference_params,
            "softmax_offset": softmax_offset,
            "fp8": fp8 or None,
            "fp8_meta": fp8_meta,
            "quantizers": quantizers,
            "fp8_output": fp8_output or None,
        }
        for name, value in given.items():
            if value is not None:
                raise NotImplementedError(f"{_OWNER}.forward: {name} is not supported")
        if qkv_layout not in _LAYOUTS:
            raise ValueError(
                f"{_OWNER}.forward: qkv_layout: expected one of {_LAYOUTS}, got {qkv_layout!r}"
            )
        q, k, v = query_layer, key_layer, value_layer
        fmt = _impl.qkv_format_of(qkv_layout)
        mask = normalize_mask_type(_OWNER, attn_mask_type)
        window = check_set_window_size(mask, window_size)
        if (
            bottom_right_diagonal is False
            and mask in ("no_mask", "padding", "arbitrary")
            and (window != (-1, -1) or core_attention_bias_type == "alibi")
            and q.shape[-3 if fmt != "thd" else 0] != k.shape[-3 if fmt != "thd" else 0]
        ):
            raise NotImplementedError(
                f"{_OWNER}.forward: bottom_right_diagonal=False (top-left windows / ALiBi) for "
                f"mask {mask!r}: this library aligns them bottom-right"
            )
        mask, cu_q, cu_kv, max_q, max_kv = resolve_sequences(
            _OWNER,
            fmt,
            mask,
            q,
            k,
            attention_mask if mask != "arbitrary" else None,
            self.attention_type,
            cu_seqlens_q,
            cu_seqlens_kv,
            max_seqlen_q,
            max_seqlen_kv,
        )
        bias, slopes = check_bias(
            _OWNER,
            core_attention_bias_type,
            core_attention_bias,
            alibi_slopes,
            q,
            fmt,
            cu_q,
            max_q,
            max_kv,
        )
        p = self.attention_dropout if self.training else 0.0
        rng_state = _impl.draw_rng_state(q.device, self.attention_dropout_ctx) if p > 0 else None
        extra = {}
        if mask == "arbitrary":
            extra = {"attention_mask": attention_mask}
            mask = "no_mask"  # the mask tensor carries it; a window still applies
        return super().forward(
            q,
            k,
            v,
            qkv_layout,
            cu_q,
            cu_kv,
            max_q,
            max_kv,
            mask,
            window,
            core_attention_bias_type,
            bias,
            slopes,
            rng_state,
            **extra,
        )
