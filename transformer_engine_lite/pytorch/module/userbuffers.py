"""TE's Userbuffers (`initialize_ub` / `get_ub` / `destroy_ub`): named communicators that overlap
the tensor-parallel all-gather (AG) / reduce-scatter (RS) of sequence-parallel activations with
the GEMMs (qkv_fprop, proj_fprop, fc1_fprop, fc2_fprop and their _dgrad / _wgrad partners).

On a GPU the overlap splits each GEMM into chunks and streams the chunks through CUDA IPC buffers
while the next chunk computes. On the CPU there is nothing to overlap with: the collectives are
blocking gloo calls. What stays real is the *semantics*: a module or fused op that names a
communicator all-gathers its input before the GEMM / reduce-scatters its output after it (and the
transposed collectives in the backward), which is exactly what our sequence-parallel path already
does. So a communicator here is the validated configuration (the one TE builds, with TE's
defaults and TE's checks on ub_cfgs) plus the TP domain it serves; the modules look it up by name
as TE does (KeyError for a name initialize_ub did not create) and compute through the ordinary
sequence-parallel collectives, giving the bytes of the same module without the ub flags.
"""

from __future__ import annotations

import copy
import warnings
from enum import Enum
from typing import Any

import torch

__all__ = [
    "UserBufferQuantizationMode",
    "UbCommunicator",
    "destroy_ub",
    "get_ub",
    "get_ub_is_fp8",
    "initialize_ub",
    "is_ub_initialized",
    "using_cublasmp_backend",
]


class UserBufferQuantizationMode(Enum):
    """TE's quantization mode of a Userbuffers buffer (one set of communicators per mode)."""

    NONE = "none"
    FP8 = "fp8"


# The GEMM names TE creates and their default overlap method / direction (TE's tables).
_ALL_GATHER = ["qkv_fprop", "qkv_dgrad", "proj_dgrad", "proj_wgrad", "fc1_fprop", "fc1_dgrad",
               "fc2_dgrad", "fc2_wgrad"]
_REDUCE_SCATTER = ["proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad"]
_DGRAD_RS = ["qkv_dgrad", "fc1_dgrad"]  # dgrads that may switch from bulk AG to an RS overlap
_METHODS = {
    "ring_exchange": ["qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad"],
    "pipeline": ["proj_fprop", "fc2_fprop"],
    "bulk": ["qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"],
    "external": ["proj_wgrad", "fc2_wgrad"],
}
_AG_RS_PAIRS = {"qkv_fprop": "proj_fprop", "fc1_fprop": "fc2_fprop"}
_EXTERNAL = {"proj_wgrad": "proj_dgrad", "fc2_wgrad": "fc2_dgrad"}
# The keys a ub_cfgs entry may set (TE passes them as keyword arguments, so another key is a
# TypeError there too). The SM / stream / CGA knobs size GPU kernels: kept, and unused here.
_CFG_KEYS = ("method", "is_reduce_scatter", "num_sm", "cga_size", "set_sm_margin", "num_splits",
             "aggregate", "atomic_gemm", "use_ce", "fp8_buf", "comm_priority", "gemm_priority",
             "pipeline_rs_overlap_first_gemm")


class UbCommunicator:
    """One named communicator: its overlap configuration, buffer shape / dtype and TP domain.
    TE's CommOverlap / CommOverlapP2P query methods answer from the configuration."""

    def __init__(self, name: str, mode: UserBufferQuantizationMode, cfg: dict[str, Any],
                 shape: tuple[int, int], dtype: torch.dtype, tp_size: int,
                 with_cublasmp: bool) -> None:
        self.name = name
        self.quantization_mode = mode
        self.config = cfg
        self.method = cfg["method"]
        self.is_reduce_scatter = bool(cfg["is_reduce_scatter"])
        self.buffer_shape = shape
        fp8_buf = mode == UserBufferQuantizationMode.FP8 and bool(cfg["fp8_buf"])
        self.buffer_dtype = torch.uint8 if fp8_buf else dtype
        self.tp_size = tp_size
        self._with_cublasmp = with_cublasmp

    def is_fp8_ubuf(self) -> bool:
        """Whether the buffer holds FP8 bytes (TE: FP8 mode with fp8_buf)."""
        return self.buffer_dtype == torch.uint8

    def is_atomic_gemm(self) -> bool:
        return bool(self.config["atomic_gemm"])

    def is_p2p_overlap(self) -> bool:
        return self.method == "ring_exchange"

    def with_cublasmp(self) -> bool:
        return self._with_cublasmp

    def __repr__(self) -> str:
        return (f"UbCommunicator({self.name!r}, {self.quantization_mode.name}, "
                f"method={self.method!r}, {'RS' if self.is_reduce_scatter else 'AG'}, "
                f"shape={self.buffer_shape}, dtype={self.buffer_dtype})")


_communicators: dict[tuple[str, UserBufferQuantizationMode], UbCommunicator] | None = None
_with_cublasmp = False


def is_ub_initialized() -> bool:
    """Whether initialize_ub has run (and destroy_ub not since)."""
    return _communicators is not None


def using_cublasmp_backend() -> bool:
    """Whether the communicators were initialized with_cublasmp=True."""
    return _communicators is not None and _with_cublasmp


def _check_shape(shape: Any) -> tuple[int, int]:
    ok = (isinstance(shape, (list, tuple, torch.Size)) and len(shape) == 2
          and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape))
    if not ok:
        raise ValueError(
            "initialize_ub: shape: expected [sequence_length * batch_size, hidden_size] (two "
            f"ints > 0), got {shape!r}"
        )
    return int(shape[0]), int(shape[1])


def _check_tp_size(tp_size: Any, shape: tuple[int, int]) -> int:
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise ValueError(f"initialize_ub: tp_size: expected an int >= 1, got {tp_size!r}")
    world = torch.distributed.get_world_size()
    if world % tp_size:
        raise ValueError(
            f"initialize_ub: tp_size: expected a divisor of the world size {world} (the TP "
            f"domains tile the world), got {tp_size}"
        )
    if shape[0] % tp_size:
        raise ValueError(
            f"initialize_ub: shape: the first dim (sequence * batch, {shape[0]}) must split "
            f"evenly over tp_size={tp_size}"
        )
    return tp_size


def _check_bootstrap(backend: Any) -> None:
    if backend is None:
        return
    if backend not in ("gloo", "mpi", "nccl"):
        raise ValueError(
            f"initialize_ub: bootstrap_backend: expected one of 'gloo', 'mpi', 'nccl', got "
            f"{backend!r}"
        )
    # TE bootstraps its IPC buffers (handle exchange) over this backend; the communicators here
    # hold no shared buffers, so nothing is exchanged and the backend need not be built in
    # (Megatron's default is 'nccl', absent from CPU builds of PyTorch).


def _quantization_modes(use_fp8: bool, modes: Any) -> list[UserBufferQuantizationMode]:
    if not modes:
        warnings.warn("Initializing Userbuffers with use_fp8 is deprecated. Please use "
                      "quantization_modes instead.", DeprecationWarning, stacklevel=3)
        return [UserBufferQuantizationMode.FP8 if use_fp8 else UserBufferQuantizationMode.NONE]
    if not isinstance(modes, list):
        raise TypeError(
            f"initialize_ub: quantization_modes: expected a list, got {type(modes).__name__}"
        )
    bad = [m for m in modes if not isinstance(m, UserBufferQuantizationMode)]
    if bad:
        raise TypeError(
            "initialize_ub: quantization_modes: expected UserBufferQuantizationMode entries, got "
            f"{bad!r}"
        )
    return modes


def _default_config(name: str, method: str, rs_names: list[str], ag_names: list[str],
                    tp_size: int) -> dict[str, Any]:
    ring = method == "ring_exchange"
    return {
        "method": method, "is_reduce_scatter": name in rs_names, "num_sm": 1 if ring else 16,
        "cga_size": 1 if ring else 2, "set_sm_margin": not ring,
        "num_splits": tp_size if ring else 4, "aggregate": False, "atomic_gemm": False,
        "use_ce": True, "fp8_buf": name in ag_names, "comm_priority": 0, "gemm_priority": 0,
        "pipeline_rs_overlap_first_gemm": False,
    }


def _check_config(name: str, mode: UserBufferQuantizationMode, cfg: dict[str, Any],
                  methods: dict[str, list[str]], atomic_ring: list[str],
                  with_cublasmp: bool) -> dict[str, Any]:
    """TE's add_ub checks on one communicator's configuration."""
    method = cfg["method"]
    if method not in _METHODS:
        raise ValueError(
            f"initialize_ub: ub_cfgs['{name}']['method']: expected one of {list(_METHODS)}, got "
            f"{method!r}"
        )
    if with_cublasmp and method in ("bulk", "external"):
        raise ValueError(f"At {name}, cuBLASMp does not support `{method}` overlap method. "
                         "Please select a different method or set with_cublasmp=False.")
    if cfg["atomic_gemm"]:
        if mode != UserBufferQuantizationMode.FP8:
            raise ValueError("Atomic GEMM overlap supported only for FP8 GEMM, "
                             f"got quantization_mode={mode}")
        if method in ("bulk", "external"):
            warnings.warn(f"At {name}, atomic GEMM is not supported for a bulk overlap. "
                          "Defaulting to `atomic_gemm=False`.")
            cfg["atomic_gemm"] = False
    if not cfg["is_reduce_scatter"] and method == "pipeline":
        raise ValueError(f"At {name}, `pipeline` overlap method is not supported for AllGather.")
    # An AG/RS pair (qkv_fprop / proj_fprop): atomic ring-exchange on one side shuffles the
    # chunks the other side must un-shuffle, so both or neither.
    atomic_ring_here = bool(cfg["atomic_gemm"]) and method == "ring_exchange"
    if atomic_ring_here and name in _AG_RS_PAIRS:
        atomic_ring += [name, _AG_RS_PAIRS[name]]
    rs_ag = {v: k for k, v in _AG_RS_PAIRS.items()}
    if name in rs_ag and (name in atomic_ring) != atomic_ring_here:
        raise ValueError(
            f"At {name}, atomic AG-GEMM overlap with `ring_exchange` must be used by both "
            f"{rs_ag[name]} and {name} (a TP block's pair) or by neither"
        )
    if name in _EXTERNAL and not with_cublasmp:  # TE drops the pairing under cuBLASMp
        if method != "external":
            raise ValueError(f"At {name}, `external` overlap method is specified, but the "
                             f"selected method is {method}")
        if _EXTERNAL[name] not in methods["ring_exchange"]:
            raise ValueError(f"At {name}, `external` overlap method is specified, but the "
                             f"external gemm {_EXTERNAL[name]} is not using `ring_exchange`")
    return cfg


def initialize_ub(
    shape: list,
    tp_size: int,
    use_fp8: bool = False,
    quantization_modes: list[UserBufferQuantizationMode] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    ub_cfgs: dict | list[dict] | None = None,
    bootstrap_backend: Any = None,
    with_cublasmp: bool = False,
) -> None:
    """Create TE's named communicators (see the module docstring) for each quantization mode.

    shape: [sequence * batch, hidden] of a TransformerLayer input; tp_size: the TP domain size
    (a divisor of the world size); ub_cfgs: {gemm_name: {option: value}} overriding TE's
    defaults (one dict per quantization mode when a list); torch.distributed must be initialized.
    """
    global _communicators, _with_cublasmp
    modes = _quantization_modes(use_fp8, quantization_modes)
    if isinstance(ub_cfgs, dict) or ub_cfgs is None:
        cfgs = [ub_cfgs] * len(modes)
    elif isinstance(ub_cfgs, (list, tuple)):
        if len(ub_cfgs) != len(modes):
            raise ValueError(
                f"Number of ub_cfgs settings ({len(ub_cfgs)}) must match number of "
                f"quantization configurations ({len(modes)})"
            )
        cfgs = list(ub_cfgs)
    else:
        raise TypeError(
            f"initialize_ub: ub_cfgs: expected a dict, a list of dicts or None, got "
            f"{type(ub_cfgs).__name__}"
        )
    if _communicators is not None:
        raise RuntimeError("UB communicators are already initialized.")
    if not torch.distributed.is_initialized():
        raise RuntimeError("torch.distributed must be initialized before using Userbuffers")
    shp = _check_shape(shape)
    tp = _check_tp_size(tp_size, shp)
    _check_bootstrap(bootstrap_backend)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(
            f"initialize_ub: dtype: expected torch.float32, float16 or bfloat16, got {dtype!r}"
        )
    comms: dict[tuple[str, UserBufferQuantizationMode], UbCommunicator] = {}
    for mode, user in zip(modes, cfgs):
        if user is not None and not isinstance(user, dict):
            raise TypeError(f"initialize_ub: ub_cfgs: expected dict entries, got {user!r}")
        user = user or {}
        for name, opts in user.items():
            if not isinstance(opts, dict):
                raise TypeError(f"initialize_ub: ub_cfgs['{name}']: expected a dict, got {opts!r}")
            unknown = sorted(set(opts) - set(_CFG_KEYS))
            if unknown:  # TE passes the options as keywords: an unknown one is a TypeError
                raise TypeError(
                    f"initialize_ub: ub_cfgs['{name}']: unknown option(s) {unknown}; expected "
                    f"some of {list(_CFG_KEYS)}"
                )
        methods = copy.deepcopy(_METHODS)
        ag_names, rs_names = list(_ALL_GATHER), list(_REDUCE_SCATTER)
        for name in _DGRAD_RS:  # a non-bulk dgrad turns into a dgrad + RS overlap (TE's rule)
            m = user.get(name, {}).get("method")
            if m is not None and m != "bulk":
                wgrad = name.replace("dgrad", "wgrad")
                if wgrad in user:
                    raise ValueError(
                        f"Cannot specify user UB config for '{wgrad}' when its corresponding "
                        f"dgrad '{name}' uses a non-bulk overlap method ('{m}')"
                    )
                if m not in methods:
                    raise ValueError(f"initialize_ub: ub_cfgs['{name}']['method']: expected one "
                                     f"of {list(_METHODS)}, got {m!r}")
                rs_names.remove(wgrad)
                ag_names.remove(name)
                rs_names.append(name)
                methods["bulk"].remove(name)
                methods[m].append(name)
        if with_cublasmp:  # no bulk / external overlaps there: the dgrads become RS overlaps
            warnings.warn("cuBLASMp does not support bulk or external overlaps. 'qkv_dgrad' and "
                          "'fc1_dgrad' GEMMs will be configured with 'ring_exchange' overlap "
                          "unless user configuration specifies otherwise.")
            methods["bulk"], methods["external"] = [], []
            for name in _DGRAD_RS:
                wgrad = name.replace("dgrad", "wgrad")
                if name not in rs_names:
                    rs_names.append(name)
                if wgrad in rs_names:
                    rs_names.remove(wgrad)
                if name not in methods["ring_exchange"] + methods["pipeline"]:
                    methods["ring_exchange"].append(name)
        atomic_ring: list[str] = []
        for method in ("ring_exchange", "pipeline", "bulk", "external"):
            for name in methods[method]:
                cfg = _default_config(name, method, rs_names, ag_names, tp)
                if name in user:
                    fp8_buf = name in ag_names or (
                        bool(user[name].get("fp8_buf", False)) and name in methods["pipeline"])
                    cfg.update(user[name])
                    cfg["fp8_buf"] = fp8_buf
                _check_config(name, mode, cfg, methods, atomic_ring, with_cublasmp)
                comms[(name, mode)] = UbCommunicator(name, mode, cfg, shp, dtype, tp,
                                                     with_cublasmp)
    _communicators, _with_cublasmp = comms, bool(with_cublasmp)


def get_ub(name: str, use_fp8: bool) -> UbCommunicator:
    """The communicator `name` of the FP8 (use_fp8) or high-precision set."""
    mode = UserBufferQuantizationMode.FP8 if use_fp8 else UserBufferQuantizationMode.NONE
    if _communicators is None:
        raise RuntimeError("UB manager is not initialized.")
    if (name, mode) not in _communicators:
        raise KeyError(f"UB for {name} with use_fp8={use_fp8} is not registered.")
    return _communicators[(name, mode)]


def get_ub_is_fp8(name: str, use_fp8: bool) -> bool:
    """Whether the communicator's buffer holds FP8 bytes."""
    return get_ub(name, use_fp8).is_fp8_ubuf()


def destroy_ub() -> None:
    """Drop every communicator (initialize_ub may run again)."""
    global _communicators, _with_cublasmp
    _communicators, _with_cublasmp = None, False



class ModuleUbConfig:
    """A module's Userbuffers flags after TE's masking (each overlap applies only to the parallel
    mode it belongs to, and only with sequence parallelism), and the communicators they name.

    `fprop` / `dgrad` / `wgrad`: communicator names the forward GEMM(s), the dgrad and the wgrad
    GEMMs use. `rs_out`: those whose reduce-scattered output TE returns in FP8 when the buffer is
    FP8 (the module's output / input gradient would become a Float8Tensor)."""

    def __init__(self, owner: str, flags: dict[str, bool], fprop: list[str], dgrad: list[str],
                 wgrad: list[str], rs_out: list[str]) -> None:
        self.owner, self.flags = owner, flags
        self.fprop, self.dgrad, self.wgrad, self.rs_out = fprop, dgrad, wgrad, rs_out

    @property
    def enabled(self) -> bool:
        return any(self.flags.values())

    def check_forward(self, fp8: bool, backward: bool) -> None:
        """Look the communicators up as TE does at each forward (KeyError for a name that
        initialize_ub did not create, or not in this FP8 mode); refuse an FP8 reduce-scatter
        output, which TE hands back quantized and our modules do not produce."""
        if not self.enabled:
            return
        names = self.fprop + (self.dgrad + self.wgrad if backward else [])
        for name in names:
            comm = get_ub(name, fp8)
            if fp8 and name in self.rs_out and comm.is_fp8_ubuf():
                raise NotImplementedError(
                    f"{self.owner}: Userbuffers communicator '{name}' has an FP8 buffer "
                    "(ub_cfgs fp8_buf=True): its reduce-scatter would return an FP8 tensor, which "
                    "is not implemented; set fp8_buf=False"
                )


    def check_module_forward(self, module: torch.nn.Module, inp: torch.Tensor) -> None:
        """check_forward for a module's step: this step's FP8 mode; the backward's communicators
        only when a gradient will flow."""
        if not self.enabled:
            return
        from ..fp8 import FP8GlobalStateManager  # pylint: disable=import-outside-toplevel

        backward = torch.is_grad_enabled() and (
            inp.requires_grad or any(p.requires_grad for p in module.parameters())
        )
        self.check_forward(FP8GlobalStateManager.is_fp8_enabled(), backward)

    def apply_to(self, module: torch.nn.Module, ub_name: str | None, mlp: bool = False) -> None:
        """TE's module attributes for the resolved flags (Megatron reads some of them)."""
        f = self.flags
        module.ub_name = ub_name
        module._ub = self
        if mlp:
            module.ub_overlap_ag = f["ag_fprop"]
            module.ub_overlap_rs = f["rs_fprop"]
        else:
            module.ub_overlap_ag_fprop, module.ub_overlap_rs_fprop = f["ag_fprop"], f["rs_fprop"]
            module.ub_overlap_ag_dgrad = f["ag_dgrad"]
        module.ub_overlap_rs_dgrad = f["rs_dgrad"]
        module.ub_bulk_dgrad, module.ub_bulk_wgrad = f["bulk_dgrad"], f["bulk_wgrad"]


def _flag(owner: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {name}: expected a bool, got {value!r}")
    return value


def module_ub_config(owner: str, *, parallel_mode: str | None, sequence_parallel: bool,
                     tp_size: int, ub_name: str | None, mlp: bool = False,
                     delay_wgrad_compute: bool = False, **flags: bool) -> ModuleUbConfig:
    """TE's per-module Userbuffers setup for Linear / LayerNormLinear (mlp=False: one GEMM named
    ub_name) and LayerNormMLP (mlp=True: fc1 column-parallel, fc2 row-parallel, fixed names).
    flags: ub_overlap_ag, ub_overlap_rs, ub_overlap_rs_dgrad, ub_bulk_dgrad, ub_bulk_wgrad."""
    f = {k: _flag(owner, k, v) for k, v in flags.items()}
    ag, rs = f.get("ub_overlap_ag", False), f.get("ub_overlap_rs", False)
    rs_dgrad, bulk_d = f.get("ub_overlap_rs_dgrad", False), f.get("ub_bulk_dgrad", False)
    bulk_w = f.get("ub_bulk_wgrad", False)
    if ub_name is not None and not isinstance(ub_name, str):
        raise TypeError(f"{owner}: ub_name: expected a str or None, got {ub_name!r}")
    sp = bool(sequence_parallel)
    col = sp and (mlp or parallel_mode == "column")
    row = sp and (mlp or parallel_mode == "row")
    eff = {
        "ag_fprop": col and ag, "rs_dgrad": col and rs_dgrad,
        "bulk_dgrad": col and bulk_d and not rs_dgrad, "bulk_wgrad": col and bulk_w and not rs_dgrad,
        "rs_fprop": row and rs, "ag_dgrad": row and ag,
    }
    if any(eff.values()):
        if not is_ub_initialized():
            raise RuntimeError(f"{owner}: initialize_ub() must be called before layer "
                               "construction (a ub_* overlap flag is set)")
        if not mlp and ub_name is None:
            raise ValueError(f"{owner}: ub_name: a ub_* overlap flag is set, so the name of its "
                             "Userbuffers communicators (e.g. 'qkv', 'proj') is needed; got None")
        ub_tp = next(iter(_communicators.values())).tp_size if _communicators else tp_size
        if tp_size != ub_tp:
            raise ValueError(f"{owner}: tp_size: the Userbuffers communicators serve TP domains "
                             f"of {ub_tp} ranks (initialize_ub's tp_size), got {tp_size}")
        if delay_wgrad_compute and eff["bulk_wgrad"]:
            raise NotImplementedError(
                f"{owner}: delay_wgrad_compute with ub_bulk_wgrad: delayed weight grad "
                "computation is not supported with Userbuffers (as in TE)")
    if using_cublasmp_backend() and eff["bulk_dgrad"]:
        warnings.warn(f"{owner}: the cuBLASMp backend has no bulk overlaps; falling back on the "
                      "dgrad + reduce-scatter overlap with no bulk wgrad overlap")
        eff["rs_dgrad"], eff["bulk_dgrad"], eff["bulk_wgrad"] = True, False, False
    n1, n2 = ("fc1", "fc2") if mlp else (ub_name, ub_name)
    fprop = ([f"{n1}_fprop"] if eff["ag_fprop"] else []) + (
        [f"{n2}_fprop"] if eff["rs_fprop"] else [])
    dgrad = ([f"{n2}_dgrad"] if eff["ag_dgrad"] else []) + (
        [f"{n1}_dgrad"] if eff["rs_dgrad"] or eff["bulk_dgrad"] else [])
    wgrad = [f"{n1}_wgrad"] if eff["bulk_wgrad"] else []
    rs_out = ([f"{n2}_fprop"] if eff["rs_fprop"] else []) + (
        [f"{n1}_dgrad"] if eff["rs_dgrad"] else [])
    return ModuleUbConfig(owner, eff, fprop, dgrad, list(dict.fromkeys(wgrad)), rs_out)
