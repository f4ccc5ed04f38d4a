"""The README's Python snippets run as written on a CPU: the linen and NNX train steps, swap -> train -> unswap."""

import inspect
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_sparse24 as s24

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _snippet(marker):
    """The first ```python block of the README containing ``marker``."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return next(code for code in blocks if marker in code)


def _run(code):
    ns: dict = {}
    exec(compile(code, str(README), "exec"), ns)  # noqa: S102 - our own README
    return ns


def test_readme_snippet_runs():
    ns = _run(_snippet("s24.nn.Sparse24Dense"))
    state = ns["state"].replace(step=jnp.asarray(39, jnp.int32))  # the update makes it 40: the masks refresh
    state, loss = ns["train_step"](state, ns["x"], ns["y"])
    assert int(state.step) == 40 and np.isfinite(float(loss))
    assert 0.0 < float(state.flip_rate) <= 1.0
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree_util.tree_leaves(state.params))
    for name in ("Sparse24Dense_0", "Sparse24Dense_1"):  # refreshed from the updated kernels
        np.testing.assert_array_equal(np.asarray(state.sparsity[name]["transposable_mask"]),
                                      np.asarray(s24.transposable_mask24(state.params[name]["kernel"])))


def test_readme_swap_snippet_runs():
    """swap -> train -> unswap on an existing model, as the README shows it."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (code,) = [b for b in blocks if "swap.swap_dense(" in b]
    ns: dict = {}
    exec(compile(code, str(README), "exec"), ns)  # noqa: S102 - our own README
    params, sparsity, x = ns["params"], ns["sparsity"], ns["x"]
    assert set(sparsity) == {"fc1", "fc2"}  # the head was excluded and stayed dense
    assert float(ns["loss"]) < np.log(10) - 0.2  # it trained
    pruned = ns["pruned"]
    for name in ("fc1", "fc2"):  # exactly 2 of every 4 kept along the inputs
        nz = np.asarray(pruned[name]["kernel"] != 0).reshape(-1, 4, 256).sum(axis=1)
        assert (nz <= 2).all() and nz.mean() > 1.9
    np.testing.assert_array_equal(pruned["head"]["kernel"], params["head"]["kernel"])
    # unswap + masked params compute what the swapped model computes
    sparse_logits = ns["model"].apply({"params": params, "sparsity": sparsity}, x)
    np.testing.assert_allclose(ns["logits"], sparse_logits, rtol=1e-5, atol=1e-5)
    assert type(ns["dense_model"]).__name__ == "Classifier"


def test_readme_nnx_snippet_runs():
    code = _snippet("s24.nnx.Sparse24Linear")
    if "model" not in inspect.signature(nnx.Optimizer.update).parameters:  # flax 0.10: update(grads, **kwargs)
        code = code.replace("optimizer.update(model, grads,", "optimizer.update(grads,")
    ns = _run(code)
    model, optimizer = ns["model"], ns["optimizer"]
    step = s24.nnx._get(optimizer.step)
    s24.nnx._set(optimizer.step, jnp.asarray(39, step.dtype))  # the update makes it 40: the masks refresh
    flip_rate = ns["train_step"](model, optimizer)
    assert 0.0 <= float(flip_rate) <= 1.0
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
    for layer in (model.up, model.down):  # refreshed in place from the updated kernels
        np.testing.assert_array_equal(np.asarray(s24.nnx._get(layer.mask)),
                                      np.asarray(s24.transposable_mask24(s24.nnx._get(layer.kernel))))
