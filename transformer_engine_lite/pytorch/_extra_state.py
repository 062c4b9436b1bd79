"""TE's extra-state checkpoint constants. TE-lite checkpoints its FP8 state as plain tensors and
values (module/base.py: get_extra_state), loadable with torch.load(weights_only=True); it never
unpickles, so TE's opt-in for unsafe unpickling of its own pickled extra state has no use here:
such a state is refused with an error that says so, whatever the variable's value."""

UNSAFE_PICKLE_EXTRA_STATE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"

__all__ = ["UNSAFE_PICKLE_EXTRA_STATE_ENV"]
