"""Megatron-Core's own CUDA-only spots, answered for the CPU: used by examples/megatron/train_gpt.py
and tests/integration/megatron_gpt.py, and nowhere else (the library needs no patch).

  1. tensor_parallel/random.py keeps its RNG tracker's states with torch.cuda.get_rng_state /
     set_rng_state (also torch.cuda.random.*, and `_set_cuda_rng_state`, which uses CUDA
     generators): mapped to the CPU generator's state.
  2. model_parallel_cuda_manual_seed calls torch.cuda.manual_seed: a no-op (the tracker's own seeds
     are set through 1).
  3. the MoE router's gating moves its weight to torch.cuda.current_device() on every call:
     current_device() answers "cpu".
(The alltoall MoE token dispatcher creates a torch.cuda.Stream at construction: runs on the CPU
choose the "allgather" dispatcher instead, a configuration choice rather than a patch.)
"""

from __future__ import annotations

import torch


def patch_megatron_cuda_only_spots() -> None:
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    torch.cuda.random.get_rng_state = torch.cuda.get_rng_state
    torch.cuda.random.set_rng_state = torch.cuda.set_rng_state
    torch.cuda.manual_seed = lambda seed: None
    torch.cuda.current_device = lambda: "cpu"
    import megatron.core.tensor_parallel.random as mrandom

    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
