"""Attention backend selection shared by the front ends (framework-free).

Both front ends ask the C selection function (nvte_fused_attn_backend_reasons, through capi) and
run what it picks; this module adds the parts that are the same for PyTorch and JAX:
- `select`: one cached call per configuration (the env switches are part of the key), with
  NVTE_DEBUG logging on the logger "transformer_engine_lite.attention" (a stderr handler when
  NVTE_DEBUG=1): "Disabling <Backend> due to <reason>" (NVTE_DEBUG_LEVEL=2) and
  "Selected backend = <Backend>" (level >= 1), logged once per owner and configuration;
- the mask name "arbitrary" (a mask tensor, which the C API has no enum for): the rest of the
  problem is asked about, then only the framework math (unfused) is left;
- `no_backend_error`: the NotImplementedError listing every backend's reason.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from . import capi, config

__all__ = [
    "BACKEND_NAMES",
    "ENV_KEYS",
    "PREFERENCE",
    "enum_value",
    "env_key",
    "no_backend_error",
    "qkv_format_of",
    "select",
]

LOGGER = logging.getLogger("transformer_engine_lite.attention")
# Backend values of NVTE_Fused_Attn_Backend in order of preference, with the names logs use.
PREFERENCE = (("ck", 1), ("aotriton", 0), ("flash", 2), ("unfused", 3))
BACKEND_NAMES = {
    "ck": "CK",
    "aotriton": "AOTriton",
    "flash": "FlashAttention",
    "unfused": "UnfusedDotProductAttention",
}
# Env vars the selection depends on (C switches, Python logging): part of the cache key.
ENV_KEYS = (
    "NVTE_FUSED_ATTN",
    "NVTE_FUSED_ATTN_CK",
    "NVTE_FUSED_ATTN_AOTRITON",
    "NVTE_FLASH_ATTN",
    "NVTE_UNFUSED_ATTN",
    "NVTE_DEBUG",
    "NVTE_DEBUG_LEVEL",
)
_ENUMS: dict[str, dict[str, int]] = {}


def enum_value(kind: str, name: str) -> int:
    """The C enum value of a layout / mask / bias name ("bshd_bshd_bshd", "causal", "no_bias")."""
    if not _ENUMS:
        for k, names in (
            ("layout", capi.qkv_layout_names()),
            ("mask", capi.mask_type_names()),
            ("bias", capi.bias_type_names()),
        ):
            _ENUMS[k] = {n: i for i, n in enumerate(names)}
    return _ENUMS[kind][name]


def qkv_format_of(qkv_layout: str) -> str:
    """'bs3hd' -> 'bshd', 'sbhd_sb2hd' -> 'sbhd', 't3hd' -> 'thd'."""
    return {"b": "bshd", "s": "sbhd", "t": "thd"}[qkv_layout[0]]


def env_key() -> str:
    return "|".join(os.environ.get(k, "") for k in ENV_KEYS)


# ------------------------------------------------------------------------------------ logging
class _StderrHandler(logging.StreamHandler):
    """Writes to the current sys.stderr (not the one at creation: pytest and notebooks swap it)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


_HANDLER: logging.Handler | None = None


def _debug_logger() -> logging.Logger | None:
    """The attention logger set to NVTE_DEBUG_LEVEL's level when NVTE_DEBUG=1, else None."""
    global _HANDLER
    if config.get("NVTE_DEBUG") != "1":
        return None
    level = config.get("NVTE_DEBUG_LEVEL")
    levels = {"0": logging.WARNING, "1": logging.INFO, "2": logging.DEBUG}
    if level not in levels:
        raise ValueError(f"NVTE_DEBUG_LEVEL: expected 0, 1 or 2, got {level!r}")
    if _HANDLER is None:
        _HANDLER = _StderrHandler()
        _HANDLER.setFormatter(logging.Formatter("[%(levelname)-8s | %(name)s]: %(message)s"))
        LOGGER.addHandler(_HANDLER)
    LOGGER.setLevel(levels[level])
    return LOGGER


# ------------------------------------------------------------------------------------ selection
_RESULTS: dict[tuple, tuple[str | None, tuple[str, ...]]] = {}
_LAST_LOGGED: dict[Any, tuple] = {}


def _run_selection(key: tuple) -> tuple[str | None, tuple[str, ...]]:
    """(backend name or None, reasons indexed by enum value) of one configuration."""
    (device, dtype, layout, bias, mask, dropout, h, h_kv, sq, skv, dqk, dv, left, right) = key[:14]
    arbitrary = mask == "arbitrary"
    cfg = capi.NVTEFusedAttnConfig(
        device=device,
        q_dtype=dtype,
        kv_dtype=dtype,
        qkv_layout=enum_value("layout", layout),
        bias_type=enum_value("bias", bias),
        attn_mask_type=enum_value("mask", "no_mask" if arbitrary else mask),
        dropout=dropout,
        num_attn_heads=h,
        num_gqa_groups=h_kv,
        max_seqlen_q=sq,
        max_seqlen_kv=skv,
        head_dim_qk=dqk,
        head_dim_v=dv,
        window_size_left=left,
        window_size_right=right,
    )
    selected, reasons = capi.fused_attn_backend_reasons(cfg)
    reasons = list(reasons)
    if arbitrary:
        for _, value in PREFERENCE[:3]:
            if not reasons[value]:
                reasons[value] = "attn_mask_type 'arbitrary' is supported by the unfused backend only"
        selected = -1 if reasons[3] else 3
    by_value = {value: name for name, value in PREFERENCE}
    return by_value.get(selected), tuple(reasons)


def select(
    owner: Any,
    device: int,
    dtype: int,
    layout: str,
    bias: str,
    mask: str,
    dropout: float,
    h: int,
    h_kv: int,
    sq: int,
    skv: int,
    dqk: int,
    dv: int,
    left: int,
    right: int,
    env: str,
    log: bool = True,
    refresh: bool = False,
) -> tuple[str | None, tuple[str, ...]]:
    """(backend name or None, reasons indexed by backend enum value) for one configuration:
    device 0 = CPU, 1 = the GPU; dtype a capi.DType value; names as the C API's. Logs the result
    (NVTE_DEBUG) when `log` and this owner last logged another configuration. `refresh` asks the C
    selection again and logs again even when this configuration is cached (TE's
    backend_selection_requires_update)."""
    key = (device, dtype, layout, bias, mask, dropout, h, h_kv, sq, skv, dqk, dv, left, right, env)
    if refresh:
        _RESULTS.pop(key, None)
        _LAST_LOGGED.pop(owner, None)
    if key not in _RESULTS:
        if len(_RESULTS) > 4096:
            _RESULTS.clear()
        _RESULTS[key] = _run_selection(key)
    backend, reasons = _RESULTS[key]
    logger = _debug_logger() if log else None
    if logger is not None and _LAST_LOGGED.get(owner) != key:
        if len(_LAST_LOGGED) > 4096:
            _LAST_LOGGED.clear()
        _LAST_LOGGED[owner] = key
        for name, value in PREFERENCE:
            if reasons[value]:
                logger.debug("Disabling %s due to %s", BACKEND_NAMES[name], reasons[value])
        logger.info("Selected backend = %s", BACKEND_NAMES[backend] if backend else "None")
    return backend, reasons


def no_backend_error(where: str, key: tuple, reasons: tuple[str, ...]) -> NotImplementedError:
    """The error raised when no backend can run configuration `key` (select's arguments from
    device to right)."""
    (_, dtype, layout, bias, mask, dropout, h, h_kv, sq, skv, dqk, dv, left, right) = key[:14]
    why = "; ".join(f"{n}: {reasons[v]}" for n, v in PREFERENCE)
    return NotImplementedError(
        f"{where}: no attention backend can run this configuration (dtype "
        f"{capi.DType(dtype).name}, layout {layout}, mask {mask}, bias {bias}, h={h} h_kv={h_kv} "
        f"s_q={sq} s_kv={skv} d_qk={dqk} d_v={dv}, window ({left}, {right}), dropout {dropout}): "
        f"{why}"
    )
