"""Every benchmark result file that the README, the docs, the results' own notes, the scripts and the code
comments name exists in benchmarks/results/, and so do the sources of the `auto` table."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PREFIXES = ("train_gpt_", "layer", "spmm", "profile_step_", "gated_ffn", "mask_kernels", "mask_check", "scaling",
            "prune_demo", "ncu_", "step_time_", "step_breakdown_", "gpu_tests_", "sharding_", "ab_", "probe_",
            "speedup_", "quality_", "fp8_", "example_loop_", "example_train_", "loader_", "weak_scaling_", "prepare_gpt2", "compress_", "launch_overhead",
            "compile_")
NAME = re.compile(r"(?<![\w/.-])(?:benchmarks/results/)?([A-Za-z][\w.-]*\.(?:md|json|png|txt|csv))(?![\w*])")
EXPLICIT = re.compile(r"benchmarks/results/([A-Za-z][\w.-]*\.(?:md|json|png|txt|csv))(?![\w*])")
SOURCE_SUFFIXES = {".py", ".sh", ".cu", ".cuh", ".h", ".cc", ".toml", ".md"}
ELSEWHERE = {"spmm_autotune.json"}  # the `auto` table itself, in jax_sparse24/_src/
OUTPUT_WRITERS = ("tests/", "benchmarks/bench_", "examples/data/", "examples/prune_demo.py", "scripts/probe_fp8.py")


def _named(text: str) -> set[str]:
    return {m.group(1) for m in NAME.finditer(text) if m.group(1).startswith(PREFIXES)}


def _tracked_sources() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines() if Path(p).suffix in SOURCE_SUFFIXES and (ROOT / p).is_file()]


def test_named_result_files_exist():
    """Documents (README, docs/, the results' notes) by file name; code anywhere else by file name too,
    except benchmark scripts (which name their own outputs) and tests (their own temporary files), where only
    an explicit ``benchmarks/results/NAME`` counts."""
    missing = set()
    for p in _tracked_sources():
        rel = p.relative_to(ROOT).as_posix()
        text = p.read_text(errors="replace")
        if rel.startswith(OUTPUT_WRITERS):
            names = {m.group(1) for m in EXPLICIT.finditer(text)}
        else:
            names = _named(text) | {m.group(1) for m in EXPLICIT.finditer(text)}
        missing |= {f"{rel}: {name}" for name in names if name not in ELSEWHERE and not (RESULTS / name).exists()}
    assert not missing, sorted(missing)


def test_checker_sees_a_missing_file():
    text = "see " + "benchmarks/results" + "/train_gpt_h100_nonexistent.md and `spmm.md`"
    assert _named(text) == {
        "train_gpt_h100_nonexistent.md", "spmm.md"}
    assert not (RESULTS / "train_gpt_h100_nonexistent.md").exists()


def test_auto_table_sources_exist():
    table = json.loads((ROOT / "jax_sparse24" / "_src" / "spmm_autotune.json").read_text())
    for src in [*table["source"], *table["source_kn"]]:
        assert (ROOT / src).exists(), src
