"""STEP (``optim.adamw_step``) against a recording: 20 jitted updates of a small model with a 2:4 mask and the
AutoSwitch, compared with the parameter trajectory recorded in ``tests/data/step_trajectory.npz``.

The model trains dense until STEP switches, then 2:4 sparse (the kernel times its fixed mask) with
SR-STE's masked decay chained before the optimizer. Two configurations cover the optimizer's options:
a learning-rate schedule with a decay mask and the mean statistic (``option=1``, ``freeze="sparse"``),
and a constant learning rate with the geometric mean (``option=2``, ``freeze="all"``). Each switches
between ``t_min`` and ``t_max`` on its statistic. ``python tests/test_step_trajectory.py --record``
rewrites the file (only when the optimizer's results are meant to change).
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_sparse24 import mask24
from jax_sparse24.optim import adamw_step, masked_decay, step_state

DATA = os.path.join(os.path.dirname(__file__), "data", "step_trajectory.npz")
STEPS = 20
# The recorded trajectory's code generation: XLA's CPU backend at its default optimization level (3), whatever
# XLA_FLAGS says (the test suite compiles at -O0, tests/conftest.py): LLVM's optimizations move float32 results by an
# ulp, so a bit-for-bit record holds for the code generation it was recorded with.
_RECORDED_CODEGEN = {"xla_backend_optimization_level": 3}

CONFIGS = {
    "schedule": dict(learning_rate=optax.linear_schedule(2e-2, 2e-3, STEPS), b1=0.9, b2=0.9, eps=1e-8,
                     weight_decay=1e-2, clipping=(3, 15), option=1, switch_eps=4.5e-3,
                     mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)),
    "constant": dict(learning_rate=1e-2, b1=0.8, b2=0.95, eps=1e-7, weight_decay=5e-3, clipping=(4, 15),
                     option=2, switch_eps=6.5e-4, freeze="all"),
}


def _problem():
    rng = np.random.default_rng(0)
    f32 = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)  # noqa: E731
    params = {"fc": {"kernel": f32(16, 8), "bias": 0.1 * f32(8)}, "ln": {"scale": 1.0 + 0.1 * f32(8)}}
    x, y = f32(32, 16), f32(32, 8)
    mask = mask24(params["fc"]["kernel"], axis=0)
    return params, mask, x, y


def trajectory(name: str) -> dict:
    """``{"<step>/<leaf path>": params after the update, "<step>/phase", ...}`` over ``STEPS`` updates."""
    params, mask, x, y = _problem()
    masks = {"fc": {"kernel": mask, "bias": None}, "ln": {"scale": None}}
    tx = optax.chain(masked_decay(2e-2), adamw_step(**CONFIGS[name]))

    @functools.partial(jax.jit, compiler_options=_RECORDED_CODEGEN)
    def grads_of(p, sparse):
        def loss(p):
            w = jnp.where(sparse, jnp.where(mask, p["fc"]["kernel"], 0.0), p["fc"]["kernel"])
            return jnp.mean(((x @ w + p["fc"]["bias"]) * p["ln"]["scale"] - y) ** 2)
        return jax.grad(loss)(p)

    update = jax.jit(lambda g, s, p: tx.update(g, s, p, masks=masks), compiler_options=_RECORDED_CODEGEN)
    state = tx.init(params)
    out = {}
    for t in range(STEPS):
        st = step_state(state)
        grads = grads_of(params, st.phase == 1)
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            out[f"{t}/{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
        st = step_state(state)
        out[f"{t}/phase"] = np.asarray(st.phase)
        out[f"{t}/switch_step"] = np.asarray(st.switch_step)
        out[f"{t}/z_avg"] = np.asarray(st.z_avg)
    return out


def _recorded(name):
    with np.load(DATA) as f:
        return {k[len(name) + 1:]: f[k] for k in f.files if k.startswith(name + "/")}


# XLA's CPU code generation follows the host's instruction set (e.g. which multiply-adds it fuses), which moves
# float32 results by an ulp or two from one x86 machine to another (seen: 1.3e-7 absolute after 20 steps between
# the recording's machine and another 2-core one). The floats are compared to a few ulps; the integer state (step
# counts, the switch step) exactly. A change to the optimizer's math moves the trajectory by orders of magnitude more.
_RTOL, _ATOL = 1e-5, 1e-6


def _check(name):
    got, want = trajectory(name), _recorded(name)
    assert sorted(got) == sorted(want)
    for k in want:
        if np.issubdtype(want[k].dtype, np.floating):
            np.testing.assert_allclose(got[k], want[k], rtol=_RTOL, atol=_ATOL, err_msg=f"{name}: {k}")
        else:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{name}: {k}")
    switch = int(want[f"{STEPS - 1}/switch_step"])
    t_min, t_max = CONFIGS[name]["clipping"]
    assert t_min < switch <= t_max, switch  # the statistic switched, not t_max


def test_step_trajectory_schedule_matches_recording():
    _check("schedule")


def test_step_trajectory_constant_matches_recording():
    _check("constant")


if __name__ == "__main__":
    if "--record" in sys.argv:
        np.savez(DATA, **{f"{n}/{k}": v for n in CONFIGS for k, v in trajectory(n).items()})
    for n in CONFIGS:
        t = trajectory(n)
        print(n, "switch", int(t[f"{STEPS - 1}/switch_step"]), "z_avg", [float(t[f"{i}/z_avg"]) for i in range(STEPS)])
