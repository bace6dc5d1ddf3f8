"""A CUDA device simulated on the CPU, at the boundary the probes really use, so that their CUDA
branches run in CI on a machine without a GPU.

What is simulated, and only that:

- placement: tensors made or moved with `device="cuda:N"` stay CPU tensors of the subclass
  `SimTensor`, flagged as living on the device (`.to("cpu")` / `.cpu()` clears the flag);
- `torch.cuda.*` as the probes call it (`SimCuda`): availability, the current device and its
  guard, capability and properties, synchronize, empty_cache, events, streams, the caching
  allocator's counters, the sync debug mode;
- a sticky error (`SimState.poison`): after it, `synchronize`, `empty_cache` and every host read
  of a device tensor (`.item()`, `bool()`, `.cpu()`...) raise the text a real poisoned context
  gives, as `torch.AcceleratorError` (torch 2.8 and later) or `RuntimeError` (before);
- the allocator's counters: every op's output adds its bytes to the live window, and the first
  GEMM-family op allocates cuBLAS's per-handle workspace (32 MiB on sm_90, as
  CublasHandlePool.cpp sizes it), which is never freed;
- the sync debug mode: with `set_sync_debug_mode("warn")`, a host read of a device tensor warns
  "called a synchronizing CUDA operation", as torch's TORCH_WARN does;
- device-side asserts: an out-of-range index into a device tensor does not raise at the call (the
  kernel is asynchronous); it poisons the context with "device-side assert triggered", which the
  next synchronize or host read reports.

The kernels themselves are torch's CPU kernels: numbers are real. Nothing of the probes' own logic
is replaced.
"""
from __future__ import annotations

import contextlib
import types
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

# torch 2.8 and later raise CUDA errors as torch.AcceleratorError (a RuntimeError); older, RuntimeError.
CudaError = getattr(torch, "AcceleratorError", RuntimeError)
ERROR_NAME = CudaError.__name__

WORKSPACE_BYTES = 4096 * 8 * 1024  # cuBLAS workspace on sm_90 (CublasHandlePool.cpp)
_GEMMS = {"bmm", "baddbmm", "matmul", "mm", "addmm", "__matmul__", "__rmatmul__", "linear",
          "scaled_dot_product_attention", "_scaled_mm"}
_HOST_READS = {"item", "__bool__", "__int__", "__float__", "__index__", "tolist", "cpu", "numpy"}


def sticky_text(error: str = "misaligned address", name: str = "cudaErrorMisalignedAddress") -> str:
    """torch 2.11's text for a sticky CUDA error (c10/cuda/CUDAException, as users paste it)."""
    return (f"CUDA error: {error}\nSearch for `{name}' in https://docs.nvidia.com/cuda/"
            "cuda-runtime-api/group__CUDART__TYPES.html for more information.\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the "
            "stacktrace below might be incorrect.\nFor debugging consider passing "
            "CUDA_LAUNCH_BLOCKING=1")


@dataclass
class SimState:
    devices: int = 2
    current: int = 0
    capability: tuple[int, int] = (9, 0)
    name: str = "NVIDIA H100 80GB HBM3"
    total_memory: int = 80 << 30
    poisoned: str | None = None
    sync_debug: int = 0
    elapsed_ms: float = 1.0  # what every Event.elapsed_time answers
    fast_gemm: bool = False  # large GEMMs (>= 1M elements an operand) return zeros: timing-only tests
    workspace: int = 0
    window: int = 0
    peak: int = 0
    log: list[tuple[str, Any]] = field(default_factory=list)

    def poison(self, text: str | None = None) -> None:
        self.poisoned = text or sticky_text()

    def fault(self) -> None:
        if self.poisoned:
            raise CudaError(self.poisoned)

    def allocated(self) -> int:
        return self.workspace


_STATE: SimState | None = None  # the state SimTensor reports to (one simulation at a time)


def _is_cuda(device: Any) -> bool:
    return device is not None and str(device).startswith("cuda")


def _strip(args: tuple, kwargs: dict) -> tuple[tuple, dict, bool | None]:
    """Replace CUDA devices by the CPU; say whether the call asked for CUDA (True), the CPU
    (False) or named no device (None)."""
    asked = None
    out = []
    for a in args:
        if isinstance(a, (str, torch.device)) and (_is_cuda(a) or str(a) == "cpu"):
            asked = _is_cuda(a)
            a = "cpu"
        out.append(a)
    if "device" in kwargs and kwargs["device"] is not None:
        asked = _is_cuda(kwargs["device"])
        kwargs = {**kwargs, "device": "cpu"}
    return tuple(out), kwargs, asked


def _flag(out: Any, on_device: bool) -> Any:
    if isinstance(out, SimTensor):
        out._sim_cuda = on_device
    elif isinstance(out, (tuple, list)):
        for o in out:
            _flag(o, on_device)
    return out


def _nbytes(out: Any) -> int:
    if isinstance(out, torch.Tensor):
        try:
            return int(out.untyped_storage().nbytes())
        except Exception:  # noqa: BLE001
            return 0
    if isinstance(out, (tuple, list)):
        return sum(_nbytes(o) for o in out)
    return 0


class SimTensor(torch.Tensor):
    """A CPU tensor that says whether it lives on the simulated device."""

    _sim_cuda = False

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        state = _STATE
        on_device = any(getattr(a, "_sim_cuda", False) for a in (*args, *kwargs.values()))
        if name in ("to", "cuda", "cpu", "new_empty", "new_zeros", "new_ones", "new_full",
                    "new_tensor", "empty_like", "zeros_like", "ones_like", "randn_like"):
            args, kwargs, asked = _strip(args, kwargs)
            if name == "cuda":
                func, args, asked = torch.Tensor.clone, args[:1], True
            if name == "cpu":
                asked = False
            if asked is not None:
                if on_device and not asked and state is not None:
                    state.fault()  # a device-to-host copy syncs
                on_device = asked
        elif state is not None and on_device and name in _HOST_READS:
            if state.sync_debug:
                warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)
            state.fault()
        if (state is not None and on_device and name in _GEMMS and state.fast_gemm and name != "_scaled_mm"
                and args[0].numel() >= 1 << 20):
            a, b = args[0], args[1]
            out = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=a.dtype).as_subclass(SimTensor)
            return _flag(out, True)
        try:
            out = super().__torch_function__(func, types_, args, kwargs)
        except IndexError:
            if state is None or not on_device:
                raise
            # CUDA_KERNEL_ASSERT in the indexing kernel: reported later, and sticky.
            state.poison(sticky_text("device-side assert triggered", "cudaErrorAssert"))
            return _flag(torch.zeros(0).as_subclass(SimTensor), True)
        if state is not None and on_device:
            if name in _GEMMS and not state.workspace:
                state.workspace = WORKSPACE_BYTES
            state.window += _nbytes(out)
            state.peak = max(state.peak, state.workspace + state.window)
        return _flag(out, on_device)


def _wrap_factory(fn):
    def call(*args, **kwargs):
        args, kwargs, asked = _strip(args, dict(kwargs))
        out = fn(*args, **kwargs)
        if isinstance(out, torch.Tensor) and not isinstance(out, SimTensor):
            out = out.as_subclass(SimTensor)
        return _flag(out, bool(asked)) if isinstance(out, SimTensor) else out

    call.__name__ = getattr(fn, "__name__", "factory")
    return call


class _Event:
    def __init__(self, state: SimState, enable_timing: bool = False) -> None:
        self.state = state
        self.device: int | None = None

    def record(self, stream: Any = None) -> None:
        self.device = stream.device_index if stream is not None else self.state.current
        self.state.log.append(("event.record", self.device))

    def synchronize(self) -> None:
        self.state.fault()

    def elapsed_time(self, other: "_Event") -> float:
        self.state.fault()
        return self.state.elapsed_ms


class SimCuda:
    """`torch.cuda` as the probes call it."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.Event = lambda enable_timing=False: _Event(state, enable_timing)

    def _index(self, device: Any = None) -> int:
        if device is None:
            return self.state.current
        if isinstance(device, int):
            return device
        text = str(device)
        return int(text.split(":", 1)[1]) if ":" in text else self.state.current

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def init(self) -> None:
        pass

    def device_count(self) -> int:
        return self.state.devices

    def current_device(self) -> int:
        return self.state.current

    def set_device(self, device: Any) -> None:
        self.state.current = self._index(device)

    @contextlib.contextmanager
    def device(self, device: Any):
        before = self.state.current
        self.state.current = self._index(device)
        self.state.log.append(("device-guard", self.state.current))
        try:
            yield
        finally:
            self.state.current = before

    def current_stream(self, device: Any = None) -> Any:
        return types.SimpleNamespace(device_index=self._index(device))

    def get_device_capability(self, device: Any = None) -> tuple[int, int]:
        return self.state.capability

    def get_device_name(self, device: Any = None) -> str:
        return self.state.name

    def get_device_properties(self, device: Any = None) -> Any:
        major, minor = self.state.capability
        return types.SimpleNamespace(name=self.state.name, major=major, minor=minor,
                                     total_memory=self.state.total_memory)

    def get_arch_list(self) -> list[str]:
        return ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]

    def synchronize(self, device: Any = None) -> None:
        self.state.log.append(("synchronize", self._index(device)))
        self.state.fault()

    def empty_cache(self) -> None:
        self.state.log.append(("empty_cache", None))
        self.state.fault()  # cudaFree returns the sticky error (CUDACachingAllocator)

    def memory_allocated(self, device: Any = None) -> int:
        return self.state.allocated()

    def max_memory_allocated(self, device: Any = None) -> int:
        return self.state.peak

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.state.log.append(("reset_peak_memory_stats", self._index(device)))
        self.state.window = 0
        self.state.peak = self.state.allocated()

    def get_sync_debug_mode(self) -> int:
        return self.state.sync_debug

    def set_sync_debug_mode(self, mode: Any) -> None:
        self.state.sync_debug = {"default": 0, "warn": 1, "error": 2}.get(mode, mode)


class SimTorch:
    """torch, with `torch.cuda` simulated and factories that accept `device="cuda:N"`."""

    def __init__(self, state: SimState) -> None:
        self.cuda = SimCuda(state)
        self.version = types.SimpleNamespace(cuda="13.0", hip=None, git_version="sim")
        self.__version__ = f"{torch.__version__} (simulated CUDA)"

    def __getattr__(self, name: str) -> Any:
        attr = getattr(torch, name)
        if isinstance(attr, (types.BuiltinFunctionType, types.FunctionType)) and not name.startswith("_"):
            return _wrap_factory(attr)
        return attr


@contextlib.contextmanager
def simulated(**overrides: Any):
    """A simulated CUDA machine for the duration of the block: yields (SimTorch, SimState)."""
    global _STATE
    state = SimState(**overrides)
    previous, _STATE = _STATE, state
    try:
        yield SimTorch(state), state
    finally:
        _STATE = previous
