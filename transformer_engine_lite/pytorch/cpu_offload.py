"""TE's activation offloading (`transformer_engine.pytorch.cpu_offload`, the v2 API of TE's main
branch): the tensors autograd saves during a layer's forward are copied to host memory and copied
back before that layer's backward.

get_cpu_offload_context(enabled, num_layers, model_layers, ..., manual_synchronization,
retain_pinned_cpu_buffers, offload_stream) returns (context, synchronization_function) - plus the
synchronizer with manual_synchronization - as TE: run each layer's forward inside the context and
pass its output through the synchronization function. The layer bookkeeping is TE's:
OffloadableLayerState (one layer's saved tensors, states not_offloaded -> offload_started ->
offload_finished -> reload_started, with TE's errors for a call in the wrong state),
DefaultOffloadSynchronizer (offloads layers 0..num_layers-1 of model_layers, each finishing its
copy-out when a later layer starts and copied back when the backward reaches the layer before it)
and ManualOffloadSynchronizer (start_offload_layer / release_activation_forward_gpu_memory /
start_reload_layer called by the user).

What is copied: as in TE, tensors of at least 256Ki elements that are neither parameters nor
marked with mark_not_offload and that live on the compute device. Views whose base has the same
number of elements (or marked with start_offload(offload_base_tensor=True)) are offloaded as their
base and rebuilt with as_strided; the same tensor saved twice is copied once; a QuantizedTensor is
offloaded as its buffers. Host buffers are pinned when CUDA is available, and reused across
iterations with retain_pinned_cpu_buffers.

The compute device is CUDA when it is available (TE: only CUDA tensors are offloaded) and the CPU
otherwise. On the CPU backend the saved activations therefore really go through the transport: a
copy into a separate host buffer at start_offload, the layer's reference dropped at
release_activation_forward_gpu_memory, a fresh tensor copied back at start_reload. Both sides are
the same RAM, so nothing is saved (the copies cost time, and a reloaded layer briefly holds two
copies); what a CPU run gets is TE's semantics: backward receives the snapshot taken at offload
time, and the bookkeeping and its errors (non-contiguous tensors, retained buffers whose shapes
changed, calls in the wrong state) are the ones a GPU run meets.

Streams: on CUDA the copies run on `offload_stream` (TE's own stream when none is given) ordered
against the current stream with wait_stream. CPU work runs in program order on the calling thread,
so there is nothing to order: a CPU stream (torch.cpu.Stream, or torch.Stream(device="cpu")) is
accepted as offload_stream and every stream operation on it is a no-op; the copies are synchronous.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import defaultdict
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks

from .quantized_tensor import QuantizedTensor

__all__ = [
    "DefaultOffloadSynchronizer",
    "ManualOffloadSynchronizer",
    "OffloadSynchronizer",
    "OffloadableLayerState",
    "get_cpu_offload_context",
    "is_cpu_offload_enabled",
    "mark_activation_offload",
    "mark_not_offload",
    "start_offload",
]

# TE's threshold: smaller tensors cost more in bookkeeping than they free
_MIN_OFFLOAD_NUMEL = 256 * 1024

OFFLOAD_SYNCHRONIZER: OffloadSynchronizer | None = None


def is_cpu_offload_enabled() -> bool:
    """True inside an offloading context."""
    return OFFLOAD_SYNCHRONIZER is not None


def _buffers(tensors: tuple[Any, ...]) -> list[torch.Tensor]:
    """The plain tensors behind `tensors` (a QuantizedTensor's buffers, as TE's
    prepare_for_saving gives them)."""
    out = []
    for t in tensors:
        if isinstance(t, QuantizedTensor):
            out.extend(b for n in t._inner_names() if (b := getattr(t, n, None)) is not None)
        elif isinstance(t, torch.Tensor):
            out.append(t)
    return out


def mark_activation_offload(*tensors: Any) -> None:
    """TE's v1 marker; the v2 path (this one) offloads by layer and ignores it, as TE."""
    del tensors


def mark_not_offload(*tensors: Any) -> None:
    """Keep these tensors (a QuantizedTensor: its buffers) where they are."""
    for t in _buffers(tensors):
        t._TE_do_not_offload = True


def start_offload(*tensors: Any, offload_base_tensor: bool = False) -> None:
    """TE marks the point where these tensors are ready to be copied out (a CUDA event its offload
    stream waits for). Our copies are ordered on the current stream (or wait for it), so that
    point needs no event. offload_base_tensor: a view among these is offloaded as its base tensor
    and rebuilt from it (views of one buffer, e.g. interleaved q, k, v, are copied once)."""
    if offload_base_tensor:
        for t in _buffers(tensors):
            if t._base is not None:
                t.offload_base_tensor = True


def _on_compute_device(t: torch.Tensor) -> bool:
    """Whether `t` lives where the layers compute: CUDA when it is available (TE offloads CUDA
    tensors only), the CPU otherwise (module docstring: the CPU backend's transport)."""
    if t.device.type == "meta":
        return False
    if torch.cuda.is_available():
        return t.device.type != "cpu"
    return t.device.type == "cpu"


def _is_cuda_stream(stream: Any) -> bool:
    return torch.cuda.is_available() and isinstance(stream, torch.cuda.Stream)


def _is_cpu_stream(stream: Any) -> bool:
    if isinstance(stream, torch.cpu.Stream):
        return True
    # torch.Stream.device_type is the enum's int; .device names the type
    return isinstance(stream, torch.Stream) and stream.device.type == "cpu"


def _copy_stream(stream: Any) -> Any:
    """The stream the copies are issued on: a CUDA stream, or None (the current stream; for a CPU
    stream, whose operations are no-ops: CPU copies are synchronous and in program order)."""
    return stream if _is_cuda_stream(stream) else None


def _stream_ctx(stream: Any) -> Any:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


class OffloadableLayerState:
    """One layer's saved tensors: pushed during forward, copied out (start_offload), their device
    copies dropped (release_activation_forward_gpu_memory), copied back (start_reload), popped
    during backward, and forgotten (release_all_memory)."""

    _STATES = ("not_offloaded", "offload_started", "offload_finished", "reload_started")

    def __init__(self, offload_stream: Any = None, retain_pinned_cpu_buffers: bool = False):
        self.offload_stream = offload_stream
        self._stream = _copy_stream(offload_stream)  # None: synchronous copies
        self.retain_pinned_cpu_buffers = bool(retain_pinned_cpu_buffers)
        self.fwd_tensors: list[torch.Tensor] = []  # pushed (device) tensors
        self.cpu_tensors: list[torch.Tensor] = []  # their host copies (kept with retain_...)
        self.bwd_tensors: list[torch.Tensor] = []  # copied back, in push order
        self.layout: dict[str, list] = {}  # how pushed tensors map to copied ones
        self.devices: list[torch.device] = []
        self.state = "not_offloaded"

    def _validate_state(self, func_name: str, allowed_states: list[str]) -> None:
        if self.state not in allowed_states:
            raise RuntimeError(
                f"Invalid state: {self.state} for {func_name}, must be one of {allowed_states}"
            )

    def _check_if_offload(self, t: torch.Tensor) -> bool:
        if t.numel() < _MIN_OFFLOAD_NUMEL:
            return False
        if (
            isinstance(t, torch.nn.Parameter)
            or getattr(t, "_TE_do_not_offload", False)
            or isinstance(t, torch._subclasses.FakeTensor)
            or not _on_compute_device(t)
        ):
            return False
        if not t.is_contiguous() and not getattr(t, "offload_base_tensor", False):
            warnings.warn(
                "Tried to offload non-contiguous tensor, which is not supported. Offload of this "
                "tensor will be skipped."
            )
            return False
        return True

    def push_tensor(self, tensor: torch.Tensor) -> Any:
        """A tensor saved for backward: an index into this layer's offloaded tensors, the tensor
        itself when it is not offloaded, or for a QuantizedTensor (push results of its buffers,
        [the tensor to rebuild])."""
        self._validate_state("push_tensor", ["not_offloaded"])
        if not self._check_if_offload(tensor):
            return tensor
        if isinstance(tensor, QuantizedTensor):
            names = tensor._inner_names()
            bufs = [getattr(tensor, n, None) for n in names]
            # rebuilt at pop from the type, shape and quantizer: a template on the meta device
            # (holding no memory, unlike the tensor itself)
            template = tensor._with_inner(
                {n: (b.to("meta") if b is not None else None) for n, b in zip(names, bufs)}
            )
            pushed = [self.push_tensor(b) if b is not None else None for b in bufs]
            return (pushed, [template])
        self.fwd_tensors.append(tensor)
        return len(self.fwd_tensors) - 1

    def pop_tensor(self, tensor_or_tensor_id: Any) -> torch.Tensor:
        """The tensor a push_tensor result stands for (copied back when it was offloaded)."""
        self._validate_state("pop_tensor", ["not_offloaded", "reload_started"])
        if isinstance(tensor_or_tensor_id, torch.Tensor):
            return tensor_or_tensor_id
        if isinstance(tensor_or_tensor_id, tuple):
            pushed, (template,) = tensor_or_tensor_id
            inner = {
                n: (self.pop_tensor(p) if p is not None else None)
                for n, p in zip(template._inner_names(), pushed)
            }
            return template._with_inner(inner)
        if self.state == "not_offloaded":
            return self.fwd_tensors[tensor_or_tensor_id]
        if self._stream is not None:
            torch.cuda.current_stream().wait_stream(self._stream)
        return self.bwd_tensors[tensor_or_tensor_id]

    def _bases_and_duplicates(self) -> list[torch.Tensor]:
        """The tensors to copy: a view whose base has as many elements (or marked with
        offload_base_tensor) is replaced by its base, and each tensor appears once."""
        views, index, unique = [], [], []
        seen: dict[int, int] = {}
        for t in self.fwd_tensors:
            if getattr(t, "offload_base_tensor", False) or (
                t._base is not None and t._base.numel() == t.numel()
            ):
                if t._base is None:
                    raise RuntimeError("Cannot offload base tensor, if the tensor is not a view.")
                views.append((t.shape, t.stride(), t.storage_offset()))
                t = t._base
            else:
                views.append(None)
            if id(t) not in seen:
                seen[id(t)] = len(unique)
                unique.append(t)
            index.append(seen[id(t)])
        self.layout = {"views": views, "index": index}
        return unique

    def start_offload(self) -> None:
        """Copy this layer's pushed tensors to host memory."""
        self._validate_state("start_offload", ["not_offloaded"])
        self.state = "offload_started"
        unique = self._bases_and_duplicates()
        reuse = self.retain_pinned_cpu_buffers and len(self.cpu_tensors) > 0
        if reuse and len(self.cpu_tensors) != len(unique):
            raise ValueError(
                f"retain_pinned_cpu_buffers: this layer saved {len(unique)} tensors to offload, "
                f"the retained CPU buffers are {len(self.cpu_tensors)}: make sure that the saved "
                "tensors do not change between iterations"
            )
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream())
        self.devices = []
        for i, t in enumerate(unique):
            if not t.is_contiguous():
                raise ValueError(
                    f"Tensor at index {i} must be contiguous for CPU offloading, but got "
                    f"non-contiguous tensor with shape={t.shape}, stride={t.stride()}, "
                    f"dtype={t.dtype}"
                )
            if reuse:
                host = self.cpu_tensors[i]
                if host.shape != t.shape or host.dtype != t.dtype:
                    raise ValueError(
                        "CPU buffer shape does not match the offloaded tensor shape: "
                        f"{host.shape} != {t.shape}  Make sure that tensor shapes do not change "
                        "between iterations if retain_pinned_cpu_buffers is True."
                    )
            else:
                host = torch.empty(t.shape, dtype=t.dtype, device="cpu",
                                   pin_memory=torch.cuda.is_available())
                self.cpu_tensors.append(host)
            with _stream_ctx(self._stream):
                host.copy_(t, non_blocking=self._stream is not None)
            self.devices.append(t.device)

    def release_activation_forward_gpu_memory(self) -> None:
        """Drop the references to the device tensors once their copies are done."""
        self._validate_state("release_activation_forward_gpu_memory", ["offload_started"])
        self.state = "offload_finished"
        if self._stream is not None:
            # the copies read the device memory: it may be reused only after them
            torch.cuda.current_stream().wait_stream(self._stream)
        self.fwd_tensors = []

    def start_reload(self) -> None:
        """Copy the host copies back to their devices (views and duplicates rebuilt)."""
        self._validate_state("start_reload", ["offload_finished"])
        self.state = "reload_started"
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream())
        back = []
        for host, device in zip(self.cpu_tensors, self.devices):
            # allocated on the current stream (as TE: the caching allocator keeps memory per stream)
            t = torch.empty_like(host, device=device)
            with _stream_ctx(self._stream):
                t.copy_(host, non_blocking=self._stream is not None)
            back.append(t)
        self.bwd_tensors = []
        for view, i in zip(self.layout["views"], self.layout["index"]):
            t = back[i]
            self.bwd_tensors.append(t if view is None else t.as_strided(*view))

    def release_all_memory(self) -> None:
        """After the layer's backward: forget everything (but retained host buffers)."""
        self.fwd_tensors, self.bwd_tensors = [], []
        if not self.retain_pinned_cpu_buffers:
            self.cpu_tensors = []
        self.state = "not_offloaded"

    def get_offloaded_total_size_mb(self) -> float:
        return sum(t.numel() * t.element_size() for t in self.cpu_tensors) / (1024**2)


class OffloadSynchronizer:
    """Layer bookkeeping shared by the synchronizers: the forward count (fwd_step before each
    layer's forward; a new forward pass starts after model_layers of them) and the layer whose
    backward runs (bwd_step). It offloads nothing by itself."""

    def __init__(
        self, num_layers: int, retain_pinned_cpu_buffers: bool = False, offload_stream: Any = None
    ):
        if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
            raise ValueError(f"{type(self).__name__}: num_layers: expected an int >= 1, got "
                             f"{num_layers!r}")
        if offload_stream is None and torch.cuda.is_available():
            offload_stream = torch.cuda.Stream()  # TE's own stream (accelerator tensors: CUDA)
        self.num_layers = num_layers
        self.offload_stream = offload_stream
        self.layer_states = {
            i: OffloadableLayerState(offload_stream, retain_pinned_cpu_buffers)
            for i in range(num_layers)
        }
        self.num_of_fwds: int | None = None
        self.previous_bwd_layer_id: int | None = None
        self.current_layer_id: int | None = None

    def fwd_step(self) -> int:
        if self.num_of_fwds is None or self.num_of_fwds == self.num_layers - 1:
            for state in self.layer_states.values():
                state.release_all_memory()
            self.num_of_fwds = 0
        else:
            self.num_of_fwds += 1
        self.current_layer_id = self.num_of_fwds
        return self.current_layer_id

    def bwd_step(self, layer_num: int) -> None:
        if self.previous_bwd_layer_id is not None:
            self.layer_states[self.previous_bwd_layer_id].release_all_memory()
        self.previous_bwd_layer_id = layer_num
        self.current_layer_id = layer_num

    def push_tensor(self, tensor: torch.Tensor) -> Any:
        return self.layer_states[self.num_of_fwds].push_tensor(tensor)

    def pop_tensor(self, tensor_or_tensor_id: Any) -> torch.Tensor:
        return self.layer_states[self.current_layer_id].pop_tensor(tensor_or_tensor_id)

    def finish_part_of_bwd(self) -> None:
        """After a backward pass (several with pipeline parallelism): the last layer's memory."""
        if self.previous_bwd_layer_id is not None:
            self.layer_states[self.previous_bwd_layer_id].release_all_memory()
        self.previous_bwd_layer_id = None

    def get_offloaded_total_size_mb(self) -> float:
        return sum(s.get_offloaded_total_size_mb() for s in self.layer_states.values())


class DefaultOffloadSynchronizer(OffloadSynchronizer):
    """Offloads layers 0..num_offloaded_layers-1: layer i's copy-out starts when layer i+1's
    forward starts and is finished (device memory dropped) when layer
    num_layers - num_offloaded_layers + i starts; its copy-back starts at the backward of layer
    num_layers - 1 - num_offloaded_layers + i. Saved activations then peak at
    (num_layers - num_offloaded_layers) layers' worth (TE's schedule)."""

    def __init__(
        self,
        num_layers: int,
        num_offloaded_layers: int | None = None,
        retain_pinned_cpu_buffers: bool = False,
        offload_stream: Any = None,
    ):
        super().__init__(num_layers, retain_pinned_cpu_buffers, offload_stream)
        k = num_layers - 1 if num_offloaded_layers is None else num_offloaded_layers
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < num_layers:
            raise ValueError(
                "DefaultOffloadSynchronizer: num_offloaded_layers: expected an int in "
                f"[0, {num_layers - 1}] (the last layer is not offloaded), got {k!r}"
            )
        self.offload_layer_map = {i: i < k for i in range(num_layers)}
        self.finish_offload_map: defaultdict[int, list[int]] = defaultdict(list)
        self.start_reload_map: defaultdict[int, list[int]] = defaultdict(list)
        for i in range(k):
            self.finish_offload_map[num_layers - k + i].append(i)
            self.start_reload_map[num_layers - 1 - k + i].append(i)

    def fwd_step(self) -> int:
        layer = super().fwd_step()
        if self.offload_layer_map.get(layer - 1, False):
            self.layer_states[layer - 1].start_offload()
        for i in self.finish_offload_map[layer]:
            self.layer_states[i].release_activation_forward_gpu_memory()
        return layer

    def bwd_step(self, layer_num: int) -> None:
        super().bwd_step(layer_num)
        for i in self.start_reload_map[layer_num]:
            self.layer_states[i].start_reload()

    def push_tensor(self, tensor: torch.Tensor) -> Any:
        if not self.offload_layer_map.get(self.num_of_fwds, False):
            return tensor  # a layer that stays on the device: no bookkeeping
        return self.layer_states[self.num_of_fwds].push_tensor(tensor)


class ManualOffloadSynchronizer(OffloadSynchronizer):
    """The user schedules each layer: start_offload_layer, release_activation_forward_gpu_memory,
    start_reload_layer (a layer none of them is called for is not offloaded)."""

    def start_offload_layer(self, layer_id: int) -> None:
        self.layer_states[layer_id].start_offload()

    def release_activation_forward_gpu_memory(self, layer_id: int) -> None:
        self.layer_states[layer_id].release_activation_forward_gpu_memory()

    def start_reload_layer(self, layer_id: int) -> None:
        self.layer_states[layer_id].start_reload()


class _CpuOffloadContext(contextlib.ContextDecorator):
    """The context of get_cpu_offload_context: saved tensors go through the synchronizer; one
    entry per layer forward, each followed by synchronization_function on the layer's output."""

    def __init__(self, synchronizer: OffloadSynchronizer):
        self.offload_synchronizer = synchronizer
        self.current_layer: int | None = None
        self.inside_context = False
        self.previous_offload_synchronizer: OffloadSynchronizer | None = None

    def __enter__(self) -> _CpuOffloadContext:
        global OFFLOAD_SYNCHRONIZER
        if self.inside_context:
            raise RuntimeError(
                "Offloading context was entered without synchronization function being called."
            )
        self.inside_context = True
        sync = self.offload_synchronizer
        self._hooks = saved_tensors_hooks(sync.push_tensor, sync.pop_tensor)
        self._hooks.__enter__()
        self.previous_offload_synchronizer, OFFLOAD_SYNCHRONIZER = OFFLOAD_SYNCHRONIZER, sync
        self.current_layer = sync.fwd_step()
        return self

    def __exit__(self, *args: Any) -> None:
        global OFFLOAD_SYNCHRONIZER
        self._hooks.__exit__(*args)
        OFFLOAD_SYNCHRONIZER = self.previous_offload_synchronizer
        self.inside_context = False

    def synchronization_function(self, tensor: torch.Tensor) -> torch.Tensor:
        """Marks where this layer's backward starts (a pre-hook on the output's grad_fn)."""
        if not isinstance(tensor, torch.Tensor) or not tensor.requires_grad:
            got = f"requires_grad=False for tensor with shape={tensor.shape}, dtype={tensor.dtype}" \
                if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(
                "Tensor passed to synchronization_function must require grad to register backward "
                f"hooks, but got {got}"
            )
        if self.current_layer is None:
            raise RuntimeError(
                "synchronization_function called but no layer has been set via __enter__. "
                f"inside_context={self.inside_context}, offload_synchronizer "
                f"num_layers={self.offload_synchronizer.num_layers}"
            )
        if self.inside_context:
            raise RuntimeError(
                "Synchronization function was called without offloading context being entered."
            )
        if tensor.grad_fn is None:
            raise ValueError(
                "synchronization_function: tensor: expected the output of the layer run in the "
                "offloading context (a tensor with a grad_fn), got a leaf tensor"
            )
        sync, layer = self.offload_synchronizer, self.current_layer

        def before_layer_backward(_: Any) -> None:
            # the end of this backward pass frees the last layer's memory
            torch.autograd.Variable._execution_engine.queue_callback(sync.finish_part_of_bwd)
            sync.bwd_step(layer)

        tensor.grad_fn.register_prehook(before_layer_backward)
        return tensor


def _check_offload_stream(stream: Any) -> None:
    """A stream of the compute device: torch.cuda.Stream when CUDA is available, a CPU stream
    (no-op, module docstring) otherwise."""
    if stream is None:
        return
    if torch.cuda.is_available():
        if not _is_cuda_stream(stream):
            raise ValueError(
                "get_cpu_offload_context: offload_stream: expected a torch.cuda.Stream (the "
                f"offload copies run on the CUDA device) or None, got {_describe(stream)}"
            )
    elif not _is_cpu_stream(stream):
        raise ValueError(
            "get_cpu_offload_context: offload_stream: expected a CPU stream (torch.cpu.Stream or "
            "torch.Stream(device='cpu'); CUDA is not available, the CPU is the compute device) "
            f"or None, got {_describe(stream)}"
        )


def _describe(stream: Any) -> str:
    device = stream.device.type if isinstance(stream, torch.Stream) else None
    return type(stream).__name__ + (f" on {device}" if device is not None else "")


def get_cpu_offload_context(
    enabled: bool = False,
    num_layers: int | None = 1,
    model_layers: int = 1,
    offload_activations: bool = True,
    offload_weights: bool = False,
    double_buffering: bool = False,
    manual_synchronization: bool = False,
    retain_pinned_cpu_buffers: bool = False,
    offload_stream: Any = None,
) -> tuple[Any, ...]:
    """(context, synchronization_function), and the ManualOffloadSynchronizer third with
    manual_synchronization=True (module docstring). num_layers: how many of the model_layers are
    offloaded (at most model_layers - 1 without manual synchronization); offload_activations /
    offload_weights / double_buffering: deprecated in TE (offload_weights alone turns offloading
    off with a DeprecationWarning; double_buffering has no effect there either)."""
    del double_buffering  # deprecated in TE and unused there

    def off() -> tuple[Any, ...]:
        noop = (contextlib.nullcontext(), lambda x: x)
        return (*noop, None) if manual_synchronization else noop

    if not enabled:
        return off()
    if not offload_weights and not offload_activations:
        raise ValueError(
            "CPU Offloading is enabled while it is not mentioned what to offload "
            "(weights/activations)"
        )
    if offload_weights:
        warnings.warn(
            "Offloading weights is deprecated. Using offload_weights=True does not have any "
            "effect.",
            DeprecationWarning,
            stacklevel=2,
        )
        if not offload_activations:
            return off()
    if not isinstance(model_layers, int) or isinstance(model_layers, bool) or model_layers < 1:
        raise ValueError(f"get_cpu_offload_context: model_layers: expected an int >= 1, got "
                         f"{model_layers!r}")
    if not manual_synchronization:
        if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 0:
            raise ValueError(f"get_cpu_offload_context: num_layers: expected an int >= 0, got "
                             f"{num_layers!r}")
        if num_layers > model_layers - 1:
            raise ValueError(
                "Cannot offload all layers without manual synchronization - last layer is not "
                f"offloaded. Got num_layers={num_layers}, model_layers={model_layers}."
            )
        if num_layers == model_layers - 1:
            warnings.warn(
                "Offloading num_layers == model_layers - 1 is not recommended, it prevents "
                "overlapping of computation and offload/reload.",
                stacklevel=2,
            )
    _check_offload_stream(offload_stream)
    if offload_stream is not None and not manual_synchronization:
        raise ValueError("offload_stream can be provided only if manual_synchronization is True")
    if manual_synchronization:
        sync: OffloadSynchronizer = ManualOffloadSynchronizer(
            model_layers, retain_pinned_cpu_buffers, offload_stream
        )
    else:
        sync = DefaultOffloadSynchronizer(
            model_layers, num_layers, retain_pinned_cpu_buffers, offload_stream
        )
    ctx = _CpuOffloadContext(sync)
    if manual_synchronization:
        return ctx, ctx.synchronization_function, sync
    return ctx, ctx.synchronization_function
