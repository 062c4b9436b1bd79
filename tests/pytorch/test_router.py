"""pytorch/router.py (TE's transformer_engine.pytorch.router) against a pure-torch fp64 reference
written here: fused_topk_with_score_function (softmax pre/post, sigmoid, sqrtsoftplus, group-limited
top-k, expert_bias, scaling_factor), fused_compute_score_for_moe_aux_loss and fused_moe_aux_loss,
forward values, routing maps (exact: logits are distinct multiples of 1/16, exact in every dtype),
gradients (autograd of the reference), dtypes, errors naming the argument, Megatron-Core's calls,
and the opcheck cases of the router ops (ROUTER_OPCHECK_CASES, collected by test_ops.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytest.importorskip(
    "transformer_engine_lite.pytorch.te_lite_ops",
    reason="PyTorch extension not built",
    exc_type=ImportError,
)

from op_helpers import randn, run_opcheck  # noqa: E402
from utils import assert_close  # noqa: E402

from transformer_engine_lite.pytorch import router  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ------------------------------------------------------------------------------ fp64 reference
def _scores(logits: torch.Tensor, score_function: str) -> torch.Tensor:
    if score_function == "softmax":
        return torch.softmax(logits, -1)
    if score_function == "sigmoid":
        return torch.sigmoid(logits)
    return torch.nn.functional.softplus(logits).sqrt()


def _topk_ids(key: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k indices, higher first, ties to the lower index (stable sort)."""
    return torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :k]


def ref_topk(logits, topk, use_pre_softmax, num_groups, group_topk, scaling_factor, score_function,
             expert_bias):
    """Megatron-Core's topk_routing_with_score_function, in fp64 (logits: 2-D, any dtype)."""
    x = logits.double()
    tokens, experts = x.shape
    if score_function == "softmax":
        act = torch.softmax(x, -1) if use_pre_softmax else x
        key = act
    else:
        act = _scores(x, score_function)
        key = act + expert_bias.double() if expert_bias is not None else act
    if group_topk:
        size = experts // num_groups
        grouped = key.detach().view(tokens, num_groups, size)
        group_scores = torch.sort(grouped, -1, descending=True).values[..., : topk // group_topk]
        kept = _topk_ids(group_scores.sum(-1), group_topk)
        mask = torch.zeros(tokens, num_groups, dtype=torch.bool).scatter(1, kept, True)
        key = key.masked_fill(~mask.repeat_interleave(size, 1), float("-inf"))
    ids = _topk_ids(key.detach(), topk)
    picked = act.gather(1, ids)
    if score_function == "softmax":
        probs = picked if use_pre_softmax else torch.softmax(picked, -1)
    else:
        probs = picked / (picked.sum(-1, keepdim=True) + 1e-20) if topk > 1 else picked
    if scaling_factor:
        probs = probs * scaling_factor
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter(1, ids, True)
    return torch.zeros_like(x).scatter(1, ids, probs), routing_map


def ref_scores_for_aux_loss(logits, topk, score_function):
    x = logits.double()
    scores = _scores(x, score_function)
    if score_function != "softmax":
        scores = scores / (scores.sum(-1, keepdim=True) + 1e-20)
    ids = _topk_ids(scores.detach(), topk)
    return torch.zeros(x.shape, dtype=torch.bool).scatter(1, ids, True), scores


def ref_aux_loss(probs, tokens_per_expert, total_num_tokens, num_experts, topk, coeff):
    """Megatron-Core's switch_load_balancing_loss_func, in fp64."""
    p = probs.double()
    return (p.sum(0) * tokens_per_expert.double()).sum() * (
        num_experts * coeff / (topk * total_num_tokens * total_num_tokens)
    )


def distinct_logits(tokens, experts, dtype, seed=0, requires_grad=True):
    """Per token a shuffle of k/16, k in [-experts/2, experts/2): no ties, exact in bf16."""
    g = torch.Generator().manual_seed(seed)
    base = (torch.arange(experts, dtype=torch.float64) - experts // 2) / 16
    rows = [base[torch.randperm(experts, generator=g)] for _ in range(tokens)]
    return torch.stack(rows).to(dtype).requires_grad_(requires_grad)


def _ref_leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().double().requires_grad_(True)


# (tokens, experts, topk, num_groups, group_topk)
DIMS = [(1, 1, 1, None, None), (9, 8, 2, None, None), (33, 64, 6, 8, 3), (17, 37, 5, None, None),
        (6, 32, 4, 32, 4)]
# (score_function, use_pre_softmax, expert_bias)
MODES = [("softmax", True, False), ("softmax", False, False), ("sigmoid", False, False),
         ("sigmoid", False, True), ("sqrtsoftplus", False, False), ("sqrtsoftplus", False, True)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: "x".join(str(v) for v in d))
@pytest.mark.parametrize(
    "mode", MODES, ids=lambda m: m[0] + ("-pre" if m[1] else "") + ("-bias" if m[2] else "")
)
def test_topk_with_score_function(dtype, dims, mode):
    tokens, experts, topk, num_groups, group_topk = dims
    score_function, pre, bias = mode
    x = distinct_logits(tokens, experts, dtype, seed=tokens)
    g = torch.Generator().manual_seed(1)
    expert_bias = (torch.rand(experts, generator=g) - 0.5) * 0.6 if bias else None
    scaling = 2.5 if experts % 2 else None
    args = (topk, pre, num_groups, group_topk, scaling, score_function, expert_bias)
    probs, routing_map = router.fused_topk_with_score_function(x, *args)
    xr = _ref_leaf(x)
    ref_probs, ref_map = ref_topk(xr, *args)
    assert probs.dtype == dtype and routing_map.dtype == torch.bool
    assert torch.equal(routing_map, ref_map)
    assert_close(probs, ref_probs, dtype, "probs")
    dy = randn(tokens, experts, seed=3).to(dtype)
    probs.backward(dy)
    ref_probs.backward(dy.double())
    assert x.grad.dtype == dtype
    assert_close(x.grad, xr.grad, dtype, "grad logits")


def test_topk_leading_dims_and_ties():
    # [2, 3, 8] logits route per token; equal logits go to the lower expert indices (torch.topk).
    x = torch.zeros(2, 3, 8)
    x[1, 2, 5] = 1.0
    probs, routing_map = router.fused_topk_with_score_function(
        x, 2, False, None, None, None, "softmax", None
    )
    assert probs.shape == routing_map.shape == (2, 3, 8)
    assert routing_map[0, 0].nonzero().flatten().tolist() == [0, 1]
    assert routing_map[1, 2].nonzero().flatten().tolist() == [0, 5]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("score_function", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("dims", [(1, 1, 1), (19, 8, 2), (40, 64, 6), (7, 37, 5)], ids=str)
def test_compute_score_for_moe_aux_loss(dtype, score_function, dims):
    tokens, experts, topk = dims
    x = distinct_logits(tokens, experts, dtype, seed=experts)
    routing_map, scores = router.fused_compute_score_for_moe_aux_loss(x, topk, score_function)
    xr = _ref_leaf(x)
    ref_map, ref_scores = ref_scores_for_aux_loss(xr, topk, score_function)
    assert scores.dtype == torch.float32 and routing_map.dtype == torch.bool
    assert torch.equal(routing_map, ref_map)
    assert_close(scores, ref_scores, torch.float32, "scores")
    dy = randn(tokens, experts, seed=4)
    scores.backward(dy)
    ref_scores.backward(dy.double())
    assert x.grad.dtype == dtype
    assert_close(x.grad, xr.grad, dtype, "grad logits")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize(
    "count_dtype", [torch.int32, torch.int64, torch.float32, torch.bfloat16], ids=str
)
@pytest.mark.parametrize("total", [37, torch.tensor(1000)], ids=["int", "tensor"])
def test_moe_aux_loss(dtype, count_dtype, total):
    probs = torch.softmax(randn(37, 16, seed=5), -1).to(dtype).requires_grad_(True)
    counts = torch.arange(16).remainder(5).to(count_dtype)
    loss = router.fused_moe_aux_loss(probs, counts, total, 8, 2, 0.01)
    pr = _ref_leaf(probs)
    ref = ref_aux_loss(pr, counts, int(total), 8, 2, 0.01)
    assert loss.dtype == dtype and loss.dim() == 0
    assert_close(loss, ref, dtype, "aux loss")
    loss.backward(torch.tensor(1.5, dtype=dtype))
    ref.backward(torch.tensor(1.5, dtype=torch.float64))
    assert_close(probs.grad, pr.grad, dtype, "grad probs")


def test_empty_batch():
    x = torch.zeros(0, 8, dtype=torch.bfloat16, requires_grad=True)
    probs, routing_map = router.fused_topk_with_score_function(
        x, 2, False, None, None, None, "sigmoid", None
    )
    assert probs.shape == routing_map.shape == (0, 8)
    probs.sum().backward()
    assert x.grad.shape == (0, 8)


def test_megatron_calls():
    """As megatron/core/transformer/moe: router.py / moe_utils.py call the fused functions with
    keywords (DeepSeek-V3-style sigmoid routing with expert bias and node-limited groups, then the
    sequence-level aux loss over the aux-loss scores)."""
    tokens, experts, topk = 64, 32, 4
    logits = distinct_logits(tokens, experts, torch.bfloat16, seed=9)
    expert_bias = torch.zeros(experts, dtype=torch.float32)
    expert_bias[::3] = 0.05
    probs, routing_map = router.fused_topk_with_score_function(
        logits=logits,
        topk=topk,
        use_pre_softmax=False,
        num_groups=4,
        group_topk=2,
        scaling_factor=2.5,
        score_function="sigmoid",
        expert_bias=expert_bias,
    )
    ref_probs, ref_map = ref_topk(_ref_leaf(logits), topk, False, 4, 2, 2.5, "sigmoid", expert_bias)
    assert torch.equal(routing_map, ref_map) and routing_map.sum(-1).eq(topk).all()
    assert_close(probs, ref_probs, torch.bfloat16, "probs")

    routing_map_aux, scores = router.fused_compute_score_for_moe_aux_loss(
        logits=logits, topk=topk, score_function="sigmoid"
    )
    tokens_per_expert = routing_map_aux.sum(dim=0)
    aux_loss = router.fused_moe_aux_loss(
        probs=scores,
        tokens_per_expert=tokens_per_expert,
        total_num_tokens=tokens,
        topk=topk,
        num_experts=experts,
        coeff=1e-2,
    )
    xr = _ref_leaf(logits)
    _, ref_scores = ref_scores_for_aux_loss(xr, topk, "sigmoid")
    ref_loss = ref_aux_loss(ref_scores, tokens_per_expert, tokens, experts, topk, 1e-2)
    assert_close(aux_loss, ref_loss, torch.float32, "aux loss")
    (probs.float().sum() + aux_loss).backward()
    (ref_probs.sum() + ref_loss).backward()
    assert_close(logits.grad, xr.grad, torch.bfloat16, "grad logits")


def test_compile_fullgraph():
    x = distinct_logits(12, 16, torch.float32, seed=2)

    def route(x):
        probs, routing_map = router.fused_topk_with_score_function(
            x, 3, False, None, None, 1.5, "sigmoid", None
        )
        routing_aux, scores = router.fused_compute_score_for_moe_aux_loss(x, 3, "softmax")
        loss = router.fused_moe_aux_loss(scores, routing_aux.sum(0), 12, 16, 3, 0.1)
        return probs, routing_map, loss

    eager = route(x)
    compiled = torch.compile(route, fullgraph=True, backend="aot_eager")(x)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------------ errors
_X = torch.zeros(4, 8)


@pytest.mark.parametrize(
    "call,exc,needle",
    [
        (lambda: router.fused_topk_with_score_function(_X.long(), 2, False, None, None, None,
                                                       "softmax", None), TypeError, "logits"),
        (lambda: router.fused_topk_with_score_function(_X.double(), 2, False, None, None, None,
                                                       "softmax", None), TypeError, "logits"),
        (lambda: router.fused_topk_with_score_function(_X, 0, False, None, None, None, "softmax",
                                                       None), ValueError, "topk"),
        (lambda: router.fused_topk_with_score_function(_X, 9, False, None, None, None, "softmax",
                                                       None), ValueError, "topk"),
        (lambda: router.fused_topk_with_score_function(_X, 2.0, False, None, None, None,
                                                       "softmax", None), TypeError, "topk"),
        (lambda: router.fused_topk_with_score_function(_X, 2, False, None, None, None, "relu",
                                                       None), ValueError, "score_function"),
        (lambda: router.fused_topk_with_score_function(_X, 2, False, 4, None, None, "sigmoid",
                                                       None), ValueError, "num_groups"),
        (lambda: router.fused_topk_with_score_function(_X, 2, False, 3, 1, None, "sigmoid",
                                                       None), ValueError, "num_groups"),
        (lambda: router.fused_topk_with_score_function(_X, 2, False, 4, 5, None, "sigmoid",
                                                       None), ValueError, "group_topk"),
        (lambda: router.fused_topk_with_score_function(_X, 3, False, 4, 2, None, "sigmoid",
                                                       None), ValueError, "topk"),
        (lambda: router.fused_topk_with_score_function(_X, 2, False, None, None, None, "softmax",
                                                       torch.zeros(8)), ValueError, "expert_bias"),
        (lambda: router.fused_topk_with_score_function(_X, 2, False, None, None, None, "sigmoid",
                                                       torch.zeros(7)), ValueError, "expert_bias"),
        (lambda: router.fused_topk_with_score_function(
            _X, 2, False, None, None, None, "sigmoid", torch.zeros(8, dtype=torch.bfloat16)),
         TypeError, "expert_bias"),
        (lambda: router.fused_topk_with_score_function(
            _X, 2, False, None, None, None, "sigmoid", None, routing_map_format="bitmap_u8"),
         NotImplementedError, "routing_map_format"),
        (lambda: router.fused_topk_with_score_function(
            _X, 2, False, None, None, None, "sigmoid", None, routing_map_format="bits"),
         ValueError, "routing_map_format"),
        (lambda: router.fused_topk_with_score_function(
            _X, 2, False, None, None, None, "sigmoid", None, topk_indices=torch.zeros(4, 2)),
         NotImplementedError, "topk_indices"),
        (lambda: router.fused_compute_score_for_moe_aux_loss(_X, 2, "tanh"), ValueError,
         "score_function"),
        (lambda: router.fused_compute_score_for_moe_aux_loss(_X, 9, "softmax"), ValueError,
         "topk"),
        (lambda: router.fused_moe_aux_loss(_X, torch.ones(8), 0, 8, 2, 0.1), ValueError,
         "total_num_tokens"),
        (lambda: router.fused_moe_aux_loss(_X, torch.ones(7), 4, 8, 2, 0.1), ValueError,
         "tokens_per_expert"),
        (lambda: router.fused_moe_aux_loss(_X, torch.ones(8, dtype=torch.uint8), 4, 8, 2, 0.1),
         TypeError, "tokens_per_expert"),
        (lambda: router.fused_moe_aux_loss(_X, torch.ones(8), 4, 3, 2, 0.1), ValueError,
         "num_experts"),
        (lambda: router.fused_moe_aux_loss(_X[0], torch.ones(8), 4, 8, 2, 0.1), ValueError,
         "probs"),
        (lambda: router.fused_moe_aux_loss(_X, torch.ones(8), 4, 8, 2, "0.1"), TypeError,
         "coeff"),
    ],
)
def test_errors_name_the_argument(call, exc, needle):
    with pytest.raises(exc, match=needle):
        call()


def test_core_rejects_what_the_binding_passes():
    # The op itself (no Python checks): the core's message names the C argument.
    with pytest.raises(RuntimeError, match="argument 'topk'"):
        torch.ops.te_lite.fused_topk_with_score_function_fwd(_X, 9, False, -1, -1, 1.0, 1, None)
    with pytest.raises(RuntimeError, match="argument 'score_function'"):
        torch.ops.te_lite.fused_score_for_moe_aux_loss_fwd(_X, 2, 5)


# ------------------------------------------------------------------------------ opcheck
# (op name, id, args factory), as OPCHECK_CASES in test_ops.py, whose coverage check imports these.
ROUTER_OPCHECK_CASES: list[tuple[str, str, Callable[[], tuple]]] = []
for _dt in DTYPES:
    _d = str(_dt)[6:]
    ROUTER_OPCHECK_CASES += [
        (
            "fused_topk_with_score_function_fwd",
            f"sigmoid-groups-bias-{_d}",
            lambda d=_dt: (
                distinct_logits(6, 16, d, requires_grad=False), 4, False, 4, 2, 1.5, 0,
                torch.linspace(-0.1, 0.1, 16),
            ),
        ),
        (
            "fused_topk_with_score_function_bwd",
            f"softmax-pre-{_d}",
            lambda d=_dt: (
                torch.zeros(6, 16, dtype=torch.bool).index_fill_(1, torch.tensor([1, 5]), True),
                torch.softmax(randn(6, 16), -1), randn(6, 16, seed=1).to(d), 2, True, 1.0, 1,
            ),
        ),
        (
            "fused_score_for_moe_aux_loss_fwd",
            f"sqrtsoftplus-{_d}",
            lambda d=_dt: (distinct_logits(5, 8, d, requires_grad=False), 3, 2),
        ),
        (
            "fused_score_for_moe_aux_loss_bwd",
            f"sigmoid-{_d}",
            lambda d=_dt: (torch.sigmoid(randn(5, 8)), randn(5, 8, seed=2), 3, 0, d),
        ),
        (
            "fused_moe_aux_loss_fwd",
            f"int64-{_d}",
            lambda d=_dt: (torch.rand(7, 8).to(d), torch.arange(8), 40, 4, 2, 0.1),
        ),
        (
            "fused_moe_aux_loss_bwd",
            f"{_d}",
            lambda d=_dt: (torch.tensor([0.25]), torch.arange(8), torch.tensor(2.0).to(d), 7, 8),
        ),
    ]


@pytest.mark.parametrize(
    "name,factory",
    [(c[0], c[2]) for c in ROUTER_OPCHECK_CASES],
    ids=[f"{c[0]}-{c[1]}" for c in ROUTER_OPCHECK_CASES],
)
def test_opcheck(name, factory):
    run_opcheck(name, factory())
