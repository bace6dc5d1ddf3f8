"""gpudoctor.probes: the built-in probes, one module each, in the order a scan runs them.

`BUILTIN` is the one explicit registry; a test pins it against the modules in this folder. Loading
a probe module reads its SPEC only: probe modules import torch inside `run`, never at import.

Probe modules run in a scan's worker, in the target interpreter. May import: the standard
library, `base`, this package's private helpers (`_attention`) and gpudoctor.scan.fatbin, nothing
else of gpudoctor. `base` (the probe contract: spec, context, status, finding) imports nothing.
Imported by: gpudoctor.scan (the worker runs them; the runner reads their specs), gpudoctor.reports
(`base`: statuses and findings), gpudoctor.ticket and gpudoctor.reports.diff (the registry).
"""
from __future__ import annotations

import importlib
from types import ModuleType

# Module names, in scan order. arch-compat comes first: it predicts no-kernel-image before any
# kernel is launched.
BUILTIN: tuple[str, ...] = (
    "arch_compat",
    "cuda_runtime",
    "sdpa_backends",
    "xformers_kernels",
    "flash_attn_kernels",
    "attention_memory",
    "fp8_matmul",
    "async_errors",
    "shape_sync",
    "contiguity",
    "matmul_sanity",
    "device_conformance",
)


def load_builtin() -> list[ModuleType]:
    """Import every built-in probe module (cheap: no torch) and return them in scan order."""
    return [importlib.import_module(f"{__name__}.{name}") for name in BUILTIN]
