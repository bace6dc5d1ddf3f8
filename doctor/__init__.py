"""gpudoctor: a diagnostic doctor for PyTorch on NVIDIA GPUs.

The folder doctor/ is the CLI layer and one package per capability:

- the CLI layer: `entry` (the console script and `python -m gpudoctor`), `cli` (the commands:
  parse options, call one library function, pick a renderer, set the exit code) and `__main__`.
  It may import anything below it; nothing below imports it.
- shared by every command: `output` (the output convention: formats, -o, exit codes) and
  `safetext` (untrusted text made safe to show). `output` imports `safetext`, which imports
  nothing.
- the capabilities, which import the layers below and each other's public modules only as their
  `__init__` docstrings say: `scan`, `explain`, `ticket`, `lint`, `fleet`, `patch`.
- below them: `knowledge` (the knowledge base and its loader), gpudoctor.reports (the report
  model, schema, renderers, redaction) and gpudoctor.probes (the probes; their contract in
  `probes.base`).
tests/test_architecture.py pins these directions.

This module stays import-light: it must load in any interpreter (the CLI's, or a probe worker's in
another environment) without typer, rich or torch. Heavier pieces are imported where they are used.
"""
from __future__ import annotations

# The version (PEP 440), the one place it is written: pyproject.toml reads it from here.
__version__ = "0.2.0"

__all__ = ["__version__", "check_module"]


def __getattr__(name: str):
    # check_module needs torch; import it only when someone asks for it.
    if name == "check_module":
        from gpudoctor.scan.modcheck import check_module

        return check_module
    raise AttributeError(f"module 'gpudoctor' has no attribute {name!r}")
