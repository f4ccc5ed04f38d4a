"""Tests for benchmarks/harness/train_gpt.py (CPU, tiny dims: each recipe trains, resume is bit-exact, bad input)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]

import gpt_checkpoints  # noqa: E402
import gpt_experiment  # noqa: E402
import train_gpt  # noqa: E402
from jax_sparse24.masks import masks_for_params  # noqa: E402

# A model small enough to compile and train in a few seconds on two CPU cores.
TINY = ["--size", "tiny", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--seq-len", "32",
        "--batch-size", "8", "--eval-batches", "1", "--quiet", "--lr", "3e-3", "--warmup", "3"]


def four_cpu_devices_env() -> dict:
    """The environment of a subprocess on four CPU devices (this session's other XLA flags kept)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    return dict(os.environ, XLA_FLAGS=" ".join([*flags, "--xla_force_host_platform_device_count=4"]), JAX_PLATFORMS="cpu",
                PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run(*argv) -> int:
    return train_gpt.main([*TINY, *map(str, argv)])


def tree_files(d: Path) -> dict:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def history(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def straight_and_resumed(flags, tmp_path: Path, stop_at: int) -> tuple[Path, Path]:
    """``flags`` trained straight into ``tmp_path/a`` and, stopped at ``stop_at`` then resumed, into
    ``tmp_path/b``: the two histories are identical. Returns (a, b)."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(*flags, "--out", a) == 0
    assert run(*flags, "--out", b, "--stop-at", stop_at) == 0
    assert run(*flags, "--out", b, "--resume") == 0
    assert history(a) == history(b)
    return a, b


def _get_path(tree, path):
    for k in path:
        tree = tree[k.key]
    return tree


def assert_same_checkpoints(hp: dict, a: Path, b: Path, step: int):
    """The two runs' checkpoints of ``step`` (restored with the run's abstract state) are bit for bit
    equal; returns the first."""
    exp = train_gpt.build_experiment(hp)
    abstract = jax.eval_shape(lambda: gpt_experiment.init_state(exp, hp["seed"]))
    sa, _ = train_gpt.Checkpoints(a).restore(step, abstract)
    sb, _ = train_gpt.Checkpoints(b).restore(step, abstract)
    assert jax.tree.structure(sa) == jax.tree.structure(sb)
    for x, y in zip(jax.tree.leaves(sa), jax.tree.leaves(sb)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    return sa


# Every recipe trains once per session with these flags (checkpoints at 12 and 24); the tests
# below read those runs, and the resume test recompiles nothing (same programs, JAX's cache).
STEPS = ["--steps", 24, "--eval-every", 12, "--ckpt-every", 12, "--mask-every", 4]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    done = {}

    def get(recipe: str) -> Path:
        if recipe not in done:
            out = base / recipe
            assert run("--recipe", recipe, *STEPS, "--out", out) == 0
            done[recipe] = out
        return done[recipe]

    return get


@pytest.mark.parametrize("recipe", sorted(r for r in train_gpt.RECIPES if r != "ast"))  # ast: below
def test_recipe_trains_and_loss_falls(runs, recipe):
    out = runs(recipe)
    s = json.loads((out / "summary.json").read_text())
    h = history(out)
    vals = [r["val_loss"] for r in h if "val_loss" in r]
    assert [r["step"] for r in h if "val_loss" in r] == [0, 12, 24]
    assert vals[0] > 5.3  # ~ln 256 at init
    assert vals[-1] < vals[0] - 1.0, vals
    assert s["steps_done"] == 24 and s["tokens_per_s"] > 0
    assert (out / "loss.png").stat().st_size > 1000
    assert train_gpt.Checkpoints(out / "ckpt").steps() == [12, 24]
    train = [r for r in h if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 25))
    sparse = [r["sparse"] for r in train]
    flips = [r["flip"] for r in train]
    if recipe == "dense":
        assert not any(sparse) and all(f is None for f in flips)
    elif recipe == "srste":  # dense fine-tune for the last 1/6: steps 20..23 (0-based) dense
        assert sparse == [True] * 20 + [False] * 4
        assert [i + 1 for i, f in enumerate(flips) if f is not None] == [4, 8, 12, 16, 20, 24]
        assert all(0 <= f <= 1 for f in flips if f is not None)
    elif recipe == "step":  # clipping (2, 12): dense at first, sparse by update 13
        assert not sparse[0] and sparse[-1] and sparse.index(True) <= 13
        assert s["phase_step"] == train[sparse.index(True)]["step"]
    else:  # flip rate of the update of every logging step (tiny: --log-every 5)
        assert all(sparse) and [i + 1 for i, f in enumerate(flips) if f is not None] == [5, 10, 15, 20]
        assert all(0 < f <= 1 for f in flips if f is not None)


@pytest.mark.parametrize("recipe", ["srste", "step"])
def test_resume_is_bit_exact(runs, tmp_path, recipe):
    # 24 steps straight == 12 (stopped as if interrupted) + resume + 12, bit for bit.
    # srste: mask refreshes at 16/20/24, MVUE keys and the dense fine-tune switch (20) after the
    # resume; step: the restored STEP phase / frozen second moment decide the second half.
    a, b = runs(recipe), tmp_path / "resumed"
    assert run("--recipe", recipe, *STEPS, "--out", b, "--stop-at", 12) == 0
    assert train_gpt.Checkpoints(b / "ckpt").steps() == [12]
    assert run("--recipe", recipe, *STEPS, "--out", b, "--resume") == 0

    hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args([*TINY, *map(str, STEPS)]), recipe)
    assert_same_checkpoints(hp, a / "ckpt", b / "ckpt", 24)
    assert history(a) == history(b)  # identical losses, flip rates, phases, val losses


@pytest.fixture
def trained(runs, tmp_path):
    """A copy of the srste run (tests may break it)."""
    out = tmp_path / "trained"
    shutil.copytree(runs("srste"), out)
    return out


def test_bad_recipe_and_size_exit_nonzero(capsys):
    with pytest.raises(SystemExit) as e:
        run("--recipe", "nope", "--out", "unused")
    assert e.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        train_gpt.main(["--size", "huge"])
    assert e.value.code == 2
    assert run("--compare", "dense,nope", "--out", "unused") == 2
    assert "unknown recipe" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        run("--recipe", "srste", "--sparse-backend", "fast", "--out", "unused")
    assert e.value.code == 2 and "invalid choice: 'fast'" in capsys.readouterr().err
    assert run("--final-eval-tokens", "-1", "--out", "unused") == 2
    assert "--final-eval-tokens must be >= 0" in capsys.readouterr().err
    assert not Path("unused").exists()


def test_sparse_backend_flag_reaches_the_layers():
    """--sparse-backend sets Sparse24Dense(backend=) of every 2:4 layer; not part of the checkpointed
    config (a kernel choice: same math)."""
    hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args([*TINY, "--sparse-backend", "reference"]), "srste")
    exp = train_gpt.build_experiment(hp)
    assert exp.cfg.backend == "reference" and "sparse_backend" not in gpt_experiment.CONFIG_KEYS
    assert train_gpt.build_experiment(train_gpt.resolve_flags(train_gpt.build_parser().parse_args(TINY), "srste")
                                      ).cfg.backend == "auto"


@pytest.mark.parametrize("content, message", [(b"", "empty"), (b"hello world " * 20, "too short")])
def test_bad_corpus(tmp_path, capsys, content, message):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(content)
    assert run("--data", corpus, "--out", tmp_path / "o", "--steps", 2) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
    assert run("--data", tmp_path / "missing.txt", "--out", tmp_path / "o") == 2
    assert "no such file" in capsys.readouterr().err
    assert run("--data", tmp_path, "--out", tmp_path / "o") == 2  # a directory without index.json: named as such
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--data {tmp_path} is a directory without index.json" in err
    assert "prepare_data.py" in err and not (tmp_path / "o").exists()


def test_val_data_is_a_separate_file(tmp_path, capsys):
    """--val-data: all of --data trains, the other file validates; the data fingerprint covers both."""
    from data import ByteData

    corpus = (ROOT / "examples" / "data" / "corpus.txt").read_bytes()
    train_f, val_f = tmp_path / "train.txt", tmp_path / "val.txt"
    train_f.write_bytes(corpus[:20000])
    val_f.write_bytes(corpus[-5000:])
    d = ByteData(train_f, 32, 4, 0, 2, val_path=val_f)
    assert len(d.train) == 20000 and len(d.val) == 5000
    assert all(bytes(row.astype(np.uint8)) in corpus[-5000:] for b in d.val_batches for row in b)
    assert d.batch(3).shape == (4, 33) and d.sha256 != ByteData(train_f, 32, 4, 0, 2).sha256
    assert ByteData(train_f, 32, 4, 0, 2).sha256 == hashlib.sha256(corpus[:20000]).hexdigest()  # unchanged
    other = tmp_path / "val2.txt"
    other.write_bytes(corpus[-6000:-1000])
    assert ByteData(train_f, 32, 4, 0, 2, val_path=other).sha256 != d.sha256
    out = tmp_path / "o"
    assert run("--data", train_f, "--val-data", val_f, "--out", out, "--steps", 2, "--ckpt-every", 0) == 0
    assert "20000 train / 5000 val bytes" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["config"]["data_sha256"] == d.sha256
    short = tmp_path / "short.txt"
    short.write_bytes(b"abc")
    assert run("--data", train_f, "--val-data", short, "--out", tmp_path / "o2", "--steps", 2) == 2
    assert "--val-data" in capsys.readouterr().err and not (tmp_path / "o2").exists()
    assert run("--data", train_f, "--val-data", tmp_path / "nope.txt", "--out", tmp_path / "o2") == 2
    assert "no such file" in capsys.readouterr().err


def test_resume_of_a_finished_run_keeps_its_summary(trained, capsys):
    """--resume of a finished run says so and leaves summary.json as it is (it was rewritten with
    final_train_loss null); a summary that an older version degraded so is rebuilt from the history."""
    before = (trained / "summary.json").read_bytes()
    assert run("--recipe", "srste", *STEPS, "--out", trained, "--resume") == 0
    err = capsys.readouterr().err
    assert "srste: already finished (24 steps, final val loss" in err and "summary.json is kept" in err
    assert (trained / "summary.json").read_bytes() == before
    degraded = dict(json.loads(before), final_train_loss=None)
    (trained / "summary.json").write_text(json.dumps(degraded))
    assert run("--recipe", "srste", *STEPS, "--out", trained, "--resume") == 0
    s, want = json.loads((trained / "summary.json").read_text()), json.loads(before)
    assert s["final_train_loss"] == want["final_train_loss"] == history(trained)[-2]["loss"] is not None
    assert {k: s[k] for k in want if k != "device"} == {k: want[k] for k in want if k != "device"}


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    """A diverging run (--lr 1e30) stops at the first non-finite loss with one line naming the step and
    the last good checkpoint (exit 1); no checkpoint is written from that step on."""
    out = tmp_path / "nan"
    assert run("--recipe", "dense", "--steps", 8, "--eval-every", 4, "--ckpt-every", 2, "--log-every", 2,
               "--lr", "1e30", "--out", out) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "Traceback" not in err[-1], err  # the data line, the error
    bad = [r for r in history(out) if "loss" in r and not np.isfinite(r["loss"])]
    assert len(bad) == 1 and history(out)[-1] == bad[0]  # the history ends at the first bad step
    k = bad[0]["step"]
    saved = train_gpt.Checkpoints(out / "ckpt").steps()
    assert saved and saved[-1] < k, (saved, k)
    assert err[-1].startswith(f"train_gpt.py: error: training diverged at step {k}: non-finite training loss (nan)")
    assert f"the last good checkpoint is step {saved[-1]} in {out / 'ckpt'}" in err[-1]
    assert json.loads((out / "summary.json").read_text())["diverged_at_step"] == k
    hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args(
        [*TINY, "--recipe", "dense", "--steps", "8", "--lr", "1e30"]), "dense")
    state, _ = train_gpt.Checkpoints(out / "ckpt").restore(
        saved[-1], jax.eval_shape(lambda: gpt_experiment.init_state(train_gpt.build_experiment(hp), 0)))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state) if np.issubdtype(x.dtype, np.inexact))
    assert "apply_if_finite" in train_gpt.build_parser().format_help()  # --help says what happens


def test_mismatched_checkpoint_refused(trained, capsys):
    before = tree_files(trained)
    assert run("--recipe", "srste", *STEPS, "--out", trained, "--resume", "--lr", "1e-3") == 2
    err = capsys.readouterr().err
    assert "different configuration" in err and "lr=" in err
    assert run("--recipe", "sste", *STEPS, "--out", trained, "--resume") == 2
    assert "recipe='srste' in the checkpoint but 'sste' now" in capsys.readouterr().err
    assert run("--recipe", "srste", *STEPS, "--out", trained) == 2  # would overwrite
    assert "already holds a previous run (checkpoints (steps [12, 24])" in capsys.readouterr().err
    assert tree_files(trained) == before


def test_corrupt_checkpoint_refused(trained, tmp_path, capsys):
    for how in ("flip", "truncate", "meta"):
        out = tmp_path / how
        shutil.copytree(trained, out)
        step_dir = out / "ckpt" / "24"
        if how == "meta":
            shutil.rmtree(step_dir / "meta")
        else:
            data = max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
            raw = bytearray(data.read_bytes())
            if how == "flip":
                raw[len(raw) // 2] ^= 0xFF
            else:
                raw = raw[: len(raw) // 3]
            data.write_bytes(bytes(raw))
        before = tree_files(out)
        assert run("--recipe", "srste", *STEPS, "--out", out, "--resume") == 2, how
        err = capsys.readouterr().err
        assert " is corrupt" in err, (how, err)
        # the error names the intact older checkpoint and the flag that continues from it
        assert "the newest intact checkpoint is step 12: continue from it with --resume-from 12" in err, (how, err)
        assert "TensorStore details" not in err and err.count("\n") <= 2, err
        assert tree_files(out) == before
    # --resume-from 12 continues from the intact checkpoint, replaces the corrupt one, and ends
    # bit for bit where the uncorrupted run ended
    assert run("--recipe", "srste", *STEPS, "--out", out, "--resume-from", 12) == 0
    assert "discarded the checkpoints after step 12 (steps [24])" in capsys.readouterr().err
    hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args([*TINY, *map(str, STEPS)]), "srste")
    assert_same_checkpoints(hp, trained / "ckpt", out / "ckpt", 24)
    assert history(out) == history(trained)
    assert run("--recipe", "srste", *STEPS, "--out", out, "--resume-from", 7) == 2
    assert "has no checkpoint of that step (steps [12, 24])" in capsys.readouterr().err


def test_corrupt_checkpoint_leaves_no_orbax_noise(trained, capsys, monkeypatch):
    """A failed orbax restore left reads in flight: their 'Event loop is closed' errors, abandoned
    read coroutines and asyncio's 'exception was never retrieved' reports printed dozens of
    tracebacks after the one-line error. None of them reach the hooks any more."""
    import gc
    import logging
    import time

    leftovers, logged = [], []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: leftovers.append(repr(u.exc_value)))

    class Record(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage())

    handler = Record(level=logging.DEBUG)
    # a truncated data file fails inside orbax's concurrent reads
    data = max((p for p in (trained / "ckpt" / "24" / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])
    logging.getLogger("asyncio").addHandler(handler)
    try:
        for _ in range(3):
            assert run("--recipe", "srste", *STEPS, "--out", trained, "--resume") == 2
            gc.collect()
        time.sleep(0.5)  # reads still in flight finish
        gc.collect()
    finally:
        logging.getLogger("asyncio").removeHandler(handler)
    err = capsys.readouterr().err
    assert err.count("error: checkpoint") == 3 and "Traceback" not in err
    assert leftovers == [] and logged == [], (leftovers[:3], logged[:3])


def test_previous_run_is_never_overwritten(tmp_path, capsys):
    """A finished run without checkpoints (--ckpt-every 0) is not replaced silently; --out naming a
    file is a one-line error; --overwrite replaces the run (and only with it)."""
    out = tmp_path / "run"
    flags = ["--recipe", "dense", "--steps", 2, "--eval-every", 2, "--ckpt-every", 0]
    assert run(*flags, "--out", out) == 0
    capsys.readouterr()
    before = tree_files(out)
    assert set(before) == {"summary.json", "metrics.jsonl", "loss.png"}
    assert run(*flags, "--out", out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds a previous run (summary.json, metrics.jsonl, loss.png)" in err
    assert "--resume" not in err  # nothing to resume without checkpoints
    (out / "ckpt").mkdir()
    for name in ("summary.json", "loss.png"):  # any one of the files is enough
        keep = {n: (out / n).read_bytes() for n in before}
        for n in before:
            if n != name:
                (out / n).unlink()
        assert run(*flags, "--out", out) == 2 and name in capsys.readouterr().err
        for n, b in keep.items():
            (out / n).write_bytes(b)
    assert tree_files(out) == before
    assert run(*flags, "--out", out, "--overwrite", "--resume") == 2
    assert "pass one of them" in capsys.readouterr().err
    (out / "summary.json").write_text("{}")
    assert run(*flags, "--steps", 1, "--eval-every", 1, "--out", out, "--overwrite") == 0
    assert json.loads((out / "summary.json").read_text())["steps_done"] == 1
    capsys.readouterr()
    for target, what in ((out / "summary.json", "is a file"), (out / "summary.json" / "sub", "which is a file")):
        assert run(*flags, "--out", target) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and what in err and "Traceback" not in err


def test_stop_at_says_how_to_resume(tmp_path, capsys):
    flags = ["--recipe", "dense", "--steps", 4, "--eval-every", 2]
    assert run(*flags, "--ckpt-every", 2, "--stop-at", 2, "--out", tmp_path / "a") == 0
    err = capsys.readouterr().err
    assert "stopped at step 2 of 4 (--stop-at)" in err and "--resume instead of --stop-at" in err
    assert "final val loss" not in err
    assert run(*flags, "--ckpt-every", 0, "--stop-at", 2, "--out", tmp_path / "b") == 0
    assert "no checkpoint was written (--ckpt-every 0), so it cannot be resumed" in capsys.readouterr().err
    assert run(*flags, "--ckpt-every", 2, "--out", tmp_path / "a", "--resume") == 0
    assert "final val loss" in capsys.readouterr().err


def test_help_shows_each_default_once():
    text = train_gpt.build_parser().format_help()
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "(default: per size) (default" not in text
    for line in text.split("  --")[1:]:
        assert line.count("(default") <= 1 and line.count("default:") <= 1, line
    flat = " ".join(text.split())
    assert "--b1 B1 AdamW beta1" in flat and "--b2 B2 AdamW beta2" in flat
    for name, shape in train_gpt.SIZES.items():  # every size is described
        assert f" {name} (" in flat and f"{shape['n_layer']} layers, width {shape['n_embd']}," in flat, name
    assert "--seed SEED init / data / MVUE seed (default: 0)" in flat


def test_compare_without_gpu_kernels_compares_no_speed(tmp_path, capsys, monkeypatch):
    out = tmp_path / "cmp"
    flags = ["--compare", "dense,ste", "--steps", 2, "--eval-every", 2, "--ckpt-every", 0, "--out", out]
    monkeypatch.setattr(train_gpt.s24, "cuda_kernels_available", lambda: False)
    assert run(*flags) == 0
    md = (out / "compare.md").read_text()
    assert "no GPU kernels: speed not compared" in md and "no GPU kernels: speed not compared" in capsys.readouterr().out
    rows = [line for line in md.splitlines() if line.startswith("| ste |") or line.startswith("| dense |")]
    assert len(rows) == 2 and all(row.split("|")[5].strip() == "-" for row in rows), rows  # no tokens/s ratio
    summaries = json.loads((out / "compare.json").read_text())
    train_gpt.write_compare(tmp_path, summaries, compare_speed=True)  # with kernels: the ratio is there
    assert "no GPU kernels" not in (tmp_path / "compare.md").read_text()
    assert "x |" in (tmp_path / "compare.md").read_text()
    capsys.readouterr()
    assert run(*flags) == 2  # the comparison is not written over either
    assert "already holds a comparison (compare.md, compare.json, compare.png)" in capsys.readouterr().err


# --- ast: a 2:4 student distilled from a dense teacher ------------------------------------------

AST_STEPS = ["--steps", 12, "--eval-every", 6, "--ckpt-every", 6]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A dense teacher trained for a few steps on the tiny config."""
    out = tmp_path_factory.mktemp("teacher") / "dense"
    assert run("--recipe", "dense", *AST_STEPS, "--out", out) == 0
    return out


def test_ast_trains_from_dense_teacher(teacher, tmp_path):
    out = tmp_path / "ast"
    assert run("--recipe", "ast", "--teacher", teacher, *AST_STEPS, "--out", out) == 0
    h = history(out)
    vals = [r["val_loss"] for r in h if "val_loss" in r]
    t_vals = [r["val_loss"] for r in history(teacher) if "val_loss" in r]
    # the student starts from the teacher (2:4 + SLoRB stand-in for the pruned weights) ...
    assert abs(vals[0] - t_vals[-1]) < 0.1, (vals, t_vals)
    # ... and keeps learning
    assert vals[-1] < vals[0] - 0.2, vals
    train = [r for r in h if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 13))
    assert all(r["sparse"] and r["kd"] >= 0 for r in train)
    assert [r["step"] for r in train if r["flip"] is not None] == [5, 10] and all(
        0 <= r["flip"] <= 1 for r in train if r["flip"] is not None)
    s = json.loads((out / "summary.json").read_text())
    assert s["config"]["teacher"] == str(teacher.resolve()) and s["config"]["recipe"] == "ast"
    assert (out / "loss.png").stat().st_size > 1000
    # the 2:4 layers are Sparse24LowRankDense: kernel + SLoRB lora_b under the dense names
    hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args(
        [*TINY, *map(str, AST_STEPS), "--recipe", "ast", "--teacher", str(teacher)]), "ast")
    exp = train_gpt.build_experiment(hp)
    abstract = jax.eval_shape(lambda: gpt_experiment.init_state(exp, hp["seed"]))
    assert set(abstract["params"]["h"]["mlp"]["fc"]) == {"kernel", "bias", "lora_b"}  # (the scanned stack)
    assert set(abstract["params"]["h"]["attn"]["qkv"]) == {"kernel", "bias"}
    # resume: 6 steps (stopped) + resume == 12 straight, bit for bit
    b = tmp_path / "resumed"
    assert run("--recipe", "ast", "--teacher", teacher, *AST_STEPS, "--out", b, "--stop-at", 6) == 0
    assert run("--recipe", "ast", "--teacher", teacher, *AST_STEPS, "--out", b, "--resume") == 0
    sa, _ = train_gpt.Checkpoints(out / "ckpt").restore(12, abstract)
    sb, _ = train_gpt.Checkpoints(b / "ckpt").restore(12, abstract)
    for x, y in zip(jax.tree.leaves(sa), jax.tree.leaves(sb)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert history(out) == history(b)


def test_ast_bad_teacher_refused(teacher, tmp_path, capsys):
    out = tmp_path / "o"
    assert run("--recipe", "ast", *AST_STEPS, "--out", out) == 2
    assert "--recipe ast needs --teacher" in capsys.readouterr().err
    assert run("--compare", "dense,ast", *AST_STEPS, "--out", out) == 2
    assert "--recipe ast needs --teacher" in capsys.readouterr().err
    assert run("--recipe", "srste", "--teacher", teacher, *AST_STEPS, "--out", out) == 2
    assert "only used by --recipe ast" in capsys.readouterr().err
    before = tree_files(teacher)
    assert run("--recipe", "ast", "--teacher", teacher, *AST_STEPS, "--out", out, "--n-embd", 64) == 2
    err = capsys.readouterr().err
    assert "different model configuration" in err and "n_embd=32 in the teacher but 64 now" in err
    assert err.count("\n") == 1
    assert run("--recipe", "ast", "--teacher", tmp_path / "nothing", *AST_STEPS, "--out", out) == 2
    assert "no such directory" in capsys.readouterr().err
    assert not out.exists() and tree_files(teacher) == before


def test_resume_without_checkpoint(tmp_path, capsys):
    assert run("--out", tmp_path / "none", "--resume", "--steps", 2) == 2
    assert "no checkpoint found" in capsys.readouterr().err


def test_mesh_mismatch(tmp_path, capsys):
    assert run("--mesh", f"data={jax.device_count() + 1}", "--out", tmp_path / "m", "--steps", 2) == 2
    assert "devices but" in capsys.readouterr().err
    assert run("--mesh", "data=x", "--out", tmp_path / "m", "--steps", 2) == 2
    assert "expected e.g." in capsys.readouterr().err


def test_mesh_on_four_cpu_devices(tmp_path):
    """Data parallel x Megatron model parallel (2 x 2 forced host devices), sparse attention and
    gradient accumulation (micro-batches keep the data sharding) too."""
    out = tmp_path / "mesh"
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / 'benchmarks' / 'harness')!r})
import jax, train_gpt
assert jax.device_count() == 4
sys.exit(train_gpt.main({TINY!r} + ["--recipe", "srste", "--steps", "4", "--eval-every", "4", "--sparse-attn",
                                   "--mesh", "data=2,model=2", "--grad-accum", "2", "--out", {str(out)!r}]))
"""
    env = four_cpu_devices_env()
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    vals = [r["val_loss"] for r in history(out) if "val_loss" in r]
    assert len(vals) == 2 and np.isfinite(vals).all() and vals[1] < vals[0] - 0.1, vals


def test_corpus_generator_reproduces_bundled_file():
    sys.path.insert(0, str(ROOT / "examples" / "data"))
    import make_corpus

    assert make_corpus.generate().encode("ascii") == (ROOT / "examples" / "data" / "corpus.txt").read_bytes()


def test_one_hot_embed_matches_nn_embed():
    """The example's byte embedding (one-hot matmul, a GEMM gradient) equals nn.Embed's lookup and
    gradient on the same parameter, and keeps its tied-head ``attend``."""
    import jax.numpy as jnp
    from flax import linen as nn

    import model

    idx = jax.random.randint(jax.random.key(0), (3, 17), 0, 256)
    ref, ours = nn.Embed(256, 32, dtype=jnp.bfloat16), model.OneHotEmbed(256, 32, dtype=jnp.bfloat16)
    v = ref.init(jax.random.key(1), idx)
    np.testing.assert_array_equal(np.asarray(ours.apply(v, idx), np.float32), np.asarray(ref.apply(v, idx), np.float32))
    loss = lambda m: lambda v: (m.apply(v, idx).astype(jnp.float32) ** 2).sum()  # noqa: E731
    g_ref, g_ours = jax.grad(loss(ref))(v), jax.grad(loss(ours))(v)
    np.testing.assert_allclose(np.asarray(g_ours["params"]["embedding"]), np.asarray(g_ref["params"]["embedding"]),
                               rtol=1e-2, atol=1e-3)
    x = jnp.ones((2, 32), jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(ours.apply(v, x, method="attend"), np.float32),
                                  np.asarray(ref.apply(v, x, method="attend"), np.float32))
    with pytest.raises(ValueError, match="integer"):
        ours.apply(v, jnp.ones((2, 3)))


def test_attention_choice(capsys, monkeypatch):
    """``--attention``: auto falls back to XLA where cuDNN cannot run; cudnn there is a clear
    CLI error (exit 2); an unknown GPTConfig.attention is a ValueError naming the choices."""
    import jax.numpy as jnp

    import model

    impl = model.attention_implementation
    assert impl("xla", jnp.bfloat16, 64) == "xla"
    assert impl("auto", jnp.float32, 64) == "xla"
    monkeypatch.setattr(model.jax, "default_backend", lambda: "gpu")
    assert impl("auto", jnp.bfloat16, 64) == "cudnn"
    assert impl("auto", jnp.bfloat16, 12) == "xla"  # head dim not a multiple of 8
    assert impl("cudnn", jnp.float16, 256) == "cudnn"
    with pytest.raises(ValueError, match="float16/bfloat16"):
        impl("cudnn", jnp.float32, 64)
    with pytest.raises(ValueError, match="multiple of 8"):
        impl("cudnn", jnp.bfloat16, 260)
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"one of \('xla', 'cudnn', 'auto'\), got 'flash'"):
        impl("flash", jnp.bfloat16, 64)
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="needs a GPU"):
            impl("cudnn", jnp.bfloat16, 64)
        assert run("--attention", "cudnn", "--steps", 2) == 2
        assert "--attention cudnn" in capsys.readouterr().err


@pytest.mark.gpu
def test_cudnn_attention_matches_xla():
    """On a GPU the cuDNN attention model gives the XLA attention model's loss and gradients."""
    import jax.numpy as jnp
    import optax

    import gpt_model
    import model

    if jax.default_backend() != "gpu":
        pytest.skip("needs a GPU")
    base = dict(n_layer=2, n_head=4, n_embd=256, block_size=256, dtype=jnp.bfloat16)
    idx = jax.random.randint(jax.random.key(0), (4, 256), 0, 256)
    models = {a: model.GPT(gpt_model.GPTConfig(**base, attention=a)) for a in ("xla", "cudnn")}
    v = models["xla"].init(jax.random.key(1), idx)

    def loss(m):
        return lambda p: optax.softmax_cross_entropy_with_integer_labels(
            m.apply(dict(v, params=p), idx)[:, :-1], idx[:, 1:]).mean()

    (lx, gx), (lc, gc) = (jax.jit(jax.value_and_grad(loss(models[a])))(v["params"]) for a in ("xla", "cudnn"))
    np.testing.assert_allclose(float(lc), float(lx), rtol=2e-3)
    for a, b in zip(jax.tree.leaves(gc), jax.tree.leaves(gx)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        # bf16 attention kernels differ elementwise at bf16 precision: compare relative norms
        # (a wrong kernel — e.g. not causal — is off by O(1)).
        assert np.linalg.norm(a - b) <= 0.03 * np.linalg.norm(b) + 1e-6, np.linalg.norm(a - b) / np.linalg.norm(b)


def test_grad_accum_matches_one_batch(tmp_path, capsys):
    """--grad-accum 4 (micro-batches of 2) trains the same dense model as one batch of 8, up to
    float summation order; a batch not divisible by it is a CLI error."""
    import jax.numpy as jnp

    def params_after(accum):
        hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args(
            [*TINY, "--steps", "3", "--grad-accum", str(accum)]), "dense")
        hp["data_sha256"] = "test"
        exp = train_gpt.build_experiment(hp)
        step = jax.jit(gpt_experiment.make_train_step(exp, None))
        state = gpt_experiment.init_state(exp, 0)
        tok = jax.random.randint(jax.random.key(3), (8, 33), 0, 256, dtype=jnp.int32)
        losses = []
        for _ in range(3):
            state, m = step(state, tok)
            losses.append((float(m["loss"]), float(m["grad_norm"])))
        return state["params"], losses

    (p1, l1), (p4, l4) = params_after(1), params_after(4)
    np.testing.assert_allclose(l4, l1, rtol=1e-5)  # mean loss and the norm of the mean gradient
    # Adam divides by sqrt(v): where a gradient is ~0 the summation order moves its update by a fraction of the
    # learning rate (3 steps of at most 3e-3; seen: 1.8e-5), elsewhere the weights agree to float32 noise
    for a, b in zip(jax.tree.leaves(p4), jax.tree.leaves(p1)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=5e-5)
    assert l1[-1][0] < l1[0][0]  # the steps did update the model
    assert run("--grad-accum", 3, "--steps", 2, "--out", tmp_path / "g") == 2
    assert "multiple of --grad-accum 3" in capsys.readouterr().err
    assert run("--grad-accum", 0, "--steps", 2, "--out", tmp_path / "g") == 2


def test_grad_accum_sparse_recipe_trains(tmp_path):
    """srste with MVUE (a key per micro-batch) and --grad-accum 2: trains, and resumes."""
    out = tmp_path / "ga"
    assert run("--recipe", "srste", "--grad-accum", 2, "--steps", 8, "--eval-every", 8, "--out", out) == 0
    vals = [r["val_loss"] for r in history(out) if "val_loss" in r]
    assert vals[-1] < vals[0] - 0.3, vals


def experiment(recipe: str, *flags):
    """The TINY experiment of ``recipe`` with extra command-line ``flags``."""
    hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args([*TINY, *map(str, flags)]), recipe)
    hp["data_sha256"] = "test"
    return train_gpt.build_experiment(hp)


def params_after_steps(recipe: str, *flags, steps: int = 3):
    """(params, loss of the last step) after ``steps`` jitted train steps of the TINY model (sparse
    phase, 64 tokens per device planned) on one fixed batch."""
    import jax.numpy as jnp

    exp = experiment(recipe, "--steps", steps, *flags)
    step = jax.jit(gpt_experiment.make_train_step(exp, exp.sparse_at(0, 1), 64))
    state = gpt_experiment.init_state(exp, 0)
    tok = jax.random.randint(jax.random.key(3), (8, 33), 0, 256, dtype=jnp.int32)
    for _ in range(steps):
        state, m = step(state, tok)
    return state["params"], float(m["loss"])


@pytest.fixture
def prepare_calls(monkeypatch):
    """The keyword arguments of every ``jax_sparse24.preparation.prepare`` call the train steps trace."""
    from jax_sparse24 import preparation

    calls = []
    real = preparation.prepare
    monkeypatch.setattr(preparation, "prepare", lambda *a, **k: calls.append(k) or real(*a, **k))
    return calls


def assert_same_training(a, b):
    """Equal up to float rounding, not bit for bit: XLA may fuse the weight work differently once it
    is outside the GEMM calls (sste's β·S(w) differed by one ulp in the loss on jax 0.10.2's CPU
    backend)."""
    (p_a, l_a), (p_b, l_b) = a, b
    np.testing.assert_allclose(l_a, l_b, rtol=1e-6)
    for x, y in zip(jax.tree.leaves(p_a), jax.tree.leaves(p_b)):
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("recipe", ["srste", "sste"])
def test_grad_accum_prepared_weights_change_nothing(recipe, prepare_calls):
    """--prepare-weights on (the default with --grad-accum > 1) prepares every sparse layer once per
    step and trains as off does (same math, done once instead of per micro-batch)."""
    on = params_after_steps(recipe, "--grad-accum", 2, "--prepare-weights", "on")
    assert prepare_calls == [{"sparse": True, "tokens": 64, "reuse": 2}]  # traced once, in the step
    off = params_after_steps(recipe, "--grad-accum", 2, "--prepare-weights", "off")
    assert len(prepare_calls) == 1
    assert_same_training(on, off)


@pytest.mark.parametrize("recipe", ["srste", "ste"])
def test_prepare_weights_always_without_grad_accum(recipe, prepare_calls):
    """--prepare-weights always prepares the weights once per step at --grad-accum 1 too (reuse 1:
    read by the forward and the backward GEMMs) and trains as off does (each GEMM call masking and
    compressing its weight). srste reads its stored masks, ste recomputes them from |W|."""
    always = params_after_steps(recipe, "--prepare-weights", "always")
    assert prepare_calls == [{"sparse": True, "tokens": 64, "reuse": 1}]
    off = params_after_steps(recipe, "--prepare-weights", "off")
    assert len(prepare_calls) == 1
    assert_same_training(always, off)


def test_prepare_weights_default_per_size():
    """--prepare-weights: always at the GPT-2 sizes (measured faster there), on at the other sizes; a
    flag on the command line wins."""
    def resolved(size, *flags):
        args = train_gpt.build_parser().parse_args(["--size", size, *flags])
        return train_gpt.resolve_flags(args, "srste")["prepare_weights"]

    assert resolved("gpt2-medium") == "always" and resolved("gpt2") == "always" and resolved("tiny") == "on"
    assert resolved("llama-1b") == "on"
    assert resolved("gpt2-medium", "--prepare-weights", "off") == "off"
    assert resolved("gpt2", "--prepare-weights", "on") == "on"


def test_prepare_weights_always_only_where_the_model_runs_sparse(prepare_calls, tmp_path):
    """always prepares nothing where nothing is 2:4 in the step: dense models (the same program as
    off), fp8 layers (nn.prepare skips them), ast's low-rank layers, and the dense phases (srste's
    fine-tune, STEP's first phase: sparse=False); on keeps needing --grad-accum > 1."""
    import jax.numpy as jnp

    def traced(exp, sparse):
        st = jax.eval_shape(lambda: gpt_experiment.init_state(exp, 0))
        tok = jax.ShapeDtypeStruct((8, 33), jnp.int32)
        return str(jax.make_jaxpr(gpt_experiment.make_train_step(exp, sparse, 64))(st, tok))

    dense = {how: traced(experiment("dense", "--prepare-weights", how), None) for how in ("always", "off")}
    assert dense["always"] == dense["off"]
    srste = experiment("srste", "--prepare-weights", "always")
    traced(srste, False)  # the dense fine-tune
    traced(experiment("step", "--prepare-weights", "always"), False)  # STEP before its switch
    fp8 = experiment("srste", "--prepare-weights", "always", "--fp8")
    traced(fp8, True)
    assert prepare_calls == []
    ast = experiment("ast", "--prepare-weights", "always", "--teacher", tmp_path)
    assert not any(map(gpt_experiment.prepares_weights, (fp8, ast, experiment("dense", "--prepare-weights", "always"))))
    assert gpt_experiment.prepares_weights(srste) and not gpt_experiment.prepares_weights(experiment("srste"))
    assert gpt_experiment.prepares_weights(experiment("srste", "--grad-accum", 2))
    traced(srste, True)  # the sparse phase does prepare: the spy sees it
    assert prepare_calls == [{"sparse": True, "tokens": 64, "reuse": 1}]


@pytest.mark.parametrize("recipe", ["srste", "sste", "ste", "step"])
def test_train_step_has_no_conditional(recipe):
    """No lax.cond in the train program (on a GPU the host reads a conditional's predicate and waits
    for the device, once per step): the srste refresh and the ste/soft flip rate run in programs of
    their own (Runtime.run_step), STEP's phase bookkeeping is a select."""
    import jax.numpy as jnp

    exp = experiment(recipe)
    st = jax.eval_shape(lambda: gpt_experiment.init_state(exp, 0))
    tok = jax.ShapeDtypeStruct((8, 33), jnp.int32)
    for sparse in ({True, False} if recipe in ("srste", "step") else {True}):
        assert "cond[" not in str(jax.make_jaxpr(gpt_experiment.make_train_step(exp, sparse, 64))(st, tok))


def test_checkpoint_config_without_grad_accum(tmp_path):
    """A checkpoint written before --grad-accum existed resumes as --grad-accum 1, and only so."""
    now = {"recipe": "dense", "grad_accum": 1, "sparse_lr_scale": 1.0}
    gpt_checkpoints.check_config({"recipe": "dense"}, now, tmp_path)
    with pytest.raises(train_gpt.CLIError, match="grad_accum=1 in the checkpoint but 2 now"):
        gpt_checkpoints.check_config({"recipe": "dense"}, dict(now, grad_accum=2), tmp_path)


def test_sparse_lr_scale_flag():
    """--sparse-lr-scale (default 2 on the tiny size): the 2:4 kernels of srste/sste/ste move that many times as far
    per step as the dense kernels (srste: until the dense fine-tune); 1 (and dense/step, which do not
    use it, whatever the flag) leaves every update as AdamW's; the value is in the checkpoint config."""
    import jax.numpy as jnp

    def first_update(recipe, *flags):
        args = train_gpt.build_parser().parse_args(["--size", "tiny", "--n-layer", "1", "--n-embd", "32", "--n-head", "2",
                                                    "--warmup", "0", *flags])
        hp = train_gpt.resolve_flags(args, recipe)
        exp = train_gpt.build_experiment(hp)
        params = jax.tree.map(jnp.zeros_like, gpt_experiment.init_state(exp, 0)["params"])
        grads = jax.tree.map(jnp.ones_like, params)
        u, _ = exp.tx.update(grads, exp.tx.init(params), params)
        ratio = float(jnp.abs(u["h"]["mlp"]["fc"]["kernel"]).max() / jnp.abs(u["h"]["attn"]["qkv"]["kernel"]).max())
        return ratio, hp["sparse_lr_scale"]

    for recipe in ("srste", "sste", "ste"):
        ratio, scale = first_update(recipe)
        assert scale == 2.0 and abs(ratio - 2) < 1e-5, recipe
    assert abs(first_update("srste", "--sparse-lr-scale", "3")[0] - 3) < 1e-5
    assert abs(first_update("srste", "--finetune-fraction", "1")[0] - 1) < 1e-5  # dense from step 0: not scaled
    for recipe, flags in (("srste", ("--sparse-lr-scale", "1")), ("dense", ()), ("step", ("--sparse-lr-scale", "3"))):
        ratio, scale = first_update(recipe, *flags)
        assert scale == 1.0 and abs(ratio - 1) < 1e-5, recipe
    assert run("--size", "tiny", "--sparse-lr-scale", "0", "--steps", "1") == 2
    # the default by size, recipe and dense-tail length (train_gpt.default_sparse_lr_scale): 1 for sste/ste and
    # for srste with a dense second half beyond the tiny sizes
    for size, recipe, flags, want in (
            ("gpt2", "srste", (), 2.0), ("gpt2", "sste", (), 1.0), ("gpt2", "ste", (), 1.0),
            ("llama-1b", "sste", (), 1.0), ("llama-tiny", "ste", (), 2.0), ("gpt2", "dense", (), 1.0),
            ("gpt2", "srste", ("--finetune-fraction", "0.5"), 1.0), ("gpt2", "srste", ("--finetune-fraction", "0.25"), 2.0),
            ("tiny", "srste", ("--finetune-fraction", "0.5"), 2.0), ("llama-1b", "srste", ("--finetune-fraction", "0.5"), 1.0)):
        hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args(["--size", size, *flags]), recipe)
        assert hp["sparse_lr_scale"] == want, (size, recipe, flags)
    hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args(["--size", "gpt2", "--sparse-lr-scale", "2"]),
                                 "sste")
    assert hp["sparse_lr_scale"] == 2.0
    # checkpoints written before the flag ran without it: they resume only with --sparse-lr-scale 1
    now = {"recipe": "srste", "grad_accum": 1, "sparse_lr_scale": 1.0}
    gpt_checkpoints.check_config({"recipe": "srste"}, now, Path("."))
    with pytest.raises(train_gpt.CLIError, match="sparse_lr_scale=1.0 in the checkpoint but 2.0 now"):
        gpt_checkpoints.check_config({"recipe": "srste"}, dict(now, sparse_lr_scale=2.0), Path("."))


def test_kernel_plan_per_sparse_layer(capsys, tmp_path, monkeypatch):
    """The example prints which kernel each GEMM of its sparse layers runs; with a mesh the plan is
    made for the per-device shapes (tokens over data, Megatron split over model)."""
    argv = [*TINY, "--steps", "2", "--sparse-attn", "--grad-accum", "2"]
    hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args(argv), "srste")
    hp["data_sha256"] = "test"
    exp = train_gpt.build_experiment(hp)
    seen = []
    monkeypatch.setattr(train_gpt.s24, "linear_plan", lambda t, i, o, *a, **k: seen.append((t, i, o, k)) or
                        {"forward": "f", "input_grad": "x", "weight_grad": "w"})
    plan = train_gpt.kernel_plan(train_gpt.make_runtime(exp))
    assert sorted(plan) == ["128x32", "32x128", "32x32", "32x96"]  # fc, proj, attn proj, qkv
    assert {s[0] for s in seen} == {8 // 2 * 32}  # tokens of one micro-batch
    assert all(k["transposable"] and k["mvue"] for *_, k in seen)
    assert {k["reuse"] for *_, k in seen} == {2}  # weights prepared once per step of 2 micro-batches
    # nn.prepare(batch="auto") batches them on one device only (planned at that pass's cost); this
    # process has 8 host devices
    assert {k["batched"] for *_, k in seen} == {False}
    seen.clear()
    monkeypatch.setattr(sys.modules["gpt_runtime"], "_single_device", lambda: True)
    train_gpt.kernel_plan(train_gpt.make_runtime(exp))
    assert {k["batched"] for *_, k in seen} == {True}
    seen.clear()
    for changes, reuse in ((dict(prepare_weights="off"), None), (dict(grad_accum=1), None),
                           (dict(grad_accum=1, prepare_weights="always"), 1), (dict(fp8=True), None)):
        train_gpt.kernel_plan(train_gpt.make_runtime(train_gpt.build_experiment(dict(hp, **changes))))
        assert {k["reuse"] for *_, k in seen} == {reuse}, changes  # as the train step prepares
        assert {k["batched"] for *_, k in seen} == {reuse is not None}, changes  # (one device, patched)
        seen.clear()

    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT / 'benchmarks' / 'harness')!r})
import train_gpt
hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args({argv!r}), "srste")
hp["data_sha256"] = "test"
seen = []
train_gpt.s24.linear_plan = lambda t, i, o, *a, **k: seen.append((t, i, o)) or {{}}
train_gpt.kernel_plan(train_gpt.make_runtime(train_gpt.build_experiment(hp), train_gpt.parse_mesh("data=2,model=2")))
print(json.dumps(seen))
"""
    env = four_cpu_devices_env()
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    local = {(i, o) for _, i, o in seen}
    assert {s[0] for s in seen} == {8 // 2 // 2 * 32}
    assert local == {(32, 64), (64, 32), (32, 48), (16, 32)}  # fc, proj, qkv split out; proj in
    monkeypatch.undo()
    assert run("--recipe", "ste", "--steps", 1, "--out", tmp_path / "p") == 0  # TINY is --quiet
    assert "GEMMs per sparse layer" not in capsys.readouterr().err
    argv = [a for a in TINY if a != "--quiet"] + ["--recipe", "ste", "--steps", "1", "--out", str(tmp_path / "q")]
    assert train_gpt.main(argv) == 0
    err = capsys.readouterr().err
    assert "ste GEMMs per sparse layer" in err and "32x128: fwd dense, dx dense, dW dense (exact)" in err


def test_step_loop_freezes_gc_after_each_compile_and_unfreezes(tmp_path, monkeypatch):
    """After the first step of each program (srste: sparse, then the dense fine-tune) the loop moves
    the live objects out of the collector's reach; when training ends nothing stays frozen."""
    import gc

    calls = []
    real = gc.freeze
    monkeypatch.setattr(train_gpt.gc, "freeze", lambda: (calls.append("freeze"), real()))
    assert run("--recipe", "srste", "--steps", 12, "--eval-every", 12, "--ckpt-every", 0, "--out", tmp_path / "r") == 0
    assert len(calls) == 2  # one per compiled program: the sparse phase and the dense fine-tune
    assert gc.get_freeze_count() == 0


def _llama_experiment(*flags, recipe="srste"):
    args = train_gpt.build_parser().parse_args(["--size", "llama-tiny", *flags])
    return train_gpt.build_experiment(train_gpt.resolve_flags(args, recipe))


def test_llama_size_builds_the_llama_architecture():
    """llama sizes: RMSNorm, rotary positions (no wpe), SwiGLU of the preset width, no biases, an untied
    head, every linear layer 2:4 (attention projections included) unless --no-sparse-attn."""
    import jax.numpy as jnp

    exp = _llama_experiment()
    cfg = exp.cfg
    assert (cfg.arch, cfg.ffn, cfg.ffn_hidden, cfg.use_bias, cfg.tie_head, cfg.sparse_attn) == (
        "llama", "swiglu", 352, False, False, True)
    v = exp.model.init(jax.random.key(0), jnp.zeros((2, 16), jnp.int32))
    p = v["params"]
    assert "wpe" not in p and "lm_head" in p
    assert set(p["h"]["ln_1"]) == {"scale"}  # RMSNorm (the blocks: one scanned stack of 2)
    assert set(p["h"]["attn"]["qkv"]) == {"kernel"} and p["h"]["mlp"]["fc"]["kernel"].shape == (2, 128, 2 * 352)
    assert set(v["sparsity"]["h"]) == {"attn", "mlp"}  # attention projections are 2:4 too
    assert not _llama_experiment("--no-sparse-attn").cfg.sparse_attn
    assert _llama_experiment("--ffn", "gelu").cfg.ffn == "gelu"  # a flag given wins over the preset
    gpt = train_gpt.build_experiment(train_gpt.resolve_flags(train_gpt.build_parser().parse_args(TINY), "srste"))
    assert (gpt.cfg.arch, gpt.cfg.ffn, gpt.cfg.sparse_attn, gpt.cfg.tie_head) == ("gpt", "gelu", False, True)


def test_llama_tiny_trains(tmp_path):
    out = tmp_path / "llama"
    assert run("--size", "llama-tiny", "--recipe", "srste", "--steps", "12", "--eval-every", "6",
               "--log-every", "6", "--ckpt-every", "0", "--out", str(out)) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_rotary_is_a_relative_position_rotation():
    """rotary keeps norms, and q·k after it depends only on the offset of the two positions."""
    from model import rotary

    key = jax.random.key(3)
    q = jax.random.normal(key, (1, 1, 1, 8))
    k = jax.random.normal(jax.random.fold_in(key, 1), (1, 1, 1, 8))
    pos = lambda x, t: rotary(jax.numpy.tile(x, (1, t, 1, 1)))  # noqa: E731  (x at positions 0..t-1)
    rq, rk = pos(q, 7), pos(k, 7)
    np.testing.assert_allclose(np.linalg.norm(rq, axis=-1), np.linalg.norm(np.tile(q, (1, 7, 1, 1)), axis=-1),
                               rtol=1e-5)
    dots = np.einsum("bthd,bshd->ts", np.asarray(rq), np.asarray(rk))
    np.testing.assert_allclose(dots[5, 2], dots[4, 1], rtol=1e-4)  # offset 3 both
    assert abs(dots[5, 2] - dots[5, 3]) > 1e-4  # a different offset gives a different product
    with pytest.raises(ValueError, match="even head dimension"):
        rotary(jax.numpy.ones((1, 2, 1, 3)))


def test_fp8_flag_trains_and_is_checkpointed_config(tmp_path, capsys):
    """--fp8: the 2:4 layers (and, for the dense recipe, the same layers as fp8 dense) are
    Sparse24Dense(fp8=True); it is part of the checkpointed config (a checkpoint without the key ran
    without fp8); refused with ast."""
    from jax_sparse24.nn import Sparse24Dense

    assert run("--recipe", "srste", "--fp8", "--steps", "3", "--eval-every", "3", "--out", tmp_path / "s") == 0
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["config"]["fp8"] is True and np.isfinite(summary["final_val_loss"])
    import model

    for recipe in ("dense", "srste"):
        exp = train_gpt.build_experiment(train_gpt.resolve_flags(
            train_gpt.build_parser().parse_args([*TINY, "--fp8"]), recipe))
        fc = exp.cfg.make_linear(128, "fc", True, 0.02, 32)
        assert isinstance(fc, Sparse24Dense) and fc.fp8 and fc.method == exp.cfg.method
        assert not isinstance(exp.cfg.make_linear(128, "head", False, 0.02, 32), Sparse24Dense)
    assert "fp8" in gpt_experiment.CONFIG_KEYS
    gpt_checkpoints.check_config({"recipe": "dense"}, {"recipe": "dense", "fp8": False}, tmp_path)
    with pytest.raises(train_gpt.CLIError, match="fp8=False in the checkpoint but True now"):
        gpt_checkpoints.check_config({"recipe": "dense"}, {"recipe": "dense", "fp8": True}, tmp_path)
    assert run("--recipe", "ast", "--fp8", "--teacher", tmp_path, "--out", tmp_path / "a") == 2
    assert "--fp8 is not supported with --recipe ast" in capsys.readouterr().err


def test_fp8_delayed_scaling_trains_accumulates_and_resumes_bit_exact(tmp_path, capsys):
    """--fp8 --fp8-scaling delayed: the layers keep amax histories in the train state (checkpointed:
    a resumed run is bit-exact), the micro-batches of --grad-accum combine their new histories by
    maximum, the flag is part of the checkpointed config (older checkpoints ran current scaling), and
    it needs --fp8."""
    from jax_sparse24 import nn as s24nn

    steps = ["--steps", 6, "--eval-every", 3, "--ckpt-every", 3, "--grad-accum", 2, "--mask-every", 2]
    flags = ["--recipe", "srste", "--fp8", "--fp8-scaling", "delayed", *steps]
    a, b = straight_and_resumed(flags, tmp_path, stop_at=3)
    hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args([*TINY, *map(str, flags[2:])]), "srste")
    assert hp["fp8_scaling"] == "delayed"
    meta = assert_same_checkpoints(hp, a / "ckpt", b / "ckpt", 6)["fp8_meta"]
    hists = [v for path, v in jax.tree_util.tree_leaves_with_path(meta) if "amax_history" in jax.tree_util.keystr(path)]
    assert hists and all(int((np.asarray(h) > 0).sum()) == 6 for h in hists)  # one entry per optimizer step
    # the micro-batches' new states were combined by maximum: the kernel amaxes of the 6 steps stay
    # within a few percent of each other (the weights barely move), where a sum would double the whole
    # history every step (the oldest entry 2^5 times its amax)
    for h in [v for p, v in jax.tree_util.tree_leaves_with_path(meta) if "kernel_amax_history" in jax.tree_util.keystr(p)]:
        h = np.asarray(h)[np.asarray(h) > 0]
        assert h.max() / h.min() < 1.5, h
    # and the scale step 6 used came from the amaxes of steps 1-5 (history[1:])
    for leaf_path, scale in jax.tree_util.tree_leaves_with_path(meta):
        name = jax.tree_util.keystr(leaf_path)
        if name.endswith("_scale']"):
            hist = _get_path(meta, leaf_path[:-1])[name.rsplit("['", 1)[1][:-2].replace("_scale", "_amax_history")]
            scale = np.asarray(scale).reshape(-1)  # one per layer (a scanned stack: a leading layer axis)
            np.testing.assert_allclose(scale, np.max(np.asarray(hist).reshape(scale.size, -1)[:, 1:], axis=1) / 448.0,
                                       rtol=1e-6, err_msg=name)
    exp = train_gpt.build_experiment(hp)
    assert s24nn.FP8_META in exp.model.init(jax.random.key(0), np.zeros((1, 32), np.int32))
    gpt_checkpoints.check_config({"recipe": "dense"}, {"recipe": "dense", "fp8_scaling": "current"}, tmp_path)
    assert run("--recipe", "srste", "--fp8-scaling", "delayed", "--out", tmp_path / "c") == 2
    assert "--fp8-scaling delayed needs --fp8" in capsys.readouterr().err


def test_fp8_dense_flax_baseline_trains_and_keeps_flax_state(tmp_path, capsys):
    """--recipe dense --fp8 --fp8-scaling delayed --fp8-dense flax: the fp8 layers are Flax's own
    nn.Dense(dot_general_cls=Fp8DirectDotGeneralOp), its state (Flax's variables in the same
    collection) goes through the example's delayed-scaling path: one history entry per optimizer step
    with --grad-accum 2 (micro-batches combined, not summed), a bit-exact resume; the flag is part of
    the checkpointed config and refused where it means nothing."""
    import flax.linen as nn
    import model

    steps = ["--steps", 4, "--eval-every", 2, "--ckpt-every", 2, "--grad-accum", 2]
    flags = ["--recipe", "dense", "--fp8", "--fp8-scaling", "delayed", "--fp8-dense", "flax", *steps]
    a, b = straight_and_resumed(flags, tmp_path, stop_at=2)
    hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args([*TINY, *map(str, flags[2:])]), "dense")
    assert hp["fp8_dense"] == "flax"
    exp = train_gpt.build_experiment(hp)
    fc = exp.cfg.make_linear(128, "fc", True, 0.02, 32)
    assert type(fc) is nn.Dense and fc.dot_general_cls is nn.Fp8DirectDotGeneralOp
    meta = assert_same_checkpoints(hp, a / "ckpt", b / "ckpt", 4)["fp8_meta"]
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(meta)]
    assert paths and all("Fp8DirectDotGeneralOp_0" in p for p in paths)  # Flax's layer owns the state
    hists = [v for p, v in jax.tree_util.tree_leaves_with_path(meta) if "kernel_amax_history" in jax.tree_util.keystr(p)]
    assert hists and all(int((np.asarray(h) > 0).sum()) == 4 for h in hists)  # one entry per optimizer step
    for h in hists:  # combined by maximum (a sum would double the history every step)
        h = np.asarray(h)[np.asarray(h) > 0]
        assert h.max() / h.min() < 1.5, h
    with pytest.raises(train_gpt.CLIError, match="'sparse24' in the checkpoint but 'flax' now"):
        gpt_checkpoints.check_config({"recipe": "dense"}, {"recipe": "dense", "fp8_dense": "flax"}, tmp_path)
    assert run("--recipe", "dense", "--fp8", "--fp8-dense", "flax", "--out", tmp_path / "c") == 2
    assert "add --fp8-scaling delayed" in capsys.readouterr().err
    assert run("--recipe", "srste", "--fp8", "--fp8-scaling", "delayed", "--fp8-dense", "flax",
               "--out", tmp_path / "d") == 2
    assert "chooses the fp8 layer of the dense recipe with --fp8 (got recipe srste with --fp8)" in capsys.readouterr().err
    # under --compare it is the dense recipe's layer; the 2:4 recipe keeps its own (the pairing to time)
    args = train_gpt.build_parser().parse_args([*TINY, "--compare", "dense,srste", "--fp8", "--fp8-scaling", "delayed",
                                                 "--fp8-dense", "flax"])
    assert [train_gpt.resolve_flags(args, r)["fp8_dense"] for r in ("dense", "srste")] == ["flax", "sparse24"]
    with pytest.raises(ValueError, match="fp8_dense must be one of"):
        dataclasses.replace(exp.cfg, fp8_dense="cublas")
    for bad in (dict(method="srste"), dict(fp8=False), dict(fp8_scaling="current")):
        with pytest.raises(ValueError, match="fp8_dense='flax' .* needs method='dense', fp8=True and fp8_scaling"):
            dataclasses.replace(exp.cfg, **bad)


def test_finetune_start(tmp_path, capsys):
    """--finetune-start masked / masked-reset: at the first dense step (12 of 24 with --finetune-fraction
    0.5) the srste kernels are pruned to their masks (masked-reset: their Adam moments too), nothing
    else changes; it runs once: a resume at the switch or past it is bit-exact with the straight run;
    the value is part of the checkpointed config."""
    half = [*STEPS[:-2], "--mask-every", 4, "--finetune-fraction", 0.5]  # switch at 12 (a mask refresh step)

    def go(start, out, *extra):
        return run("--recipe", "srste", *half, "--finetune-start", start, "--out", tmp_path / out, *extra)

    def load(out, step, start="weights"):
        hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args(
            [*TINY, *map(str, half), "--finetune-start", start]), "srste")
        exp = train_gpt.build_experiment(hp)
        abstract = jax.eval_shape(lambda: gpt_experiment.init_state(exp, hp["seed"]))
        return exp, train_gpt.Checkpoints(tmp_path / out / "ckpt").restore(step, abstract)[0]

    for start in ("weights", "masked", "masked-reset"):
        assert go(start, f"{start}12", "--stop-at", 12) == 0
    exp, a = load("weights12", 12)
    assert exp.switch_step == 12 and exp.sparse_at(11, 0) and not exp.sparse_at(12, 0)
    masks = masks_for_params(a["params"], a["sparsity"])
    n_pruned = 0

    def sparse_kernel_mask(keys):
        """The mask of a sparse layer's kernel whose path (in params, or in an Adam moment) ends ``keys``."""
        for p in exp.sparse_paths:
            if tuple(keys[-len(p) - 1:]) == (*p, "kernel"):
                return np.asarray(gpt_experiment.subtree(masks, p)["kernel"])
        return None

    def check(start, b):
        nonlocal n_pruned
        flat_b = dict(jax.tree_util.tree_flatten_with_path(b)[0])
        for path, x in jax.tree_util.tree_flatten_with_path(a)[0]:
            keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
            x, y, m = np.asarray(x), np.asarray(flat_b[path]), sparse_kernel_mask(keys)
            if m is not None and (keys[0] == "params" or (start == "masked-reset" and keys[0] == "opt_state")):
                assert (x[~m] != 0).any(), keys  # something to prune
                np.testing.assert_array_equal(y, np.where(m, x, 0), err_msg=str(keys))
                n_pruned += 1
            else:
                np.testing.assert_array_equal(y, x, err_msg=str(keys))

    for start in ("masked", "masked-reset"):
        _, b = load(f"{start}12", 12, start)
        check(start, b)
    n_kernels = len(exp.sparse_paths)
    assert n_pruned == n_kernels + 3 * n_kernels  # masked: params; masked-reset: params + mu + nu

    # the val loss at the switch: the dense model of the pruned state = the 2:4 model of the unpruned one
    tok = [train_gpt.ByteData(train_gpt.DEFAULT_DATA, 32, 8, 0, 1).val_batches[0]]
    sparse_val = float(gpt_experiment.make_eval_step(exp, True)(a, tok[0]))
    val12 = {s: [r["val_loss"] for r in history(tmp_path / f"{s}12") if r["step"] == 12 and "val_loss" in r][0]
             for s in ("weights", "masked")}
    assert abs(val12["masked"] - sparse_val) < 5e-6 and abs(val12["weights"] - sparse_val) > 2e-5, (val12, sparse_val)

    # once: straight == stopped at the switch + resumed == stopped past it + resumed, bit for bit
    assert go("masked", "straight") == 0
    assert go("masked", "masked12", "--resume") == 0
    assert go("masked", "past", "--stop-at", 16) == 0
    assert go("masked", "past", "--resume") == 0
    _, s = load("straight", 24, "masked")
    # pruned once, not at every dense step: the fine-tune grew the pruned weights back
    end_masks = masks_for_params(s["params"], s["sparsity"])
    for p in exp.sparse_paths:
        w, m = (np.asarray(gpt_experiment.subtree(t, p)["kernel"]) for t in (s["params"], end_masks))
        assert (w[~m] != 0).mean() > 0.5, p
    for out in ("masked12", "past"):
        _, r = load(out, 24, "masked")
        for x, y in zip(jax.tree.leaves(s), jax.tree.leaves(r)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert history(tmp_path / out) == history(tmp_path / "straight")
    # and it changed the run: the straight weights run ends elsewhere
    assert go("weights", "weights12", "--resume") == 0
    assert history(tmp_path / "weights12")[-1] != history(tmp_path / "straight")[-1]

    # part of the config: another value does not resume; older checkpoints resume as "weights"
    capsys.readouterr()
    assert go("masked-reset", "masked12", "--resume") == 2
    assert "finetune_start='masked' in the checkpoint but 'masked-reset' now" in capsys.readouterr().err
    now = {"recipe": "srste", "grad_accum": 1, "sparse_lr_scale": 1.0, "finetune_start": "weights"}
    gpt_checkpoints.check_config({"recipe": "srste"}, now, tmp_path)
    with pytest.raises(train_gpt.CLIError, match="finetune_start='weights' in the checkpoint but 'masked' now"):
        gpt_checkpoints.check_config({"recipe": "srste"}, dict(now, finetune_start="masked"), tmp_path)
    # recipes without a fine-tune store "weights" whatever the flag
    hp = train_gpt.resolve_flags(train_gpt.build_parser().parse_args([*TINY, "--finetune-start", "masked"]), "dense")
    assert hp["finetune_start"] == "weights"


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
                if c.strip().startswith(("python examples/", "python benchmarks/"))]
    assert len(commands) >= 4 and sum("train_gpt.py" in c for c in commands) >= 3
    for c in commands:
        argv = shlex.split(c)
        if "train_gpt.py" in c:
            ap.parse_args(argv[argv.index(next(a for a in argv if a.endswith("train_gpt.py"))) + 1:])
