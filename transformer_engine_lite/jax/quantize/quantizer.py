"""Quantizers (pytrees): how a tensor becomes FP8 under each recipe, and the QuantizerSet a GEMM uses.

- CurrentScaleQuantizer: amax of this tensor -> scale (ARCHITECTURE §5, the core's rule) -> quantize.
- DelayedScaleQuantizer: quantize with the stored scale, then `update(amax)` (TE-JAX's order: the
  amax goes into history[0], then the core's delayed-scaling update computes the new scale and rolls
  the history) — the same arithmetic as the PyTorch front end, so the states are bit-identical.
- BlockScaleQuantizer: MXFP8, 1x32 blocks along the last dim of the 2-D view (row-wise) and along its
  first dim (column-wise), `flatten_axis` choosing the 2-D view.

Quantizers are mutated in place by `quantize` (as TE-JAX's are); the functional API returns the
updated QuantizerSet as the "gradient" of its quantizer_set argument, which is how Flax's fp8_metas
collection gets its new values (TE's idiom).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.tree_util import register_pytree_node_class

from .. import cpp_extensions as tex
from .scaling_modes import AmaxComputeAlgo, QuantizeLayout, ScalingMode
from .tensor import ScaledTensor1x, ScaledTensor2x

__all__ = [
    "BlockScaleQuantizer",
    "CurrentScaleQuantizer",
    "NVFP4Quantizer",
    "DelayedScaleQuantizer",
    "QuantizeMeta",
    "QuantizeMetaSet",
    "Quantizer",
    "QuantizerSet",
    "compute_scale_from_amax",
    "noop_quantizer_set",
]


def compute_scale_from_amax(amax, q_dtype, margin=0.0, scale=None):
    """TE-JAX helper: fp8_max / amax / 2^margin; keeps `scale` where amax is 0 or not finite."""
    fmax = float(jnp.finfo(q_dtype).max)
    sf = (jnp.float32(fmax) / amax) / jnp.float32(2.0 ** margin)
    prev = jnp.ones_like(sf) if scale is None else scale
    sf = jnp.where(jnp.isfinite(amax) & (amax > 0), sf, prev)
    return jnp.where(jnp.isinf(sf), jnp.float32(jnp.finfo(jnp.float32).max), sf)


def _pytree(cls):
    """Registers a quantizer dataclass: array fields are children, the rest aux data."""
    cls = dataclass(cls)
    names = [f.name for f in fields(cls)]
    arrays = getattr(cls, "_array_fields", ())

    def flatten(self):
        return tuple(getattr(self, n) for n in arrays), tuple(
            getattr(self, n) for n in names if n not in arrays)

    def unflatten(aux, children):
        obj = object.__new__(cls)
        it = iter(aux)
        for n in names:
            object.__setattr__(obj, n, None)
        for n, v in zip(arrays, children):
            object.__setattr__(obj, n, v)
        for n in names:
            if n not in arrays:
                object.__setattr__(obj, n, next(it))
        return obj

    cls.tree_flatten = flatten
    cls.tree_unflatten = classmethod(lambda c, aux, ch: unflatten(aux, ch))
    return register_pytree_node_class(cls)


@_pytree
class Quantizer:
    q_dtype: Any = jnp.float8_e4m3fn
    scaling_mode: ScalingMode = ScalingMode.NO_SCALING
    q_layout: QuantizeLayout = QuantizeLayout.ROWWISE_COLWISE
    checkpoint_name: str | None = None
    _array_fields = ()

    def is_2x2x(self) -> bool:
        return self.q_layout == QuantizeLayout.ROWWISE_COLWISE

    def update(self, amax) -> None:
        del amax

    def quantize(self, x, is_rowwise=None, is_colwise=None, dq_dtype=None, flatten_axis=-1):
        raise NotImplementedError

    def _wrap(self, t: ScaledTensor1x, is_rowwise, is_colwise):
        row = self.q_layout.has_rowwise if is_rowwise is None else is_rowwise
        col = self.q_layout.has_colwise if is_colwise is None else is_colwise
        if self.checkpoint_name is not None:
            # TE-JAX's checkpoint_name: the quantized arrays carry the name so that a remat policy
            # (jax.checkpoint_policies.save_only_these_names) can keep them instead of recomputing.
            t = jax.tree_util.tree_map(lambda a: checkpoint_name(a, self.checkpoint_name), t)
        if row and col:
            colt = ScaledTensor1x(t.data, t.scale_inv, t.scaling_mode, t.dq_dtype, True, t.amax)
            return ScaledTensor2x(t, colt)
        if col:
            t.is_colwise = True
        return t


@_pytree
class CurrentScaleQuantizer(Quantizer):
    scaling_mode: ScalingMode = ScalingMode.CURRENT_TENSOR_SCALING
    power_2_scale: bool = False
    amax_epsilon: float = 0.0

    def _scale(self, x, amax_scope=None, transpose_batch_sequence=False):
        amax = tex.calculate_amax(x, amax_scope, transpose_batch_sequence)
        scale, _ = tex.compute_scale_from_amax(amax, self.q_dtype, self.amax_epsilon,
                                               self.power_2_scale)
        return scale

    def quantize(self, x, is_rowwise=None, is_colwise=None, dq_dtype=None, flatten_axis=-1,
                 amax_scope=None, transpose_batch_sequence=False):
        """amax_scope (an AmaxScope) takes the amax as TE-JAX's scoped reduction does (LOCAL: each
        shard its own); None: over the whole tensor."""
        del flatten_axis
        scale = self._scale(x, amax_scope, transpose_batch_sequence)
        q, amax, scale_inv = tex.quantize(x, scale, self.q_dtype)
        t = ScaledTensor1x(q, scale_inv, self.scaling_mode, dq_dtype or x.dtype, False, amax)
        return self._wrap(t, is_rowwise, is_colwise)


@_pytree
class DelayedScaleQuantizer(Quantizer):
    scaling_mode: ScalingMode = ScalingMode.DELAYED_TENSOR_SCALING
    margin: float = 0.0
    amax_compute_algo: AmaxComputeAlgo = AmaxComputeAlgo.MAX
    scale: Any = field(default_factory=lambda: jnp.ones((1,), jnp.float32))
    amax_history: Any = field(default_factory=lambda: jnp.zeros((1024,), jnp.float32))
    _array_fields = ("scale", "amax_history")

    def quantize(self, x, is_rowwise=None, is_colwise=None, dq_dtype=None, flatten_axis=-1):
        del flatten_axis
        q, amax, scale_inv = tex.quantize(x, self.scale, self.q_dtype)
        self.update(amax)
        t = ScaledTensor1x(q, scale_inv, self.scaling_mode, dq_dtype or x.dtype, False, amax)
        return self._wrap(t, is_rowwise, is_colwise)

    def update(self, amax) -> None:
        """history[0] = amax, then the core's update: new scale from the history, roll by -1."""
        hist = self.amax_history.at[0].set(amax.reshape(-1)[0])
        algo = AmaxComputeAlgo(self.amax_compute_algo).value
        new_hist, new_scale = tex.delayed_scaling_update(
            hist[:, None], self.scale.reshape(1), algo, self.q_dtype, self.margin)
        self.amax_history = new_hist[:, 0]
        self.scale = new_scale


@_pytree
class BlockScaleQuantizer(Quantizer):
    """MXFP8 1x32 blocks; `flatten_axis` = how many leading dims form the rows of the 2-D view."""

    scaling_mode: ScalingMode = ScalingMode.MXFP8_1D_SCALING

    def quantize(self, x, is_rowwise=None, is_colwise=None, dq_dtype=None, flatten_axis=-1):
        row = self.q_layout.has_rowwise if is_rowwise is None else is_rowwise
        col = self.q_layout.has_colwise if is_colwise is None else is_colwise
        fa = flatten_axis % x.ndim if flatten_axis < 0 else flatten_axis
        x2 = x.reshape(math.prod(x.shape[:fa]), math.prod(x.shape[fa:]))
        rq, rs, cq, cs = tex.quantize_mxfp8(x2, self.q_dtype, row, col)
        dq = dq_dtype or x.dtype
        shape = tuple(x.shape)
        out_r = ScaledTensor1x(rq, rs, self.scaling_mode, dq, False, None, shape) if row else None
        out_c = ScaledTensor1x(cq, cs, self.scaling_mode, dq, True, None, shape) if col else None
        if self.checkpoint_name is not None:  # as in Quantizer._wrap
            out_r, out_c = jax.tree_util.tree_map(
                lambda a: checkpoint_name(a, self.checkpoint_name), (out_r, out_c))
        if row and col:
            return ScaledTensor2x(out_r, out_c)
        return out_r if row else out_c


@register_pytree_node_class
@dataclass
class QuantizerSet:
    """The quantizers of one GEMM: input x, kernel, and the incoming gradient (dgrad)."""

    x: Quantizer | None = None
    kernel: Quantizer | None = None
    dgrad: Quantizer | None = None

    def tree_flatten(self):
        return (self.x, self.kernel, self.dgrad), ()

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def is_noop(self) -> bool:
        return self.x is None and self.kernel is None and self.dgrad is None


noop_quantizer_set = QuantizerSet()


@dataclass
class QuantizeMeta:
    """Per-tensor recipe state: delayed scaling's (scale, amax_history); NVFP4's use_rht and
    stochastic-rounding state (uint32 [num_devices, 4]); empty for the other recipes."""

    scale: Any = None
    amax_history: Any = None
    use_rht: bool | None = None
    stochastic_rounding_rng_state: Any = None


@dataclass
class QuantizeMetaSet:
    x: QuantizeMeta = field(default_factory=QuantizeMeta)
    kernel: QuantizeMeta = field(default_factory=QuantizeMeta)
    grad: QuantizeMeta = field(default_factory=QuantizeMeta)


from .nvfp4 import NVFP4Quantizer  # noqa: E402  (it builds on Quantizer, defined above)
