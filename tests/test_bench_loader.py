"""benchmarks/bench_loader.py (the loader's cost in the train step) on the CPU: tiny model, token shards."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

pytest.importorskip("tokenizers")

import bench_loader  # noqa: E402
from test_bench_quality import token_dir  # noqa: E402,F401  (the fixture: BPE shards of a small text)

FLAGS = "--n-layer 1 --n-embd 32 --n-head 2"


def test_bench_loader_times_loader_fixed_and_control(tmp_path, token_dir, capsys):  # noqa: F811
    args = ["--data", str(token_dir), "--size", "tiny", "--batch-size", "4", "--seq-len", "32", "--warmup", "1",
            "--iters", "2", "--rounds", "3", "--flags", FLAGS, "--out", str(tmp_path), "--tag", "t"]
    assert bench_loader.main(args) == 0
    res = json.loads((tmp_path / "loader_t.json").read_text())
    assert list(res["modes"]) == list(bench_loader.MODES) and res["train_tokens"] > 0
    for m in res["modes"].values():
        assert len(m["step_times_s"]) == 3 and m["median_step_s"] > 0
        assert m["tokens_per_s"] == pytest.approx(4 * 32 / m["median_step_s"])
    assert res["modes"]["fixed"]["vs_fixed"] == 1.0
    md = (tmp_path / "loader_t.md").read_text()
    assert f"| loader | {1e3 * res['modes']['loader']['median_step_s']:.2f} |" in md
    # bad input: a text file instead of a token directory -> one line, exit 2, nothing written
    assert bench_loader.main(["--data", str(token_dir / "index.json"), "--out", str(tmp_path / "no")]) == 2
    assert not (tmp_path / "no").exists()
    assert "token directory" in capsys.readouterr().err.splitlines()[-1]
