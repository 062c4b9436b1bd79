"""TE's pickled _extra_state, classified without unpickling it (TE's te.pytorch._extra_state API:
CheckpointExtraStatePolicy, _RECIPE_POLICIES, should_load_extra_state_pickle).

A pickle runs code only through the globals it resolves, so the payload's opcodes are scanned for
string literals (dict keys) and global references (module, name) instead: a payload with no
global and no delayed-scaling keys (TE's old stateless `{}`), or one whose only recipe is a
stateless one, carries nothing to load and is ignored; anything else (TE 1.x delayed scaling,
delayed-scaling tensors, an unknown recipe, an unparsable payload) needs unpickling, which TE
allows only under NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1."""

from __future__ import annotations

import pickletools
from enum import Enum
from typing import Any

from ..common import config
from ..common.recipe import Recipe

__all__ = [
    "CheckpointExtraStatePolicy",
    "UNSAFE_PICKLE_EXTRA_STATE_ENV",
    "is_stateless_recipe",
    "recipe_extra_state_policy",
    "should_load_extra_state_pickle",
]

UNSAFE_PICKLE_EXTRA_STATE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"


class CheckpointExtraStatePolicy(Enum):
    """What a recipe's pickled extra state holds. STATELESS: nothing (no unpickling needed);
    STATEFUL_FP8_DELAYED_SCALING: delayed scaling's amax histories and scales (unpickling needed);
    DYNAMIC: depends on the payload (CustomRecipe: stateless unless delayed-scaling keys appear)."""

    STATELESS = "stateless"
    STATEFUL_FP8_DELAYED_SCALING = "stateful_fp8_delayed_scaling"
    DYNAMIC = "dynamic"


_POLICY_BY_NAME = {
    "DelayedScaling": CheckpointExtraStatePolicy.STATEFUL_FP8_DELAYED_SCALING,
    "Float8CurrentScaling": CheckpointExtraStatePolicy.STATELESS,
    "MXFP8BlockScaling": CheckpointExtraStatePolicy.STATELESS,
    "Float8BlockScaling": CheckpointExtraStatePolicy.STATELESS,
    "NVFP4BlockScaling": CheckpointExtraStatePolicy.STATELESS,
    "CustomRecipe": CheckpointExtraStatePolicy.DYNAMIC,
}
# Keyed by the (module, class) a pickle names: TE's module (checkpoints written by TE) and ours;
# common.recipe_block is where our block recipes' pickles pointed before they named common.recipe.
_RECIPE_POLICIES: dict[tuple[str, str], CheckpointExtraStatePolicy] = {
    (module, name): policy
    for module in ("transformer_engine.common.recipe", "transformer_engine_lite.common.recipe",
                   "transformer_engine_lite.common.recipe_block")
    for name, policy in _POLICY_BY_NAME.items()
}
# Keys of delayed scaling's pickled state (TE 1.x and 2.x)
_DELAYED_KEYS = frozenset({"scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"})
_STRING_OPS = frozenset({"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE",
                         "BINUNICODE8", "SHORT_BINUNICODE"})


def recipe_extra_state_policy(recipe: Recipe) -> CheckpointExtraStatePolicy | None:
    """The policy of a recipe instance (None for a recipe class we do not know)."""
    return _POLICY_BY_NAME.get(type(recipe).__name__) if isinstance(recipe, Recipe) else None


def is_stateless_recipe(recipe: Recipe) -> bool:
    return recipe_extra_state_policy(recipe) is CheckpointExtraStatePolicy.STATELESS


def _scan(data: bytes) -> tuple[set[str], set[tuple[str, str]], bool]:
    """(string literals, resolved (module, name) globals, any global at all) of a pickle.
    STACK_GLOBAL takes its two strings from the stack, which may come from the memo (protocol 4
    memoizes a module name and fetches it again for its next class), so the memo is tracked."""
    strings: set[str] = set()
    refs: set[tuple[str, str]] = set()
    any_global = False
    recent: list[Any] = []  # the last two values pushed, as far as strings are concerned
    memo: dict[int, Any] = {}
    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name in _STRING_OPS:
            text = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else arg
            strings.add(text)
            recent = [*recent[-1:], text]
        elif name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
            key = len(memo) if name == "MEMOIZE" else int(arg)
            memo[key] = recent[-1] if recent else None
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            recent = [*recent[-1:], memo.get(int(arg))]
        elif name == "GLOBAL":
            any_global = True
            parts = str(arg).split(" ")
            if len(parts) == 2:
                refs.add((parts[0], parts[1]))
            recent = [*recent[-1:], None]
        elif name == "STACK_GLOBAL":
            any_global = True
            if len(recent) == 2 and all(isinstance(v, str) for v in recent):
                refs.add((recent[0], recent[1]))
            recent = [None]
        elif name not in ("FRAME", "PROTO"):
            recent = [*recent[-1:], None]
    return strings, refs, any_global


def _needs_unpickling(data: bytes) -> bool:
    if not data:
        return False
    try:
        strings, refs, any_global = _scan(data)
    except Exception:  # noqa: BLE001  (not a pickle: only unpickling could tell what it is)
        return True
    delayed_keys = bool(strings & _DELAYED_KEYS)
    if not any_global and not delayed_keys:
        return False  # resolves no callable: cannot hold tensors or run code (TE's old `{}`)
    if "recipe" not in strings or delayed_keys:
        return True  # TE 1.x (delayed scaling only, no recipe key) or delayed-scaling tensors
    policies = {_RECIPE_POLICIES[r] for r in refs if r in _RECIPE_POLICIES}
    if not policies or CheckpointExtraStatePolicy.STATEFUL_FP8_DELAYED_SCALING in policies:
        return True  # an unknown recipe, or a delayed one
    return False


def should_load_extra_state_pickle(data: bytes, context: str) -> bool:
    """TE's gate: False when the payload is stateless (ignore it); True when it needs unpickling
    and NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1; otherwise RuntimeError with TE's advisory."""
    if not _needs_unpickling(bytes(data)):
        return False
    if config.get(UNSAFE_PICKLE_EXTRA_STATE_ENV) == "1":
        return True
    raise RuntimeError(
        f"{context}: refusing to load pickled Transformer Engine extra state: it holds FP8 "
        "delayed-scaling state (or an unknown payload) that only unpickling can read, and "
        "unpickling can execute arbitrary code. If the checkpoint is from a trusted source, set "
        f"{UNSAFE_PICKLE_EXTRA_STATE_ENV}=1."
    )
