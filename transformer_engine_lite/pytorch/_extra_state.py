"""The modules' checkpointed FP8 state (_extra_state): its schema and the checks that run before
anything is assigned (module/base.py: get_extra_state / set_extra_state). TE-lite checkpoints its
FP8 state as plain tensors and values, loadable with torch.load(weights_only=True), and never
unpickles. TE stores its extra state as a pickle (a uint8 tensor); pytorch/_pickled_state.py
classifies such a payload without running it (TE's policy API), so that a stateless one loads as
"no FP8 state" and a stateful one is refused."""

import io
from typing import Any

import torch

from ._pickled_state import (  # noqa: F401  (TE's names live in te.pytorch._extra_state)
    _RECIPE_POLICIES,
    UNSAFE_PICKLE_EXTRA_STATE_ENV,
    CheckpointExtraStatePolicy,
    is_stateless_recipe,
    recipe_extra_state_policy,
    should_load_extra_state_pickle,
)

__all__ = [
    "EXTRA_STATE_VERSION",
    "UNSAFE_PICKLE_EXTRA_STATE_ENV",
    "CheckpointExtraStatePolicy",
    "is_stateless_recipe",
    "recipe_extra_state_policy",
    "should_load_extra_state_pickle",
    "check_fp8_meta",
    "check_fp8_param_scales",
    "check_schema",
    "fp8_param_scales",
    "pickled_bytes",
]

EXTRA_STATE_VERSION = 2
# Keys each schema version may hold (anything else is refused, naming the key).
EXTRA_STATE_KEYS = {
    1: {"version", "amax_history_fwd", "scale_fwd", "scale_inv_fwd", "amax_history_bwd",
        "scale_bwd", "scale_inv_bwd"},
    2: {"version", "num_gemms", "recipe", "amax_history_fwd", "scale_fwd", "amax_history_bwd",
        "scale_bwd", "fp8_param_scales"},
}


def check_schema(owner: str, state: dict[str, Any], num_gemms: int) -> int:
    """The state's schema version, after checking its keys (and version 2's num_gemms / recipe)."""
    version = state.get("version")
    if version not in (1, 2):
        raise ValueError(
            f"{owner}: _extra_state: expected schema version 1 or {EXTRA_STATE_VERSION}, got "
            f"{version!r}"
        )
    allowed = EXTRA_STATE_KEYS[version]
    unknown = sorted(str(k) for k in state if k not in allowed)
    if unknown:
        raise ValueError(
            f"{owner}: _extra_state: unexpected keys {unknown} for schema version {version} "
            f"(expected some of {sorted(allowed)})"
        )
    if version == 2:
        got = state.get("num_gemms", num_gemms)
        if type(got) is not int or got != num_gemms:
            raise ValueError(
                f"{owner}: _extra_state: expected num_gemms {num_gemms}, got {got!r}"
            )
        recipe = state.get("recipe")
        if recipe is not None and not isinstance(recipe, dict):
            raise ValueError(
                f"{owner}: _extra_state: expected recipe to be a dict or None, got "
                f"{type(recipe).__name__}"
            )
    return version


def check_fp8_meta(owner: str, state: dict[str, Any], key: str, n: int, dev: Any) -> Any:
    """(amax history [L, n], scale [n]) of direction `key` ("fwd" / "bwd") as float32 on `dev`,
    checked; None when the state has neither."""
    hist = state.get(f"amax_history_{key}")
    scale = state.get(f"scale_{key}")
    if hist is None and scale is None:
        return None
    for name, t in ((f"amax_history_{key}", hist), (f"scale_{key}", scale)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"{owner}: _extra_state: expected {name} to be a floating-point tensor, "
                f"got {got}"
            )
    if hist.dim() != 2 or hist.shape[0] < 1 or hist.shape[1] != n or scale.shape != (n,):
        raise ValueError(
            f"{owner}: _extra_state: expected amax_history_{key} [L, {n}] (L >= 1) and "
            f"scale_{key} [{n}], got {tuple(hist.shape)} and {tuple(scale.shape)}"
        )
    hist32 = hist.detach().to(device=dev, dtype=torch.float32)
    scale32 = scale.detach().to(device=dev, dtype=torch.float32)
    # amaxes are >= 0 (Inf allowed: an overflowed step keeps its scale); scales are finite
    # and > 0, as the recipes produce them.
    if torch.isnan(hist32).any() or (hist32 < 0).any():
        raise ValueError(
            f"{owner}: _extra_state: expected amax_history_{key} values >= 0 (no NaN), "
            f"got min {hist32.min().item()} (NaN: {bool(torch.isnan(hist32).any())})"
        )
    if not torch.isfinite(scale32).all() or (scale32 <= 0).any():
        raise ValueError(
            f"{owner}: _extra_state: expected scale_{key} finite and > 0, got "
            f"{scale32.tolist()}"
        )
    return hist32, scale32


def pickled_bytes(state: Any) -> bytes | None:
    """The bytes of TE's pickled extra state (a 1-D uint8 tensor, or io.BytesIO in TE 1.x), else
    None."""
    if isinstance(state, io.BytesIO):
        return state.getvalue()
    if isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.dim() == 1:
        return state.detach().cpu().numpy().tobytes()
    return None


def fp8_param_scales(module: Any) -> dict[str, Any]:
    """{name: tensor([scale, amax])} of the module's own DelayedScaling FP8 parameters: the scale
    their next re-quantization uses and the amax it is derived from (Float8Quantizer with
    update_margin; see tensor/float8_tensor.py). A checkpoint without them would resume with the
    scale of the loading module's random init."""
    from .tensor import Float8Quantizer, QuantizedTensor

    out = {}
    for name, p in module._parameters.items():
        q = getattr(p, "_quantizer", None)
        if isinstance(p, QuantizedTensor) and isinstance(q, Float8Quantizer) and (
            q.update_margin is not None
        ):
            out[name] = torch.cat([q.scale.reshape(1), q.amax.reshape(1)]).detach().cpu()
    return out


def check_fp8_param_scales(owner: str, module: Any, value: Any) -> list[tuple[Any, Any]]:
    """Validates a checkpoint's fp8_param_scales for `module`; returns (quantizer, [scale, amax])
    pairs to assign (nothing is assigned here)."""
    mine = fp8_param_scales(module)
    if not isinstance(value, dict):
        raise ValueError(
            f"{owner}: _extra_state: expected fp8_param_scales to be a dict, got "
            f"{type(value).__name__}"
        )
    updates = []
    for name, t in value.items():
        if name not in module._parameters:
            raise ValueError(
                f"{owner}: _extra_state: fp8_param_scales names {name!r}, which is not a "
                f"parameter of this module (those: {sorted(module._parameters)})"
            )
        ok = isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() == 2
        if ok:
            v = t.detach().to(torch.float32).reshape(2)
            ok = bool(torch.isfinite(v[0]) and v[0] > 0 and not torch.isnan(v[1]) and v[1] >= 0)
        if not ok:
            raise ValueError(
                f"{owner}: _extra_state: expected fp8_param_scales[{name!r}] = [scale > 0, "
                f"amax >= 0] (2 floats), got {t!r}"
            )
        if name in mine:  # a high-precision (or other recipe's) parameter has no such state
            updates.append((module._parameters[name]._quantizer, v))
    return updates
