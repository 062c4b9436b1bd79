"""The AOTriton kernels' ABI and variant table: per kernel its non-constexpr parameters in order
with their Triton types ("{dtype}" = the element type bf16/fp16), its constexprs and grid rule, and
the launch config per (arch family, dtype, BLOCK_D). build_tools/aotriton.py compiles one image per
(arch, kernel, dtype, BLOCK_D); the C++ glue packs arguments by name in this order, and launch.py
builds its argument lists from the same table. Importing this module imports no triton.
"""

from __future__ import annotations

import importlib

# Every name a kernel parameter may have: the C++ glue knows how to fill exactly these.
# Pointers (elements of the variant's dtype unless noted): LSE, Delta fp32 [b, h, max_seqlen_q];
# CuSeqlens* int32 [b + 1] (read only when varlen); RngState int64 {seed, offset} (read only when
# dropout_threshold != 0). Strides are in elements; the head_dim stride is 1.
_TENSORS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")


def _names(words: str) -> list[str]:
    return words.split()


ABI_NAMES: tuple[str, ...] = (
    "Q", "K", "V", "Out", "dO", "LSE", "Delta", "dQ", "dK", "dV",
    "CuSeqlensQ", "CuSeqlensKV", "RngState",
    "sm_scale", "keep_scale", "dropout_threshold",
    *(f"stride_{t}_{a}" for t in _TENSORS for a in "bhs"),
    "num_heads", "num_heads_kv", "max_seqlen_q", "max_seqlen_kv", "head_dim",
    "varlen", "is_thd", "window_left", "window_right", "bottom_right",
)  # fmt: skip

# Triton type of each ABI name ("{dtype}": the variant's element type).
ABI_TYPES: dict[str, str] = {
    **{n: "*{dtype}" for n in _names("Q K V Out dO dQ dK dV")},
    **{n: "*fp32" for n in ("LSE", "Delta")},
    **{n: "*i32" for n in ("CuSeqlensQ", "CuSeqlensKV")},
    "RngState": "*i64",
    **{n: "fp32" for n in ("sm_scale", "keep_scale")},
    "dropout_threshold": "u32",
    **{f"stride_{t}_{a}": "i64" for t in _TENSORS for a in "bhs"},
    **{n: "i32" for n in ABI_NAMES[-10:]},  # sizes and flags
}

CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_D")
DTYPES = ("bf16", "fp16")
BLOCK_DS = (64, 128)
ARCH_FAMILIES = ("amd", "nvidia")
# Grid rules: axis 0 over query or key blocks of max_seqlen, axis 1 over b * heads (or kv heads).
GRID_AXIS0 = ("q_blocks", "kv_blocks")
GRID_AXIS1 = ("batch_heads", "batch_heads_kv")


def _strides(*tensors: str) -> list[str]:
    return [f"stride_{t}_{a}" for t in tensors for a in "bhs"]


_MASKING = ["varlen", "is_thd", "window_left", "window_right", "bottom_right"]
_DROPOUT = ["sm_scale", "keep_scale", "dropout_threshold"]
_SIZES = ["num_heads", "num_heads_kv", "max_seqlen_q", "max_seqlen_kv", "head_dim"]


def _kernel(name: str, module: str, names: list[str], grid: tuple[str, str]) -> dict:
    return {
        "name": name,
        "module": module,  # relative to this package (see __init__.py)
        "function": name,
        "params": tuple((n, ABI_TYPES[n]) for n in names),
        "constexprs": CONSTEXPRS,
        "grid": grid,
    }


KERNELS: tuple[dict, ...] = (
    _kernel(
        "attn_fwd",
        "flash_fwd",
        [*_names("Q K V Out LSE CuSeqlensQ CuSeqlensKV RngState"), *_DROPOUT,
         *_strides("q", "k", "v", "o"), *_SIZES, *_MASKING],
        ("q_blocks", "batch_heads"),
    ),
    _kernel(
        "attn_bwd_preprocess",
        "flash_bwd",
        [*_names("Out dO Delta CuSeqlensQ"), *_strides("o", "do"),
         *_names("num_heads max_seqlen_q head_dim varlen is_thd")],
        ("q_blocks", "batch_heads"),
    ),
    _kernel(
        "attn_bwd_dkdv",
        "flash_bwd",
        [*_names("Q K V dO LSE Delta dK dV CuSeqlensQ CuSeqlensKV RngState"), *_DROPOUT,
         *_strides("q", "k", "v", "do", "dk", "dv"), *_SIZES, *_MASKING],
        ("kv_blocks", "batch_heads_kv"),
    ),
    _kernel(
        "attn_bwd_dq",
        "flash_bwd",
        [*_names("Q K V dO LSE Delta dQ CuSeqlensQ CuSeqlensKV RngState"), *_DROPOUT,
         *_strides("q", "k", "v", "do", "dq"), *_SIZES, *_MASKING],
        ("q_blocks", "batch_heads"),
    ),
)  # fmt: skip
KERNEL_NAMES = tuple(k["name"] for k in KERNELS)


def kernel(name: str) -> dict:
    for k in KERNELS:
        if k["name"] == name:
            return k
    raise KeyError(f"variants: expected a kernel among {KERNEL_NAMES}, got {name!r}")


def jit_function(name: str):
    """The @triton.jit function of kernel `name` (imports triton and the kernel module)."""
    k = kernel(name)
    return getattr(importlib.import_module(f".{k['module']}", __package__), k["function"])


def signature(name: str, dtype: str) -> dict[str, str]:
    """triton.compile's signature of one variant: params typed, constexprs as 'constexpr'."""
    k = kernel(name)
    sig = {n: t.format(dtype=dtype) for n, t in k["params"]}
    sig.update({c: "constexpr" for c in k["constexprs"]})
    return sig


# Launch configs per (kernel, arch family, BLOCK_D); bf16 and fp16 share them (equal sizes).
# Chosen from triton 3.9 compiles (ptxas -v for sm_80, amdgcn metadata for gfx942):
# - NVIDIA: 8 warps everywhere but the preprocess. With 4 warps a 128 x 64 forward tile plus the
#   dropout path's Philox state (10 rounds over every logit of the tile) exceeds 255 registers and
#   spills; with 8 warps: fwd d64 200 regs, d128 (BLOCK_N 32) 224, dkdv 234 / 248, dq 254 / 202,
#   no spills, shared 24-58 KiB (of sm_80's 163 KiB; > 48 KiB needs the dynamic-smem opt-in).
# - AMD (64 KiB LDS, 512 VGPR+AGPR per lane): 4 warps of 64 lanes; shared 8-32 KiB, no spills.
# dkdv: BLOCK_N is its key tile (K, V, dK, dV stay in registers), BLOCK_M the streamed query
# tile; fwd and dq the reverse. Block sizes are powers of two >= 16 (tl.dot, tl.arange).
_FAMILY_CONFIGS = {
    # kernel: {(family, block_d): (BLOCK_M, BLOCK_N, num_warps, num_stages)}
    "attn_fwd": {
        ("amd", 64): (128, 64, 4, 2), ("amd", 128): (128, 64, 8, 2),
        ("nvidia", 64): (128, 64, 8, 3), ("nvidia", 128): (128, 32, 8, 3),
    },
    "attn_bwd_preprocess": {
        ("amd", 64): (64, 64, 4, 1), ("amd", 128): (64, 64, 4, 1),
        ("nvidia", 64): (64, 64, 4, 1), ("nvidia", 128): (64, 64, 4, 1),
    },
    "attn_bwd_dkdv": {
        ("amd", 64): (64, 64, 4, 1), ("amd", 128): (32, 64, 4, 1),
        ("nvidia", 64): (32, 64, 8, 2), ("nvidia", 128): (32, 64, 8, 2),
    },
    "attn_bwd_dq": {
        ("amd", 64): (64, 64, 4, 1), ("amd", 128): (64, 32, 4, 1),
        ("nvidia", 64): (64, 64, 8, 2), ("nvidia", 128): (64, 32, 8, 2),
    },
}  # fmt: skip


def config(kernel_name: str, arch_family: str, dtype: str, block_d: int) -> dict:
    """BLOCK_M, BLOCK_N, num_warps, num_stages of one variant."""
    if arch_family not in ARCH_FAMILIES:
        raise KeyError(
            f"variants: expected an arch family among {ARCH_FAMILIES}, got {arch_family!r}"
        )
    if dtype not in DTYPES:
        raise KeyError(f"variants: expected a dtype among {DTYPES}, got {dtype!r}")
    if block_d not in BLOCK_DS:
        raise KeyError(f"variants: expected BLOCK_D among {BLOCK_DS}, got {block_d!r}")
    m, n, warps, stages = _FAMILY_CONFIGS[kernel(kernel_name)["name"]][(arch_family, block_d)]
    return {"BLOCK_M": m, "BLOCK_N": n, "num_warps": warps, "num_stages": stages}


def block_d_for(head_dim: int) -> int:
    """The smallest BLOCK_D variant that holds head_dim (e.g. 80 -> 128)."""
    for bd in BLOCK_DS:
        if head_dim <= bd:
            return bd
    raise ValueError(f"variants: head_dim {head_dim} exceeds the largest BLOCK_D {BLOCK_DS[-1]}")
