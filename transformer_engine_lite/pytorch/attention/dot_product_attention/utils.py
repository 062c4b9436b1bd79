"""TE's attention probe and helpers
(transformer_engine.pytorch.attention.dot_product_attention.utils) answered by this library's
backend selection.

TE's DotProductAttention has three backend slots; this library fills them with its own backends
(README, "Attention (PyTorch)"), switched by the same env vars:

  TE slot                    | here                                | switch
  FlashAttention             | our flash kernel (any device)       | NVTE_FLASH_ATTN
  FusedAttention             | the GPU fused kernels ck, aotriton  | NVTE_FUSED_ATTN(_CK|_AOTRITON)
  UnfusedDotProductAttention | torch GEMMs + the fused softmax ops | NVTE_UNFUSED_ATTN

`get_attention_backend(AttentionParams)` returns TE's six values for a configuration: it asks the
C selection (nvte_fused_attn_backend_reasons, the one DotProductAttention runs) and first turns
off every backend for what DotProductAttention does not run at all (FP8 attention, context
parallelism, ...), each with its reason in the NVTE_DEBUG log; a KV-cache configuration
(inference_params) is asked as the bshd padding problem DotProductAttention runs for it. The
answer is the one DotProductAttention acts on: the backend it selects for the same inputs and
env vars.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from packaging.version import Version as PkgVersion

from .... import __version__ as _lite_version
from ....common import attention_selection as selection
from ... import tex
from ...cpp_extensions.fused_attn import FusedAttnBackend
from ...utils import get_cudnn_version
from .. import backends as _backends
from .fp8_qkv import combine_and_quantize  # noqa: F401 (TE's name, re-exported)

__all__ = [
    "AttentionLogging",
    "AttentionParams",
    "FlashAttentionUtils",
    "check_set_window_size",
    "combine_and_quantize",
    "get_attention_backend",
    "get_cudnn_version",
]

# Layouts the C API has (TE's names); TE's paged / mixed-format / bhsd layouts are not among them.
_LAYOUTS = (
    "sb3hd", "sbh3d", "sbhd_sb2hd", "sbhd_sbh2d", "sbhd_sbhd_sbhd",
    "bs3hd", "bsh3d", "bshd_bs2hd", "bshd_bsh2d", "bshd_bshd_bshd",
    "t3hd", "th3d", "thd_t2hd", "thd_th2d", "thd_thd_thd",
)  # fmt: skip
_MASKS = (
    "no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
    "padding_causal_bottom_right", "arbitrary",
)  # fmt: skip
# Bias shapes DotProductAttention takes for pre/post_scale_bias ([1|b, 1|h, s_q, s_kv]).
_BIAS_SHAPES = ("1hss", "b1ss", "bhss", "11ss")
_SLOTS = ("FlashAttention", "FusedAttention", "UnfusedDotProductAttention")


class AttentionLogging:
    """TE's logging switch for attention. The log is this library's attention logger
    ("transformer_engine_lite.attention", the one DotProductAttention's selection writes to);
    setup_logging() sets its level from NVTE_DEBUG * NVTE_DEBUG_LEVEL (0: WARNING, 1: INFO,
    2: DEBUG), read at the call, and gives it a stderr handler when it has none."""

    _log_level = logging.WARNING
    _formatter = logging.Formatter("[%(levelname)-8s | %(name)s]: %(message)s")
    _stream_handler = logging.StreamHandler()
    fa_logger = selection.LOGGER
    _is_logging_setup = False

    @staticmethod
    def setup_logging() -> None:
        """Set the attention logger's level and handler from NVTE_DEBUG / NVTE_DEBUG_LEVEL."""
        try:
            level = int(os.environ.get("NVTE_DEBUG", "0")) * int(
                os.environ.get("NVTE_DEBUG_LEVEL", "0")
            )
        except ValueError as e:
            raise ValueError(f"NVTE_DEBUG / NVTE_DEBUG_LEVEL: expected integers ({e})") from None
        levels = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}
        AttentionLogging._log_level = levels[min(max(level, 0), 2)]
        AttentionLogging._stream_handler.setFormatter(AttentionLogging._formatter)
        AttentionLogging.fa_logger.setLevel(AttentionLogging._log_level)
        if not AttentionLogging.fa_logger.handlers:
            AttentionLogging.fa_logger.addHandler(AttentionLogging._stream_handler)
        AttentionLogging._is_logging_setup = True


class FlashAttentionUtils:
    """TE's record of the FlashAttention backend. Here that backend is this library's flash kernel,
    always built in: is_installed is True and `version` is this library's version (it is not the
    flash-attn package, which this library never imports). The v2_*_plus flags, which TE reads as
    "the FlashAttention backend has flash-attn 2.x's feature", say which of those features the
    kernel has: sliding windows (2.3), ALiBi (2.4), a deterministic backward (2.4.1) — yes;
    paged KV cache (2.5) and later — no (a paged KV cache is gathered into dense rows before the
    kernel, attention/inference.py: the kernel takes no page table). No flash-attn 3 or 4.
    version_required / max_version and is_version_supported are TE's supported flash-attn range,
    kept for code that checks a flash-attn version against it."""

    is_installed = True
    version = PkgVersion(_lite_version)
    version_required = PkgVersion("2.1.1")
    version_required_blackwell = PkgVersion("2.7.3")
    max_version = PkgVersion("2.8.4")
    v2_plus = True
    v2_1_plus = True
    v2_3_plus = True
    v2_4_plus = True
    v2_4_1_plus = True
    v2_5_plus = False
    v2_5_7_plus = False
    v2_6_0_plus = False
    v2_7_0_plus = False
    warning_printed = False
    v3_is_installed = False
    fa3_version = PkgVersion("0")
    v3_0_0_beta = False
    use_v3 = False
    v3_warning_printed = False
    v4_is_installed = False
    fa4_version = PkgVersion("0")
    use_v4 = False
    v4_warning_printed = False

    @staticmethod
    def is_version_supported(version: PkgVersion, minimum_version: PkgVersion) -> bool:
        """minimum_version <= version < max_version (TE's half-open flash-attn 2 range)."""
        return minimum_version <= version < FlashAttentionUtils.max_version


def _get_supported_versions(version_min: Any, version_max: Any) -> str:
    """TE's wording of a half-open version range (">= 2.1.1, < 2.8.4")."""
    return f">= {version_min}, < {version_max}"


@dataclass(eq=True)
class AttentionParams:
    """TE's attention configuration (same fields, defaults and meaning), plus `device`: where the
    tensors live (None: torch's default device, torch.get_default_device()); TE assumes the
    current CUDA device, this library runs on the CPU as well."""

    qkv_type: Any = torch.Tensor
    qkv_dtype: torch.dtype = torch.bfloat16
    qkv_layout: str = "sbh3d"
    batch_size: int = 1
    num_heads: int = 16
    num_gqa_groups: int = 16
    max_seqlen_q: int = 128
    max_seqlen_kv: int = 128
    head_dim_qk: int = 64
    head_dim_v: int = 64
    attn_mask_type: str = "no_mask"
    window_size: tuple[int, int] | None = None
    bottom_right_diagonal: bool | None = True
    alibi_slopes_shape: Any = None
    core_attention_bias_type: str = "no_bias"
    core_attention_bias_shape: str | None = "1hss"
    core_attention_bias_requires_grad: bool = True
    pad_between_seqs: bool = False
    attention_dropout: float = 0.0
    context_parallel: bool = False
    cp_comm_type: str = "p2p"
    cp_size: int = 1
    deterministic: bool = False
    is_training: bool = True
    fp8: bool = False
    fp8_meta: dict[str, Any] | None = None
    inference_params: Any = None
    softmax_type: str = "vanilla"
    return_max_logit: bool = False
    cuda_graph: bool = False
    num_splits: int = 1
    fp8_output: bool = False
    checkpoint_core_attention: bool = False
    has_score_mod: bool = False
    has_score_mod_bprop: bool = False
    device: torch.device | str | None = None

    def __eq__(self, other: object) -> bool:
        # As TE: of fp8_meta only the recipe matters to the selection.
        if not isinstance(other, self.__class__):
            return NotImplemented
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "fp8_meta":
                a, b = (a or {}).get("recipe"), (b or {}).get("recipe")
            if a != b:
                return False
        return True


def check_set_window_size(
    attn_mask_type: str, window_size: tuple[int, int] | None = None
) -> tuple[int, int]:
    """TE's window rules: causal masks take (-1, 0) or (>= 0, 0), the others (-1, -1) or
    (>= 0, >= 0). None gives the mask's default; (-1, -1) for a causal mask, (>= 0, != 0) for a
    causal mask and (-1, 0) for the others are corrected with a warning, as TE does. Anything
    else raises ValueError (TE asserts)."""
    if not isinstance(attn_mask_type, str):
        raise ValueError(
            f"check_set_window_size: attn_mask_type: expected a str, got {attn_mask_type!r}"
        )
    if window_size is not None:
        if (
            not isinstance(window_size, (tuple, list))
            or len(window_size) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)
        ):
            raise ValueError(
                f"check_set_window_size: window_size: expected None or (left, right) ints, got "
                f"{window_size!r}"
            )
        window_size = (int(window_size[0]), int(window_size[1]))
    if "causal" in attn_mask_type:
        if window_size is None:
            return (-1, 0)
        if window_size == (-1, -1) or (window_size[0] >= 0 and window_size[1] != 0):
            warnings.warn(
                f"window_size should be (-1, 0) or (>=0, 0) for attn_mask_type={attn_mask_type}"
            )
            return (window_size[0], 0)
        if window_size != (-1, 0) and window_size[0] < 0:
            raise ValueError(
                f"check_set_window_size: window_size {window_size}: expected (-1, 0) or (>=0, 0) "
                f"for attn_mask_type={attn_mask_type}"
            )
        return window_size
    if attn_mask_type in ("no_mask", "padding", "arbitrary"):
        if window_size is None:
            return (-1, -1)
        if window_size == (-1, 0):
            warnings.warn(
                f"window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type={attn_mask_type}"
            )
            return (-1, -1)
        if window_size != (-1, -1) and (window_size[0] < 0 or window_size[1] < 0):
            raise ValueError(
                f"check_set_window_size: window_size {window_size}: expected (-1, -1) or "
                f"(>=0, >=0) for attn_mask_type={attn_mask_type}"
            )
        return window_size
    raise ValueError(f"check_set_window_size: invalid attn_mask_type {attn_mask_type!r}")


_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_FP8_TYPES = ("Float8Tensor", "Float8TensorStorage")  # by name: utils.py is imported before them


def _fp8_attention(p: AttentionParams) -> bool:
    """Whether the configuration asks for FP8 attention (fp8 with an fp8_dpa / fp8_mha recipe;
    NVTE_DPA_FP8_RECIPE=F16 turns it off, as in DotProductAttention)."""
    recipe = (p.fp8_meta or {}).get("recipe") if p.fp8 else None
    if recipe is None or os.environ.get("NVTE_DPA_FP8_RECIPE", "") == "F16":
        return False
    return bool(getattr(recipe, "fp8_dpa", False) or getattr(recipe, "fp8_mha", False))


def _unsupported(p: AttentionParams) -> list[str]:
    """Why DotProductAttention runs this configuration on no backend at all (empty: it may)."""
    why = []
    recipe = (p.fp8_meta or {}).get("recipe") if p.fp8 else None
    name = getattr(p.qkv_type, "__name__", p.qkv_type)
    if p.qkv_type is not torch.Tensor and not (name in _FP8_TYPES and _fp8_attention(p)):
        # FP8 attention takes q, k, v as Float8Tensors (TE's fp8_mha hand-off): their values
        # enter its QKV point; other tensor types are not inputs of any backend here
        why.append(f"qkv_type = {name} (supported: torch.Tensor, and Float8Tensor / "
                   "Float8TensorStorage under FP8 attention)")  # fmt: skip
    if _fp8_attention(p) and not (recipe.delayed() or recipe.float8_current_scaling()):
        why.append(
            f"FP8 attention (recipe fp8_dpa / fp8_mha) under {type(recipe).__name__} (emulated "
            "under DelayedScaling and Float8CurrentScaling only)"
        )
    if p.fp8_output and not _fp8_attention(p):
        why.append("fp8_output without FP8 attention (recipe fp8_dpa / fp8_mha)")
    if p.qkv_dtype in _FP8_DTYPES:  # TE's probe for FP8 attention names the FP8 input dtype
        if not _fp8_attention(p):
            why.append(f"qkv_dtype = {p.qkv_dtype} without FP8 attention (recipe fp8_dpa / "
                       "fp8_mha)")  # fmt: skip
    elif p.qkv_dtype not in _backends._DTYPES:
        why.append(f"qkv_dtype = {p.qkv_dtype} (supported: float32, float16, bfloat16, and "
                   "float8_e4m3fn / float8_e5m2 under FP8 attention)")  # fmt: skip
    if p.qkv_layout not in _LAYOUTS:
        why.append(f"qkv_layout = {p.qkv_layout!r} (supported: {', '.join(_LAYOUTS)})")
    if p.attn_mask_type not in _MASKS:
        why.append(f"attn_mask_type = {p.attn_mask_type!r}")
    elif p.attn_mask_type == "arbitrary" and p.qkv_layout.startswith("t"):
        why.append("attn_mask_type 'arbitrary' with the thd format")
    if p.context_parallel:
        why += _cp_unsupported(p)
    if p.pad_between_seqs and not p.qkv_layout.startswith("t"):
        # thd: DotProductAttention attends the real tokens (padded_seqs.py), CP per chunk
        why.append("pad_between_seqs with a layout other than thd")
    if p.softmax_type not in ("vanilla", "off-by-one", "learnable"):
        why.append(f"softmax_type = {p.softmax_type!r} (vanilla, off-by-one, learnable)")
    if p.return_max_logit:
        why.append("return_max_logit is not supported")
    if p.num_splits != 1:
        why.append(f"num_splits = {p.num_splits} (only 1)")
    if p.cuda_graph:
        why.append("CUDA graph capture is not supported by this library")
    if p.has_score_mod or p.has_score_mod_bprop:
        why.append("score_mod is not supported")
    if p.core_attention_bias_type in ("pre_scale_bias", "post_scale_bias"):
        shape = p.core_attention_bias_shape
        if shape is not None and shape not in _BIAS_SHAPES:
            supported = ", ".join(_BIAS_SHAPES)
            why.append(f"core_attention_bias_shape = {shape!r} (supported: {supported})")
    if p.core_attention_bias_type == "alibi" and p.alibi_slopes_shape is not None:
        if list(p.alibi_slopes_shape) not in ([p.num_heads], [p.batch_size, p.num_heads]):
            shape = list(p.alibi_slopes_shape)
            why.append(f"alibi_slopes_shape = {shape} (supported: [h], [b, h])")
    top_left_choice = p.attn_mask_type in ("no_mask", "padding", "arbitrary")
    if top_left_choice and p.bottom_right_diagonal is False and p.max_seqlen_q != p.max_seqlen_kv:
        window = p.window_size not in (None, (-1, -1))
        if window or p.core_attention_bias_type == "alibi":
            why.append(
                "top-left aligned windows / ALiBi for masks other than causal (this library "
                "aligns them bottom-right)"
            )
    return why


def _cp_unsupported(p: AttentionParams) -> list[str]:
    """Why context parallelism (context_parallel.py, the flash kernel per chunk) cannot run p."""
    why = []
    if p.cp_comm_type not in ("p2p", "all_gather", "a2a", "a2a+p2p"):
        why.append(f"cp_comm_type = {p.cp_comm_type!r}")
    thd = p.qkv_layout.startswith("t")
    if thd and p.cp_comm_type == "all_gather":
        why.append("context parallelism with the thd format and 'all_gather'")
    masks = ("no_mask", "causal", "causal_bottom_right")
    if thd:  # the packed sequences are the padding
        masks += ("padding", "padding_causal", "padding_causal_bottom_right")
    if p.attn_mask_type not in masks:
        why.append(f"context parallelism with attn_mask_type = {p.attn_mask_type!r}")
    bias = p.core_attention_bias_type
    # a post_scale_bias: the ring slices it per step ('p2p', non-padding masks, as TE's)
    bias_ok = bias == "post_scale_bias" and p.cp_comm_type == "p2p" and not thd
    if bias != "no_bias" and not bias_ok:
        why.append(f"context parallelism with bias type {bias!r} and {p.cp_comm_type!r}")
    if p.is_training and p.attention_dropout:
        why.append("context parallelism with dropout")
    full = p.window_size in (None, (-1, -1), (-1, 0))
    causal_left = "causal" in p.attn_mask_type
    windowed_ok = p.cp_comm_type == "a2a" or (p.cp_comm_type == "all_gather" and causal_left)
    if not full and not windowed_ok:
        why.append(f"context parallelism with window_size {p.window_size} and {p.cp_comm_type!r}")
    if p.softmax_type != "vanilla" and p.cp_comm_type != "a2a":
        why.append(f"context parallelism with softmax_type {p.softmax_type!r} (a2a only)")
    return why


class _NoOpLogger:
    """The logger get_attention_backend uses while torch.compile traces it: logging.Logger's
    methods break the graph, these no-ops are inlined away (selection logs are eager only)."""

    def debug(self, *args: Any, **kwargs: Any) -> None:
        """No-op."""


@torch.compiler.assume_constant_result
def _device_code(device: Any) -> int:
    # 0: the CPU, 1: a GPU (the C selection's NVTEDevice); None: torch's default device.
    dev = torch.get_default_device() if device is None else torch.device(device)
    return 0 if dev.type == "cpu" else 1


@torch.compiler.assume_constant_result
def _c_selection(*key: Any) -> tuple[str | None, tuple[str, ...]]:
    # A trace-time constant under torch.compile (ctypes and the cache stay out of the graph);
    # the env switches are in the key, read by the traced caller (dynamo guards os.environ).
    return selection.select("get_attention_backend", *key, log=False)


@torch.compiler.assume_constant_result
def _fused_sub_backend(*args: Any) -> int:
    # TE's _get_fused_attn_backend: looked up at the call (tests replace tex's function); a plain
    # int survives graph breaks, an enum member does not.
    return int(tex.get_fused_attn_backend(*args))


def selection_answer(
    key: tuple, backend: str | None, reasons: tuple[str, ...]
) -> tuple[bool, Any, bool, int | None, bool, list[bool]]:
    """TE's six return values from one C selection (`key` as attention_selection.select's)."""
    ok = {name: not reasons[value] for name, value in selection.PREFERENCE}
    available = [ok["flash"], ok["ck"] or ok["aotriton"], ok["unfused"]]
    flash_version = FlashAttentionUtils.version if available[0] else None
    # ck and aotriton are F16/BF16 arbitrary-seqlen kernels; this library has no FP8 attention.
    fused_sub = int(FusedAttnBackend.F16_arbitrary_seqlen) if available[1] else None
    return (
        backend == "flash",
        flash_version,
        backend in ("ck", "aotriton"),
        fused_sub,
        backend == "unfused",
        available,
    )


def params_of_key(key: tuple) -> AttentionParams:
    """The AttentionParams of a selection key (the fields the selection reads; the others keep
    their defaults)."""
    (device, dtype, layout, bias, mask, dropout, h, h_kv, sq, skv, dqk, dv, left, right) = key[:14]
    torch_dtype = {int(v): k for k, v in _backends._DTYPES.items()}[dtype]
    return AttentionParams(
        qkv_dtype=torch_dtype,
        qkv_layout=layout,
        num_heads=h,
        num_gqa_groups=h_kv,
        max_seqlen_q=sq,
        max_seqlen_kv=skv,
        head_dim_qk=dqk,
        head_dim_v=dv,
        attn_mask_type=mask,
        window_size=(left, right),
        core_attention_bias_type=bias,
        core_attention_bias_shape=None,
        attention_dropout=dropout,
        device="cpu" if device == 0 else "cuda",
    )


def get_attention_backend(
    attention_params: AttentionParams | None = None,
) -> tuple[bool, Any, bool, int | None, bool, list[bool]]:
    """TE's probe: (use_flash_attention, flash_attention_backend, use_fused_attention,
    fused_attention_backend, use_unfused_attention, available_backends) for a configuration, as
    DotProductAttention selects under the current env vars (module docstring: the slots).

    available_backends = [flash, fused, unfused]: every backend that can run it; the use_* flags:
    the one DotProductAttention runs (preference fused > flash > unfused). flash_attention_backend:
    FlashAttentionUtils.version when flash is available, else None; fused_attention_backend:
    int(FusedAttnBackend.F16_arbitrary_seqlen) when ck or aotriton is available, else None.
    deterministic and is_training restrict nothing here (every backend has a deterministic
    backward); dropout counts only when is_training, as in DotProductAttention."""
    p = AttentionParams() if attention_params is None else attention_params
    if not isinstance(p, AttentionParams):
        raise TypeError(
            "get_attention_backend: attention_params: expected AttentionParams, got "
            f"{type(p).__name__}"
        )
    logger = _NoOpLogger() if torch.compiler.is_compiling() else selection.LOGGER
    why = []
    if p.inference_params is not None:
        p, why = _kv_cache_params(p)
    why += _unsupported(p)
    window = (-1, -1)
    if not why:
        window, bad = _window(p.attn_mask_type, p.window_size)
        if bad:
            why.append(bad)
    if why:
        for slot in _SLOTS:
            logger.debug("Disabling %s due to %s", slot, "; ".join(why))
        logger.debug("Selected backend = NoBackend")
        return False, None, False, None, False, [False, False, False]
    mask = p.attn_mask_type
    if p.qkv_layout.startswith("t") and "padding" not in mask:  # thd masks are padding masks
        mask = "padding" if mask == "no_mask" else f"padding_{mask}"
    dropout = float(p.attention_dropout) if p.is_training else 0.0
    dev = _device_code(p.device)
    # FP8 inputs: the emulation's nominal dtype (bf16) stands for them in the kernel selection
    dtype = int(_backends._DTYPES[torch.bfloat16 if p.qkv_dtype in _FP8_DTYPES else p.qkv_dtype])
    sizes = (p.num_heads, p.num_gqa_groups, p.max_seqlen_q, p.max_seqlen_kv, p.head_dim_qk,
             p.head_dim_v)  # fmt: skip
    key = (dev, dtype, p.qkv_layout, p.core_attention_bias_type, mask,
           dropout, *sizes, window[0], window[1], selection.env_key())  # fmt: skip
    _, reasons = _c_selection(*key)
    fused = _fused_sub_backend(
        p.is_training, dtype, dtype, p.qkv_layout, p.core_attention_bias_type, mask, p.softmax_type,
        dropout, *sizes, window[0], window[1], p.return_max_logit, p.cuda_graph, p.deterministic,
        "cpu" if dev == 0 else "cuda",
    )  # fmt: skip
    ok = {name: not reasons[value] for name, value in selection.PREFERENCE}
    available = [ok["flash"], fused != int(FusedAttnBackend.No_Backend), ok["unfused"]]
    if p.softmax_type != "vanilla":  # attention sinks: ck / aotriton take vanilla only, and the
        available[1] = False  # GPU flash path of DotProductAttention refuses them (CPU only)
        if dev != 0:
            available[0] = False
            logger.debug("Disabling FlashAttention due to softmax_type %r on a GPU", p.softmax_type)
    if _fp8_attention(p):  # FP8 attention is emulated on the unfused backend only
        available[0] = available[1] = False
        logger.debug("Disabling FlashAttention and FusedAttention due to FP8 attention (emulated "
                     "by UnfusedDotProductAttention)")
    if p.context_parallel:  # CP runs the flash kernel per chunk (context_parallel.py), or
        # under FP8 (bshd / sbhd, no bias; every cp_comm_type) the unfused emulation
        fp8_cp = (_fp8_attention(p) and not p.qkv_layout.startswith("t")
                  and p.core_attention_bias_type == "no_bias")  # fmt: skip
        available[1] = False
        available[2] = available[2] and fp8_cp
        logger.debug("Disabling FusedAttention%s due to CP",
                     "" if fp8_cp else " and UnfusedDotProductAttention")
    for name, value in selection.PREFERENCE:
        if reasons[value]:
            logger.debug("Disabling %s due to %s", selection.BACKEND_NAMES[name], reasons[value])
    # DotProductAttention's preference: a fused kernel, then the flash kernel, then unfused.
    use_fused = available[1]
    use_flash = available[0] and not use_fused
    use_unfused = available[2] and not (use_fused or use_flash)
    logger.debug(
        "Available backends = {FlashAttention=%s, FusedAttention=%s, "
        "UnfusedDotProductAttention=%s}",
        available[0], available[1], available[2],
    )  # fmt: skip
    return (
        use_flash,
        FlashAttentionUtils.version if available[0] else None,
        use_fused,
        fused if available[1] else None,
        use_unfused,
        available,
    )


def _kv_cache_params(p: AttentionParams) -> tuple[AttentionParams, list[str]]:
    """The configuration DotProductAttention runs for a KV-cache step (inference.py): q in any
    format against the bshd cache (TE's layouts '[paged_kv_]{q}_bshd_bshd', or q's format for
    all three), run as bshd with padding and the causal diagonal bottom-right."""
    parts = p.qkv_layout.removeprefix("paged_kv_").split("_")
    why = []
    if (
        len(parts) != 3
        or parts[0] not in ("bshd", "sbhd", "thd")
        or parts[1:] not in (["bshd", "bshd"], [parts[0], parts[0]])
    ):
        why.append(
            f"qkv_layout = {p.qkv_layout!r} with KV caching (expected q's format, then the "
            "cache's: '[paged_kv_]{bshd|sbhd|thd}_bshd_bshd')"
        )
    if p.core_attention_bias_type in ("pre_scale_bias", "post_scale_bias"):
        why.append(f"core_attention_bias_type = {p.core_attention_bias_type!r} with KV caching")
    mask = p.attn_mask_type
    if "padding" not in mask:
        mask = "padding" if mask == "no_mask" else f"padding_{mask}"
    if mask == "padding_causal":
        mask = "padding_causal_bottom_right"
    return dataclasses.replace(p, qkv_layout="bshd_bshd_bshd", attn_mask_type=mask), why


def _window(mask: str, window: Any) -> tuple[tuple[int, int], str]:
    """check_set_window_size's answer without its warnings (traceable): (window, "" or why it
    is invalid)."""
    causal = "causal" in mask
    if window is None:
        return ((-1, 0) if causal else (-1, -1)), ""
    if (
        not isinstance(window, (tuple, list))
        or len(window) != 2
        or not all(isinstance(w, int) and not isinstance(w, bool) for w in window)
    ):
        return (-1, -1), f"window_size {window!r} is not (left, right) ints"
    left, right = int(window[0]), int(window[1])
    if causal:
        if (left, right) == (-1, -1) or (left >= 0 and right != 0):
            return (left, 0), ""
        if (left, right) != (-1, 0) and left < 0:
            return (-1, -1), f"window_size {window!r} is invalid for attn_mask_type={mask}"
        return (left, right), ""
    if (left, right) == (-1, 0):
        return (-1, -1), ""
    if (left, right) != (-1, -1) and (left < 0 or right < 0):
        return (-1, -1), f"window_size {window!r} is invalid for attn_mask_type={mask}"
    return (left, right), ""
