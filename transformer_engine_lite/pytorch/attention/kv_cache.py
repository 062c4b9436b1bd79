"""TE's KV cache managers (transformer_engine.pytorch.attention.inference: KVCacheManager,
NonPagedKVCacheManager, PagedKVCacheManager), with TE's names, shapes and bookkeeping;
InferenceParams (inference.py) drives them.

Workflow (TE's): per iteration the caller names the sequences in the batch and how many new tokens
each brings, `inference_params.pre_step(OrderedDict({seq_id: step_len}))`, then runs the model with
`inference_params=`; each attention layer calls `step(layer_number, new_k, new_v, qkv_format)`,
which copies the new tokens into that layer's cache and returns the whole cache (bshd) with the
cumulative lengths (new tokens, cached tokens after the copy) that the attention reads. A sequence
missing from step_dict is finished: its slot (non-paged) or pages (paged) are freed.

Batch order contract (TE's): row i of the new q/k/v is the i-th sequence of `sequences` after
pre_step: the continuing sequences in their previous order, then the new ones in step_dict order.
pre_step checks that step_dict lists them in that order (TE would silently attend to the wrong
cache rows). Continuing sequences may bring more than one token per step (TE advances them by
exactly 1; with step_len 1 both agree).

The copies are torch index ops on the tensors' device (index lists built on the host from the
lengths pre_step keeps there), so they run on the CPU and any GPU alike.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, defaultdict
from typing import Any

import torch

from ..module.base import default_device

__all__ = ["KVCacheManager", "NonPagedKVCacheManager", "Page", "PagedKVCacheManager"]

QKV_FORMATS = ("bshd", "sbhd", "thd")
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _positive_int(owner: str, name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}: {name}: expected an int >= 1, got {value!r}")
    return value


def _check_format(owner: str, qkv_format: object) -> str:
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"{owner}: qkv_format: expected one of {QKV_FORMATS}, got {qkv_format!r}")
    return qkv_format  # type: ignore[return-value]


def _host_lens(cu: torch.Tensor, b: int) -> list[int]:
    host = cu[: b + 1].tolist()
    return [host[i + 1] - host[i] for i in range(b)]


def _new_tokens(
    qkv_format: str, new_shape: tuple, new_lens: list[int], cached_lens: list[int], device: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src, seq, pos) for every new token, as long tensors on `device`: its row in new_k
    flattened to [rows, h, d] (bshd: i * s + j; sbhd: j * b + i; thd: packed, cu_new[i] + j),
    its batch index i, and its position in its sequence (cached length before the step + j)."""
    # Built from the host lengths (torch.repeat_interleave costs ~20 ms a call on a loaded CPU,
    # more than a decode step's whole attention).
    seq_host = [i for i, n in enumerate(new_lens) for _ in range(n)]
    j_host = [j for n in new_lens for j in range(n)]
    seq = torch.tensor(seq_host, dtype=torch.long, device=device)
    j = torch.tensor(j_host, dtype=torch.long, device=device)
    total = len(seq_host)
    if qkv_format == "bshd":
        src = seq * new_shape[1] + j
    elif qkv_format == "sbhd":
        src = j * new_shape[1] + seq
    else:
        src = torch.arange(total, device=device)
    before = torch.tensor(
        [c - n for c, n in zip(cached_lens, new_lens)], dtype=torch.long, device=device
    )
    return src, seq, before[seq] + j


def _scatter(
    new: torch.Tensor, cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor
) -> None:
    """cache rows dst (cache flattened to [rows, h, d]) = new rows src. Outside autograd, as TE's
    copy kernel: an in-place copy of a tensor that requires grad would chain every step's graph
    (activations, weights' copies) onto the cache and keep it alive for the whole generation."""
    with torch.no_grad():
        rows = new.detach().reshape(-1, *new.shape[-2:]).index_select(0, src)
        cache.view(-1, *cache.shape[-2:]).index_copy_(0, dst, rows)


def _check_new_kv(
    owner: str,
    new_k: torch.Tensor,
    new_v: torch.Tensor,
    qkv_format: str,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    new_lens: list[int],
) -> None:
    _check_format(owner, qkv_format)
    nd = 3 if qkv_format == "thd" else 4
    for name, t, cache in (("new_k", new_k, k_cache), ("new_v", new_v, v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != nd:
            raise ValueError(
                f"{owner}: {name}: expected a {nd}-D tensor in '{qkv_format}', got "
                f"{getattr(t, 'shape', t)!r}"
            )
        if tuple(t.shape[-2:]) != tuple(cache.shape[-2:]):
            raise ValueError(
                f"{owner}: {name}: expected [..., {cache.shape[-2]} heads, {cache.shape[-1]}] "
                f"(the cache's num_heads_kv, head dim), got {tuple(t.shape)}"
            )
        if t.dtype != cache.dtype or t.device != cache.device:
            raise TypeError(
                f"{owner}: {name}: expected {cache.dtype} on {cache.device} (the cache's), got "
                f"{t.dtype} on {t.device}"
            )
    if qkv_format == "thd":
        if new_k.shape[0] < sum(new_lens):
            raise ValueError(
                f"{owner}: new_k: {new_k.shape[0]} tokens, fewer than the {sum(new_lens)} new "
                "tokens pre_step was given"
            )
    else:
        b, s = (new_k.shape[0], new_k.shape[1]) if qkv_format == "bshd" else new_k.shape[1::-1]
        if b < len(new_lens) or (new_lens and max(new_lens) > s):
            raise ValueError(
                f"{owner}: new_k: '{qkv_format}' shape {tuple(new_k.shape)} does not hold the "
                f"step: {len(new_lens)} sequences with up to {max(new_lens, default=0)} new tokens"
            )


class KVCacheManager:
    """TE's base cache manager: `cache[layer_number] = (k_cache, v_cache)` and `sequences`
    ({seq_id: cached length}); subclasses allocate and fill the caches."""

    def __init__(self) -> None:
        self.cache: dict[int, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        self.sequences: OrderedDict = OrderedDict()
        self._step_lens: list[int] = []  # this step's new tokens per sequence (pre_step's)

    def reset(self) -> None:
        """Forget all sequences (the cache tensors stay allocated)."""
        self.sequences = OrderedDict()

    def allocate_memory(self, layer_number: int) -> None:
        """Allocate the cache of one layer."""
        self.cache[layer_number] = (None, None)

    def pre_step(self, step_dict: OrderedDict) -> OrderedDict:
        """Update the tracked sequences for the next step(); returns them."""
        return self.sequences

    def step(
        self,
        layer_number: int,
        new_k: torch.Tensor,
        new_v: torch.Tensor,
        cu_new_seqlens: torch.Tensor,
        cu_cached_seqlens: torch.Tensor,
        qkv_format: str,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Copy the new tokens into the cache of layer_number; returns (k_cache, v_cache)."""
        return self.cache[layer_number]

    def _advance(self, step_dict: OrderedDict) -> tuple[list, list]:
        """TE's sequence update shared by both managers: drop the finished sequences, advance the
        continuing ones by their step length, append the new ones (step_dict order). Returns
        (finished seq ids, new seq ids)."""
        finished = [s for s in self.sequences if s not in step_dict]
        new = [s for s in step_dict if s not in self.sequences]
        order = [s for s in self.sequences if s in step_dict] + new
        owner = f"{type(self).__name__}.pre_step"
        if order != list(step_dict):
            raise ValueError(
                f"{owner}: step_dict: expected the sequences in batch order {order} (continuing "
                f"ones in their previous order, then new ones), got {list(step_dict)}"
            )
        lens = {s: self.sequences.get(s, 0) + n for s, n in step_dict.items()}
        cap = getattr(self, "max_seqlen", None)
        too_long = {s: n for s, n in lens.items() if cap is not None and n > cap}
        if too_long:
            raise ValueError(
                f"{owner}: sequences {too_long} would exceed max_sequence_length {cap}"
            )
        self.sequences = OrderedDict(lens)
        self._step_lens = list(step_dict.values())
        return finished, new

    def _step_lengths(
        self, cu_new_seqlens: torch.Tensor, cu_cached_seqlens: torch.Tensor, n: int
    ) -> tuple[list[int], list[int]]:
        """(new tokens, cached tokens after the step) of the n sequences, as host lists: read off
        the cumulative lengths step() is given (TE's interface). Under torch.compile that read is
        data-dependent (a host sync no graph can hold), so the lengths pre_step() recorded on the
        host are used instead -- the same numbers InferenceParams builds those tensors from. They
        become constants of the graph: dynamo recompiles when they change."""
        if torch.compiler.is_compiling():
            return list(self._step_lens), list(self.sequences.values())
        return _host_lens(cu_new_seqlens, n), _host_lens(cu_cached_seqlens, n)


class NonPagedKVCacheManager(KVCacheManager):
    """One cache row per batch slot: k_cache [max_batch_size, max_seqlen, num_heads, head_dim_k]
    (v likewise with head_dim_v). Batch slot i holds the i-th tracked sequence; when sequences
    finish, the continuing ones are moved to the front (TE's batch_indices / re-indexing)."""

    def __init__(
        self,
        max_batch_size: int,
        max_seqlen: int,
        num_heads: int,
        head_dim_k: int,
        dtype: torch.dtype,
        head_dim_v: int | None = None,
    ) -> None:
        super().__init__()
        self.max_batch_size = max_batch_size
        self.max_seqlen = max_seqlen
        self.num_heads = num_heads
        self.head_dim_k = head_dim_k
        self.dtype = dtype
        self.head_dim_v = head_dim_v if head_dim_v is not None else head_dim_k
        dev = default_device()
        # TE's names: the old slot of each tracked sequence (continuing ones first), and the
        # identity the slots have after re-indexing.
        self.batch_indices = torch.zeros(max_batch_size, dtype=torch.int32, device=dev)
        self.batch_indices_post_step = torch.arange(max_batch_size, dtype=torch.int32, device=dev)
        self.need_reindex = True
        self._moves: list[int] = []  # old slots of the continuing sequences, in their new order
        self._reindexed: set[int] = set()  # layers already re-indexed in this step

    def allocate_memory(self, layer_number: int) -> None:
        """Allocate zeroed k/v caches of layer_number (TE's shapes)."""
        dev = default_device()
        shape = (self.max_batch_size, self.max_seqlen, self.num_heads)
        k = torch.zeros(*shape, self.head_dim_k, dtype=self.dtype, device=dev)
        v = torch.zeros(*shape, self.head_dim_v, dtype=self.dtype, device=dev)
        # Updated in place: fixed addresses, as TE marks them (CUDA graphs / torch.compile).
        torch._dynamo.mark_static_address(k)
        torch._dynamo.mark_static_address(v)
        self.cache[layer_number] = (k, v)

    def pre_step(self, step_dict: OrderedDict) -> OrderedDict:
        """Track the step's sequences; finished ones free their slot (see the class)."""
        prev = list(self.sequences)
        continuing = [i for i, s in enumerate(prev) if s in step_dict]
        finished_idx = [i for i, s in enumerate(prev) if s not in step_dict]
        order = continuing + finished_idx + list(range(len(prev), self.max_batch_size))
        self._advance(step_dict)  # validates step_dict before anything changes
        self.batch_indices.copy_(torch.tensor(order, dtype=torch.int32))
        self.need_reindex = set(self.sequences) != set(prev)
        self._moves = continuing if continuing != list(range(len(continuing))) else []
        self._reindexed = set()
        return self.sequences

    def step(
        self,
        layer_number: int,
        new_k: torch.Tensor,
        new_v: torch.Tensor,
        cu_new_seqlens: torch.Tensor,
        cu_cached_seqlens: torch.Tensor,
        qkv_format: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy the new tokens of layer_number into its cache; returns (k_cache[:b],
        v_cache[:b]) bshd, b the batch of new_k (bshd / sbhd) or max_batch_size (thd), as TE."""
        owner = "NonPagedKVCacheManager.step"
        if layer_number not in self.cache:
            raise ValueError(f"{owner}: layer_number {layer_number} has no cache (allocate_memory)")
        k_cache, v_cache = self.cache[layer_number]
        n = len(self.sequences)
        new_lens, cached_lens = self._step_lengths(cu_new_seqlens, cu_cached_seqlens, n)
        _check_new_kv(owner, new_k, new_v, qkv_format, k_cache, v_cache, new_lens)
        if self._moves and layer_number not in self._reindexed:
            # Continuing sequences move to the front slots; index_select copies first, so the
            # overlapping source and destination rows are safe. Only the cached prefix moves.
            old = torch.tensor(self._moves, dtype=torch.long, device=k_cache.device)
            prefix = max(c - m for c, m in zip(cached_lens, new_lens))
            if prefix > 0:
                u = len(self._moves)
                with torch.no_grad():
                    k_cache[:u, :prefix] = k_cache.index_select(0, old)[:, :prefix]
                    v_cache[:u, :prefix] = v_cache.index_select(0, old)[:, :prefix]
        self._reindexed.add(layer_number)
        src, seq, pos = _new_tokens(
            qkv_format, tuple(new_k.shape), new_lens, cached_lens, k_cache.device
        )
        if src.numel():
            dst = seq * self.max_seqlen + pos  # slot i holds the i-th sequence
            _scatter(new_k, k_cache, src, dst)
            _scatter(new_v, v_cache, src, dst)
        b = self.max_batch_size
        if qkv_format == "bshd":
            b = new_k.shape[0]
        elif qkv_format == "sbhd":
            b = new_k.shape[1]
        return k_cache[:b], v_cache[:b]


class Page:
    """TE's page record: a page id and whether it is allocated."""

    def __init__(self, page_id: int) -> None:
        self.page_id = page_id
        self.allocated = False

    def allocate_page(self) -> None:
        """Mark the page in use."""
        self.allocated = True

    def deallocate_page(self) -> None:
        """Mark the page free."""
        self.allocated = False


class PagedKVCacheManager(KVCacheManager):
    """A pool of pages: k_cache [total_num_pages, page_size, num_heads, head_dim_k] (v likewise);
    each sequence owns whole pages, listed in page_table [max_batch_size, max_pages_per_seq]
    (row i: the i-th tracked sequence, unused entries 0). Pages are taken from the free list
    (first free first) as sequences grow and returned when they finish."""

    def __init__(
        self,
        total_num_pages: int,
        page_size: int,
        num_heads: int,
        head_dim_k: int,
        dtype: torch.dtype,
        max_batch_size: int,
        max_seqlen: int,
        head_dim_v: int | None = None,
    ) -> None:
        super().__init__()
        self.total_num_pages = total_num_pages
        self.page_size = page_size
        self.num_heads = num_heads
        self.head_dim_k = head_dim_k
        self.dtype = dtype
        self.max_batch_size = max_batch_size
        self.max_seqlen = max_seqlen
        self.max_pages_per_seq = max_seqlen // page_size
        self.head_dim_v = head_dim_v if head_dim_v is not None else head_dim_k
        self.free_pages = [Page(i) for i in range(total_num_pages)]
        self.allocated_pages: defaultdict = defaultdict(list)
        self.page_table = torch.zeros(
            max_batch_size, self.max_pages_per_seq, dtype=torch.int32, device=default_device()
        )

    def reset(self) -> None:
        """Forget all sequences and free every page."""
        self.sequences = OrderedDict()
        self.free_pages = [Page(i) for i in range(self.total_num_pages)]
        self.allocated_pages = defaultdict(list)
        self.page_table.fill_(0)

    def allocate_memory(self, layer_number: int) -> None:
        """Allocate zeroed k/v page pools of layer_number (TE's shapes)."""
        dev = default_device()
        shape = (self.total_num_pages, self.page_size, self.num_heads)
        k = torch.zeros(*shape, self.head_dim_k, dtype=self.dtype, device=dev)
        v = torch.zeros(*shape, self.head_dim_v, dtype=self.dtype, device=dev)
        torch._dynamo.mark_static_address(k)
        torch._dynamo.mark_static_address(v)
        self.cache[layer_number] = (k, v)

    def print_cache(self) -> None:
        """Log the pool's state at DEBUG level (logger "PagedKVCacheManager", TE's)."""
        logger = logging.getLogger("PagedKVCacheManager")
        used = [self.get_page_count(s) for s in self.sequences]
        logger.debug("Cache status:")
        logger.debug(
            "  total pages:     %s (used %s, free %s)",
            self.total_num_pages,
            sum(used),
            len(self.free_pages),
        )
        logger.debug("  total sequences: %s", self.get_sequence_count())
        lens = self.get_sequence_lengths()
        for i, s in enumerate(self.sequences):
            logger.debug(
                "  >> batch index %s: seq_id %s, num_tokens %s, num_pages %s, page_list %s",
                i,
                s,
                lens[i],
                self.get_page_count(s),
                self.get_page_list(s),
            )

    def get_sequence_count(self) -> int:
        """Number of tracked sequences."""
        return len(self.sequences)

    def get_sequence_lengths(self) -> list[int]:
        """Cached length of each tracked sequence, in batch order."""
        return list(self.sequences.values())

    def has_free_page(self) -> bool:
        """Whether a page is free."""
        return len(self.free_pages) > 0

    def get_page_count(self, seq: int) -> int:
        """Pages owned by sequence seq."""
        return len(self.allocated_pages.get(seq, []))

    def get_page_list(self, seq: int) -> list[int]:
        """Page ids owned by sequence seq, in token order."""
        return [p.page_id for p in self.allocated_pages.get(seq, [])]

    def get_page_table(self, sequences: list[int]) -> torch.Tensor:
        """Fill page_table's first rows from `sequences` (zero-padded); returns page_table."""
        rows = [
            self.get_page_list(s) + [0] * (self.max_pages_per_seq - self.get_page_count(s))
            for s in sequences
        ]
        if rows:
            self.page_table[: len(rows)].copy_(torch.tensor(rows, dtype=torch.int32))
        return self.page_table

    def allocate_page(self, seq: int) -> None:
        """Give sequence seq the first free page (RuntimeError when none is free, TE's)."""
        if not self.has_free_page():
            raise RuntimeError("KV cache is full!")
        page = self.free_pages.pop(0)
        page.allocate_page()
        self.allocated_pages[seq].append(page)

    def allocate_sequence(self, seq: int, context_len: int) -> None:
        """Allocate the pages a new sequence of context_len tokens needs."""
        for _ in range(-(-context_len // self.page_size)):
            self.allocate_page(seq)

    def deallocate_sequence(self, seq: int) -> None:
        """Return every page of sequence seq to the free list."""
        for page in self.allocated_pages.pop(seq, []):
            page.deallocate_page()
            self.free_pages.append(page)

    def pre_step(self, step_dict: OrderedDict) -> OrderedDict:
        """Track the step's sequences: finished ones free their pages, growing ones get pages
        for their new tokens, new ones pages for their context; then the page table."""
        finished, new = self._advance(step_dict)
        for s in finished:
            self.deallocate_sequence(s)
        for s, n in self.sequences.items():
            if s in new:
                self.allocate_sequence(s, n)
            else:
                while self.get_page_count(s) * self.page_size < n:
                    self.allocate_page(s)
        self.page_table = self.get_page_table(list(self.sequences))
        return self.sequences

    def step(
        self,
        layer_number: int,
        new_k: torch.Tensor,
        new_v: torch.Tensor,
        cu_new_seqlens: torch.Tensor,
        cu_cached_seqlens: torch.Tensor,
        qkv_format: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy the new tokens of layer_number into their pages; returns the page pools
        (k_cache, v_cache), [total_num_pages, page_size, h, d]."""
        owner = "PagedKVCacheManager.step"
        if layer_number not in self.cache:
            raise ValueError(f"{owner}: layer_number {layer_number} has no cache (allocate_memory)")
        k_cache, v_cache = self.cache[layer_number]
        n = len(self.sequences)
        new_lens, cached_lens = self._step_lengths(cu_new_seqlens, cu_cached_seqlens, n)
        _check_new_kv(owner, new_k, new_v, qkv_format, k_cache, v_cache, new_lens)
        src, seq, pos = _new_tokens(
            qkv_format, tuple(new_k.shape), new_lens, cached_lens, k_cache.device
        )
        if src.numel():
            table = self.page_table.to(k_cache.device).long()
            page = table[seq, pos // self.page_size]
            dst = page * self.page_size + pos % self.page_size
            _scatter(new_k, k_cache, src, dst)
            _scatter(new_v, v_cache, src, dst)
        return k_cache, v_cache
