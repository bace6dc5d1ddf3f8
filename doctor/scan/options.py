"""The option types of `gpudoctor scan`: each parses one option's text into the value the scan
takes, or raises typer.BadParameter with one line that names the text and what was expected (the
CLI prints it as a usage error, exit 2). Used by gpudoctor.cli's `scan` signature.
"""
from __future__ import annotations

import math
import os
import re

import typer

# Device types torch knows (c10/core/DeviceType.h); any other name must not look like a typo of
# one of the usual ones. A custom backend renamed with rename_privateuse1_backend passes.
_DEVICE_TYPES = frozenset({
    "cpu", "cuda", "mps", "xpu", "xla", "meta", "hpu", "mtia", "privateuseone", "ipu", "ve", "fpga",
    "maia", "vulkan", "lazy", "ort", "mkldnn", "opengl", "opencl", "ideep", "hip", "msnpu",
})
_DEVICE_RE = re.compile(r"^([a-z_][a-z0-9_]{0,31})(?::(\d{1,4}))?$")


def parse_device(text: str) -> str:
    """`--device`: auto, all, cpu, cuda, cuda:N, or a torch device type (xpu:0, npu:1)."""
    import difflib

    value = text.strip()
    if value in ("auto", "all"):
        return value
    found = _DEVICE_RE.match(value)
    if not found or found.group(1) in ("auto", "all"):
        raise typer.BadParameter(f"{text}: expected auto, all, cpu, cuda, cuda:N or a torch device such as xpu:0")
    name = found.group(1)
    if name not in _DEVICE_TYPES:
        close = ["cuda"] if name in ("gpu", "nvidia") else difflib.get_close_matches(
            name, ["cuda", "cpu", "auto", "all"], n=1, cutoff=0.75)
        if close:
            raise typer.BadParameter(f"{text}: unknown device type {name!r} (did you mean {close[0]}?)")
    return value


def parse_seconds(text: str) -> float:
    """`--timeout`: a positive, finite number of seconds, at most a day."""
    try:
        value = float(text)
    except ValueError:
        raise typer.BadParameter(f"{text}: not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise typer.BadParameter(f"{text}: must be a positive, finite number of seconds")
    from gpudoctor.scan.protocol import MAX_TIMEOUT_S  # the runner's own limit: one number for both

    if value > MAX_TIMEOUT_S:
        raise typer.BadParameter(f"{text}: more than an hour ({MAX_TIMEOUT_S:g} s) per probe is not a limit")
    return value


_MAX_DIM = 2**31 - 1


def parse_level(text: str) -> str:
    """`--level quick|deep` (gpudoctor.probes.base.LEVELS)."""
    from gpudoctor.probes.base import LEVELS

    value = text.strip().lower()
    if value not in LEVELS:
        raise typer.BadParameter(f"expected {' or '.join(LEVELS)}, got {text[:40]!r}")
    return value


def parse_attn_shape(text: str) -> tuple:
    """`--attn-shape B,H,N,D`: four positive integers, each below 2**31."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise typer.BadParameter(f"{text!r}: expected four positive integers B,H,N,D, e.g. 2,8,4096,64")
    shape = tuple(int(p) for p in parts)
    if min(shape) <= 0 or max(shape) > _MAX_DIM:
        raise typer.BadParameter(f"{text}: each of B,H,N,D must be between 1 and {_MAX_DIM}")
    return shape


def parse_probe_option(text: str) -> tuple:
    """`--probe-option KEY=VALUE`: values that parse as JSON (1, true, 0.5, [1,2]) are typed,
    others stay text."""
    import json

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise typer.BadParameter(f"{text}: expected KEY=VALUE")
    try:
        parsed: object = json.loads(value)
    except ValueError:
        parsed = value
    return (key.strip(), parsed)


def parse_probe_file(text: str) -> str:
    if not os.path.isfile(text):
        raise typer.BadParameter(f"{text}: no such file")
    return text
