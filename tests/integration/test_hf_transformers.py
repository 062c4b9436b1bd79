"""HF transformers (5.24.0, unmodified) holding TE layers: a PreTrainedModel with a
TransformerLayer saves with save_pretrained (safetensors: every state-dict entry must be a tensor,
the FP8 extra state included) and loads back with from_pretrained, weights and FP8 state equal,
the next forward bit-identical. TE's own tests/pytorch/test_hf_integration.py is the model."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is installed by ci/install_deps.sh")
from transformers.configuration_utils import PretrainedConfig  # noqa: E402
from transformers.modeling_utils import PreTrainedModel  # noqa: E402

import transformer_engine_lite.pytorch as te  # noqa: E402
from transformer_engine_lite.common.recipe import DelayedScaling  # noqa: E402

RECIPE = DelayedScaling(amax_history_len=4)


class TinyTEModel(PreTrainedModel):
    config_class = PretrainedConfig

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        self.layer = te.TransformerLayer(hidden_size=64, ffn_hidden_size=128,
                                         num_attention_heads=4, layer_number=None,
                                         hidden_dropout=0.0, attention_dropout=0.0)
        self.post_init()  # transformers 5 requires it (tied-weight bookkeeping)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.layer(hidden_states)


def _fp8_meta(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t.clone() for m in model.modules() if hasattr(m, "fp8_meta_tensors")
            for fwd in (True, False) for t in m.fp8_meta_tensors(fwd)[:2]]


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_free", "fp8_delayed"])
def test_save_pretrained_then_from_pretrained(tmp_path, fp8):
    torch.manual_seed(0)
    model = TinyTEModel(PretrainedConfig())
    x = torch.randn(8, 2, 64)
    if fp8:  # a few steps so that the amax histories and scales are not the defaults
        for _ in range(3):
            with te.fp8_autocast(fp8_recipe=RECIPE):
                model(x).sum().backward()
    model.save_pretrained(tmp_path / "tiny")
    assert (tmp_path / "tiny" / "model.safetensors").exists()
    loaded = TinyTEModel.from_pretrained(tmp_path / "tiny")
    for (n, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters()):
        assert torch.equal(a, b), n
    before, after = _fp8_meta(model), _fp8_meta(loaded)
    assert len(before) == len(after) > 0
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    if fp8:
        assert any(not torch.equal(t, torch.ones_like(t)) for t in after)  # real state travelled
    model.eval()
    loaded.eval()
    with torch.no_grad(), te.fp8_autocast(enabled=fp8, fp8_recipe=RECIPE):
        y0 = model(x)
    with torch.no_grad(), te.fp8_autocast(enabled=fp8, fp8_recipe=RECIPE):
        y1 = loaded(x)
    assert torch.equal(y0, y1)


def test_te_llama_generate_with_kv_cache(monkeypatch):
    """The te_llama example (HF's LlamaForCausalLM with te.TransformerLayer decoder layers) under
    HF's own generate(): with use_cache=True its layers keep TE's KV cache (one InferenceParams
    step per generated token) and the greedy tokens equal those without the cache and those of
    HF's Llama on the same weights (fp32)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "pytorch"))
    import te_llama

    config = te_llama.small_config(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                   num_attention_heads=4, num_key_value_heads=2)
    hf, model = te_llama.models(config)
    steps = []
    pre_step = te.InferenceParams.pre_step
    monkeypatch.setattr(te.InferenceParams, "pre_step",
                        lambda self, d: (steps.append(dict(d)), pre_step(self, d))[1])
    prompt = torch.randint(0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    cached = te_llama.generate(model, prompt, 10, True)[0]
    assert steps == [{0: 12, 1: 12}] + [{0: 1, 1: 1}] * 9  # prefill, then one token per step
    steps.clear()
    full = te_llama.generate(model, prompt, 10, False)[0]
    assert not steps
    assert torch.equal(cached, full)
    assert torch.equal(cached, te_llama.generate(hf, prompt, 10, True)[0])
    with pytest.raises(NotImplementedError, match="left-padded"):
        mask = torch.ones_like(prompt)
        mask[0, :3] = 0
        model.generate(prompt, attention_mask=mask, max_new_tokens=2, do_sample=False,
                       use_cache=True, pad_token_id=0)
