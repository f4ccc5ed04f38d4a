"""Tests for examples/train.py (CPU; a one-layer model of width 32 trained for a few steps)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]

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
    assert run("--compare", "dense,srste", "--steps", 6, "--eval-every", 3, "--ckpt-every", 3, "--n-layer", 2,
               "--out", out) == 0
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
    err = error_of(capsys, "--recipe", "dense", "--out", out)  # README command 1 run twice: says what to do
    assert "holds a previous run" in err and "--resume to continue it, --overwrite to replace it" in err
    assert (out / "summary.json").read_bytes() == before
    assert train.parse_args(["--size", "test", "--out", str(out), "--overwrite"]).overwrite


@pytest.mark.parametrize("argv, says", [
    (["--compare", "dense,nope"], "give distinct recipes"),
    (["--compare", "dense,dense"], "give distinct recipes"),
    (["--recipe", "nope"], "invalid choice"),
    (["--steps", "0"], "--steps must be > 0"),
    (["--eval-every", "0"], "--eval-every must be > 0"),
    (["--n-layer", "0"], "--n-layer must be > 0"),
    (["--ckpt-every", "-1"], "--ckpt-every must be >= 0"),
    (["--steps", "x"], "invalid int value"),
    (["--resume", "--overwrite"], "pass one of them"),
])
def test_bad_flags_are_one_line_exit_2(tmp_path, capsys, argv, says):
    out = tmp_path / "out"
    err = bad_input(capsys, *argv, "--out", out)
    assert err.startswith("train.py: error: ") and says in err, err
    assert not out.exists()


def error_of(capsys, *argv) -> str:
    """The one line of an error found after the flags were parsed (exit code 2)."""
    capsys.readouterr()
    assert run(*argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("train.py: error: "), err
    return err


def test_data_is_checked_before_out(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    # a missing --data is named even when --out is unusable too
    err = error_of(capsys, "--data", tmp_path / "nonexistent.txt", "--out", a_file)
    assert f"--data {tmp_path / 'nonexistent.txt'}: no such file" in err
    # a directory that is not a token directory: no advice to write into it (e.g. the source tree)
    err = error_of(capsys, "--data", ROOT / "examples", "--out", tmp_path / "o")
    assert "without index.json" in err and "--out DIR" in err and f"--out {ROOT / 'examples'}" not in err
    assert error_of(capsys, "--out", a_file).startswith(f"train.py: error: --out {a_file}: {a_file} is a file")
    assert "holds no checkpoints" in error_of(capsys, "--resume", "--out", tmp_path / "none")
    assert not (tmp_path / "o").exists() and not (tmp_path / "none").exists()


def test_interrupted_run_resumes_to_the_same_losses(tmp_path, capsys, monkeypatch):
    flags = ["--recipe", "srste", "--steps", 6, "--eval-every", 3, "--ckpt-every", 2]
    assert run(*flags, "--out", tmp_path / "whole") == 0
    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())["runs"][0]

    load_data = train.load_data

    def interrupting(*a, **kw):  # Ctrl-C while step 3 (0-based) is computed
        data = load_data(*a, **kw)
        batch = data.batch
        data.batch = lambda step: (setattr(train.STOP, "requested", step == 3 or train.STOP.requested), batch(step))[1]
        return data

    out = tmp_path / "cut"
    monkeypatch.setattr(train, "load_data", interrupting)
    capsys.readouterr()
    assert run(*flags, "--out", out) == 130
    err = capsys.readouterr().err.strip().splitlines()
    saved = f"train.py: interrupted at step 4 of srste: checkpoint saved in {(out / 'ckpt' / 'srste').resolve()}; "
    assert err[-1].startswith(saved + "continue with: python ") and err[-1].endswith(" --resume"), err
    assert not (out / "summary.json").exists()
    monkeypatch.setattr(train, "load_data", load_data)
    train.STOP.requested = False
    # the same command again is refused and says how to continue
    assert "pass --resume to continue it, --overwrite to replace it" in error_of(capsys, *flags, "--out", out)
    assert run(*flags, "--out", out, "--resume") == 0
    resumed = json.loads((out / "summary.json").read_text())["runs"][0]
    assert resumed["resumed_at"] == 4 and resumed["train_loss"] == whole["train_loss"]
    assert resumed["history"] == whole["history"] and resumed["final_val_loss"] == whole["final_val_loss"]
    # another run's flags are refused; --overwrite starts over
    capsys.readouterr()
    assert run(*flags[:2], "--steps", 8, "--out", out, "--resume") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: --resume: the checkpoint in" in err and "is of another run (steps 6 there, 8 now)" in err
    assert run(*flags, "--out", out, "--overwrite", "--ckpt-every", 0) == 0
    assert not (out / "ckpt").exists()


def test_mesh_run_matches_one_device(tmp_path, capsys):
    """--mesh data=2,fsdp=2,model=2 on 8 CPU devices (FSDP, tensor parallel, the activation pins): the losses
    of the one-device run; a mesh that does not fit the devices or the batch is one line naming it."""
    flags = ["--recipe", "ste", "--steps", 4, "--eval-every", 2, "--ckpt-every", 0]  # ste: the fewest programs
    assert run(*flags, "--out", tmp_path / "one") == 0
    assert run(*flags, "--mesh", "data=2,fsdp=2,model=2", "--out", tmp_path / "mesh") == 0
    one, mesh = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "mesh"))
    assert mesh["mesh"] == {"data": 2, "fsdp": 2, "model": 2}
    np.testing.assert_allclose(mesh["runs"][0]["train_loss"], one["runs"][0]["train_loss"], rtol=2e-4)
    assert "needs 3 devices, but 8 are available" in error_of(capsys, "--mesh", "model=3", "--out", tmp_path / "x")
    err = error_of(capsys, "--mesh", "data=8", "--batch-size", 4, "--out", tmp_path / "x")
    assert "--batch-size 4 is not divisible by the mesh's data x fsdp devices (8)" in err


def test_ctrl_c_at_any_moment_exits_130_with_one_line(tmp_path):
    """README command 1 (shortened) interrupted during the imports, the first compilation (SIGINT there used to
    crash the process: exit 139 in 10 of 14 tries) and training: exit 130, one line, no traceback. Runs in
    parallel; each is interrupted a different time after its first line (printed right before compiling)."""
    import signal
    import subprocess
    import time

    delays = [None, 0.2, 1.0, 2.5]  # None: during the imports (once jaxlib's library is loaded)
    procs = []
    for i, delay in enumerate(delays):
        cmd = [sys.executable, str(ROOT / "examples" / "train.py"), "--size", "tiny", "--n-layer", "1", "--steps", "1000",
               "--out", str(tmp_path / f"run{i}")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                      env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")))
    for p, delay in zip(procs, delays):
        if delay is None:
            t = time.monotonic()
            while "jaxlib" not in Path(f"/proc/{p.pid}/maps").read_text() and time.monotonic() - t < 60:
                time.sleep(0.01)
        else:
            p.first_line = p.stderr.readline()
            time.sleep(delay)
        p.send_signal(signal.SIGINT)
    for p, delay in zip(procs, delays):
        out, err = p.communicate(timeout=180)
        err = getattr(p, "first_line", "") + err
        lines = err.strip().splitlines()
        assert p.returncode == 130, (delay, p.returncode, err)
        assert "Traceback" not in err and lines[-1].startswith("train.py: interrupted "), (delay, err)
        assert sum("interrupted" in line for line in lines) == 1, err
        assert all(line.startswith("train.py: ") for line in lines), err
