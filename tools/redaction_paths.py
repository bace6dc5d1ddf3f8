"""Write the file lists of real Python distributions for the redaction precision corpus.

    python tools/redaction_paths.py OUT.txt.gz WHEEL_OR_DIST_INFO...

Each argument is a wheel (`*.whl`) or an installed `*.dist-info` folder; its RECORD file lists
every file the distribution installs, relative to site-packages. The output is gzip-compressed
text, one section per distribution: a `# name version` line, then its paths, sorted. The gzip
header carries no time stamp, so the same inputs give the same bytes.

tests/fixtures/redaction/paths.txt.gz was made from the wheels of torch 2.13.0+cpu (installed),
transformers 5.24.0, diffusers 0.42.1, huggingface_hub 2.4.0, accelerate 1.15.0, safetensors
0.8.0, tokenizers 0.23.3, numpy 2.4.6, nvidia-cuda-runtime-cu12, nvidia-cuda-cupti-cu12 and
nvidia-nvtx-cu12 12.9.79, and the rest of the test environment (sympy, networkx, jinja2, pip,
setuptools, pytest, rich, ...). File names are facts about those packages; no file content is kept.
"""
from __future__ import annotations

import csv
import gzip
import io
import pathlib
import sys
import zipfile


def record(source: pathlib.Path) -> tuple[str, list[str]]:
    """(the distribution's `name version`, the paths in its RECORD)."""
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
            text = z.read(name).decode("utf-8")
        dist = name.split("/")[0]
    else:
        text = (source / "RECORD").read_text(encoding="utf-8")
        dist = source.name
    name, version = dist[: -len(".dist-info")].split("-", 1)
    paths = sorted({row[0] for row in csv.reader(io.StringIO(text)) if row and row[0]})
    return f"{name} {version}", paths


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out, sources = pathlib.Path(argv[0]), [pathlib.Path(a) for a in argv[1:]]
    lines: list[str] = []
    total = 0
    for dist, paths in sorted(record(s) for s in sources):
        lines.append(f"# {dist}")
        lines += paths
        total += len(paths)
    data = ("\n".join(lines) + "\n").encode("utf-8")
    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as f:
        f.write(data)
    print(f"{out}: {len(sources)} distributions, {total} paths, {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
