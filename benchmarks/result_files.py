"""A benchmark's current result pair in ``benchmarks/results/`` (or ``--out``): ``<stem>.json`` and ``<stem>.md``.

A module of its own, importing nothing heavy, so that a benchmark which must set up JAX itself (bench_compile.py:
fake CPU devices before JAX starts) writes its results as bench_train_gpt.py does without loading the harness.
"""

from __future__ import annotations

import json
from pathlib import Path


def write_result(out: Path, stem: str, res: dict, md: str, indent: int = 2) -> None:
    """A benchmark's current result pair, ``out/<stem>.json`` and ``out/<stem>.md`` (a re-run replaces them)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(res, indent=indent) + "\n")
    (out / f"{stem}.md").write_text(md)
