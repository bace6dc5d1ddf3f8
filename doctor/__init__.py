"""gpudoctor: a diagnostic doctor for PyTorch on NVIDIA GPUs.

This module stays import-light: it must load in any interpreter (the CLI's, or a probe worker's in
another environment) without typer, rich or torch. Heavier pieces are imported where they are used.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "check_module"]


def __getattr__(name: str):
    # check_module needs torch; import it only when someone asks for it.
    if name == "check_module":
        from gpudoctor.modcheck import check_module

        return check_module
    raise AttributeError(f"module 'gpudoctor' has no attribute {name!r}")
