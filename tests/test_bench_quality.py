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

import bench_quality  # noqa: E402
import prepare_data  # noqa: E402
from test_data import _text  # noqa: E402

FLAGS = "--n-layer 1 --n-embd 32 --n-head 2 --batch-size 4 --seq-len 32 --warmup 2"


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory) -> Path:
    pytest.importorskip("tokenizers")
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
    assert dense["train_trace"]["steps_logged"] == 4 and np.isfinite(dense["final_val_loss_full"])
    assert np.isfinite(dense["val_history"][0]["val_loss"]) and dense["val_history"][0]["val_loss"] > np.log(256)  # 300 logits
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


def _history(steps: int, spike_at: int, sparse_until: int, seed: int) -> list[dict]:
    """A per-step history as the example logs it: a decaying noisy train loss with one spike, the gradient norm,
    the flip rate at every 10th step (None between), sparse steps up to ``sparse_until``, and an evaluation
    every 100 steps (a val record before the train record of its step, as train_gpt writes them)."""
    rng = np.random.default_rng(seed)
    out = [{"step": 0, "val_loss": 5.5}]
    for t in range(1, steps + 1):
        loss = 1.0 + 4.0 * np.exp(-t / 150) + 0.03 * rng.standard_normal()
        if t == spike_at:
            loss *= 1.9
        out.append({"step": t, "loss": float(loss), "flip": float(rng.uniform(1e-4, 1e-3)) if t % 10 == 0 else None,
                    "grad_norm": float(abs(rng.normal(1.0, 0.2))), "sparse": t <= sparse_until})
        if t % 100 == 0:
            out.append({"step": t, "val_loss": float(1.1 + 4.0 * np.exp(-t / 150) + 0.01 * rng.standard_normal())})
    return out


def _res(runs: dict) -> dict:
    return {"size": "tiny", "steps": 1000, "batch_size": 4, "seq_len": 32, "tokens": 1000 * 128, "seed": 0,
            "eval_every": 100, "eval_batches": 1, "tag": "syn", "data_name": "train.txt", "val_name": "val.txt",
            "train_tokens": 10**6, "val_tokens": 10**4, "device": "cpu: cpu", "jax": "0", "flags": [],
            "command": "python benchmarks/bench_quality.py --tag syn", "n_params": 1,
            "runs": {k: {"recipe": k, "extra": [], "final_val_loss": h[-1]["val_loss"], "final_train_loss": None,
                         "tokens_per_s": 1.0, "train_time_s": 1.0, "phase_step": None, "config": {}, "history": h,
                         "command": "python benchmarks/bench_quality.py --tag syn"} for k, h in runs.items()}}


def test_compact_result_keeps_the_summaries_of_the_full_history(tmp_path):
    """The result JSON drops the per-step history: the spike and its step, the tail train loss and the best val
    loss are those of every step (not of the thinned series, which averages a one-step spike away), every
    evaluation is kept, and the table is the same from either form."""
    full = {"dense": _history(1000, spike_at=537, sparse_until=0, seed=0),
            "srste": _history(1000, spike_at=538, sparse_until=833, seed=1)}
    res = _res(full)
    compact = bench_quality.compact_result(res)
    for k, h in full.items():
        c = compact["runs"][k]
        assert "history" not in c and "history" in res["runs"][k]  # the input is left as it was
        assert (c["spike"], c["spike_step"]) == bench_quality.spike(h) and c["spike"] > 1.7
        assert c["spike_step"] == {"dense": 537, "srste": 538}[k]
        assert c["tail_train_loss"] == bench_quality.tail_train_loss(h)
        assert (c["best_val_loss"], c["best_val_step"]) == bench_quality.best_val_loss(h)
        assert c["val_history"] == [r for r in h if "val_loss" in r] and len(c["val_history"]) == 11
        # the thinned series: <= TRACE_POINTS buckets of 4 steps; min / max / mean of every step
        tr = c["train_trace"]
        losses = np.array([r["loss"] for r in h if "loss" in r])
        assert tr["bucket_steps"] == 4 and tr["steps_logged"] == 1000 and len(tr["step"]) == 250
        assert tr["step"][0] == 4 and tr["step"][-1] == 1000 and "4 consecutive" in tr["thinning"]
        assert max(tr["loss_max"]) == bench_quality._sig(losses.max())
        assert min(tr["loss_min"]) == bench_quality._sig(losses.min())
        assert np.mean(tr["loss_mean"]) == pytest.approx(losses.mean(), rel=1e-5)
        assert tr["loss_mean"][1] == bench_quality._sig(losses[4:8].mean())
        assert tr["flip_mean"][2] == bench_quality._sig(h[10]["flip"]) and tr["flip_mean"][0] is None  # steps 9-12; 1-4
        assert tr["sparse_steps"] == ([] if k == "dense" else [[1, 833]])
        # what thinning would have broken: the spike and the tail of the bucket means are not the run's
        thinned = [{"step": t, "loss": v} for t, v in zip(tr["step"], tr["loss_mean"])]
        assert bench_quality.spike(thinned)[0] < c["spike"] - 0.3
        assert bench_quality.tail_train_loss(thinned) != c["tail_train_loss"]
    assert bench_quality.compact_result(compact) == compact  # compacting again changes nothing
    assert bench_quality.to_markdown(res) == bench_quality.to_markdown(compact)
    # a recorded spike stays as recorded; fewer steps than TRACE_POINTS: one step per bucket
    short = bench_quality.compact_run({"spike": 1.25, "spike_step": 3, "history": full["dense"][:60]})
    assert (short["spike"], short["spike_step"]) == (1.25, 3)
    assert short["train_trace"]["bucket_steps"] == 1 and short["train_trace"]["step"] == list(range(1, 60))
    no_flip = bench_quality.compact_run({"history": [dict(r, flip=None) for r in full["dense"]]})
    assert "flip_mean" not in no_flip["train_trace"]  # a series no step logged (dense): left out

    # write_report: the compact JSON in the results, the full history only where --history-out says
    assert bench_quality.write_report(res, tmp_path / "out", tmp_path / "h.json") == 0
    assert json.loads((tmp_path / "out" / "quality_syn.json").read_text()) == compact
    assert json.loads((tmp_path / "h.json").read_text())["runs"] == full
    assert (tmp_path / "out" / "quality_syn.md").read_text() == bench_quality.to_markdown(res)
    assert bench_quality.write_report(compact, tmp_path / "out2", tmp_path / "h2.json") == 2  # no history to write
    # --compact: a result JSON of the full form rewritten in place; the compact form is kept as it is
    old = tmp_path / "quality_old.json"
    old.write_text(json.dumps(res))
    assert bench_quality.main(["--compact", str(old)]) == 0
    assert json.loads(old.read_text()) == compact
    text = old.read_text()
    assert bench_quality.main(["--compact", str(old)]) == 0 and old.read_text() == text
    assert bench_quality.main(["--compact", str(tmp_path / "nope.json")]) == 2


def test_committed_quality_results_are_compact():
    """benchmarks/results keeps the compact form (the per-step histories were MBs per file)."""
    for path in sorted((ROOT / "benchmarks" / "results").glob("quality_*.json")):
        res = json.loads(path.read_text())
        assert bench_quality.compact_result(res) == res, path.name
        assert all(len(r["train_trace"]["step"]) <= bench_quality.TRACE_POINTS for r in res["runs"].values())
        assert path.stat().st_size < 300_000, path.name
