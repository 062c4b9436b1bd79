"""torch.ops.te_lite.quantize_nvfp4 with given amaxes (row_amax_in / col_amax_in: TE's amax
all-reduced over amax_reduction_group before the cast): the per-tensor scales come from them and
they come back as the amaxes. Bytes and scales against the PyTorch reference recipe's block math
(custom_recipes/_reference_nvfp4_math.quantize_blocks) with the same amax; argument checks.
The cross-rank reduction itself: tests/pytorch/test_distributed.py (torchrun)."""

from __future__ import annotations

import pytest
import torch

from transformer_engine_lite.pytorch.custom_recipes import _reference_nvfp4_math as m
from transformer_engine_lite.pytorch.quantization import ops


def _x():
    torch.manual_seed(11)
    return (torch.randn(48, 64) * 3).to(torch.bfloat16)


@pytest.mark.parametrize("two_d", [False, True], ids=["1x16", "16x16"])
@pytest.mark.parametrize("factor", [5.0, 0.3])
def test_given_amax_scales_the_tensor(two_d, factor):
    x = _x()
    own = x.float().abs().amax().reshape(1)
    ra, ca = own * factor, own * factor * 1.5
    r, rs, a_r, c, cs, a_c = ops().quantize_nvfp4(x, True, True, two_d, False, 0, False, 0, 0,
                                                  row_amax_in=ra, col_amax_in=ca)
    assert torch.equal(a_r, ra) and torch.equal(a_c, ca)
    for data, scales, src, amax, name in ((r, rs, x.float(), ra, "row"),
                                          (c, cs, x.float().t().contiguous(), ca, "col")):
        want_d, want_s = m.quantize_blocks(src, amax, two_d)
        assert torch.equal(data.reshape(want_d.shape), want_d), name
        rows, nb = src.shape[0], want_s.shape[1]
        assert torch.equal(scales[:rows, :nb], want_s[:rows].view(torch.uint8)), name
    # not the tensor's own scaling
    own = ops().quantize_nvfp4(x, True, False, two_d, False, 0, False, 0, 0)
    assert not (torch.equal(own[0], r) and torch.equal(own[1], rs))


def test_given_amax_arguments_checked():
    x = _x()
    a = torch.ones(1)
    with pytest.raises(RuntimeError, match="argument 'col_amax_in': expected float32 \\[1\\]"):
        ops().quantize_nvfp4(x, True, True, False, False, 0, False, 0, 0, row_amax_in=a)
    with pytest.raises(RuntimeError, match="argument 'col_amax_in': expected None"):
        ops().quantize_nvfp4(x, True, False, False, False, 0, False, 0, 0, row_amax_in=a,
                             col_amax_in=a)
    with pytest.raises(RuntimeError, match="argument 'row_amax_in': expected one float32"):
        ops().quantize_nvfp4(x, True, False, False, False, 0, False, 0, 0,
                             row_amax_in=torch.ones(2))
    with pytest.raises(RuntimeError, match="row_scaled=True"):
        ops().quantize_nvfp4(x, True, False, False, False, 0, False, 0, 0, True,
                             row_amax_in=a)
