"""`softmax(logits, mask=None, scale_factor=1.0, softmax_fusion_type=SCALED)`: TE-JAX's fused
softmax, differentiable, over the core kernels."""

from __future__ import annotations

from enum import Enum
from functools import partial

import jax

from . import cpp_extensions as tex

__all__ = ["SoftmaxFusionType", "SoftmaxShapeError", "softmax"]


class SoftmaxShapeError(ValueError, AssertionError):
    """A shape the fused softmax does not take (is_softmax_kernel_available says False for it). A
    ValueError, the project's rule for a rejected value, that is also an AssertionError: TE rejects
    these with `assert` and TE code (its tests among it) expects that."""


class SoftmaxFusionType(Enum):
    SCALED = "scaled"
    SCALED_MASKED = "scaled_masked"
    SCALED_UPPER_TRIANG_MASKED = "scaled_upper_triang_masked"


SoftmaxType = SoftmaxFusionType  # TE 1.x name


def softmax(logits, mask=None, scale_factor=1.0, softmax_fusion_type=SoftmaxFusionType.SCALED):
    """softmax(logits * scale_factor) over the last dim; logits [b, h, sq, sk].

    SCALED_MASKED: mask [b or 1, 1, sq, sk], nonzero (True) = masked out. SCALED_UPPER_TRIANG_MASKED:
    causal (key j > query i masked), sq == sk.
    """
    kind = SoftmaxFusionType(softmax_fusion_type)
    if kind is SoftmaxFusionType.SCALED_MASKED and mask is None:
        raise ValueError("softmax: argument 'mask': expected a mask for SCALED_MASKED, got None")
    if (kind is SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED and logits.ndim >= 2
            and logits.shape[-1] != logits.shape[-2]):
        raise SoftmaxShapeError(f"softmax: argument 'logits': SCALED_UPPER_TRIANG_MASKED expects "
                                f"sq == sk, got shape {tuple(logits.shape)}")
    return _softmax(logits, mask, float(scale_factor), kind)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _softmax(logits, mask, scale, kind):
    return _softmax_fwd(logits, mask, scale, kind)[0]


def _softmax_fwd(logits, mask, scale, kind):
    if kind is SoftmaxFusionType.SCALED:
        y = tex.scaled_softmax_fwd(logits, scale)
    elif kind is SoftmaxFusionType.SCALED_MASKED:
        y = tex.scaled_masked_softmax_fwd(logits, mask, scale)
    else:
        y = tex.scaled_upper_triang_masked_softmax_fwd(logits, scale)
    return y, (y, mask)


def _softmax_bwd(scale, kind, res, g):
    y, _mask = res
    g = g.astype(y.dtype)
    if kind is SoftmaxFusionType.SCALED:
        dx = tex.scaled_softmax_bwd(g, y, None, scale)
    elif kind is SoftmaxFusionType.SCALED_MASKED:
        dx = tex.scaled_masked_softmax_bwd(g, y, None, None, scale)
    else:
        dx = tex.scaled_upper_triang_masked_softmax_bwd(g, y, None, scale)
    return dx, None


_softmax.defvjp(_softmax_fwd, _softmax_bwd)
