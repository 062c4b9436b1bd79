"""Sequential: torch.nn.Sequential's container for fusible ops (TE's ops.Sequential)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from .fuser import OperationFuser
from .op import FusibleOperation

__all__ = ["Sequential"]


class Sequential(torch.nn.Module):
    """Run modules in order; runs of consecutive FusibleOperations go through one OperationFuser
    (which fuses what it can). forward(input, *extra_inputs): the extra inputs go to the ops that
    take them (AddExtraInput), in order; returns output, or (output, *extra_outputs) when ops make
    extra outputs (MakeExtraOutput). Other torch modules take and return one tensor."""

    def __init__(self, *args: FusibleOperation | torch.nn.Module) -> None:
        super().__init__()
        self._module_groups: list[OperationFuser | torch.nn.Module] | None = None
        if len(args) == 1 and isinstance(args[0], dict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for module in args:
                self.append(module)

    def add_module(self, name: str, module: torch.nn.Module | None) -> None:
        self._module_groups = None
        super().add_module(name, module)

    def _keys(self, idx: int | slice) -> list[str]:
        keys = list(self._modules.keys())
        if isinstance(idx, slice):
            return keys[idx]
        if not isinstance(idx, int):
            raise TypeError(
                f"Sequential: index: expected an int or a slice, got {type(idx).__name__}"
            )
        return [keys[idx]]  # IndexError as a list's

    def _next_key(self) -> str:
        n = len(self._modules)
        while str(n) in self._modules:
            n += 1
        return str(n)

    def __getitem__(self, idx: int | slice) -> torch.nn.Module | Sequential:
        keys = self._keys(idx)
        if isinstance(idx, slice):
            return Sequential({k: self._modules[k] for k in keys})
        return self._modules[keys[0]]

    def __setitem__(self, idx: int, module: torch.nn.Module) -> None:
        self._module_groups = None
        self._modules[self._keys(idx)[0]] = module

    def __delitem__(self, idx: int | slice) -> None:
        self._module_groups = None
        for key in self._keys(idx):
            del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[torch.nn.Module]:
        return iter(self._modules.values())

    def append(self, module: torch.nn.Module) -> Sequential:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(
                f"Sequential: module: expected a torch.nn.Module, got {type(module).__name__}"
            )
        self.add_module(self._next_key(), module)
        return self

    def extend(self, modules: Iterable[torch.nn.Module]) -> Sequential:
        for module in modules:
            self.append(module)
        return self

    def insert(self, idx: int, module: torch.nn.Module) -> Sequential:
        modules = list(self._modules.values())
        modules.insert(idx, module)
        self._modules.clear()
        self._module_groups = None
        for i, m in enumerate(modules):
            self.add_module(str(i), m)
        return self

    def pop(self, idx: int | slice) -> torch.nn.Module:
        out = self[idx]
        del self[idx]
        return out

    def __iadd__(self, modules: Iterable[torch.nn.Module]) -> Sequential:
        return self.extend(modules)

    def __add__(self, modules: Iterable[torch.nn.Module]) -> Sequential:
        out = Sequential()
        out.extend(self)
        out.extend(modules)
        return out

    @staticmethod
    def _make_module_groups(
        modules: Iterable[torch.nn.Module],
    ) -> list[OperationFuser | torch.nn.Module]:
        groups: list[list[FusibleOperation] | torch.nn.Module] = []
        for module in modules:
            if isinstance(module, FusibleOperation):
                if not groups or not isinstance(groups[-1], list):
                    groups.append([])
                groups[-1].append(module)  # type: ignore[union-attr]
            else:
                groups.append(module)
        return [OperationFuser(g) if isinstance(g, list) else g for g in groups]

    def forward(
        self, input: torch.Tensor, *extra_inputs: torch.Tensor  # noqa: A002 (TE's name)
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self._module_groups is None:
            self._module_groups = self._make_module_groups(self._modules.values())
        x, outs = input, []
        for group in self._module_groups:
            if isinstance(group, OperationFuser):
                n = group.num_extra_inputs
                if len(extra_inputs) < n:
                    raise ValueError(
                        f"Sequential: extra_inputs: the ops take {n} more extra input(s) than the "
                        f"{len(extra_inputs)} left"
                    )
                y = group(x, *extra_inputs[:n])
                extra_inputs = extra_inputs[n:]
                if isinstance(y, tuple):
                    x, outs = y[0], [*outs, *y[1:]]
                else:
                    x = y
            else:
                x = group(x)
        if extra_inputs:
            raise ValueError(f"Sequential: extra_inputs: {len(extra_inputs)} left unused")
        return (x, *outs) if outs else x
