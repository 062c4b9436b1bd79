"""HF Llama with TE decoder layers, generating with TE's KV cache (the te_llama tutorial's model,
written for this library).

`TELlamaForCausalLM(config)` is HF's `LlamaForCausalLM` whose `LlamaDecoderLayer`s are
`TELlamaDecoderLayer`s: one `te.TransformerLayer` each (RMSNorm, SwiGLU, grouped-query attention,
rotary embeddings), weights loaded from an HF Llama with `load_hf_weights`. It runs under HF's
`generate()` unchanged:

- `use_cache=False`: HF feeds the whole sequence every step; each layer runs causal attention over it.
- `use_cache=True`: HF feeds only the new tokens; the layers keep their keys and values in one
  `te.InferenceParams` per generation (TE's KV cache, attached to HF's cache object), started at
  the prompt (position 0) and advanced once per step by the first layer (`pre_step`). HF's own cache
  object stays empty: the positions HF passes tell each step's new tokens.

Both give the same tokens as HF's own Llama (tests/integration/test_hf_transformers.py); the
speed of the two modes is benchmarks/bench_generate.py. Batches of equal-length prompts only (a
left-padded batch raises NotImplementedError: HF's per-row positions would need per-row cache
lengths at the prompt).

    python examples/pytorch/te_llama.py   # a small random Llama: tokens equal, tokens/s
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
import transformers.models.llama.modeling_llama as hf_llama
from transformers import LlamaConfig, LlamaForCausalLM

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch.attention import RotaryPositionEmbedding


def _rope_base(config: LlamaConfig) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise NotImplementedError(
            f"TELlamaDecoderLayer: rope_parameters.rope_type={params['rope_type']!r}: only the "
            "default rotary embedding"
        )
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class TELlamaDecoderLayer(te.TransformerLayer):
    """HF's LlamaDecoderLayer(config, layer_idx) as a te.TransformerLayer (bshd)."""

    def __init__(self, config: LlamaConfig, layer_idx: int) -> None:
        super().__init__(
            hidden_size=config.hidden_size,
            ffn_hidden_size=config.intermediate_size,
            num_attention_heads=config.num_attention_heads,
            num_gqa_groups=config.num_key_value_heads,
            bias=False,
            layernorm_epsilon=config.rms_norm_eps,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            fuse_qkv_params=False,
            normalization="RMSNorm",
            activation="swiglu",
            attn_input_format="bshd",
            layer_number=layer_idx + 1,  # the KV cache's key of this layer
            params_dtype=config.dtype if isinstance(config.dtype, torch.dtype) else None,
        )
        self.layer_idx = layer_idx
        self.max_positions = config.max_position_embeddings
        head_dim = config.hidden_size // config.num_attention_heads
        rope = RotaryPositionEmbedding(head_dim, rotary_base=_rope_base(config))
        self.register_buffer("rope_freqs", rope(self.max_positions), persistent=False)

    def forward(self, hidden_states: torch.Tensor, *args: Any, position_ids: Any = None,
                cache: Any = None, use_cache: bool | None = False, **kwargs: Any
                ) -> torch.Tensor:
        b, s = hidden_states.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(s, device=hidden_states.device).expand(b, s)
        first = position_ids[:, :1]
        if not bool((position_ids == first + torch.arange(s, device=first.device)).all()) or (
            b > 1 and not bool((first == first[0]).all())
        ):
            raise NotImplementedError(
                "TELlamaDecoderLayer: per-row positions (a left-padded batch): only batches of "
                "equal-length prompts"
            )
        if not (use_cache and cache is not None):
            return super().forward(hidden_states, self_attn_mask_type="causal",
                                   rotary_pos_emb=self.rope_freqs)
        start = int(first[0, 0])
        if self.layer_idx == 0:  # one cache step per model forward
            if start == 0:
                cache._te_inference_params = te.InferenceParams(
                    max_batch_size=b, max_sequence_length=self.max_positions,
                    num_heads_kv=self.self_attention.num_gqa_groups,
                    head_dim_k=self.self_attention.hidden_size_per_attention_head,
                    dtype=hidden_states.dtype,
                )
            cache._te_inference_params.pre_step(OrderedDict((i, s) for i in range(b)))
        return super().forward(hidden_states, self_attn_mask_type="padding_causal",
                               rotary_pos_emb=self.rope_freqs,
                               inference_params=cache._te_inference_params)


@contextlib.contextmanager
def replace_decoder() -> Iterator[None]:
    """HF builds LlamaModel's layers from this module attribute: swap it while constructing."""
    original = hf_llama.LlamaDecoderLayer
    hf_llama.LlamaDecoderLayer = TELlamaDecoderLayer
    try:
        yield
    finally:
        hf_llama.LlamaDecoderLayer = original


def TELlamaForCausalLM(config: LlamaConfig) -> LlamaForCausalLM:  # noqa: N802 (TE's name)
    with replace_decoder():
        return LlamaForCausalLM(config)


@torch.no_grad()
def load_hf_weights(te_model: LlamaForCausalLM, hf_model: LlamaForCausalLM) -> None:
    """Copy an HF Llama's weights into a TELlamaForCausalLM of the same config: the decoder
    layers by name (q/k/v, o, RMSNorms; gate and up stacked as SwiGLU's fc1), the rest as is."""
    hf = hf_model.state_dict()
    te_sd = te_model.state_dict()
    out = {k: v for k, v in hf.items() if not k.startswith("model.layers.")}
    for i in range(te_model.config.num_hidden_layers):
        p, t = f"model.layers.{i}.", f"model.layers.{i}."
        a = t + "self_attention."
        out[a + "layernorm_qkv.layer_norm_weight"] = hf[p + "input_layernorm.weight"]
        for name in ("query", "key", "value"):
            out[a + f"layernorm_qkv.{name}_weight"] = hf[p + f"self_attn.{name[0]}_proj.weight"]
        out[a + "proj.weight"] = hf[p + "self_attn.o_proj.weight"]
        m = t + "layernorm_mlp."
        out[m + "layer_norm_weight"] = hf[p + "post_attention_layernorm.weight"]
        out[m + "fc1_weight"] = torch.cat(
            [hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]]
        )
        out[m + "fc2_weight"] = hf[p + "mlp.down_proj.weight"]
    missing = [k for k in te_sd if k not in out and not k.endswith("_extra_state")]
    if missing:
        raise ValueError(f"load_hf_weights: no HF weight for {missing[:4]}")
    te_model.load_state_dict(out, strict=False)


def small_config(**overrides: Any) -> LlamaConfig:
    """A small Llama (random weights; nothing is downloaded)."""
    kw = dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
    kw.update(overrides)
    return LlamaConfig(**kw)


def models(config: LlamaConfig, seed: int = 0) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(HF's Llama, the TE Llama with its weights), both in eval mode."""
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(config).eval()
    model = TELlamaForCausalLM(config).eval()
    load_hf_weights(model, hf)
    return hf, model


def generate(model: LlamaForCausalLM, prompt: torch.Tensor, new_tokens: int, use_cache: bool
             ) -> tuple[torch.Tensor, float]:
    """Greedy generation; (tokens, new tokens per second)."""
    t0 = time.perf_counter()
    # An explicit all-ones mask: HF would otherwise infer padding from pad_token_id occurrences.
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, use_cache=use_cache,
                         pad_token_id=0)
    return out, prompt.shape[0] * new_tokens / (time.perf_counter() - t0)


def main() -> None:
    torch.manual_seed(0)
    config = small_config()
    hf, model = models(config)
    prompt = torch.randint(0, config.vocab_size, (2, 64))
    ref, hf_tps = generate(hf, prompt, 64, True)
    cached, tps = generate(model, prompt, 64, True)
    full, full_tps = generate(model, prompt, 64, False)
    print(f"tokens equal: cache vs HF {torch.equal(cached, ref)}, "
          f"cache vs no cache {torch.equal(cached, full)}")
    print(f"tokens/s: TE cache {tps:,.0f}, TE no cache {full_tps:,.0f}, HF eager cache {hf_tps:,.0f}")


if __name__ == "__main__":
    main()
