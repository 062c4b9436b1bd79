"""The startup hook `transformer_engine_lite_as_te.pth` (site-packages), installed with the package.

Python runs a .pth file's `import` lines at interpreter start. Ours does nothing unless
TE_LITE_AS_TRANSFORMER_ENGINE is set (not "" or "0"); then it imports transformer_engine_lite.as_te,
which maps `transformer_engine` to this package (and stands aside when a real TE is installed).

A wheel carries it at its root (build_py below). An editable install (`pip install -e .`, what
ci/install_deps.sh does) builds its own wheel of path hooks from setuptools' editable strategy,
which takes no files from build_py, so the strategy is wrapped to add the same file. That uses
setuptools' `editable_wheel._select_strategy` (setuptools >= 64); where it is missing the editable
install goes without the hook and says so, and `import transformer_engine_lite.as_te` still works.
"""

from __future__ import annotations

import os

from setuptools.command.build_py import build_py

HOOK_NAME = "transformer_engine_lite_as_te.pth"
# One line: .pth files run only lines that start with "import". site.py may read the file twice
# (venvs' lib64 -> lib link); importing as_te twice is harmless.
HOOK_LINE = (
    "import os; os.environ.get('TE_LITE_AS_TRANSFORMER_ENGINE', '0').strip() not in ('', '0') "
    "and __import__('transformer_engine_lite.as_te')\n"
)


class BuildPyWithHook(build_py):
    def run(self):
        super().run()
        os.makedirs(self.build_lib, exist_ok=True)
        with open(os.path.join(self.build_lib, HOOK_NAME), "w") as f:
            f.write(HOOK_LINE)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, HOOK_NAME)]


def editable_wheel_with_hook():
    """setuptools' editable_wheel command, adding the hook to the editable wheel (or None)."""
    try:
        from setuptools.command.editable_wheel import editable_wheel
    except ImportError:
        return None
    if not hasattr(editable_wheel, "_select_strategy"):
        print(f"build_tools/as_te_hook.py: this setuptools has no editable_wheel._select_strategy; "
              f"the editable install goes without {HOOK_NAME}")
        return None

    class EditableWheelWithHook(editable_wheel):
        def _select_strategy(self, *args, **kwargs):
            return _WithHook(super()._select_strategy(*args, **kwargs))

    return EditableWheelWithHook


class _WithHook:
    """An editable strategy that also writes the hook into the wheel."""

    def __init__(self, inner):
        self.inner = inner

    def __enter__(self):
        self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)

    def __call__(self, wheel, files, mapping):
        self.inner(wheel, files, mapping)
        wheel.writestr(HOOK_NAME, HOOK_LINE.encode())
