"""Tests for examples/train.py (CPU; a one-layer model of width 32 trained for a few steps)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import train  # noqa: E402

#: a size small enough to compile and train in a few seconds on two CPU cores
SIZE = dict(n_layer=1, n_head=2, n_embd=32, block_size=32)
DEFAULTS = dict(steps=6, batch_size=8, seq_len=32, lr=3e-3, warmup=2, eval_batches=1)


@pytest.fixture(autouse=True)
def _test_size(monkeypatch):
    monkeypatch.setitem(train.SIZES, "test", SIZE)
    monkeypatch.setitem(train.SIZE_DEFAULTS, "test", DEFAULTS)


def run(*argv) -> int:
    return train.main(["--size", "test", *map(str, argv)])


def bad_input(capsys, *argv) -> str:
    """The one line of ``argv``'s error (exit code 2)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run(*argv)
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    return err


def test_compare_writes_summary_plot_and_table(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert run("--compare", "dense,srste", "--steps", 6, "--eval-every", 3, "--n-layer", 2, "--out", out) == 0
    stdout = capsys.readouterr().out
    assert "| recipe | tokens/s | vs dense | whole run | final val loss | vs dense |" in stdout
    assert "| dense |" in stdout and "1.00x" in stdout and "+0.00%" in stdout
    srste = next(line for line in stdout.splitlines() if line.startswith("| srste |"))
    assert srste.count("|") == 7 and srste.rstrip(" |").endswith("%")
    summary = json.loads((out / "summary.json").read_text())
    assert [r["recipe"] for r in summary["runs"]] == ["dense", "srste"]
    for r in summary["runs"]:
        assert r["final_val_loss"] > 0 and r["tokens_per_s"] > 0 and r["run_tokens_per_s"] > 0
        assert r["run_tokens_per_s"] == pytest.approx(6 * 8 * 32 / r["train_time_s"])
        assert [h["step"] for h in r["history"]] == [3, 6] and len(r["train_loss"]) == 6
    assert summary["runs"][1]["dense_after"] == 5  # the last sixth of 6 steps runs dense
    # --n-layer 2 over the test size's one block: two blocks' weights (4 d^2 attention + 8 d^2 MLP each), more
    # than the whole one-block model has
    d = SIZE["n_embd"]
    assert summary["n_layer"] == 2 and all(r["n_params"] > 2 * 12 * d * d for r in summary["runs"])
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tokens_per_s_times_the_steady_2to4_steps(tmp_path, monkeypatch):
    # a clock that moves 1 s per reading: every span between two device syncs lasts 1 s
    ticks = iter(range(10_000))
    monkeypatch.setattr(train, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    out = tmp_path / "clock"
    assert run("--compare", "dense,srste", "--steps", 6, "--eval-every", 3, "--n-layer", 2, "--out", out) == 0
    dense, srste = json.loads((out / "summary.json").read_text())["runs"]
    tokens = 8 * 32  # per step
    # dense: spans of steps 1-3 and 4-6; the first (just after compiling) is not timed
    assert dense["tokens_per_s"] == 3 * tokens and dense["run_tokens_per_s"] == 6 * tokens / 2
    # srste: 2:4 steps 1-3 and 4-5, then the dense fine-tune (step 6): tokens/s of steps 4-5 only
    assert srste["tokens_per_s"] == 2 * tokens and srste["run_tokens_per_s"] == 6 * tokens / 3


def test_single_run_and_no_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    # dense at the shapes of the test above: its programs come from the session's compilation cache
    assert run("--recipe", "dense", "--steps", 6, "--eval-every", 3, "--out", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [r["recipe"] for r in summary["runs"]] == ["dense"] and summary["runs"][0]["dense_after"] is None
    assert (out / "loss.png").is_file()
    before = (out / "summary.json").read_bytes()
    err = bad_input(capsys, "--recipe", "dense", "--out", out)
    assert "previous run" in err and "--overwrite" in err
    assert (out / "summary.json").read_bytes() == before
    assert train.parse_args(["--size", "test", "--out", str(out), "--overwrite"]).overwrite


@pytest.mark.parametrize("argv, says", [
    (["--compare", "dense,nope"], "give distinct recipes"),
    (["--compare", "dense,dense"], "give distinct recipes"),
    (["--recipe", "nope"], "invalid choice"),
    (["--steps", "0"], "--steps must be > 0"),
    (["--eval-every", "0"], "--eval-every must be > 0"),
    (["--n-layer", "0"], "--n-layer must be > 0"),
    (["--steps", "x"], "invalid int value"),
    (["--data", "/nonexistent/corpus.txt"], "no such file"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, says):
    out = tmp_path / "out"
    if "--data" in argv:  # found when the data is read, after the flags
        capsys.readouterr()
        assert run(*argv, "--out", out) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
    else:
        err = bad_input(capsys, *argv, "--out", out)
    assert err.startswith("train.py: error: ") and says in err, err
    assert not out.exists()


def test_train_gpt_help_is_grouped_with_examples_that_parse():
    import shlex

    import train_gpt

    ap = train_gpt.build_parser()
    groups = {g.title: [a.dest for a in g._group_actions] for g in ap._action_groups}
    for title in ("model", "data", "recipe", "optimizer", "parallelism and memory", "checkpoint and output",
                  "benchmarking"):
        assert groups[title], title
    assert groups["options"] == ["help"]  # every flag in a group
    for flag in ("distributed", "mesh", "layers", "remat", "compare", "resume"):
        assert any(flag in dests for dests in groups.values()), flag
    text = ap.format_help()
    commands = [" ".join(c.split()) for c in text.split("examples:")[1].replace("\\\n", " ").splitlines()
                if c.strip().startswith("python examples/")]
    assert len(commands) >= 4 and sum("train_gpt.py" in c for c in commands) >= 3
    for c in commands:
        argv = shlex.split(c)
        if "train_gpt.py" in c:
            ap.parse_args(argv[argv.index(next(a for a in argv if a.endswith("train_gpt.py"))) + 1:])

