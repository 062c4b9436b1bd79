"""TE's module-level weight-quantizer queries (TransformerEngineBaseModule in TE's module/base.py),
as a mixin of this library's base module:

- `_get_weight_quantizers()`: the weight quantizer of each GEMM, module.quantizers' forward weight
  slots (TE: [None] per weight outside an FP8 / calibration forward).
- `_enable_weight_preswizzle(quantizer, weight)`: TE's choice of GEMM-swizzled scales for weight
  casts, which each FP8 forward writes into the weight quantizer's optimize_for_gemm
  (mark_weight_preswizzle) and which the cached casts follow (module/_weight_workspace.py).
- `is_fsdp2`: whether the module or an ancestor is under FSDP2's fully_shard (TE's Linear,
  LayerNormLinear and LayerNormMLP then cache no weight cast).
"""

from __future__ import annotations

from typing import Any

import torch

from ..fp8 import FP8GlobalStateManager
from ..tensor import MXFP8Quantizer, NVFP4Quantizer


class WeightQuantizerMixin:
    """See the module docstring (mixed into TransformerEngineBaseModule)."""

    num_gemms: int
    primary_weights_in_fp8: bool

    @property
    def is_fsdp2(self) -> bool:
        """TE's: whether this module or an ancestor is wrapped by FSDP2 (fully_shard); computed
        once, at the first use (a forward)."""
        if "_is_fsdp2" not in self.__dict__:
            from ..distributed import _get_module_fsdp_state

            try:
                _get_module_fsdp_state(self)  # type: ignore[arg-type]
                self.__dict__["_is_fsdp2"] = True
            except (RuntimeError, ImportError):
                self.__dict__["_is_fsdp2"] = False
        return self.__dict__["_is_fsdp2"]

    def _enable_weight_preswizzle(self, quantizer: Any, weight: torch.Tensor) -> bool:
        """TE's: whether a weight cast by `quantizer` gets GEMM-swizzled scales. Never for FP8
        primary weights (their unswizzled layout is what dequantize and FSDP2 gather read);
        always for MXFP8; for NVFP4 where TE's fused quantize-and-swizzle kernels run (the RHT
        cast: rows % 64, cols % 128; the plain 2D cast: rows and cols % 128, neither row-scaled
        nor 4over6; the SM 100 GPUs this recipe is emulated as); never for the other formats."""
        if self.primary_weights_in_fp8:
            return False
        if isinstance(quantizer, MXFP8Quantizer):
            return True
        if isinstance(quantizer, NVFP4Quantizer):
            rows, cols = weight.numel() // weight.shape[-1], weight.shape[-1]
            if quantizer.with_rht:
                return rows % 64 == 0 and cols % 128 == 0
            return (quantizer.with_2d_quantization and not quantizer.row_scaled_nvfp4
                    and not quantizer.nvfp4_use_4over6 and rows % 128 == 0 and cols % 128 == 0)
        return False

    def _mark_weight_preswizzle(self, gemm: int, weight: torch.Tensor) -> None:
        """TE's forward step: the weight quantizer of GEMM `gemm` (module.quantizers) records
        _enable_weight_preswizzle for this weight (delayed scaling's quantizers are views built
        per access: nothing to record)."""
        kept = self.__dict__.get("quantizers")
        fwd = kept.get("scaling_fwd") if isinstance(kept, dict) else None
        if fwd is None or len(fwd) <= 3 * gemm + 1:
            return
        q = fwd[3 * gemm + 1]
        if q is not None and hasattr(q, "optimize_for_gemm"):
            q.optimize_for_gemm = self._enable_weight_preswizzle(q, weight)

    def _get_weight_quantizers(self) -> list[Any]:
        """TE's: the weight quantizer of each GEMM (module.quantizers["scaling_fwd"] slot 3g+1),
        marked internal as TE's; [None] per GEMM outside an FP8 or calibration autocast."""
        n = self.num_gemms
        m = FP8GlobalStateManager
        if not m.is_fp8_enabled() and not m.is_fp8_calibration():
            return [None] * n
        fwd = self.quantizers["scaling_fwd"]  # type: ignore[attr-defined]
        if len(fwd) < 3 * n:  # no FP8 forward yet under this recipe
            return [None] * n
        out = [fwd[3 * g + 1] for g in range(n)]
        for q in out:
            if q is not None:
                q.internal = True  # TE's: its casts are bare storage for the module's GEMMs
        return out
