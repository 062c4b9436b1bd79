"""Primitive level of the JAX front end (TE-JAX's `transformer_engine.jax.cpp_extensions`, usually
imported as `tex`): one primitive per XLA FFI handler of libte_lite_jax.so, each with abstract
evaluation, lowering, batching, sharding rules and a pure-JAX reference (`_jax_*`)."""

from .activation import (  # noqa: F401
    ActivationEnum,
    ActivationParams,
    ClampedSwigluParams,
    _jax_act_lu_f32,
    act_lu,
    activation_name,
    dact_lu,
    is_gated,
)
from .attention import (  # noqa: F401
    dropout_keep_mask,
    fused_attn_bwd,
    fused_attn_fwd,
)
from .attention_helper import (  # noqa: F401
    FusedAttnHelper,
    NVTE_Fused_Attn_Backend,
    get_fused_attn_backend,
)
from .base import custom_calls_enabled, registrations  # noqa: F401
from .gemm import gemm, gemm_core  # noqa: F401
from .grouped import (  # noqa: F401
    GroupedQuantizePrimitive,
    grouped_gemm,
    grouped_gemm_copy_group_sizes,
    grouped_quantize,
)
from .normalization import (  # noqa: F401
    _jax_layernorm_f32,
    _jax_rmsnorm_f32,
    layernorm_bwd,
    layernorm_fwd,
    normalization_bwd,
    normalization_fwd,
    rmsnorm_bwd,
    rmsnorm_fwd,
)
from .nvfp4 import dequantize_nvfp4, quantize_nvfp4  # noqa: F401
from .amax import AmaxScope  # noqa: F401
from .quantization import (  # noqa: F401
    _jax_quantize_scaled,
    calculate_amax,
    cast_transpose,
    compute_scale_from_amax,
    delayed_scaling_update,
    dequantize,
    dequantize_mxfp8,
    quantize,
    quantize_mxfp8,
    transpose,
)
from .te_api import (  # noqa: F401
    _jax_act_lu,
    _jax_layernorm,
    _jax_quantize,
    _jax_quantize_dact_dbias,
    _jax_quantize_dbias,
    _jax_rmsnorm,
    is_norm_zero_centered_gamma_in_weight_dtype,
    quantize_dact_dbias,
    quantize_dbias,
)
from .rope import fused_rope_bwd, fused_rope_fwd  # noqa: F401
from .softmax import (  # noqa: F401
    is_softmax_kernel_available,
    jax_scaled_masked_softmax,
    jax_scaled_softmax,
    jax_scaled_upper_triang_masked_softmax,
    scaled_aligned_causal_masked_softmax_bwd,
    scaled_aligned_causal_masked_softmax_fwd,
    scaled_masked_softmax_bwd,
    scaled_masked_softmax_fwd,
    scaled_softmax_bwd,
    scaled_softmax_fwd,
    scaled_upper_triang_masked_softmax_bwd,
    scaled_upper_triang_masked_softmax_fwd,
)
