"""TE-JAX's attention API (`transformer_engine.jax.attention`) on the C core.

- Enums with TE's names (AttnBiasType, AttnMaskType, AttnSoftmaxType, QKVFormat, QKVLayout,
  CPStrategy), `SequenceDescriptor`, `canonicalize_attn_mask_type`.
- `is_fused_attn_kernel_available(...)` (TE's signature) asks the C selection
  (nvte_fused_attn_backend_reasons, common/attention_selection.py, shared with PyTorch): True when
  a fused backend (flash here; CK / AOTriton on ROCm builds) can run the configuration.
- `fused_attn(...)` (TE's signature) runs the backend the selection picks, so the NVTE switches
  (NVTE_FUSED_ATTN, NVTE_FLASH_ATTN, NVTE_UNFUSED_ATTN, ...) apply as in PyTorch and
  NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 logs "Disabling X due to ..." / "Selected backend = ...":
  - flash: the fused primitives (cpp_extensions/attention.py) under jax.custom_vjp; the backward
    recomputes from the saved softmax LSE;
  - unfused: `unfused_attn`, JAX GEMMs around the core's fused softmax ops (the only backend for
    pre_scale_bias), dropping the same logits as flash (the kernel's Philox keep mask).
- Dropout: `seed` is a JAX PRNG key (typed or raw uint32 [2], or TE's per-device [n, 2]: row 0); its
  two words are the Philox seed, the offset is 0.
- Masking follows fused_attn.h: causal / padding_causal top-left aligned, the others bottom-right;
  a query with no key kept (and every padded query) gets output 0 and gradient 0.
- Context parallelism (context_parallel_strategy / _causal_load_balanced / _axis, TE's CPStrategy
  ALL_GATHER and RING; `reorder_causal_load_balancing`): cpp_extensions/attention_cp.py; thd
  layouts (segment ids in the striped order): ALL_GATHER with `stripe_size` in
  cpp_extensions/attention_cp_thd.py, RING (stripe_size 1) in attention_cp_thd_ring.py.
Not supported (NotImplementedError): score_mod.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ..common import attention_selection as selection
from ..common import capi, config
from .attention_score_mod import check_score_mod_args
from .cpp_extensions import attention as tex_attn
from .cpp_extensions import attention_cp, attention_cp_thd
from .cpp_extensions.attention import AttnSoftmaxType  # TE defines it at the primitive level
from .cpp_extensions.attention_cp import (ReorderStrategy, inverse_reorder_causal_load_balancing,
                                          reorder_causal_load_balancing)
from .cpp_extensions.attention_reference import dropout_keep, logits, problem
from .attention_mask_helpers import make_swa_mask, run_length_fill  # TE-JAX exports them here
from .softmax import SoftmaxFusionType
from .softmax import softmax as _softmax

__all__ = [
    "AttnBiasType",
    "AttnMaskType",
    "AttnSoftmaxType",
    "CPStrategy",
    "QKVFormat",
    "QKVLayout",
    "ReorderStrategy",
    "SequenceDescriptor",
    "attention_backend",
    "canonicalize_attn_mask_type",
    "fused_attn",
    "inverse_reorder_causal_load_balancing",
    "is_fused_attn_kernel_available",
    "make_swa_mask",
    "reorder_causal_load_balancing",
    "run_length_fill",
    "unfused_attn",
]

_I32 = jnp.int32


# ------------------------------------------------------------------------------------ enums
class AttnBiasType(Enum):
    NO_BIAS = "no_bias"
    PRE_SCALE_BIAS = "pre_scale_bias"
    POST_SCALE_BIAS = "post_scale_bias"


class AttnMaskType(Enum):
    NO_MASK = "no_mask"
    PADDING_MASK = "padding"
    CAUSAL_MASK = "causal"
    PADDING_CAUSAL_MASK = "padding_causal"
    CAUSAL_BOTTOM_RIGHT_MASK = "causal_bottom_right"
    PADDING_CAUSAL_BOTTOM_RIGHT_MASK = "padding_causal_bottom_right"

    def is_causal(self) -> bool:
        return "causal" in self.value

    def is_padding(self) -> bool:
        return "padding" in self.value

    def is_bottom_right(self) -> bool:
        return "bottom_right" in self.value


class QKVFormat(Enum):
    SBHD = "sbhd"
    BSHD = "bshd"
    THD = "thd"


class QKVLayout(Enum):
    BS3HD = "bs3hd"
    BSHD_BS2HD = "bshd_bs2hd"
    BSHD_BSHD_BSHD = "bshd_bshd_bshd"
    T3HD = "t3hd"
    THD_T2HD = "thd_t2hd"
    THD_THD_THD = "thd_thd_thd"

    def get_qkv_format(self) -> QKVFormat:
        return QKVFormat.THD if self.is_thd() else QKVFormat.BSHD

    def is_qkvpacked(self) -> bool:
        return self in (QKVLayout.BS3HD, QKVLayout.T3HD)

    def is_kvpacked(self) -> bool:
        return self in (QKVLayout.BSHD_BS2HD, QKVLayout.THD_T2HD)

    def is_separate(self) -> bool:
        return self in (QKVLayout.BSHD_BSHD_BSHD, QKVLayout.THD_THD_THD)

    def is_thd(self) -> bool:
        return self.value.startswith("t")

    def to_qkvpacked(self) -> QKVLayout:
        return QKVLayout.T3HD if self.is_thd() else QKVLayout.BS3HD

    def to_kvpacked(self) -> QKVLayout:
        return QKVLayout.THD_T2HD if self.is_thd() else QKVLayout.BSHD_BS2HD

    def to_separate(self) -> QKVLayout:
        return QKVLayout.THD_THD_THD if self.is_thd() else QKVLayout.BSHD_BSHD_BSHD


class CPStrategy(Enum):
    DEFAULT = 0
    ALL_GATHER = 1
    RING = 2


_MASK_ALIASES = {
    "causal_padding": "padding_causal",
    "bottom_right_causal": "causal_bottom_right",
    "causal_padding_bottom_right": "padding_causal_bottom_right",
    "bottom_right_causal_padding": "padding_causal_bottom_right",
    "bottom_right_padding_causal": "padding_causal_bottom_right",
}


def canonicalize_attn_mask_type(attn_mask_type: str) -> AttnMaskType:
    """TE's mask strings (and their aliases) -> AttnMaskType."""
    name = _MASK_ALIASES.get(attn_mask_type, attn_mask_type)
    for member in AttnMaskType:
        if member.value == name:
            return member
    raise ValueError(f"attn_mask_type: expected one of {[m.value for m in AttnMaskType]} or an "
                     f"alias {sorted(_MASK_ALIASES)}, got {attn_mask_type!r}")


def _enum(cls, value, arg: str):
    if isinstance(value, cls):
        return value
    if cls is AttnMaskType and isinstance(value, str):
        return canonicalize_attn_mask_type(value)
    for member in cls:
        if value in (member.value, member.name):
            return member
    raise ValueError(f"fused_attn: argument '{arg}': expected a {cls.__name__} or one of "
                     f"{[m.value for m in cls]}, got {value!r}")


# ------------------------------------------------------------------------------------ sequences
@jax.tree_util.register_pytree_node_class
class SequenceDescriptor:
    """Sequence lengths and positions of a batch (TE's class): `from_seqlens` (one sequence per
    row, from position 0), `from_seqlens_and_offsets` (THD: up to m segments per row, lengths
    [b, m] and starts [b, m + 1], unused entries -1) or `from_segment_ids_and_pos` (segment ids
    [b, s] starting at 1, 0 = padding; each segment a contiguous run)."""

    def __init__(self, seqlens=None, seq_offsets=None, segment_ids=None, segment_pos=None):
        self.seqlens = seqlens
        self.seq_offsets = seq_offsets
        self.segment_ids = segment_ids
        self.segment_pos = segment_pos

    def tree_flatten(self):
        return (self.seqlens, self.seq_offsets, self.segment_ids, self.segment_pos), None

    @classmethod
    def tree_unflatten(cls, aux_data, children):
        del aux_data
        return cls(*children)

    @staticmethod
    def _pair(x):
        return tuple(x) if isinstance(x, (tuple, list)) else (x, x)

    @classmethod
    def from_seqlens(cls, seqlens) -> SequenceDescriptor:
        return cls(seqlens=cls._pair(seqlens))

    @classmethod
    def from_seqlens_and_offsets(cls, seqlens, seq_offsets) -> SequenceDescriptor:
        return cls(seqlens=cls._pair(seqlens), seq_offsets=cls._pair(seq_offsets))

    @classmethod
    def from_segment_ids_and_pos(cls, segment_ids, segment_pos=None) -> SequenceDescriptor:
        if segment_pos is None:
            raise ValueError("SequenceDescriptor.from_segment_ids_and_pos: argument "
                             "'segment_pos': required (as in TE), got None")
        return cls(segment_ids=cls._pair(segment_ids), segment_pos=cls._pair(segment_pos))

    def get_seqlens_and_offsets(self, thd: bool, max_segments_per_seq: int):
        """(q_seqlens, kv_seqlens, q_offsets, kv_offsets): int32 [b] and None (bshd) or [b, m]
        and [b, m] (thd)."""
        if self.seqlens is not None:
            lens = tuple(jnp.asarray(x, _I32) for x in self.seqlens)
            if not thd:
                return lens[0], lens[1], None, None
            if self.seq_offsets is None:
                raise ValueError("SequenceDescriptor: a thd layout needs seq_offsets "
                                 "(from_seqlens_and_offsets), got seqlens only")
            offs = tuple(jnp.asarray(x, _I32) for x in self.seq_offsets)
            m = max_segments_per_seq
            return lens[0][:, :m], lens[1][:, :m], offs[0][:, :m], offs[1][:, :m]
        if self.segment_ids is None:
            raise ValueError("SequenceDescriptor: no seqlens and no segment_ids")
        out = [_segments_from_ids(jnp.asarray(ids), thd, max_segments_per_seq)
               for ids in self.segment_ids]
        return out[0][0], out[1][0], out[0][1], out[1][1]


def _segments_from_ids(ids, thd: bool, m: int):
    """(lengths, starts) of the segments of ids [b, s] (runs of equal nonzero ids): [b] and None
    for bshd (the count of nonzero ids), [b, m] and [b, m] for thd (the first m runs)."""
    present = ids != 0
    if not thd:
        return jnp.sum(present, axis=-1, dtype=_I32), None
    prev = jnp.pad(ids, ((0, 0), (1, 0)))[:, :-1]
    start = present & (ids != prev)

    def row(start_row, present_row):
        starts = jnp.nonzero(start_row, size=m, fill_value=-1)[0].astype(_I32)
        run = jnp.cumsum(start_row) - 1
        lens = jax.ops.segment_sum(present_row.astype(_I32), jnp.where(present_row, run, m),
                                   num_segments=m + 1)[:m]
        return lens, starts

    return jax.vmap(row)(start, present)


def _mask_to_seqlens(mask):
    """Legacy mask [b, 1, s_q, s_kv] (True = masked out) -> (q_seqlens, kv_seqlens)."""
    kept = ~mask.astype(bool)
    return (jnp.sum(jnp.any(kept, axis=-1)[:, 0], axis=-1, dtype=_I32),
            jnp.sum(jnp.any(kept, axis=-2)[:, 0], axis=-1, dtype=_I32))


# ------------------------------------------------------------------------------------ selection
_DTYPES = {np.dtype(jnp.float32): capi.DType.Float32, np.dtype(jnp.float16): capi.DType.Float16,
           np.dtype(jnp.bfloat16): capi.DType.BFloat16}


def _device() -> int:
    return 0 if jax.default_backend() == "cpu" else 1


def _window(window_size, mask: AttnMaskType) -> tuple[int, int]:
    left, right = (-1, -1) if window_size is None else (int(window_size[0]), int(window_size[1]))
    return (left, 0) if mask.is_causal() else (left, right)


def _core_mask(layout: QKVLayout, mask: AttnMaskType) -> str:
    return tex_attn.core_mask(layout.value, mask.value)


def _select(q_dtype, kv_dtype, layout, bias, mask, dropout, h, h_kv, sq, skv, dqk, dv, window,
            log=True):
    if np.dtype(q_dtype) not in _DTYPES or np.dtype(kv_dtype) != np.dtype(q_dtype):
        raise TypeError(f"fused_attn: arguments 'q_dtype', 'kv_dtype': expected one dtype of "
                        f"float32 / float16 / bfloat16, got {np.dtype(q_dtype)} and "
                        f"{np.dtype(kv_dtype)}")
    key = (_device(), int(_DTYPES[np.dtype(q_dtype)]), layout.value, bias.value,
           _core_mask(layout, mask), float(dropout), int(h), int(h_kv), int(sq), int(skv),
           int(dqk), int(dv), int(window[0]), int(window[1]))
    backend, reasons = selection.select("jax", *key, selection.env_key(), log=log)
    return backend, reasons, key


def is_fused_attn_kernel_available(is_training, q_dtype, kv_dtype, qkv_layout, attn_bias_type,
                                   attn_mask_type, softmax_type, dropout_probability, q_num_heads,
                                   kv_num_heads, q_max_seqlen, kv_max_seqlen, head_dim_qk,
                                   head_dim_v, window_size=None) -> bool:
    """Whether a fused backend (not the unfused math) runs this configuration (TE's signature)."""
    del is_training
    if _enum(AttnSoftmaxType, softmax_type, "softmax_type") is not AttnSoftmaxType.VANILLA_SOFTMAX:
        return False
    mask = _enum(AttnMaskType, attn_mask_type, "attn_mask_type")
    layout = _enum(QKVLayout, qkv_layout, "qkv_layout")
    bias = _enum(AttnBiasType, attn_bias_type, "attn_bias_type")
    backend = _select(q_dtype, kv_dtype, layout, bias, mask,
                      dropout_probability, q_num_heads, kv_num_heads, q_max_seqlen, kv_max_seqlen,
                      head_dim_qk, head_dim_v, _window(window_size, mask), log=False)[0]
    return backend in ("ck", "aotriton", "flash")


def attention_backend(q_dtype, qkv_layout, attn_bias_type, attn_mask_type, dropout_probability,
                      q_num_heads, kv_num_heads, q_max_seqlen, kv_max_seqlen, head_dim_qk,
                      head_dim_v, window_size=None) -> str:
    """"flash" or "unfused": what fused_attn runs for this configuration (logged under
    NVTE_DEBUG); NotImplementedError with every backend's reason when none can."""
    mask = _enum(AttnMaskType, attn_mask_type, "attn_mask_type")
    backend, reasons, key = _select(
        q_dtype, q_dtype, _enum(QKVLayout, qkv_layout, "qkv_layout"),
        _enum(AttnBiasType, attn_bias_type, "attn_bias_type"), mask, dropout_probability,
        q_num_heads, kv_num_heads, q_max_seqlen, kv_max_seqlen, head_dim_qk, head_dim_v,
        _window(window_size, mask))
    if backend is None:
        raise selection.no_backend_error("fused_attn", key, reasons)
    if backend == "ck":
        raise NotImplementedError("fused_attn: backend 'ck' was selected but the JAX front end has "
                                  "no binding for it (not built in this project)")
    # AOTriton runs inside the core's fused call (nvte_fused_attn_fwd/bwd launch its images when
    # the same selection picks it), which the flash path calls: it is AOTriton's binding too.
    return "flash" if backend == "aotriton" else backend


# ------------------------------------------------------------------------------------ API
@dataclass(frozen=True)
class _Config:
    layout: str
    bias: str
    mask: str  # the core's name (thd: the padding form)
    scale: float
    dropout: float
    is_training: bool
    window: tuple[int, int]
    deterministic: bool


def _seed_words(seed):
    """uint32 [4] = {seed lo, seed hi, offset lo, offset hi} from a PRNG key (offset 0)."""
    if seed is None:
        raise ValueError("fused_attn: argument 'seed': expected a PRNG key when "
                         "dropout_probability > 0, got None")
    seed = jnp.asarray(seed) if not isinstance(seed, jax.Array) else seed
    if jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
        seed = jax.random.key_data(seed)
    words = seed.reshape(-1)[:2].astype(jnp.uint32)
    words = jnp.pad(words, (0, 4 - words.shape[0]))
    return words


def _sink(softmax_type, softmax_offset, h):
    """Attention sinks: the sink logit per head as fp32 [1, h, 1, 1] (0 for off-by-one, TE's
    softmax_offset [1, h, 1, 1] or [h] for learnable), or None for vanilla."""
    st = _enum(AttnSoftmaxType, softmax_type, "softmax_type")
    if st is AttnSoftmaxType.VANILLA_SOFTMAX:
        return None
    if st is AttnSoftmaxType.OFF_BY_ONE_SOFTMAX:
        return jnp.zeros((1, h, 1, 1), jnp.float32)
    if softmax_offset is None or int(np.prod(softmax_offset.shape)) != h:
        raise ValueError(f"fused_attn: argument 'softmax_offset': softmax_type 'learnable' needs "
                         f"one value per head ({h}), got "
                         f"{None if softmax_offset is None else softmax_offset.shape}")
    return jnp.reshape(softmax_offset, (1, h, 1, 1)).astype(jnp.float32)


def _refuse_extras(softmax_type, softmax_offset, score_mod):
    _enum(AttnSoftmaxType, softmax_type, "softmax_type")  # any flavour (sinks: unfused math)
    del softmax_offset
    if score_mod is not None:
        raise NotImplementedError(f"fused_attn: argument 'score_mod' is not supported, got "
                                  f"{type(score_mod).__name__}")


def _prepare(qkv, bias, sequence_descriptor, seed, attn_bias_type, attn_mask_type, qkv_layout,
             scaling_factor, dropout_probability, is_training, max_segments_per_seq, window_size):
    layout = _enum(QKVLayout, qkv_layout, "qkv_layout")
    mask = _enum(AttnMaskType, attn_mask_type, "attn_mask_type")
    bias_type = _enum(AttnBiasType, attn_bias_type, "attn_bias_type")
    qkv = tuple(qkv) if isinstance(qkv, (tuple, list)) else (qkv,)
    n = 1 if layout.is_qkvpacked() else 2 if layout.is_kvpacked() else 3
    if len(qkv) != n:
        raise ValueError(f"fused_attn: argument 'qkv': layout {layout.value} expects {n} "
                         f"array(s), got {len(qkv)}")
    q, k, v = (qkv + (None, None))[:3]
    if bias_type is AttnBiasType.NO_BIAS:
        bias = None
    elif bias is None:
        raise ValueError(f"fused_attn: argument 'bias': expected an array for "
                         f"{bias_type.value}, got None")
    elif bias.dtype != q.dtype:
        bias = bias.astype(q.dtype)  # the kernels take one dtype; autodiff casts dbias back
    seqs = (None,) * 4
    if layout.is_thd() or mask.is_padding():
        if sequence_descriptor is None:
            raise ValueError(f"fused_attn: argument 'sequence_descriptor': layout "
                             f"{layout.value} with mask {mask.value} needs sequence lengths, "
                             "got None")
        if isinstance(sequence_descriptor, SequenceDescriptor):
            seqs = sequence_descriptor.get_seqlens_and_offsets(layout.is_thd(),
                                                               int(max_segments_per_seq))
        elif layout.is_thd():
            raise ValueError("fused_attn: argument 'sequence_descriptor': thd layouts need a "
                             "SequenceDescriptor, got a mask array")
        else:
            seqs = (*_mask_to_seqlens(sequence_descriptor), None, None)
    # TE's kernels drop logits only when training (is_dropout = is_training && p != 0)
    dropout = float(dropout_probability) if is_training else 0.0
    words = _seed_words(seed) if dropout > 0 else None
    window = _window(window_size, mask)
    empty = jnp.zeros((0,), q.dtype)
    dims = tex_attn.layout_dims("fused_attn", layout.value, q,
                                *(empty if x is None else x for x in (k, v)))
    # every backend refuses what the primitives refuse (bias / sequence shapes)
    none = jnp.zeros((0,), _I32)
    tex_attn.check_side("fused_attn", layout.value, dims, empty if bias is None else bias,
                        *(none if x is None else x for x in seqs),
                        jnp.zeros((0,), jnp.uint32) if words is None else words,
                        bias_type.value, _core_mask(layout, mask))
    cfg = _Config(layout.value, bias_type.value, _core_mask(layout, mask), float(scaling_factor),
                  dropout, bool(is_training), window,
                  config.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") == "0")
    return cfg, dims, (q, k, v, bias, seqs, words)


def fused_attn(qkv, bias, sequence_descriptor, seed, attn_bias_type, attn_mask_type, qkv_layout,
               softmax_type, scaling_factor, dropout_probability, is_training,
               max_segments_per_seq=1, window_size=None,
               context_parallel_strategy=CPStrategy.DEFAULT,
               context_parallel_causal_load_balanced=False, context_parallel_axis="",
               context_checkpoint_name="context", softmax_offset=None, stripe_size=None,
               score_mod=None, score_mod_bprop=None, score_mod_tensors=None,
               score_mod_bprop_tensors=None):
    """Attention over qkv = (qkv,) / (q, kv) / (q, k, v) per `qkv_layout` -> [b, s_q, h, d_v],
    run by the backend the C selection picks (see the module docstring)."""
    del context_checkpoint_name, score_mod_bprop, score_mod_tensors, score_mod_bprop_tensors
    if score_mod is not None:  # what TE refuses is a ValueError before "not supported here"
        check_score_mod_args(qkv, bias, sequence_descriptor, seed, attn_bias_type, attn_mask_type,
                             qkv_layout, softmax_type, dropout_probability, max_segments_per_seq,
                             window_size, context_parallel_strategy,
                             context_parallel_causal_load_balanced, context_parallel_axis,
                             softmax_offset, stripe_size)
    _refuse_extras(softmax_type, softmax_offset, score_mod)
    cfg, dims, args = _prepare(qkv, bias, sequence_descriptor, seed, attn_bias_type,
                               attn_mask_type, qkv_layout, scaling_factor, dropout_probability,
                               is_training, max_segments_per_seq, window_size)
    cp = _cp_plan(cfg, dims, softmax_type, context_parallel_strategy,
                  context_parallel_causal_load_balanced, context_parallel_axis, stripe_size)
    if cp is None:
        attention_cp.check_stripe_size(stripe_size, cfg.layout)
    if cp is not None:  # every CP step is a flash kernel call: the selection must allow flash
        if attention_backend(args[0].dtype, cfg.layout, cfg.bias, attn_mask_type, cfg.dropout,
                             dims.h, dims.h_kv, dims.s_q, dims.s_kv, dims.d_qk, dims.d_v,
                             cfg.window) != "flash":
            _no_cp("the backend selection picked the unfused math (see NVTE_DEBUG)")
        if cp.stripe is not None:
            ids = getattr(sequence_descriptor, "segment_ids", None)
            if ids is None:
                _no_cp("thd layouts need SequenceDescriptor.from_segment_ids_and_pos (the "
                       "segment ids in the striped order)")
            return attention_cp_thd.thd_cp_fused_attn(cp, cfg.layout, *args[:3], ids,
                                                      args[4][0].shape[1])
        return attention_cp.cp_fused_attn(cp, cfg.layout, *args[:3])
    sink = _sink(softmax_type, softmax_offset, dims.h)
    if sink is not None:  # the flash primitives take no sink yet: the unfused math runs it
        return _unfused(cfg, *args, sink=sink)
    backend = attention_backend(args[0].dtype, cfg.layout, cfg.bias, attn_mask_type, cfg.dropout,
                                dims.h, dims.h_kv, dims.s_q, dims.s_kv, dims.d_qk, dims.d_v,
                                cfg.window)
    if backend == "unfused":
        return _unfused(cfg, *args)
    return _fused(cfg, *args)


def unfused_attn(qkv, bias, sequence_descriptor, seed, attn_bias_type, attn_mask_type,
                 qkv_layout, softmax_type, scaling_factor, dropout_probability, is_training,
                 max_segments_per_seq=1, window_size=None, **kwargs):
    """fused_attn's unfused backend, always (framework math; the reference backend)."""
    _refuse_extras(softmax_type, kwargs.get("softmax_offset"), kwargs.get("score_mod"))
    cfg, dims, args = _prepare(qkv, bias, sequence_descriptor, seed, attn_bias_type,
                               attn_mask_type, qkv_layout, scaling_factor, dropout_probability,
                               is_training, max_segments_per_seq, window_size)
    if _cp_plan(cfg, dims, softmax_type, kwargs.get("context_parallel_strategy", "DEFAULT"),
                kwargs.get("context_parallel_causal_load_balanced", False),
                kwargs.get("context_parallel_axis", ""), kwargs.get("stripe_size")) is not None:
        _no_cp("unfused_attn has no context-parallel form")
    attention_cp.check_stripe_size(kwargs.get("stripe_size"), cfg.layout)
    return _unfused(cfg, *args, sink=_sink(softmax_type, kwargs.get("softmax_offset"), dims.h))


def _cp_plan(cfg, dims, softmax_type, strategy, load_balanced, axis, stripe_size=None):
    """attention_cp's plan (None: no context parallelism active)."""
    strategy = _enum(CPStrategy, strategy, "context_parallel_strategy")
    return attention_cp.plan_context_parallel(
        strategy.name, load_balanced, axis, cfg.layout, cfg.mask, cfg.bias, cfg.dropout,
        _enum(AttnSoftmaxType, softmax_type, "softmax_type").value, cfg.window, cfg.scale, dims,
        stripe_size)


def _no_cp(why):
    raise NotImplementedError(f"fused_attn: context parallelism runs on the flash kernels; {why}")


# -- flash: the fused primitives under custom_vjp
def _prim_kwargs(cfg: _Config) -> dict:
    return {"qkv_layout": cfg.layout, "attn_bias_type": cfg.bias, "attn_mask_type": cfg.mask,
            "scaling_factor": cfg.scale, "dropout_probability": cfg.dropout,
            "window": cfg.window}


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(cfg, q, k, v, bias, seqs, seed):
    return tex_attn.fused_attn_fwd(q, k, v, bias, *seqs, seed, is_training=cfg.is_training,
                                   **_prim_kwargs(cfg))[0]


def _fused_fwd(cfg, q, k, v, bias, seqs, seed):
    out, lse = tex_attn.fused_attn_fwd(q, k, v, bias, *seqs, seed, is_training=True,
                                       **_prim_kwargs(cfg))
    return out, (q, k, v, bias, seqs, seed, out, lse)


def _fused_bwd(cfg, res, d_out):
    q, k, v, bias, seqs, seed, out, lse = res
    dq, dk, dv, dbias = tex_attn.fused_attn_bwd(q, k, v, bias, lse, out, d_out.astype(out.dtype),
                                                *seqs, seed, deterministic=cfg.deterministic,
                                                **_prim_kwargs(cfg))
    return (dq, None if k is None else dk, None if v is None else dv,
            None if bias is None else dbias, None, None)


_fused.defvjp(_fused_fwd, _fused_bwd)


# -- unfused: JAX GEMMs around the core's fused softmax ops (differentiable through jax)
def _unfused(cfg: _Config, q, k, v, bias, seqs, seed, sink=None):
    empty = jnp.zeros((0,), q.dtype)
    none = jnp.zeros((0,), _I32)
    p = problem(cfg.layout, q, empty if k is None else k, empty if v is None else v,
                *(none if x is None else x for x in seqs), cfg.mask, cfg.window)
    x, scale = logits(p, cfg.scale, cfg.bias, bias)
    kind = SoftmaxFusionType
    if sink is not None:
        # Attention sinks: softmax over the kept keys plus the sink logit (no value row); plain
        # jnp (autodiff gives the offset's gradient); a row with no key kept puts all its mass on
        # the sink, so its output is 0.
        y = x.astype(jnp.float32) * scale
        if p.keep is not None:
            y = jnp.where(p.keep, y, -jnp.inf)
        col = jnp.broadcast_to(sink, (*y.shape[:-1], 1))
        probs = jax.nn.softmax(jnp.concatenate((y, col), axis=-1), axis=-1)[..., :-1]
    elif p.keep is None:
        probs = _softmax(x, None, scale, kind.SCALED)
    elif cfg.mask == "causal" and cfg.window[0] < 0 and x.shape[-2] == x.shape[-1]:
        probs = _softmax(x, None, scale, kind.SCALED_UPPER_TRIANG_MASKED)
    else:
        keep = jnp.broadcast_to(p.keep, (x.shape[0], 1, *x.shape[2:]))
        probs = _softmax(x, (~keep).astype(jnp.uint8), scale, kind.SCALED_MASKED)
        # the masked op gives a fully masked row uniform weights; attention's convention is 0
        probs = probs * jnp.any(keep, axis=-1, keepdims=True)
    if cfg.dropout > 0:
        kept = dropout_keep(p, seed, cfg.dropout)
        probs = probs * (kept * (1.0 / (1.0 - cfg.dropout)))
    out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(q.dtype), p.v,
                     preferred_element_type=jnp.float32)
    return out.astype(q.dtype)
