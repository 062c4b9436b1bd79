"""KV caching for inference (TE's transformer_engine.pytorch.attention.inference): InferenceParams,
TE's front object over a non-paged or paged cache manager (kv_cache.py), with TE's constructor,
attributes and bookkeeping (pre_step / step, cu_seqlens_q / cu_seqlens_kv, pre-step lengths).

TE's workflow::

    inference_params = InferenceParams(max_batch_size, max_sequence_length, num_heads_kv,
                                       head_dim_k, dtype, is_paged=..., qkv_format=...)
    for each iteration:
        inference_params.pre_step(OrderedDict({seq_id: new_tokens, ...}))   # batch order
        out = model(new_tokens, attn_mask_type="padding_causal", inference_params=inference_params)

Each attention layer (DotProductAttention with a layer_number) copies its new k/v into its cache
with step() and attends its new queries to the whole cached sequence, with the causal diagonal
aligned bottom-right (the new tokens are the last ones of their sequence).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from ..module.base import default_device
from .kv_cache import (
    CACHE_DTYPES,
    KVCacheManager,
    NonPagedKVCacheManager,
    PagedKVCacheManager,
    _check_format,
    _positive_int,
)

__all__ = ["InferenceParams", "KVCacheManager", "NonPagedKVCacheManager", "PagedKVCacheManager"]

_OWNER = "InferenceParams"


class InferenceParams:
    """KV caching for inference (TE's class).

    max_batch_size, max_sequence_length: the cache's capacity (sequences at once, tokens per
    sequence). num_heads_kv, head_dim_k, dtype: required (as TE >= 2.2); head_dim_v (default
    head_dim_k). dtype: float32, float16 or bfloat16 (an FP8 cache is not supported).
    is_paged: a paged cache of total_num_pages pages of page_size tokens (TE's rules:
    max_sequence_length % page_size == 0 and total_num_pages == max_batch_size *
    max_sequence_length / page_size). max_ctx_len: the longest context a step may bring, required
    for qkv_format 'thd' (TE's rule). qkv_format: the format of the incoming q/k/v ('bshd',
    'sbhd', 'thd'); the cache is always 'bshd' (cache_qkv_format). custom_cache_manager: a
    KVCacheManager subclass built with TE's keyword arguments instead of the default manager.
    """

    def __init__(
        self,
        max_batch_size: int,
        max_sequence_length: int,
        num_heads_kv: int | None = None,
        head_dim_k: int | None = None,
        dtype: torch.dtype | None = None,
        head_dim_v: int | None = None,
        is_paged: bool = False,
        total_num_pages: int | None = None,
        page_size: int | None = None,
        max_ctx_len: int | None = None,
        qkv_format: str = "bshd",
        custom_cache_manager: type[KVCacheManager] | None = None,
    ) -> None:
        if num_heads_kv is None or head_dim_k is None or dtype is None:
            raise ValueError(
                f"{_OWNER}: num_heads_kv, head_dim_k and dtype are required (since Transformer "
                f"Engine 2.2), got {num_heads_kv!r}, {head_dim_k!r}, {dtype!r}"
            )
        self.max_batch_size = _positive_int(_OWNER, "max_batch_size", max_batch_size)
        self.max_sequence_length = _positive_int(_OWNER, "max_sequence_length", max_sequence_length)
        self.num_heads_kv = _positive_int(_OWNER, "num_heads_kv", num_heads_kv)
        self.head_dim_k = _positive_int(_OWNER, "head_dim_k", head_dim_k)
        self.head_dim_v = _positive_int(
            _OWNER, "head_dim_v", head_dim_v if head_dim_v is not None else head_dim_k
        )
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{_OWNER}: dtype: expected a torch.dtype, got {dtype!r}")
        if dtype not in CACHE_DTYPES:
            raise NotImplementedError(
                f"{_OWNER}: dtype {dtype}: the KV cache holds float32, float16 or bfloat16 "
                "(no FP8 KV cache)"
            )
        self.dtype = dtype
        if not isinstance(is_paged, bool):
            raise ValueError(f"{_OWNER}: is_paged: expected a bool, got {is_paged!r}")
        self.is_paged = is_paged
        manager = custom_cache_manager
        if manager is not None and not (
            isinstance(manager, type) and issubclass(manager, KVCacheManager)
        ):
            raise ValueError(
                f"{_OWNER}: custom_cache_manager: expected a KVCacheManager subclass, got "
                f"{custom_cache_manager!r}"
            )
        common = {
            "num_heads": self.num_heads_kv,
            "head_dim_k": self.head_dim_k,
            "dtype": dtype,
            "head_dim_v": self.head_dim_v,
            "max_batch_size": self.max_batch_size,
            "max_seqlen": self.max_sequence_length,
        }
        if not is_paged:
            self.cache_manager = (custom_cache_manager or NonPagedKVCacheManager)(**common)
        else:
            self.page_size = _positive_int(_OWNER, "page_size", page_size)
            if max_sequence_length % page_size:
                raise ValueError(
                    f"{_OWNER}: a paged cache needs max_sequence_length % page_size == 0, got "
                    f"{max_sequence_length} and {page_size}"
                )
            want = max_batch_size * (max_sequence_length // page_size)
            if total_num_pages != want:
                raise ValueError(
                    f"{_OWNER}: total_num_pages: expected max_batch_size * max_sequence_length / "
                    f"page_size = {want}, got {total_num_pages!r}"
                )
            self.total_num_pages = total_num_pages
            self.cache_manager = (custom_cache_manager or PagedKVCacheManager)(
                total_num_pages=total_num_pages, page_size=page_size, **common
            )
        _check_format(_OWNER, qkv_format)
        if qkv_format == "thd":
            if max_ctx_len is None:
                raise ValueError(f"{_OWNER}: max_ctx_len is required when qkv_format='thd'")
        if max_ctx_len is not None:
            _positive_int(_OWNER, "max_ctx_len", max_ctx_len)
            if max_ctx_len > max_sequence_length:
                raise ValueError(
                    f"{_OWNER}: max_ctx_len: expected 1 <= max_ctx_len <= max_sequence_length "
                    f"({max_sequence_length}), got {max_ctx_len}"
                )
        self.max_ctx_len = max_ctx_len
        self.cache_qkv_format = "bshd"
        self.input_qkv_format = qkv_format
        self.output_qkv_format = self._output_format(qkv_format)
        self.sequences_pre_step: OrderedDict = OrderedDict()
        self.sequences: OrderedDict = OrderedDict()
        self.batch_size = 0
        dev = default_device()
        # Updated in place by pre_step (fixed addresses, as TE's; entries past batch_size repeat
        # the last offset: empty sequences).
        self.cu_seqlens_q = torch.zeros(max_batch_size + 1, dtype=torch.int32, device=dev)
        self.cu_seqlens_kv = torch.zeros(max_batch_size + 1, dtype=torch.int32, device=dev)
        # Cached length of each sequence before this step: the position of its first new token
        # (RoPE's start_positions during decoding).
        self.pre_step_seqlens = torch.zeros(max_batch_size, dtype=torch.int32, device=dev)
        self.step_lens: list[int] = []  # host copies of this step's new / cached lengths
        self.kv_lens: list[int] = []

    def _output_format(self, qkv_format: str) -> str:
        # TE's naming of q's format against the bshd cache: 'bshd', 'sbhd_2bshd', 'thd_2bshd'.
        if qkv_format == self.cache_qkv_format:
            return qkv_format
        return f"{qkv_format}_2{self.cache_qkv_format}"

    def reset(self) -> None:
        """Forget all sequences (the caches stay allocated; a paged cache frees its pages)."""
        self.sequences = OrderedDict()
        self.sequences_pre_step = OrderedDict()
        self.batch_size = 0
        self.step_lens, self.kv_lens = [], []
        self.cache_manager.reset()

    def __repr__(self) -> str:
        size = (
            f"total_pages={self.total_num_pages}, page_size={self.page_size}"
            if self.is_paged
            else f"max_batch_size={self.max_batch_size}, max_seqlen={self.max_sequence_length}"
        )
        return (
            f"dtype={self.dtype}, is_paged={self.is_paged}, {size}, num_heads={self.num_heads_kv}"
            f", head_dim_k={self.head_dim_k}, head_dim_v={self.head_dim_v}"
        )

    def allocate_memory(self, layer_number: int) -> None:
        """Allocate the k/v cache of one layer: [max_batch_size, max_sequence_length,
        num_heads_kv, head_dim] (non-paged) or [total_num_pages, page_size, num_heads_kv,
        head_dim] (paged). MultiheadAttention calls it on first use; call it yourself for a bare
        DotProductAttention."""
        if not isinstance(layer_number, int) or isinstance(layer_number, bool):
            raise ValueError(f"{_OWNER}: layer_number: expected an int, got {layer_number!r}")
        self.cache_manager.allocate_memory(layer_number)

    def pre_step(self, step_dict: OrderedDict) -> None:
        """Start an iteration: step_dict = {seq_id: number of new tokens}, in batch order (the
        sequences continuing from the last step in their order, then new ones). Sequences not
        in step_dict are finished and leave the cache."""
        if not isinstance(step_dict, dict):
            raise ValueError(
                f"{_OWNER}.pre_step: step_dict: expected an OrderedDict {{seq_id: step_len}}, "
                f"got {type(step_dict).__name__}"
            )
        if len(step_dict) > self.max_batch_size:
            raise ValueError(
                f"{_OWNER}.pre_step: step_dict: {len(step_dict)} sequences, more than "
                f"max_batch_size {self.max_batch_size}"
            )
        for seq, n in step_dict.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(
                    f"{_OWNER}.pre_step: step_dict[{seq!r}]: expected a token count >= 1, got "
                    f"{n!r}"
                )
        self.batch_size = len(step_dict)
        self.sequences = self.cache_manager.pre_step(step_dict)
        self.sequences_pre_step = OrderedDict(
            (s, n - step_dict[s]) for s, n in self.sequences.items()
        )
        self.step_lens = list(step_dict.values())
        self.kv_lens = list(self.sequences.values())
        pad = self.max_batch_size - self.batch_size
        pre = list(self.sequences_pre_step.values()) + [0] * pad
        self.pre_step_seqlens.copy_(torch.tensor(pre, dtype=torch.int32))
        for cu, lens in ((self.cu_seqlens_q, self.step_lens), (self.cu_seqlens_kv, self.kv_lens)):
            offsets = [0]
            for n in lens:
                offsets.append(offsets[-1] + n)
            cu.copy_(torch.tensor(offsets + [offsets[-1]] * pad, dtype=torch.int32))

    def get_seqlens_pre_step(self) -> torch.Tensor:
        """int32 [max_batch_size]: each sequence's cached length before this step."""
        return self.pre_step_seqlens

    def convert_paged_to_nonpaged(self, layer_number: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The paged k/v cache of layer_number as [batch_size, max_sequence_length, h, d]
        tensors (the pages of each sequence in order; a copy)."""
        if not self.is_paged:
            raise ValueError(f"{_OWNER}.convert_paged_to_nonpaged: the cache is not paged")
        k, v = self.cache_manager.cache[layer_number]
        table = self.cache_manager.page_table[: self.batch_size].long()
        return gather_pages(k, table), gather_pages(v, table)

    def step(
        self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor, qkv_format: str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, str]:
        """Copy this step's new k/v of layer_number (in qkv_format) into its cache. Returns
        (k_cache, v_cache, cu_seqlens_q, cu_seqlens_kv, max_sequence_length, qkv_format after
        the step: 'bshd', 'sbhd_2bshd' or 'thd_2bshd'), as TE: the caches in the manager's
        layout (non-paged: [b, max_sequence_length, h, d]; paged: the page pools)."""
        _check_format(f"{_OWNER}.step", qkv_format)
        self.input_qkv_format = qkv_format
        self.output_qkv_format = self._output_format(qkv_format)
        k_cache, v_cache = self.cache_manager.step(
            layer_number, new_k, new_v, self.cu_seqlens_q, self.cu_seqlens_kv, qkv_format
        )
        return (
            k_cache,
            v_cache,
            self.cu_seqlens_q,
            self.cu_seqlens_kv,
            self.max_sequence_length,
            self.output_qkv_format,
        )


def check_inference_params(owner: str, params: object) -> InferenceParams:
    """TypeError unless params is an InferenceParams."""
    if not isinstance(params, InferenceParams):
        raise TypeError(
            f"{owner}: inference_params: expected an InferenceParams, got {type(params).__name__}"
        )
    return params


def gather_pages(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """[b, pages * page_size, h, d] from a page pool [P, page_size, h, d] and a page table
    [b, pages] (the pages of each sequence, in order)."""
    b, n = table.shape
    return pool.index_select(0, table.reshape(-1)).view(b, n * pool.shape[1], *pool.shape[2:])


def attention_inputs(
    params: InferenceParams,
    layer_number: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qkv_format: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Any]:
    """DotProductAttention's KV-cache step: copies k/v into the cache and returns (q bshd
    [b, s_q, h, d], k and v bshd [b, s_kv, h_kv, d] over the cached sequences, cu_seqlens_q,
    cu_seqlens_kv ([b + 1]: this step's and the cached lengths), restore), restore(out) taking
    the attention output [b, s_q, h * d_v] back to q's format. Non-paged: k and v are views of
    the cache's first b rows (s_kv = max_sequence_length); paged: the pages of each sequence
    gathered up to the longest one (s_kv a multiple of page_size)."""
    owner = "DotProductAttention"
    mgr = params.cache_manager
    if layer_number not in mgr.cache:
        raise ValueError(
            f"{owner}: inference_params has no cache for layer_number {layer_number} (call "
            "inference_params.allocate_memory(layer_number) first)"
        )
    if params.batch_size == 0:
        raise ValueError(f"{owner}: inference_params: call pre_step() before the forward")
    if qkv_format == "thd":
        b = params.batch_size
    else:
        b = q.shape[0] if qkv_format == "bshd" else q.shape[1]
        if not params.batch_size <= b <= params.max_batch_size:
            raise ValueError(
                f"{owner}: query_layer: batch {b} ({qkv_format}) for an inference step of "
                f"{params.batch_size} sequences (max_batch_size {params.max_batch_size})"
            )
    k_cache, v_cache, cu_q, cu_kv, _, _ = params.step(layer_number, k, v, qkv_format)
    cu_q, cu_kv = cu_q[: b + 1], cu_kv[: b + 1]
    longest = max(params.kv_lens)
    if params.is_paged:
        pages = -(-longest // params.page_size)
        table = mgr.page_table[:b, :pages].long()
        k_cache, v_cache = gather_pages(k_cache, table), gather_pages(v_cache, table)
    else:
        # The whole rows: a contiguous view, no copy; the flash kernel reads each sequence's
        # cached length only (the unfused backend trims them, DotProductAttention).
        k_cache, v_cache = k_cache[:b], v_cache[:b]
    if qkv_format == "bshd":
        return q, k_cache, v_cache, cu_q, cu_kv, lambda out: out
    if qkv_format == "sbhd":
        sbhd = lambda out: out.transpose(0, 1).contiguous()  # noqa: E731
        return q.transpose(0, 1), k_cache, v_cache, cu_q, cu_kv, sbhd
    # thd: the new tokens of each sequence padded to [b, longest step, h, d] and back
    s_q = max(params.step_lens)
    row = _thd_rows(params.step_lens, q.shape[0], s_q, q.device)
    qp = q.new_zeros((b * s_q + 1, *q.shape[1:])).index_copy_(0, row, q)[:-1]

    def restore(out: torch.Tensor) -> torch.Tensor:
        flat = torch.cat((out.reshape(b * s_q, -1), out.new_zeros((1, out.shape[-1]))))
        return flat.index_select(0, row)

    return qp.view(b, s_q, *q.shape[1:]), k_cache, v_cache, cu_q, cu_kv, restore


def _thd_rows(lens: list[int], tokens: int, s_q: int, device: torch.device) -> torch.Tensor:
    """Row of each thd token in a padded [b * s_q (+1 spare), ...] buffer; tokens past the
    step's last sequence (padding a fixed-size input) map to the spare row b * s_q."""
    rows = [i * s_q + j for i, n in enumerate(lens) for j in range(n)]
    rows += [len(lens) * s_q] * (tokens - len(rows))
    return torch.tensor(rows, dtype=torch.long, device=device)
