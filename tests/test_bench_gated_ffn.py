"""benchmarks/bench_gated_ffn.py on the CPU: the measured ops compute the SwiGLU math, and the
script writes its JSON + markdown."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_gated_ffn as bg  # noqa: E402


def test_gate_forward_backward_is_swiglu():
    ka, kb = jax.random.split(jax.random.key(0))
    ab = jax.random.normal(ka, (16, 2 * 24), jnp.float32)
    dy = jax.random.normal(kb, (16, 24), jnp.float32)
    y, dab = bg.gate_fwd_bwd(ab, dy)
    a, g = np.asarray(ab[:, :24], np.float64), np.asarray(ab[:, 24:], np.float64)
    sig = 1 / (1 + np.exp(-a))
    np.testing.assert_allclose(np.asarray(y), a * sig * g, rtol=1e-5, atol=1e-6)
    da = np.asarray(dy) * g * (sig + a * sig * (1 - sig))
    np.testing.assert_allclose(np.asarray(dab), np.concatenate([da, np.asarray(dy) * a * sig], 1), rtol=1e-4, atol=1e-5)


def test_hidden_size_matches_the_example():
    sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]
    import gpt_model

    for d in (768, 1024, 1280):
        assert bg.swiglu_hidden(d) == gpt_model.GPTConfig(n_embd=d, ffn="swiglu").ffn_hidden


def test_script_writes_results(tmp_path):
    bg.main(["--dims", "32", "--tokens", "64", "--trials", "2", "--out", str(tmp_path)])
    rec = json.loads((tmp_path / "gated_ffn.json").read_text())["records"][0]
    assert rec["d"] == 32 and rec["hidden"] == 128 and 0 < rec["gate_share"] and rec["ffn_ms"] > 0
    assert "| 32 | 128 |" in (tmp_path / "gated_ffn.md").read_text()
