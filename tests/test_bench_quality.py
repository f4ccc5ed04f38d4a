"""benchmarks/bench_quality.py on token shards of examples/prepare_data.py (the subword tokenizer), CPU.

The byte path (a text ``--data``) is trained in tests/test_bench_scripts.py::test_bench_quality_tiny.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]

pytest.importorskip("tokenizers")

import bench_quality  # noqa: E402
import prepare_data  # noqa: E402
from test_data import _text  # noqa: E402

FLAGS = "--n-layer 1 --n-embd 32 --n-head 2 --batch-size 4 --seq-len 32 --warmup 2"


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bq")
    (d / "train.txt").write_text(_text(40), encoding="utf-8")
    (d / "val.txt").write_text(_text(8, seed=1), encoding="utf-8")
    assert prepare_data.main(["--data", d / "train.txt", "--val", d / "val.txt", "--out", d / "bpe",
                              "--vocab-size", 300, "--quiet"]) == 0
    return d / "bpe"


def test_bench_quality_on_token_shards_names_the_tokenizer(tmp_path, token_dir, capsys):
    index = json.loads((token_dir / "index.json").read_text())
    common = ["--size", "tiny", "--tokens", str(4 * 4 * 32), "--flags", FLAGS, "--evals", "2", "--eval-batches", "1",
              "--final-eval-tokens", "256", "--recipes", "dense"]
    args = [*common, "--data", str(token_dir), "--out", str(tmp_path), "--tag", "t"]
    assert bench_quality.main(args) == 0
    res = json.loads((tmp_path / "quality_t.json").read_text())
    assert res["vocab_size"] == 300 and res["unit"] == "tokens" and "BPE" in res["tokenizer"]
    assert res["tokenizer_sha256"] == index["tokenizer"]["sha256"] and index["tokenizer"]["sha256"][:12] in res["tokenizer"]
    assert (res["train_tokens"], res["val_tokens"]) == (index["train"]["tokens"], index["val"]["tokens"])
    assert "train_bytes" not in res and res["val_name"] == "bpe/val.bin"
    dense = res["runs"]["dense"]
    assert dense["config"]["vocab_size"] == 300 and dense["config"]["tokenizer_sha256"] == index["tokenizer"]["sha256"]
    assert len([h for h in dense["history"] if "loss" in h]) == 4 and np.isfinite(dense["final_val_loss_full"])
    assert np.isfinite(dense["history"][0]["val_loss"]) and dense["history"][0]["val_loss"] > np.log(256)  # 300 logits
    md = (tmp_path / "quality_t.md").read_text()
    assert f"Tokenizer: {res['tokenizer']}; vocabulary 300; {res['train_tokens']:,} train / " in md, md
    # bad input: one line, exit 2, nothing trained or written
    (tmp_path / "empty").mkdir()
    for bad in (["--data", str(token_dir), "--val-data", str(token_dir.parent / "val.txt")],
                ["--data", str(tmp_path / "empty")]):
        assert bench_quality.main([*common, *bad, "--out", str(tmp_path / "no"), "--tag", "t"]) == 2
        assert not (tmp_path / "no").exists()
    err = capsys.readouterr().err.splitlines()
    assert "its own validation split" in err[-2] and "without index.json" in err[-1], err


def test_bench_quality_table_names_the_byte_tokenizer():
    """Results of a text --data (written before the table named the tokenizer too): bytes, 256."""
    res = json.loads((ROOT / "benchmarks" / "results" / "quality_tiny_cpu_realtext.json").read_text())
    res.pop("tokenizer", None), res.pop("vocab_size", None)
    md = bench_quality.to_markdown(res)
    assert f"Tokenizer: {bench_quality.BYTES}; vocabulary 256." in md
