"""The README's Python snippet runs as written (one train step on a CPU)."""

import pathlib
import re

import jax
import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_snippet_runs():
    text = README.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    ns: dict = {}
    exec(compile(code, str(README), "exec"), ns)  # noqa: S102 - our own README
    params, sparsity, opt_state, flip_rate = ns["train_step"](ns["params"], ns["sparsity"], ns["opt_state"], 39)
    assert 0.0 <= float(flip_rate) <= 1.0
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree_util.tree_leaves(params))
