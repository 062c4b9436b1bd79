"""DotProductAttention's declared packed inputs (TE main's qkv_layer / kv_layer /
qkv_interleave_dim) and the calls that cannot be traced by torch.compile.

Packed q/k/v handed over as plain views are recognised from their memory (inputs.detect_qkv_layout
reads data pointers), which torch.compile cannot do; declaring the packing instead names the
layout up front (bshd + 3 at dim -3 -> bs3hd, at -2 -> bsh3d; thd + 2 at -2 -> thd_th2d), so the
same call traces. needs_eager_dpa lists what still has to run as an eager island (TE's list, for
the features this library has).
"""

from __future__ import annotations

from typing import Any

import torch


__all__ = ["layout_needs_detection", "needs_eager_dpa", "unpack_packed_qkv"]

_OWNER = "DotProductAttention"


def layout_needs_detection(*qkv: torch.Tensor | None) -> bool:
    """Whether the layout of q/k/v can only be told from their memory: some tensor is strided
    and does not cover its whole storage (size() in bytes), i.e. may be a slice of a packed
    buffer."""
    return any(
        isinstance(t, torch.Tensor)
        and not t.is_contiguous()
        and t.untyped_storage().size() != t.numel() * t.element_size()
        for t in qkv
    )


def needs_eager_dpa(call: dict[str, Any]) -> str | None:
    """Why this DotProductAttention.forward call runs outside the compiled graph, or None (the
    `when` of jit.no_torch_dynamo; `call` maps forward's parameter names to the arguments given,
    `self` included)."""
    module = call["self"]
    fmt = call.get("qkv_format") or module.qkv_format
    if fmt == "thd" and (call.get("max_seqlen_q") is None or call.get("max_seqlen_kv") is None):
        # the maximum is read off cu_seqlens: a device value, data-dependent while tracing
        return "deriving max_seqlen from cu_seqlens"
    if call.get("qkv_layer") is None and call.get("kv_layer") is None:
        names = ("query_layer", "key_layer", "value_layer")
        if layout_needs_detection(*(call.get(n) for n in names)):
            return "detecting packed q/k/v that were not declared via qkv_layer/kv_layer"
    if module.attention_dropout_ctx is not None and module.attention_dropout > 0:
        # the tracker's fork swaps the global generator state, which dynamo does not trace
        return "attention dropout under an RNG states tracker"
    return None


def unpack_packed_qkv(
    qkv_layer: torch.Tensor | None,
    kv_layer: torch.Tensor | None,
    query_layer: torch.Tensor | None,
    key_layer: torch.Tensor | None,
    value_layer: torch.Tensor | None,
    qkv_format: str,
    qkv_interleave_dim: int,
    inference_params: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str | None]:
    """(q, k, v, declared layout): q/k/v as they were given (layout None) or as views of the
    declared packed buffer, with the layout the declaration names."""
    if qkv_layer is None and kv_layer is None:
        missing = [
            n
            for n, t in (("query_layer", query_layer), ("key_layer", key_layer),
                         ("value_layer", value_layer))
            if t is None
        ]
        if missing:
            raise ValueError(
                f"{_OWNER}.forward: {', '.join(missing)}: required unless a packed input is given "
                "(qkv_layer, or query_layer with kv_layer)"
            )
        return query_layer, key_layer, value_layer, None
    if qkv_layer is not None and kv_layer is not None:
        raise ValueError(f"{_OWNER}.forward: qkv_layer and kv_layer: give one, got both")
    if inference_params is not None:
        raise ValueError(
            f"{_OWNER}.forward: qkv_layer/kv_layer with inference_params: the KV cache takes "
            "separate query/key/value tensors"
        )
    if isinstance(qkv_interleave_dim, bool) or qkv_interleave_dim not in (-3, -2):
        raise ValueError(
            f"{_OWNER}.forward: qkv_interleave_dim: expected -3 (e.g. bs3hd) or -2 (e.g. bsh3d), "
            f"got {qkv_interleave_dim!r}"
        )
    packed = qkv_layer if qkv_layer is not None else kv_layer
    name = "qkv_layer" if qkv_layer is not None else "kv_layer"
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{_OWNER}.forward: {name}: expected a torch.Tensor, got {type(packed)}")
    # The layout string describes the buffer's memory: its innermost dim must be dense (the
    # check the kernels' stride validation would otherwise fail with a less direct message).
    if packed.dim() < 1 or packed.stride(-1) != 1:
        raise ValueError(
            f"{_OWNER}.forward: {name}: expected stride 1 in the last dimension, got strides "
            f"{tuple(packed.stride())}"
        )
    pos = len(qkv_format) + qkv_interleave_dim + 1  # where the 3 or 2 goes in the format string

    def packed_format(n: int) -> str:
        return qkv_format[:pos] + str(n) + qkv_format[pos:]

    if qkv_layer is not None:
        given = [n for n, t in (("query_layer", query_layer), ("key_layer", key_layer),
                                ("value_layer", value_layer)) if t is not None]
        if given:
            raise ValueError(
                f"{_OWNER}.forward: {', '.join(given)}: expected None with qkv_layer (it packs "
                "Q, K and V)"
            )
        rank = 4 if qkv_format == "thd" else 5
        if qkv_layer.dim() != rank:
            raise ValueError(
                f"{_OWNER}.forward: qkv_layer: expected a {rank}-D tensor for qkv_format "
                f"{qkv_format!r}, got shape {tuple(qkv_layer.shape)}"
            )
        if qkv_layer.shape[qkv_interleave_dim] != 3:
            raise ValueError(
                f"{_OWNER}.forward: qkv_layer: expected size 3 at dim {qkv_interleave_dim} "
                f"(qkv_interleave_dim), got shape {tuple(qkv_layer.shape)}"
            )
        q, k, v = (qkv_layer.select(qkv_interleave_dim, i) for i in range(3))
        return q, k, v, packed_format(3)
    if query_layer is None:
        raise ValueError(f"{_OWNER}.forward: query_layer: required with kv_layer (it packs K, V)")
    if key_layer is not None or value_layer is not None:
        raise ValueError(
            f"{_OWNER}.forward: key_layer/value_layer: expected None with kv_layer (it packs K "
            "and V)"
        )
    if kv_layer.dim() != query_layer.dim() + 1:
        raise ValueError(
            f"{_OWNER}.forward: kv_layer: expected {query_layer.dim() + 1} dims (query_layer's + "
            f"1), got shape {tuple(kv_layer.shape)}"
        )
    if kv_layer.shape[qkv_interleave_dim] != 2:
        raise ValueError(
            f"{_OWNER}.forward: kv_layer: expected size 2 at dim {qkv_interleave_dim} "
            f"(qkv_interleave_dim), got shape {tuple(kv_layer.shape)}"
        )
    k, v = (kv_layer.select(qkv_interleave_dim, i) for i in range(2))
    return query_layer, k, v, f"{qkv_format}_{packed_format(2)}"
