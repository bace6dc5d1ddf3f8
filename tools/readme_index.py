"""Rewrite the knowledge-base index in README.md from `gpudoctor list --markdown`.

    python tools/readme_index.py          # tests/test_project.py fails when the index is stale
"""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
MARKERS = re.compile(r"<!-- kb-index:start -->.*<!-- kb-index:end -->", re.S)


def index_table() -> str:
    out = subprocess.run([sys.executable, "-m", "gpudoctor", "list", "--markdown"],
                         capture_output=True, text=True, check=True)
    return out.stdout


def main() -> None:
    text = README.read_text(encoding="utf-8")
    block = "<!-- kb-index:start -->\n" + index_table() + "<!-- kb-index:end -->"
    README.write_text(MARKERS.sub(lambda _: block, text), encoding="utf-8")


if __name__ == "__main__":
    main()
