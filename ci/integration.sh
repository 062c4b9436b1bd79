#!/usr/bin/env bash
# Unmodified TE clients on transformer_engine_lite through the `transformer_engine` alias (issue #22):
# Megatron-Core 0.19.2 (GPTModel with its TE layer spec: fp32 vs its local spec, bf16, FP8 recipes,
# recompute, MoE with grouped GEMM and the fused router, TP=2 + sequence parallel under torchrun)
# and HF accelerate 1.15.0 (Accelerator(mixed_precision="fp8")). Both are pinned and installed by
# ci/install_deps.sh. Tags: integration.<file>; the startup hook (TE_LITE_AS_TRANSFORMER_ENGINE=1)
# is tested in tests/pytorch/test_te_clients.py.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/_utils.sh"
# The tests skip without the clients; CI must not: their absence fails this tag.
run_tagged integration.clients_installed python -c "import megatron.core, accelerate, transformers; \
print('megatron-core', megatron.core.__version__, 'accelerate', accelerate.__version__, \
'transformers', transformers.__version__)"
for f in "$REPO_ROOT"/tests/integration/test_*.py; do
  [ -e "$f" ] || continue
  run_tagged "integration.$(basename "$f" .py)" run_pytest "$f"
done
finish_tests integration
