"""TE's custom_recipes: quantizer factories for common.recipe.CustomRecipe and pure-torch
reference quantizers.

- quantizer_factories: one factory per built-in recipe (a CustomRecipe built from one runs the
  same numerics as that recipe), plus high_precision_factory.
- quantizer_factory_zoo: mixed-format factories (those needing TE's HybridQuantizer raise
  NotImplementedError).
- reference_current_scaling: CurrentScalingQuantizerRef, an independent torch implementation of
  per-tensor current scaling and of the FP8 GEMM, the oracle the native kernels are tested against.
- gemm: MMParams / GEMMType, the reference GEMM's options.
- reference_nvfp4: the NVFP4 reference factory (our NVFP4Quantizer, bit-exact with TE's reference).
"""

from . import gemm, quantizer_factories, quantizer_factory_zoo, reference_current_scaling  # noqa: F401
from . import reference_nvfp4  # noqa: F401
