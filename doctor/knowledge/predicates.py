"""The facts the matcher derives from values captured in error text, to decide between entries whose
messages look alike. Each returns the deciding fact as one sentence (shown as evidence), or None.

Line predicates (`when = "..."` on a template or pattern) look at the values one line captured:

    devices-differ   two legacy tensor type names (torch.cuda.HalfTensor, CUDABFloat16Type) or
                     devices on one line name different devices: a device mismatch that reads
                     like a dtype message
    same-device      the opposite: the two types agree on the device (or do not say), so the
                     message is about the dtype
    meta-device      one of the devices is `meta`: a tensor that has no data yet
    not-meta         neither device is `meta`
    fp8-operands     a cuBLASLt call whose operand types are FP8/FP4 (cudaDataType 28-33, or
                     Float8_*/Float4_* in newer builds)
    not-fp8-operands the call names its operand types and they are not FP8/FP4
    not-alloc-failed a cuBLAS status other than ALLOC_FAILED (which is an out-of-memory)
    layout-condition the condition of a failed check (`Expected <cond> to be true, but got false`,
                     a TORCH_CHECK without a message in an extension) is about strides or
                     contiguity, and not about FP8 operands
    fp8-condition    the condition names FP8/FP4 types (`b.dtype() == at::kFloat8_e4m3fn`)
    materialising-backend  a log names an attention backend that builds the whole score matrix
                     (eager flex attention, the math or eager path), not a fused kernel
    hardware-xid     an NVIDIA Xid number that NVIDIA's catalogue puts on the hardware, the
                     firmware or the board (48, 61-64, 74, 79, 92, 94, 95, 119, 120, 154), not
                     on the application (13, 31, 43, 45, 68, 109 leave the GPU healthy)

Entry facts (`facts = [...]` on an entry) look at everything the entry captured in the text and
count as one support each:

    allocation-exceeds-gpu  one allocation larger than the whole GPU (or than any GPU): a
                            materialised attention score matrix
    gemm-dims-not-16        a cuBLASLt call whose m, n or k is not a multiple of 16, which FP8
                            GEMMs require

Standard library only.
"""
from __future__ import annotations

import re
from typing import Callable, Mapping

Captures = Mapping[str, str]

_HUGE_ALLOCATION = 100 * 2**30  # bytes; larger than any single-GPU working set people allocate
_SIZE = re.compile(r"^\s*([\d.]+)\s*([KMGTP]?i?B|bytes)\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "bytes": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}

# torch.cuda.HalfTensor, torch.FloatTensor, CUDABFloat16Type, CPUFloatType, cuda:0, cpu, meta
_LEGACY_TENSOR = re.compile(r"^torch\.(?:(?P<dev>cuda|xpu|mps)\.)?(?P<dtype>\w+?)Tensor$")
_LEGACY_TYPE = re.compile(r"^(?P<dev>CUDA|CPU|XPU|MPS|Meta|HIP)(?P<dtype>\w+?)Type$")
_DEVICE = re.compile(r"^(?P<dev>cuda|cpu|meta|mps|xpu|hip|privateuseone|npu)(?::\d+)?$")
_FP8_TYPES = {"28", "29", "30", "31", "32", "33"}


def parse_size(text: str) -> int | None:
    """'112.50 GiB' -> bytes; None when it is not a size."""
    m = _SIZE.match(text)
    if not m:
        return None
    unit = _UNITS.get(m.group(2).lower())
    try:
        return int(float(m.group(1)) * unit) if unit else None
    except ValueError:
        return None


def type_device(name: str) -> tuple[str | None, str | None]:
    """(device, dtype) named by a tensor type or device string; None where it does not say.
    `torch.cuda.HalfTensor` -> ("cuda", "Half"); `CPUBFloat16Type` -> ("cpu", "BFloat16");
    `c10::BFloat16` -> (None, "BFloat16"); `cuda:0` -> ("cuda", None)."""
    name = name.strip().strip("'\"`")
    for prefix in ("struct ", "class "):
        name = name.removeprefix(prefix)
    m = _LEGACY_TENSOR.match(name)
    if m:
        return (m.group("dev") or "cpu"), m.group("dtype")
    m = _LEGACY_TYPE.match(name)
    if m:
        return m.group("dev").lower(), m.group("dtype")
    m = _DEVICE.match(name)
    if m:
        return m.group("dev"), None
    return None, name.removeprefix("c10::").removeprefix("torch.") or None


def _pair(c: Captures) -> tuple[str, str] | None:
    for a, b in (("type1", "type2"), ("device1", "device2")):
        if c.get(a) and c.get(b):
            return c[a], c[b]
    return None


def devices_differ(c: Captures) -> str | None:
    pair = _pair(c)
    if pair is None:
        return None
    (d1, _), (d2, _) = type_device(pair[0]), type_device(pair[1])
    if d1 and d2 and d1 != d2:
        return f"{pair[0]} is a {d1.upper() if d1 != 'cpu' else 'CPU'} tensor and {pair[1]} a " \
               f"{d2.upper() if d2 != 'cpu' else 'CPU'} tensor: the devices differ, not only the types"
    return None


def same_device(c: Captures) -> str | None:
    pair = _pair(c)
    if pair is None or devices_differ(c):
        return None
    (d1, t1), (d2, t2) = type_device(pair[0]), type_device(pair[1])
    if d1 and d1 == d2 and t1 and t2 and t1 != t2:
        return f"both tensors are on {d1}; the dtypes differ ({t1} and {t2})"
    return "the two types differ in dtype, not in device"


def meta_device(c: Captures) -> str | None:
    pair = _pair(c)
    if pair is None:
        return None
    for name in pair:
        if type_device(name)[0] == "meta":
            return f"one of the tensors is on the meta device ({name}): it has a shape but no data"
    return None


def not_meta(c: Captures) -> str | None:
    return None if meta_device(c) else "no meta tensor involved"


def _abtype(c: Captures) -> str | None:
    for key in ("abtype", "atype"):
        if c.get(key):
            return c[key].strip()
    return None


def fp8_operands(c: Captures) -> str | None:
    ab = _abtype(c)
    if ab is None:
        return None
    if ab in _FP8_TYPES or ab.startswith(("Float8", "Float4")):
        return f"the cuBLASLt operands are FP8/FP4 (type {ab}): FP8 GEMMs have their own layout rules"
    return None


def not_fp8_operands(c: Captures) -> str | None:
    ab = _abtype(c)
    if ab is None or fp8_operands(c):
        return None
    return f"the cuBLASLt operands are not FP8 (type {ab})"


def not_alloc_failed(c: Captures) -> str | None:
    status = c.get("status", "")
    return None if "ALLOC_FAILED" in status else f"cuBLAS reported {status or 'an error'}, not an allocation failure"


_LAYOUT_CONDITION = re.compile(r"\.strides?\s*\(|\bstrides?\b|is_contiguous|contiguous")
_FP8_CONDITION = re.compile(r"float8|fp8|float4|fp4|e4m3|e5m2", re.IGNORECASE)


def fp8_condition(c: Captures) -> str | None:
    cond = c.get("cond", "").strip()
    if cond and _FP8_CONDITION.search(cond):
        return f"the failed check ({cond}) is about FP8 operands"
    return None


_FP8_METHOD = re.compile(r"fp8|float8", re.IGNORECASE)


def fp8_method(c: Captures) -> str | None:
    """A quantization method that is FP8 (vLLM's `fp8`, `fbgemm_fp8`, `modelopt_mxfp8`...), not
    AWQ, bitsandbytes or FP4, whose GPU minimum the same message states."""
    method = c.get("method", "").strip().strip("'\"`")
    if method and _FP8_METHOD.search(method):
        return f"the quantization method {method} is FP8"
    return None


def layout_condition(c: Captures) -> str | None:
    cond = c.get("cond", "").strip()
    if not cond or fp8_condition(c) or not _LAYOUT_CONDITION.search(cond):
        return None
    return (f"the failed check ({cond}) is about the tensor's memory layout: the kernel needs it "
            "contiguous (or its strides aligned)")


_MATERIALISING = {"flex", "eager", "math", "naive", "vanilla", "manual"}


def materialising_backend(c: Captures) -> str | None:
    backend = c.get("backend", "").strip().strip("'\"`").lower()
    if backend.rsplit(".", 1)[-1] in _MATERIALISING:
        return f"the log names the attention backend '{backend}', which computes the whole score matrix"
    return None


# NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors), the numbers a GPU doctor meets: what
# each means, in a few words. 13, 31, 43, 45, 68 and 109 are application errors (the k8s device
# plugin keeps such a GPU in service); the rest here point at the hardware, firmware or board.
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception (an application fault)",
    31: "GPU memory page fault (an application's illegal address)",
    43: "GPU stopped processing (an application fault)",
    45: "preemptive cleanup after earlier errors",
    48: "double-bit ECC error: uncorrectable memory error",
    61: "internal micro-controller breakpoint or warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded (a reset activates it)",
    64: "ECC page retirement or row remapping failed",
    68: "video processor exception (an application fault)",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (the affected application must restart)",
    95: "uncontained ECC error (the GPU must be reset)",
    109: "context switch timeout (an application fault)",
    119: "GSP RPC timeout (firmware)",
    120: "GSP error (firmware)",
    154: "GPU recovery action changed (the driver asks for a reset, a reboot or a drain)",
}
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def hardware_xid(c: Captures) -> str | None:
    try:
        xid = int(c.get("xid", ""))
    except ValueError:
        return None
    if xid in APPLICATION_XIDS or xid not in XID_MEANINGS:
        return None
    return f"Xid {xid} in the kernel log: {XID_MEANINGS[xid]}, a fault of the GPU, not of the program"


LINE_PREDICATES: dict[str, Callable[[Captures], str | None]] = {
    "not-alloc-failed": not_alloc_failed,
    "devices-differ": devices_differ,
    "same-device": same_device,
    "meta-device": meta_device,
    "not-meta": not_meta,
    "fp8-operands": fp8_operands,
    "not-fp8-operands": not_fp8_operands,
    "layout-condition": layout_condition,
    "fp8-condition": fp8_condition,
    "fp8-method": fp8_method,
    "materialising-backend": materialising_backend,
    "hardware-xid": hardware_xid,
}


def allocation_exceeds_gpu(c: Captures) -> str | None:
    requested = parse_size(c.get("requested", ""))
    if requested is None:
        return None
    capacity = parse_size(c.get("capacity", ""))
    if capacity is not None and requested > capacity:
        return (f"a single allocation of {c['requested']} is larger than the whole GPU "
                f"({c['capacity']} total): a materialised attention score matrix")
    if capacity is None and requested > _HUGE_ALLOCATION:
        return (f"a single allocation of {c['requested']} is larger than any single GPU's "
                "memory: a materialised attention score matrix")
    return None


def gemm_dims_not_16(c: Captures) -> str | None:
    odd = [f"{d}={c[d]}" for d in ("m", "n", "k") if c.get(d, "").isdigit() and int(c[d]) % 16]
    if not odd:
        return None
    return f"cuBLASLt was called with {', '.join(odd)}, not a multiple of 16 as FP8 matmuls require"


_VERSION = re.compile(r"^(?P<version>\d+(?:\.\d+){1,3}(?:(?:a|b|rc|\.post|\.dev)\d+)*)(?:\+(?P<tag>[A-Za-z0-9_.]+))?$")
_CUDA_NUMBER = re.compile(r"^(?P<major>\d{1,2})(?P<minor>\d{2})$")  # xformers prints CUDA 12.1 as 1201


def derived_values(c: Captures) -> dict[str, str]:
    """Values an entry's advice can name, read from what a text captured (kb's `[[variants]]`):
    for a version with a local tag (`have` = "2.6.0+cu124"), `have_version` ("2.6.0") and
    `have_tag` ("cu124"); for a CUDA version printed as a number (`cuda` = "1201"), `cuda_tag`
    ("cu121")."""
    out: dict[str, str] = {}
    for name, value in c.items():
        value = value.strip()
        m = _VERSION.match(value)
        if m:
            out[f"{name}_version"] = m.group("version")
            if m.group("tag"):
                out[f"{name}_tag"] = m.group("tag")
        n = _CUDA_NUMBER.match(value)
        if n and "cuda" in name:
            out[f"{name}_tag"] = f"cu{int(n.group('major'))}{int(n.group('minor'))}"
    return out


ENTRY_FACTS: dict[str, Callable[[Captures], str | None]] = {
    "allocation-exceeds-gpu": allocation_exceeds_gpu,
    "gemm-dims-not-16": gemm_dims_not_16,
}
