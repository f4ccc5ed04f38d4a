"""benchmarks/plot_speedup.py reads the committed train-step results and writes the README's plot."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import plot_speedup  # noqa: E402


def test_plot_speedup_on_committed_results(tmp_path, capsys):
    out = tmp_path / "speedup.png"
    assert plot_speedup.main(["--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    md = capsys.readouterr().out
    assert "| LLaMA | 4096 | 1.325× |" in md and "| GPT | 2048 | 1.106× |" in md
    assert "| GPT | 768 | 1.013× | 1.001× | 1.000× | 0.987× |" in md  # plain labels: the example's default
    points = plot_speedup.load_points([plot_speedup.RESULTS / f for f in plot_speedup.DEFAULT_FILES])
    assert [p["d"] for p in points] == [768, 1024, 2048, 4096, 1024, 2048, 4096]
    assert all("srste" in p["speedup"] for p in points)


def test_plot_speedup_skips_grad_accum_records(tmp_path):
    accum = plot_speedup.RESULTS / "train_gpt_h100_width2048_accum2.json"
    assert plot_speedup.load_points([accum]) == []
    assert plot_speedup.main([str(accum), "--out", str(tmp_path / "x.png")]) == 1
