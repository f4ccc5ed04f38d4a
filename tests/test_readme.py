"""Every Python snippet of the README runs as written on a CPU and trains: a loop that prints a falling loss.
The Linen and the NNX snippet train the same model on the same data with the same optimizer, so they print
about the same losses. The swap snippet of docs/swap_and_prune.md runs too."""

from __future__ import annotations

import contextlib
import inspect
import io
import pathlib
import re

import jax
import numpy as np
import pytest
from flax import nnx

import jax_sparse24 as s24

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SWAP_DOC = ROOT / "docs" / "swap_and_prune.md"


def _blocks(path: pathlib.Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def _run(code: str, path: pathlib.Path) -> tuple[dict, list[float]]:
    """Run a snippet; its namespace and the losses it printed (``... loss 0.1234`` lines)."""
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(path), "exec"), ns)  # noqa: S102 - our own docs
    return ns, [float(v) for v in re.findall(r"loss (\d+\.\d+)", out.getvalue())]


@pytest.fixture(scope="module")
def readme_runs():
    blocks = _blocks(README)
    assert len(blocks) == 2, "the README has a Linen and an NNX snippet; add a test for a new one"
    runs = {}
    for code in blocks:
        api = "nnx" if "flax import nnx" in code else "linen"
        if api == "nnx" and "model" not in inspect.signature(nnx.Optimizer.update).parameters:
            code = code.replace("optimizer.update(model, grads,", "optimizer.update(grads,")  # flax 0.10
        runs[api] = _run(code, README)
    return runs


@pytest.mark.parametrize("api", ["linen", "nnx"])
def test_readme_snippet_trains(readme_runs, api):
    ns, losses = readme_runs[api]
    assert len(losses) >= 5 and all(np.isfinite(losses))
    assert losses[-1] < 0.25 * losses[0], losses  # it trained
    assert max(losses[1:]) < losses[0], losses  # no spike above the starting loss
    model = ns["model"]
    if api == "linen":
        state = ns["state"]
        assert int(state.step) == 100
        for name in ("Sparse24Dense_0", "Sparse24Dense_1"):  # refreshed at step 80 from the kernels of then
            mask = np.asarray(state.sparsity[name]["transposable_mask"])
            assert (mask.reshape(-1, 4, mask.shape[-1]).sum(axis=1) == 2).all()
    else:
        for layer in (model.up, model.down):
            mask = np.asarray(s24.nnx._get(layer.mask))
            assert (mask.reshape(-1, 4, mask.shape[-1]).sum(axis=1) == 2).all()


def test_readme_snippets_agree(readme_runs):
    """Same model, data and optimizer in both APIs: the same loss curve up to initialisation."""
    (_, linen), (_, nnx) = readme_runs["linen"], readme_runs["nnx"]
    assert len(linen) == len(nnx)
    np.testing.assert_allclose(linen, nnx, rtol=0.5)
    for code in _blocks(README):
        assert "sparse_lr_scale(2.0)" in code and "masked_decay(2e-2)" in code and "adamw(3e-3)" in code


def test_swap_snippet_runs():
    """swap -> train -> unswap on an existing model, as docs/swap_and_prune.md shows it."""
    (code,) = [b for b in _blocks(SWAP_DOC) if "swap.swap_dense(" in b]
    ns, _ = _run(code, SWAP_DOC)
    params, sparsity, x = ns["params"], ns["sparsity"], ns["x"]
    assert set(sparsity) == {"fc1", "fc2"}  # the head was excluded and stayed dense
    assert float(ns["loss"]) < np.log(10) - 0.2  # it trained
    pruned = ns["pruned"]
    for name in ("fc1", "fc2"):  # exactly 2 of every 4 kept along the inputs
        nz = np.asarray(pruned[name]["kernel"] != 0).reshape(-1, 4, 256).sum(axis=1)
        assert (nz <= 2).all() and nz.mean() > 1.9
    np.testing.assert_array_equal(pruned["head"]["kernel"], params["head"]["kernel"])
    sparse_logits = ns["model"].apply({"params": params, "sparsity": sparsity}, x)
    np.testing.assert_allclose(ns["logits"], sparse_logits, rtol=1e-5, atol=1e-5)
    assert type(ns["dense_model"]).__name__ == "Classifier"
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree_util.tree_leaves(params))
