"""The example's optimizer decays kernels and embeddings only — also in the scanned stack, whose
biases and norm scales carry a leading layer axis (rank 2) but are not matrices."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]

import train_gpt  # noqa: E402


@pytest.mark.parametrize("layers", ["scan", "unroll"])
def test_weight_decay_skips_biases_and_norms(layers):
    args = train_gpt.build_parser().parse_args(["--size", "tiny", "--n-layer", "2", "--layers", layers,
                                                "--warmup", "0", "--weight-decay", "0.5", "--grad-clip", "0"])
    hp = dict(train_gpt.resolve_flags(args, "dense"), data_sha256="-")
    exp = train_gpt.build_experiment(hp)
    params = exp.model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
    params = jax.tree.map(jnp.ones_like, params)
    updates, _ = exp.tx.update(jax.tree.map(jnp.zeros_like, params), exp.tx.init(params), params)
    decayed = {jax.tree_util.keystr(p): bool(np.any(np.asarray(u) != 0))
               for p, u in jax.tree_util.tree_leaves_with_path(updates)}
    kernels = [k for k in decayed if k.endswith("['kernel']") or "embedding" in k]
    others = [k for k in decayed if ("bias" in k or "scale" in k)]
    assert kernels and others, decayed
    assert all(decayed[k] for k in kernels), {k: decayed[k] for k in kernels}
    assert not any(decayed[k] for k in others), {k: decayed[k] for k in others if decayed[k]}
