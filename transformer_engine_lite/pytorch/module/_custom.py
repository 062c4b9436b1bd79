"""CustomRecipe in the modules: each GEMM asks the recipe's qfactory for the quantizers of its
tensor slots and runs with what they describe.

Slots (TE's layout, as the FP8 meta): forward 3*g + {0: input, 1: weight, 2: output}, backward
2*g + {0: grad_output, 1: grad_input}. The roles are QuantizerRole(module_type, tensor_type, name)
with module_type "linear" ("grouped_linear" for GroupedLinear) and the module's name
(LayerNormMLP: "<name>.fc1" / "<name>.fc2"); output and grad_input get the module's
output_quantizer_role / grad_input_quantizer_role (TE's attributes; None by default: the consumer
is outside the module). The factory is called when a GEMM first runs under a recipe object, and
again only when another recipe object becomes active or a boundary role changes; the quantizers
are kept in `module.quantizers` ({"scaling_fwd": [...], "scaling_bwd": [...]}, TE's attribute),
which built-in current-scaling and MXFP8 recipes fill too.

What a GEMM can run: every operand (input, weight, grad_output) a custom quantizer
(tensor.utils.is_custom: the custom_recipes references or a user's quantizer with a qgemm), the GEMMs
then running that quantizer's qgemm through general_gemm (_custom_linear.py; no backward_override,
alpha or delay_wgrad_compute there); or per-tensor current scaling
(Float8CurrentScalingQuantizer, any E4M3/E5M2 per operand), MXFP8 (MXFP8Quantizer, one FP8 dtype
for input and weight) or high precision (IdentityQuantizer; a factory answering None is an error,
as in TE); or, all three slots with equal DelayedScalingRequests, delayed scaling as under
DelayedScaling with those settings, on the module's scale / amax history; or, with a
HybridQuantizer in any slot, every operand quantized by its quantizer object and each GEMM run by
general_gemm on the directions it contracts (_custom_linear.py, as the custom quantizers). The GEMM
kernels take one scaling kind per GEMM, so mixing kinds within one GEMM and quantizers of other
families raise NotImplementedError naming the slot (a hybrid's mismatched GEMM pair: ValueError).
"""

from __future__ import annotations

from typing import Any

import torch

from ...common.recipe import Recipe, check_backward_override
from ..fp8 import FP8GlobalStateManager, get_fp8_torch_dtype
from ..quantization import DelayedScalingRequest, QuantizerRole, QuantSpec, check_factory_output
from ..tensor import Float8CurrentScalingQuantizer, MXFP8Quantizer
from ..tensor.quantized_tensor import QuantizedTensorStorage, Quantizer
from ..tensor.identity_tensor import IdentityQuantizer
from ..tensor.hybrid_tensor import HybridQuantizer
from ..tensor.utils import is_custom
from ..tex import dtype_to_torch
from ._autograd import GemmConfig

__all__ = ["builtin_quantizers", "custom_gemm_config", "gemm_roles"]

_SLOTS = ("input", "weight", "grad_output")


def _object_gemm_quantizers() -> tuple[type, ...]:
    from ..tensor import Float8BlockQuantizer, NVFP4Quantizer

    return (Float8CurrentScalingQuantizer, MXFP8Quantizer, Float8BlockQuantizer, NVFP4Quantizer,
            IdentityQuantizer)


_OBJECT_GEMM_QUANTIZERS = _object_gemm_quantizers()


def gemm_roles(module: Any, gemm: int) -> tuple[list[Any], list[Any]]:
    """(forward roles [input, weight, output], backward roles [grad_output, grad_input])."""
    base = getattr(module, "name", None) or ""
    suffixes = getattr(module, "_role_gemm_names", None)
    name = base
    if suffixes is not None:
        name = f"{base}.{suffixes[gemm]}" if base else suffixes[gemm]
    kind = getattr(module, "_role_module_type", "linear")
    role = lambda t: QuantizerRole(module_type=kind, tensor_type=t, name=name)  # noqa: E731
    out, gi = _boundary_roles(module)
    return [role("input"), role("weight"), out], [role("grad_output"), gi]


def _boundary_roles(module: Any) -> tuple[QuantizerRole | None, QuantizerRole | None]:
    """TE's output_quantizer_role / grad_input_quantizer_role module attributes: the consumer of
    the module's output (its gradient's producer), when the caller knows it; None otherwise."""
    got = []
    for attr in ("output_quantizer_role", "grad_input_quantizer_role"):
        r = getattr(module, attr, None)
        if r is not None and not isinstance(r, QuantizerRole):
            raise TypeError(f"{type(module).__name__}: {attr}: expected a QuantizerRole or None, "
                            f"got {type(r).__name__}")
        got.append(r)
    return got[0], got[1]


def _store(module: Any, gemm: int, recipe: Recipe, fwd: list[Any], bwd: list[Any]) -> None:
    cache = module.__dict__.setdefault("_custom_quantizers", {})
    cache[gemm] = (recipe, fwd, bwd, _boundary_roles(module))
    n = getattr(module, "num_gemms", 1) or 1
    qs = module.__dict__.get("quantizers")
    if not isinstance(qs, dict) or len(qs.get("scaling_fwd", ())) != 3 * n:
        qs = {"scaling_fwd": [None] * (3 * n), "scaling_bwd": [None] * (2 * n)}
        module.__dict__["quantizers"] = qs
    qs["scaling_fwd"][3 * gemm : 3 * gemm + 3] = fwd
    qs["scaling_bwd"][2 * gemm : 2 * gemm + 2] = bwd


def _cached(module: Any, gemm: int, recipe: Recipe) -> tuple[list[Any], list[Any]] | None:
    hit = module.__dict__.get("_custom_quantizers", {}).get(gemm)
    fresh = hit is not None and hit[0] is recipe and hit[3] == _boundary_roles(module)
    return (hit[1], hit[2]) if fresh else None


def builtin_quantizers(module: Any, gemm: int, recipe: Recipe) -> None:
    """`module.quantizers` for a built-in current-scaling or MXFP8 recipe (what TE exposes): the
    quantizers the GEMM's casts are equivalent to."""
    if _cached(module, gemm, recipe) is not None:
        return
    fd, bd = (get_fp8_torch_dtype(recipe, True), get_fp8_torch_dtype(recipe, False))
    if recipe.mxfp8():
        fwd = [MXFP8Quantizer(fd) for _ in range(3)]
        bwd = [MXFP8Quantizer(bd) for _ in range(2)]
    elif recipe.float8_block_scaling():
        from ..tensor import Float8BlockQuantizer

        def mk_block(dt: Any, qp: Any, dim: int) -> Any:
            return Float8BlockQuantizer(dt, rowwise=True, columnwise=True,
                                        amax_epsilon=float(qp.amax_epsilon),
                                        force_pow_2_scales=bool(qp.power_2_scale),
                                        block_scaling_dim=dim)
        r = recipe
        fwd = [mk_block(fd, r.fp8_quant_fwd_inp, r.x_block_scaling_dim),
               mk_block(fd, r.fp8_quant_fwd_weight, r.w_block_scaling_dim),
               mk_block(fd, r.fp8_quant_fwd_inp, r.x_block_scaling_dim)]
        bwd = [mk_block(bd, r.fp8_quant_bwd_grad, r.grad_block_scaling_dim) for _ in range(2)]
    elif recipe.nvfp4():
        from ..quantization import block_spec, nvfp4_quantizer

        fwd = [nvfp4_quantizer(block_spec(recipe, r)) for r in ("input", "weight", "input")]
        bwd = [nvfp4_quantizer(block_spec(recipe, "grad")) for _ in range(2)]
    else:
        qps = (recipe.fp8_quant_fwd_inp, recipe.fp8_quant_fwd_weight, recipe.fp8_quant_fwd_inp)
        mk = lambda dt, qp: Float8CurrentScalingQuantizer(  # noqa: E731
            dt, force_pow_2_scales=bool(qp.power_2_scale), amax_epsilon=float(qp.amax_epsilon))
        fwd = [mk(fd, qp) for qp in qps]
        bwd = [mk(bd, recipe.fp8_quant_bwd_grad) for _ in range(2)]
    _store(module, gemm, recipe, fwd, bwd)


def _spec(owner: str, slot: str, q: Any) -> tuple[str, QuantSpec]:
    """(mode, QuantSpec) of one operand's quantizer."""
    if isinstance(q, (Quantizer, QuantizedTensorStorage)) and is_custom(q):
        return "custom", QuantSpec()
    if isinstance(q, IdentityQuantizer):
        return "hp", QuantSpec()
    if isinstance(q, Float8CurrentScalingQuantizer):
        if q.with_amax_reduction:
            raise NotImplementedError(
                f"{owner}: CustomRecipe {slot} quantizer: with_amax_reduction=True is not "
                "implemented for custom recipes by transformer_engine_lite")
        dt = dtype_to_torch(q.dtype, f"{owner}: {slot} quantizer dtype")
        return "current", QuantSpec("current", dt, q.force_pow_2_scales, q.amax_epsilon)
    if isinstance(q, MXFP8Quantizer):
        return "mxfp8", QuantSpec("mxfp8", dtype_to_torch(q.dtype, f"{owner}: {slot} dtype"))
    from ..tensor import Float8BlockQuantizer

    if isinstance(q, Float8BlockQuantizer):
        dt = dtype_to_torch(q.dtype, f"{owner}: {slot} quantizer dtype")
        return "block", QuantSpec("block", dt, q.force_pow_2_scales, q.amax_epsilon,
                                  q.block_scaling_dim)
    from ..tensor import NVFP4Quantizer

    if isinstance(q, NVFP4Quantizer):
        q._check_supported()
        return "block", QuantSpec("nvfp4", torch.uint8, block_dim=2 if q.with_2d_quantization else 1,
                                  rht=q.with_rht, sr=q.stochastic_rounding,
                                  row_scaled=q.row_scaled_nvfp4, four_over_six=q.nvfp4_use_4over6,
                                  e4m3_max=q.nvfp4_e4m3_max, err_mode=q.nvfp4_4over6_err_mode)
    if isinstance(q, DelayedScalingRequest):
        fmt = q.fp8_format
        return "delayed", QuantSpec("delayed", get_fp8_torch_dtype(fmt, slot != "grad_output"))
    raise NotImplementedError(
        f"{owner}: CustomRecipe {slot}: quantizer {type(q).__name__} is not supported in modules "
        "by transformer_engine_lite (expected Float8CurrentScalingQuantizer, MXFP8Quantizer, "
        "Float8BlockQuantizer, NVFP4Quantizer, IdentityQuantizer, a DelayedScalingRequest or a "
        "custom quantizer)")


def custom_gemm_config(module: Any, gemm: int, recipe: Recipe, code: int, fuse_wgrad: bool,
                       delay_wgrad: bool, save_original_input: bool) -> GemmConfig:
    """GemmConfig of GEMM `gemm` under a CustomRecipe (the options as for the built-in recipes)."""
    opts = dict(fuse_wgrad=fuse_wgrad, delay_wgrad=delay_wgrad,
                save_original_input=save_original_input)
    owner = type(module).__name__
    got = _cached(module, gemm, recipe)
    if got is None:
        roles_f, roles_b = gemm_roles(module, gemm)
        ask = lambda r, i: check_factory_output(recipe.qfactory(r), i, r)  # noqa: E731
        got = ([ask(r, 3 * gemm + i) for i, r in enumerate(roles_f)],
               [ask(r, 2 * gemm + i) for i, r in enumerate(roles_b)])
        _store(module, gemm, recipe, *got)
    fwd, bwd = got
    if any(isinstance(q, HybridQuantizer) for q in (fwd[0], fwd[1], bwd[0])):
        return _hybrid_config(owner, gemm, recipe, code, (fwd[0], fwd[1], bwd[0]), opts)
    kinds = [_spec(owner, s, q) for s, q in zip(_SLOTS, (fwd[0], fwd[1], bwd[0]))]
    modes = [k[0] for k in kinds]
    if len(set(modes)) != 1:
        desc = ", ".join(f"{s}: {m}" for s, m in zip(_SLOTS, modes))
        raise NotImplementedError(
            f"{owner}: CustomRecipe: one GEMM mixing scaling kinds ({desc}) is not implemented by "
            "transformer_engine_lite (each GEMM runs one of per-tensor current scaling, MXFP8 or "
            "high precision)")
    mode = modes[0]
    if mode == "hp":
        return GemmConfig("hp", slot_fwd=3 * gemm, code=code, **opts)
    if mode == "delayed":
        return _delayed_config(module, gemm, recipe, code, (fwd[0], fwd[1], bwd[0]), kinds, opts)
    if mode == "custom":
        if recipe.backward_override is not None:
            raise NotImplementedError(
                f"{owner}: CustomRecipe: backward_override {recipe.backward_override!r} with "
                "custom quantizers is not implemented by transformer_engine_lite (their GEMMs run "
                "the quantizers' qgemm)")
        return GemmConfig("custom", slot_fwd=3 * gemm, slot_bwd=2 * gemm, code=code,
                          custom=(fwd[0], fwd[1], bwd[0]), **opts)
    inp, weight, grad = (k[1] for k in kinds)
    if mode == "mxfp8" and inp.dtype != weight.dtype:
        raise NotImplementedError(
            f"{owner}: CustomRecipe: MXFP8 input ({inp.dtype}) and weight ({weight.dtype}) of "
            "different FP8 dtypes are not implemented by transformer_engine_lite")
    override = recipe.backward_override
    check_backward_override("CustomRecipe", override)
    return GemmConfig(mode, inp, weight, grad, slot_fwd=3 * gemm, slot_bwd=2 * gemm, code=code,
                      bwd_override=override, **opts)


def _hybrid_config(owner: str, gemm: int, recipe: Recipe, code: int, qs: tuple[Any, ...],
                   opts: dict[str, Any]) -> GemmConfig:
    """A GEMM with a HybridQuantizer slot: every operand quantized by its quantizer object and
    each GEMM run by general_gemm on the directions it reads (fprop: input and weight rowwise;
    dgrad: weight columnwise, grad rowwise; wgrad: input and grad columnwise), as TE's modules."""
    for slot, q in zip(_SLOTS, qs):
        for sub in (q.rowwise_quantizer, q.columnwise_quantizer) if isinstance(
                q, HybridQuantizer) else (q,):
            if not isinstance(sub, _OBJECT_GEMM_QUANTIZERS) and not is_custom(sub):
                raise NotImplementedError(
                    f"{owner}: CustomRecipe {slot}: quantizer {type(sub).__name__} next to a "
                    "HybridQuantizer is not supported in modules by transformer_engine_lite "
                    "(expected Float8CurrentScalingQuantizer, MXFP8Quantizer, "
                    "Float8BlockQuantizer, NVFP4Quantizer, IdentityQuantizer or a custom "
                    "quantizer)")
            if getattr(sub, "with_amax_reduction", False):
                raise NotImplementedError(
                    f"{owner}: CustomRecipe {slot} quantizer: with_amax_reduction=True is not "
                    "implemented for custom recipes by transformer_engine_lite")
    if recipe.backward_override is not None:
        raise NotImplementedError(
            f"{owner}: CustomRecipe: backward_override {recipe.backward_override!r} with a "
            "HybridQuantizer is not implemented by transformer_engine_lite (its GEMMs read the "
            "hybrid's quantized directions)")
    return GemmConfig("custom", slot_fwd=3 * gemm, slot_bwd=2 * gemm, code=code, custom=qs,
                      **opts)


def _delayed_config(module: Any, gemm: int, recipe: Recipe, code: int, reqs: tuple[Any, ...],
                    kinds: list[tuple[str, QuantSpec]], opts: dict[str, Any]) -> GemmConfig:
    """A GEMM whose slots all requested delayed scaling: the module's own scale / amax history,
    updated by the autocast with the requests' settings (equal requests required, as TE)."""
    owner = type(module).__name__
    if any(r != reqs[0] for r in reqs):
        raise NotImplementedError(
            f"{owner}: CustomRecipe: DelayedScalingRequests with different settings within one "
            f"GEMM are not implemented by transformer_engine_lite: {reqs}")
    if recipe.backward_override is not None:
        raise ValueError(f"{owner}: CustomRecipe: backward_override: expected None with "
                         f"DelayedScalingRequest (delayed scaling keeps FP8 backward GEMMs), got "
                         f"{recipe.backward_override!r}")
    if opts["save_original_input"]:
        raise NotImplementedError(f"{owner}: save_original_input=True is not supported with "
                                  "delayed scaling (DelayedScalingRequest)")
    inner = reqs[0].delayed_scaling()
    FP8GlobalStateManager.add_custom_delayed(code, inner)
    if gemm == 0 and module.fp8_fwd_amax_history.shape[0] != inner.amax_history_len:
        # before this forward's first GEMM captures the buffers (as the autocast entry does for
        # DelayedScaling)
        module.resize_amax_history(inner.amax_history_len)
    inp, weight, grad = (k[1] for k in kinds)
    return GemmConfig("delayed", inp, weight, grad, slot_fwd=3 * gemm, slot_bwd=2 * gemm,
                      code=code, **opts)
