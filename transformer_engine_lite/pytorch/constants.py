"""TE's `transformer_engine.pytorch.constants`: dtype maps between torch and the C API's DType, the
string vocabularies of the attention and GEMM arguments, and block sizes of the block-scaled
formats. Clients (Megatron-Core) import these names directly."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed

from . import tex as _tex
from .tex import DType

__all__ = [
    "AttnBiasTypes",
    "AttnMaskTypes",
    "AttnTypes",
    "FP8BwdTensorIdx",
    "FP8FwdTensorIdx",
    "GemmParallelModes",
    "LayerTypes",
    "MXFP8_BLOCK_SCALING_SIZE",
    "NVFP4_BLOCK_SCALING_SIZE",
    "QKVLayouts",
    "TE_DType",
    "TE_DType_To_Torch",
    "dist_group_type",
]

# torch dtype -> DType for the dtypes TE maps (the same table as TE's; the values are the C API's
# NVTEDType numbers).
TE_DType = {
    torch.uint8: DType.kByte,
    torch.float8_e4m3fn: DType.kFloat8E4M3,
    torch.float8_e5m2: DType.kFloat8E5M2,
    torch.int32: DType.kInt32,
    torch.float32: DType.kFloat32,
    torch.half: DType.kFloat16,
    torch.bfloat16: DType.kBFloat16,
}
TE_DType_To_Torch = {v: k for k, v in TE_DType.items()}

AttnMaskTypes = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
AttnTypes = ("self", "cross")
AttnBiasTypes = ("pre_scale_bias", "post_scale_bias", "no_bias", "alibi")
# The layouts TE names; the paged_kv_* ones belong to TE's paged KV cache (not implemented here).
QKVLayouts = tuple(
    f"{a}_{b}" if b else a
    for a, b in [("sb3hd", ""), ("sbh3d", ""), ("sbhd", "sb2hd"), ("sbhd", "sbh2d"),
                 ("sbhd", "sbhd_sbhd"), ("bs3hd", ""), ("bsh3d", ""), ("bshd", "bs2hd"),
                 ("bshd", "bsh2d"), ("bshd", "bshd_bshd"), ("t3hd", ""), ("th3d", ""),
                 ("thd", "t2hd"), ("thd", "th2d"), ("thd", "thd_thd"), ("sbhd", "bshd_bshd"),
                 ("bshd", "sbhd_sbhd"), ("thd", "bshd_bshd"), ("thd", "sbhd_sbhd"),
                 ("paged_kv", "bshd_bshd_bshd"), ("paged_kv", "bshd_sbhd_sbhd"),
                 ("paged_kv", "sbhd_bshd_bshd"), ("paged_kv", "sbhd_sbhd_sbhd"),
                 ("paged_kv", "thd_bshd_bshd"), ("paged_kv", "thd_sbhd_sbhd")]
)
LayerTypes = ("encoder", "decoder")
GemmParallelModes = ("row", "column", None)
dist_group_type = torch.distributed.ProcessGroup
MXFP8_BLOCK_SCALING_SIZE = 32
NVFP4_BLOCK_SCALING_SIZE = 16

# TE's int views of tex.FP8FwdTensors / FP8BwdTensors (index module.quantizers[...] and the FP8
# meta columns with them).
FP8FwdTensorIdx = SimpleNamespace(**{k: int(v) for k, v in _tex.FP8FwdTensors.__members__.items()})
FP8BwdTensorIdx = SimpleNamespace(**{k: int(v) for k, v in _tex.FP8BwdTensors.__members__.items()})
