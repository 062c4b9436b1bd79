"""Run unmodified TransformerEngine code on transformer_engine_lite.

`import transformer_engine_lite.as_te` (or `TE_LITE_AS_TRANSFORMER_ENGINE=1` in the environment,
read at interpreter start by the `transformer_engine_lite_as_te.pth` hook the package installs)
puts an import hook first on `sys.meta_path` that maps

    transformer_engine            -> a small package module: `__version__` is TE_API_VERSION, every
                                     other attribute is transformer_engine_lite's
    transformer_engine.<sub>      -> transformer_engine_lite.<sub> (the same module object)
    transformer_engine_torch      -> transformer_engine_lite.pytorch.tex (TE's C extension's name)

so that `import transformer_engine.pytorch as te` in Megatron-Core, accelerate or a user's script
gets our modules. A name we lack raises ModuleNotFoundError naming both the TE name and ours, which
the clients' `try: ... except ImportError` guards treat as "feature not installed".

It never shadows a real TransformerEngine: when `transformer_engine` can be found on sys.path
(or is already imported and is not ours), install() does nothing, warns once, and returns False;
the real TE is what `import transformer_engine` gives. No distribution metadata is faked:
`importlib.metadata.version("transformer-engine")` still raises PackageNotFoundError, so clients
that look TE up by its pip name (accelerate's `is_transformer_engine_available`) see no TE.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

# The TE release whose Python API this package implements, as clients compare it
# (`packaging.version.Version(transformer_engine.__version__)`). Megatron-Core switches code paths
# on it (2.7: fused router unguarded; 2.8: ops.SiLU, softmax_type; 2.9: return_max_logit;
# 2.10: num_splits; 2.14: ops.GroupedLinear): 2.8 is the newest level whose names we provide.
TE_API_VERSION = "2.8.0"

_LITE = "transformer_engine_lite"
_TE = "transformer_engine"
_RENAMES = {"transformer_engine_torch": f"{_LITE}.pytorch.tex"}


def _target(fullname: str) -> str | None:
    """Our module name for a TE module name, or None when the name is not TE's."""
    if fullname in _RENAMES:
        return _RENAMES[fullname]
    if fullname == _TE:
        return _LITE
    if fullname.startswith(_TE + "."):
        return _LITE + fullname[len(_TE):]
    return None


class _TopLevel(types.ModuleType):
    """`transformer_engine` itself: TE's version, and transformer_engine_lite's attributes."""

    def __getattr__(self, name: str):
        lite = importlib.import_module(_LITE)
        if name in ("pytorch", "jax", "common"):  # subpackages: import them under TE's name
            return importlib.import_module(f"{_TE}.{name}")
        return getattr(lite, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(dir(importlib.import_module(_LITE))))


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target
        self.own_spec = None

    def create_module(self, spec):
        if spec.name == _TE:
            lite = importlib.import_module(_LITE)
            top = _TopLevel(_TE, lite.__doc__)
            top.__version__ = TE_API_VERSION
            top.__path__ = []  # a package: its submodules come through the finder below
            top.__lite__ = lite
            return top
        module = importlib.import_module(self.target)  # the same object under both names
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The import system set __spec__ to the alias's spec; our module keeps its own, so that its
        # relative imports, pickling and torch.compile see transformer_engine_lite names.
        if self.own_spec is not None:
            module.__spec__ = self.own_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        ours = _target(fullname)
        if ours is None:
            return None
        if fullname != _TE and importlib.util.find_spec(ours) is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: transformer_engine_lite (the TE {TE_API_VERSION} "
                f"API on this machine, TE_LITE_AS_TRANSFORMER_ENGINE) has no {ours!r}",
                name=fullname,
            )
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(ours), is_package=fullname == _TE
        )


_FINDER: _AliasFinder | None = None


def real_te_location() -> str | None:
    """Where a real TransformerEngine is installed (or imported), else None."""
    mod = sys.modules.get(_TE)
    if mod is not None and not isinstance(mod, _TopLevel):
        return getattr(mod, "__file__", None) or repr(mod)
    spec = importlib.machinery.PathFinder.find_spec(_TE)
    if spec is not None:
        return spec.origin or str(list(spec.submodule_search_locations or []))
    return None


def is_installed() -> bool:
    return _FINDER is not None and _FINDER in sys.meta_path


def install() -> bool:
    """Maps TE's module names to ours; False (with a warning) when a real TE is installed."""
    global _FINDER
    if is_installed():
        return True
    real = real_te_location()
    if real is not None:
        warnings.warn(
            f"transformer_engine_lite.as_te: a real TransformerEngine is installed ({real}); "
            "`import transformer_engine` imports it, not transformer_engine_lite",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    _FINDER = _AliasFinder()
    sys.meta_path.insert(0, _FINDER)
    return True


def uninstall() -> None:
    """Removes the hook and forgets the aliased modules (our own modules stay imported)."""
    global _FINDER
    if _FINDER is not None and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    _FINDER = None
    for name in list(sys.modules):
        if _target(name) is not None:
            del sys.modules[name]


install()
