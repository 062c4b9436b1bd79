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


def test_every_environment_read_is_registered():
    """Every variable read from the environment (Python, C++, shell) is in config.ENV_VARS."""
    names = {v.name for v in config.ENV_VARS}
    reads = [
        re.compile(r"config\.get\(\s*[\"']([A-Z0-9_]+)[\"']"),
        re.compile(r"_flag\(\s*[\"']([A-Z0-9_]+)[\"']"),
        re.compile(r"environ(?:\.get)?[\[(]\s*[\"']([A-Z0-9_]+)[\"']"),
        re.compile(r"getenv\(\s*\"([A-Z0-9_]+)\""),
        # C++ reads through common/util/env.h (env_value, env_is_zero, env_is_one, env_int).
        re.compile(r"\benv_(?:value|is_zero|is_one|int)\(\s*\"([A-Z0-9_]+)\""),
    ]
    files = [ROOT / "setup.py"]
    for folder in ("transformer_engine_lite", "build_tools"):
        for ext in ("*.py", "*.cpp", "*.h", "*.cu", "*.cuh"):
            files += list((ROOT / folder).rglob(ext))
    found = set()
    for path in files:
        text = path.read_text()
        for pattern in reads:
            found.update(pattern.findall(text))
    # Variables of other tools that we only pass through.
    found -= {"HIP_PLATFORM", "CUDA_HOME", "PATH", "LD_LIBRARY_PATH"}
    missing = sorted(found - names)
    assert not missing, f"environment variables read but not registered in config.ENV_VARS: {missing}"


def test_registry_lookup_rejects_unknown_names():
    import pytest

    with pytest.raises(KeyError, match="not a registered environment variable"):
        config.get("NVTE_NO_SUCH_VARIABLE")
