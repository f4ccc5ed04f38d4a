"""Every benchmark result file the docs, README, scripts and the auto table name exists in benchmarks/results/
(older results live in git history: a name followed by "at commit <hash>" is not checked)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PREFIXES = ("train_gpt_", "layer", "spmm", "profile_step_", "gated_ffn", "mask_kernels", "scaling", "prune_demo",
            "ncu_", "step_time_", "gpu_tests_", "sharding_", "ab_mvue_", "probe_step_times_", "speedup_")
NAME = re.compile(r"(?<![\w/.-])(?:benchmarks/results/)?([A-Za-z][\w.-]*\.(?:md|json|png|txt))(?![\w*])")


def _named(text: str) -> set[str]:
    return {m.group(1) for m in NAME.finditer(text)
            if m.group(1).startswith(PREFIXES) and "at commit" not in text[m.end():m.end() + 14]}


def test_named_result_files_exist():
    texts = {p: p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                                        *sorted(RESULTS.glob("*.md")), ROOT / "scripts" / "gpu_check.sh"]}
    missing = {f"{p.relative_to(ROOT)}: {name}" for p, t in texts.items() for name in _named(t)
               if not (RESULTS / name).exists()}
    assert not missing, sorted(missing)


def test_auto_table_sources_exist():
    table = json.loads((ROOT / "jax_sparse24" / "_src" / "spmm_autotune.json").read_text())
    for src in [*table["source"], *table["source_kn"]]:
        assert (ROOT / src).exists(), src
