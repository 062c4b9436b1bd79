"""TransformerLayer cases of bench_pytorch.py: te.TransformerLayer (hidden 1024, FFN 4096, 16 heads,
bf16, causal self-attention, fwd + bwd, batch 2 x seq 1024; --quick: 256, 1024, 4 heads, 2 x 128)
against the same block in plain torch with the same parameter values: LayerNorm, fused QKV
nn.Linear, F.scaled_dot_product_attention(is_causal=True), projection nn.Linear, residual,
LayerNorm, nn.Linear + GELU (tanh, as TE's "gelu") + nn.Linear, residual; in eager mode, and (the
_vs_compile case) under torch.compile. Checked first like the bf16 module cases: the output, dx and
every parameter gradient against the torch block in bf16 (peer) and fp32 (reference).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import Case, bf16_peer_check, fwd_bwd_step

BF16 = torch.bfloat16
LN_EPS = 1e-5


def _sizes(quick: bool) -> tuple[int, int, int, int, int]:
    """(hidden, ffn, heads, batch, seq)"""
    return (256, 1024, 4, 2, 128) if quick else (1024, 4096, 16, 2, 1024)


class TorchBlock(torch.nn.Module):
    """The pre-LayerNorm transformer block te.TransformerLayer computes (no dropout), bshd input."""

    def __init__(self, hidden: int, ffn: int, heads: int, dtype: torch.dtype) -> None:
        super().__init__()
        kw = {"dtype": dtype}
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(hidden, eps=LN_EPS, **kw)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, **kw)  # output rows [q | k | v]
        self.proj = torch.nn.Linear(hidden, hidden, **kw)
        self.ln2 = torch.nn.LayerNorm(hidden, eps=LN_EPS, **kw)
        self.fc1 = torch.nn.Linear(hidden, ffn, **kw)
        self.fc2 = torch.nn.Linear(ffn, hidden, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, hidden = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, hidden // self.heads)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # [b, heads, s, d]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, hidden))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


# te name -> torch name of each parameter
NAMES = {
    "self_attention.layernorm_qkv.layer_norm_weight": "ln1.weight",
    "self_attention.layernorm_qkv.layer_norm_bias": "ln1.bias",
    "self_attention.layernorm_qkv.weight": "qkv.weight",
    "self_attention.layernorm_qkv.bias": "qkv.bias",
    "self_attention.proj.weight": "proj.weight",
    "self_attention.proj.bias": "proj.bias",
    "layernorm_mlp.layer_norm_weight": "ln2.weight",
    "layernorm_mlp.layer_norm_bias": "ln2.bias",
    "layernorm_mlp.fc1_weight": "fc1.weight",
    "layernorm_mlp.fc1_bias": "fc1.bias",
    "layernorm_mlp.fc2_weight": "fc2.weight",
    "layernorm_mlp.fc2_bias": "fc2.bias",
}


class _Setup:
    def __init__(self, quick: bool) -> None:
        import transformer_engine_lite.pytorch as te

        hidden, ffn, heads, b, s = _sizes(quick)
        torch.manual_seed(0)
        # qkv_weight_interleaved=False: the fused weight's rows are [q | k | v], as TorchBlock's.
        self.ours = te.TransformerLayer(
            hidden,
            ffn,
            heads,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            self_attn_mask_type="causal",
            fuse_qkv_params=True,
            qkv_weight_interleaved=False,
            attn_input_format="bshd",
            bias=True,
            activation="gelu",
            normalization="LayerNorm",
            params_dtype=BF16,
            device="cpu",
        )
        with torch.no_grad():  # non-trivial biases and norm parameters
            for n, p in self.ours.named_parameters():
                if n.endswith("bias"):
                    p.copy_(0.1 * torch.randn_like(p, dtype=torch.float32))
                elif n.endswith("layer_norm_weight"):
                    p.copy_(1 + 0.1 * torch.randn_like(p, dtype=torch.float32))
        missing = set(NAMES) ^ {n for n, _ in self.ours.named_parameters()}
        if missing:
            raise RuntimeError(f"transformer_layer: parameter names differ: {sorted(missing)}")
        self.sizes = (hidden, ffn, heads)
        self.x = torch.randn(b, s, hidden).to(BF16).requires_grad_()
        self.dy = torch.randn(b, s, hidden).to(BF16)
        self.torch_bf16 = self.torch_block(BF16)
        self._compiled: Callable | None = None

    def torch_block(self, dtype: torch.dtype) -> TorchBlock:
        m = TorchBlock(*self.sizes, dtype)
        params = dict(m.named_parameters())
        ours = dict(self.ours.named_parameters())
        with torch.no_grad():
            for ours_name, ref_name in NAMES.items():
                params[ref_name].copy_(ours[ours_name])
        return m

    def compiled(self) -> Callable:
        if self._compiled is None:
            self._compiled = torch.compile(self.torch_bf16)
        return self._compiled

    _step = staticmethod(fwd_bwd_step)

    def ours_step(self) -> Callable[[], torch.Tensor]:
        return self._step(self.ours, list(self.ours.parameters()), self.x, self.dy)

    def ref_step(self, compiled: bool) -> Callable[[], torch.Tensor]:
        fn = self.compiled() if compiled else self.torch_bf16
        return self._step(fn, list(self.torch_bf16.parameters()), self.x, self.dy)

    def results(self, step: Callable, mod: torch.nn.Module, x: torch.Tensor, ours: bool) -> dict:
        """{name: tensor}: the output, dx and each parameter's gradient (our names)."""
        y = step()
        out = {"y": y.detach().clone(), "dx": x.grad.detach().clone()}
        params = dict(mod.named_parameters())
        for ours_name, ref_name in NAMES.items():
            out[f"d{ours_name}"] = params[ours_name if ours else ref_name].grad.detach().clone()
        return out

    def check(self, compiled: bool) -> str | None:
        ours = self.results(self.ours_step(), self.ours, self.x, ours=True)
        peer = self.results(self.ref_step(compiled), self.torch_bf16, self.x, ours=False)
        ref32 = self.torch_block(torch.float32)
        x32 = self.x.detach().float().requires_grad_()
        fp32 = self.results(
            self._step(ref32, list(ref32.parameters()), x32, self.dy.float()), ref32, x32, False
        )
        return bf16_peer_check(ours, peer, fp32)


_SETUPS: dict[bool, _Setup] = {}


def _setup(quick: bool) -> _Setup:
    if quick not in _SETUPS:
        _SETUPS[quick] = _Setup(quick)
    return _SETUPS[quick]


def _case(compiled: bool) -> Callable[[bool], Case]:
    def build(quick: bool) -> Case:
        s = _setup(quick)
        # the check runs the compiled reference once: compilation happens before the timing
        return Case(s.ours_step(), s.ref_step(compiled), lambda: s.check(compiled))

    return build


CASES: dict[str, tuple[Callable[[bool], Case], float | None]] = {
    "transformer_layer_bf16": (_case(False), 1.3),
    "transformer_layer_bf16_vs_compile": (_case(True), 1.25),
}
