"""The README's Python snippets run as written (one train step on a CPU): the linen one and the NNX one."""

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
    params, sparsity, opt_state, flip_rate = ns["train_step"](ns["params"], ns["sparsity"], ns["opt_state"], 39)
    assert 0.0 <= float(flip_rate) <= 1.0
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree_util.tree_leaves(params))


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
