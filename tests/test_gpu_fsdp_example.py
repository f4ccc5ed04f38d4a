"""GPU test of the example's FSDP program: the runtime's activation pins keep XLA from moving activations.

Needs 2 or more GPUs (``pytest -m gpu tests/test_gpu_fsdp_example.py``); compiles only (no step runs). The
reshard it guards against is a choice of XLA's GPU partitioner that its CPU partitioner does not make, so the
CPU tests (tests/test_distributed.py) check the constraints in the traced step and this one checks the compiled
program.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import jax
import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]


def _gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def fsdp_program_all_to_alls(devices, *, linear_pins: bool) -> int:
    """All-to-alls in the compiled train step of a LLaMA-7B-shaped dense model (2 layers, 2048 tokens per
    sequence, 4 sequences per device, vocabulary 32,000, ``--remat full``) under ``--mesh fsdp=2``; without
    ``linear_pins`` the runtime pins the blocks' activations only (``linear=None``)."""
    import gpt_runtime
    import train_gpt

    from jax_sparse24 import sharding as shd

    args = train_gpt.build_parser().parse_args(["--size", "llama-7b", "--n-layer", "2", "--batch-size", "8",
                                                "--seq-len", "2048", "--recipe", "dense", "--remat", "full"])
    hp = dict(train_gpt.resolve_flags(args, "dense"), data_sha256="-", vocab_size=32000)
    rt = gpt_runtime.make_runtime(train_gpt.build_experiment(hp), gpt_runtime.mesh_of_shape((1, 2, 1), devices=devices))
    with pytest.MonkeyPatch.context() as mp:
        if not linear_pins:
            pins = shd.batch_sharded_activations
            mp.setattr(shd, "batch_sharded_activations", lambda *a, **k: pins(*a, **{**k, "linear": None}))
        hlo = rt.train_step(False).lower(*rt.abstract_args()).compile().as_text()
    return len(re.findall(r"= \S+ all-to-all(?:-start)?\(", hlo))


def test_example_fsdp_step_moves_no_activation_on_gpus():
    """Without the linear layers' pins XLA's GPU partitioner moved the SwiGLU activations between the fc
    kernel's column sharding and the batch sharding (all-to-alls in the MLP's backward, 2 x H100); with them
    the program has none."""
    gpus = _gpus()
    if len(gpus) < 2:
        pytest.skip("needs 2 or more GPUs")
    control = fsdp_program_all_to_alls(gpus[:2], linear_pins=False)
    if control == 0:
        pytest.skip("XLA no longer moves these activations without the linear layers' pins: the test would not "
                    "see a regression (pick a shape where the control has all-to-alls)")
    assert fsdp_program_all_to_alls(gpus[:2], linear_pins=True) == 0
