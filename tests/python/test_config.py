"""The README documents exactly the environment variables the project registers."""

import re
from pathlib import Path

from transformer_engine_lite.common import config

ROOT = Path(__file__).resolve().parents[2]


def test_readme_table_matches_registry():
    readme = (ROOT / "README.md").read_text()
    assert config.markdown_table() in readme, (
        "README env-var table is stale: paste transformer_engine_lite.common.config.markdown_table()"
    )


def test_every_nvte_variable_in_code_is_registered():
    names = {v.name for v in config.ENV_VARS}
    pattern = re.compile(r"\b(NVTE_[A-Z0-9_]+)\b")
    found = set()
    for path in list((ROOT / "transformer_engine_lite").rglob("*.py")) + list(
        (ROOT / "build_tools").rglob("*.py")
    ) + [ROOT / "setup.py"]:
        for m in pattern.finditer(path.read_text()):
            if not m.group(1).endswith("_"):  # f-string stems such as NVTE_USE_{kind}
                found.add(m.group(1))
    # C API identifiers share the prefix; only environment variables must be registered.
    found = {n for n in found if not n.startswith(("NVTE_ERROR", "NVTE_SUCCESS", "NVTE_MAX_NDIM",
                                                   "NVTE_DELAYED", "NVTE_MXFP8", "NVTE_INVALID"))}
    missing = sorted(found - names)
    assert not missing, f"environment variables read but not registered in config.ENV_VARS: {missing}"
