"""TransformerEngineBaseModule's checkpoint hooks (torch's get_extra_state / set_extra_state): the
FP8 meta (amax histories, scales) and FP8 parameter scales in our versioned schema, and TE's
pickled form on load (_extra_state.py holds the encoding and every check). A mixin so base.py stays
one screenful per concern; it reads the module's fp8_* buffers and num_gemms."""

from __future__ import annotations

from typing import Any

import torch

from .._extra_state import (
    EXTRA_STATE_VERSION,
    check_fp8_meta,
    check_fp8_param_scales,
    check_schema,
    decode_extra_state,
    encode_extra_state,
    fp8_param_scales,
    pickled_bytes,
    should_load_extra_state_pickle,
    te_pickled_state_as_v1,
)

__all__ = ["ExtraStateMixin"]


class ExtraStateMixin:
    """get_extra_state / set_extra_state of TransformerEngineBaseModule (listed before
    torch.nn.Module in its bases, so these override torch's defaults)."""

    def get_extra_state(self) -> torch.Tensor:
        state = {
            "version": EXTRA_STATE_VERSION,
            "num_gemms": self.num_gemms,
            "recipe": self._last_recipe,
            "amax_history_fwd": self.fp8_fwd_amax_history.detach().clone(),
            "scale_fwd": self.fp8_fwd_scale.detach().clone(),
            "amax_history_bwd": self.fp8_bwd_amax_history.detach().clone(),
            "scale_bwd": self.fp8_bwd_scale.detach().clone(),
        }
        param_scales = fp8_param_scales(self)
        if param_scales:
            state["fp8_param_scales"] = param_scales
        return encode_extra_state(state)

    @torch.no_grad()
    def set_extra_state(self, state: Any) -> None:
        owner = type(self).__name__
        if state is None or (isinstance(state, torch.Tensor) and state.numel() == 0):
            return
        if isinstance(state, dict) and not state:
            return
        decoded = decode_extra_state(owner, state)  # ours: torch.save bytes in a uint8 tensor
        if decoded is not None:
            state = decoded
        elif pickled_bytes(state) is not None:  # TE's: a pickle in a uint8 tensor / BytesIO
            data = pickled_bytes(state)
            if not should_load_extra_state_pickle(data, owner):
                return  # stateless: nothing to load
            state = te_pickled_state_as_v1(owner, data)  # TE's opt-in is set
            if state is None:
                return
        if not isinstance(state, dict):
            raise TypeError(
                f"{owner}: _extra_state: expected a dict (schema version <= {EXTRA_STATE_VERSION}),"
                f" None, an empty tensor or TE's pickled form (uint8 tensor / BytesIO), got "
                f"{type(state).__name__}"
            )
        version = check_schema(owner, state, self.num_gemms)
        # Everything is checked before anything is assigned: a bad checkpoint changes nothing.
        param_scales = check_fp8_param_scales(owner, self, state.get("fp8_param_scales", {}))
        dev = self.fp8_meta_device()
        updates = []
        for key, n, hist_name, scale_name in (
            ("fwd", 3 * self.num_gemms, "fp8_fwd_amax_history", "fp8_fwd_scale"),
            ("bwd", 2 * self.num_gemms, "fp8_bwd_amax_history", "fp8_bwd_scale"),
        ):
            meta = check_fp8_meta(owner, state, key, n, dev)
            if meta is None:
                continue  # missing FP8 state: keep defaults
            hist32, scale32 = meta
            updates.append((hist_name, hist32.clone(), scale_name, scale32))
        for hist_name, hist32, scale_name, scale32 in updates:
            setattr(self, hist_name, hist32)
            getattr(self, scale_name).copy_(scale32)
        for q, v in param_scales:
            q.scale.copy_(v[0].reshape(q.scale.shape))
            q.amax.copy_(v[1].reshape(q.amax.shape))
        self.fp8_fwd_ran.zero_()
        self.fp8_bwd_ran.zero_()
        if version == 2:
            self._last_recipe = state.get("recipe")
