"""TE's custom_recipes: quantizer factories for common.recipe.CustomRecipe and pure-torch
reference quantizers.

- quantizer_factories: one factory per built-in recipe (a CustomRecipe built from one runs the
  same numerics as that recipe), plus high_precision_factory.
- quantizer_factory_zoo: mixed-format factories (TE's: HybridQuantizers with one format per
  direction).
- reference_current_scaling: CurrentScalingQuantizerRef, an independent torch implementation of
  per-tensor current scaling and of the FP8 GEMM, the oracle the native kernels are tested against.
- reference_nvfp4: NVFP4QuantizerRef, an independent torch implementation of NVFP4 (1x16 / 16x16
  blocks, RHT, 4over6, row-scaled; MXFP4 with pow_2_scales) and of the FP4 GEMM (qgemm), and TE's
  reference factory. reference_utils: the names it and TE's tests share.
- gemm: MMParams / GEMMType, and custom_gemm, which runs a GEMM of two custom tensors (quantizers
  saying `custom`, as the references) through the quantizer's qgemm (general_gemm and the modules
  dispatch to it).
"""

from . import gemm, quantizer_factories, quantizer_factory_zoo, reference_current_scaling  # noqa: F401
from . import reference_nvfp4, reference_utils  # noqa: F401
