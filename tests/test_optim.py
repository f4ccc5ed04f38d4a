"""Tests for jax_sparse24.optim (CPU, fast)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jax_sparse24 import optim
from jax_sparse24.optim import (
    AdamWStepState,
    adamw_step,
    dense_finetune_schedule,
    is_sparse_phase,
    magnitude_masks,
    masked_decay,
    sparse_lr_scale,
    sparsity_schedule,
    step_phase,
    step_state,
)


def _rand(rng, shape):
    return jnp.asarray(rng.normal(size=shape), jnp.float32)


def _np_mask24_axis0(w):
    """Independent 2:4 mask along axis 0 (keep the 2 largest |w| of every 4 rows, per column)."""
    w = np.abs(np.asarray(w))
    m = np.zeros(w.shape, bool)
    for g in range(w.shape[0] // 4):
        blk = w[4 * g : 4 * g + 4]
        order = np.argsort(-blk, axis=0, kind="stable")[:2]
        for c in range(w.shape[1]):
            m[4 * g + order[:, c], c] = True
    return m


def _toy_params(rng):
    return {
        "params": {
            "Dense_0": {"kernel": _rand(rng, (8, 4)), "bias": _rand(rng, (4,))},
            "Dense_1": {"kernel": _rand(rng, (6, 4))},  # in-dim not divisible by 4
            "embedding": _rand(rng, (8, 4)),  # 2-D but not a kernel
        }
    }


# ----------------------------------------------------------------------------------------------
# masked_decay
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 2e-4, 0.5])
def test_masked_decay_explicit_masks_exact(alpha):
    rng = np.random.default_rng(0)
    params = {"a": _rand(rng, (8, 3)), "b": _rand(rng, (4,)), "c": _rand(rng, (4, 4))}
    grads = jax.tree.map(lambda x: _rand(rng, x.shape), params)
    masks = {
        "a": jnp.asarray(rng.random((8, 3)) < 0.5),
        "b": None,
        "c": jnp.asarray(rng.random((4, 4)) < 0.5),
    }
    tx = masked_decay(alpha)
    updates, state = tx.update(grads, tx.init(params), params, masks=masks)
    for k in ("a", "c"):
        m, w, g = (np.asarray(x) for x in (masks[k], params[k], grads[k]))
        expected = g + np.float32(alpha) * (1 - m.astype(np.float32)) * w
        np.testing.assert_allclose(np.asarray(updates[k]), expected, rtol=1e-6, atol=0)
        # pruned entries change by exactly alpha*w, kept entries not at all
        np.testing.assert_array_equal(np.asarray(updates[k])[m], g[m])
    np.testing.assert_array_equal(np.asarray(updates["b"]), np.asarray(grads["b"]))
    assert int(state.count) == 1


def test_masked_decay_default_mask_fn():
    rng = np.random.default_rng(1)
    params = _toy_params(rng)
    grads = jax.tree.map(jnp.zeros_like, params)
    tx = masked_decay(0.25)
    updates, _ = tx.update(grads, tx.init(params), params)
    p, u = params["params"], updates["params"]
    w = np.asarray(p["Dense_0"]["kernel"])
    m = _np_mask24_axis0(w)
    np.testing.assert_allclose(np.asarray(u["Dense_0"]["kernel"]), np.where(m, 0.0, 0.25 * w), rtol=1e-6)
    assert (np.asarray(u["Dense_0"]["kernel"]) != 0).sum() == w.size // 2
    # not selected by the default `where`: gradients untouched
    for path in (("Dense_0", "bias"), ("Dense_1", "kernel"), ("embedding",)):
        got = functools.reduce(lambda t, k: t[k], path, u)
        np.testing.assert_array_equal(np.asarray(got), 0.0)


def test_magnitude_masks_structure_and_where():
    rng = np.random.default_rng(2)
    params = _toy_params(rng)
    masks = magnitude_masks(params)
    assert masks["params"]["Dense_0"]["bias"] is None
    assert masks["params"]["Dense_1"]["kernel"] is None
    assert masks["params"]["embedding"] is None
    np.testing.assert_array_equal(
        np.asarray(masks["params"]["Dense_0"]["kernel"]),
        _np_mask24_axis0(params["params"]["Dense_0"]["kernel"]),
    )
    # custom where: also the embedding (grouped along axis 0)
    masks = magnitude_masks(params, where=lambda path, x: x.ndim == 2 and x.shape[0] % 4 == 0)
    np.testing.assert_array_equal(
        np.asarray(masks["params"]["embedding"]), _np_mask24_axis0(params["params"]["embedding"])
    )
    # transposable masks: 2:4 along both axes
    w = _rand(rng, (8, 8))
    mt = np.asarray(magnitude_masks({"kernel": w}, transposable=True)["kernel"])
    assert (mt.reshape(2, 4, 8).sum(1) == 2).all() and (mt.reshape(8, 2, 4).sum(2) == 2).all()


def test_masked_decay_none_masks_leave_everything_untouched():
    rng = np.random.default_rng(3)
    params = {"kernel": _rand(rng, (8, 4)), "bias": _rand(rng, (4,))}
    grads = jax.tree.map(lambda x: _rand(rng, x.shape), params)
    tx = masked_decay(1.0)
    updates, _ = tx.update(grads, tx.init(params), params, masks={"kernel": None, "bias": None})
    for k in params:
        np.testing.assert_array_equal(np.asarray(updates[k]), np.asarray(grads[k]))


def test_masked_decay_schedule_alpha_and_active_until():
    params = {"kernel": jnp.ones((4, 1))}
    grads = {"kernel": jnp.zeros((4, 1))}
    masks = {"kernel": jnp.array([[True], [True], [False], [False]])}
    tx = masked_decay(lambda count: 0.1 * (count + 1), active_until=3)
    state = tx.init(params)
    seen = []
    for _ in range(4):
        updates, state = tx.update(grads, state, params, masks=masks)
        seen.append(np.asarray(updates["kernel"])[:, 0])
    np.testing.assert_allclose(np.stack(seen)[:, 2], [0.1, 0.2, 0.3, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(np.stack(seen)[:, :2], 0.0)
    np.testing.assert_array_equal(np.stack(seen)[:, 3], np.stack(seen)[:, 2])


def test_masked_decay_in_chain_with_masks_passed_through():
    rng = np.random.default_rng(4)
    params = {"kernel": _rand(rng, (8, 4)), "bias": _rand(rng, (4,))}
    grads = jax.tree.map(lambda x: _rand(rng, x.shape), params)
    # masks deliberately different from the magnitude masks: the chain must use them
    explicit = np.zeros((8, 4), bool)
    explicit[::2] = True
    masks = {"kernel": jnp.asarray(explicit), "bias": None}
    lr, alpha = 0.5, 0.1
    tx = optax.chain(masked_decay(alpha), optax.sgd(lr))
    updates, _ = tx.update(grads, tx.init(params), params, masks=masks)
    w, g = np.asarray(params["kernel"]), np.asarray(grads["kernel"])
    expected = -lr * (g + alpha * np.where(explicit, 0.0, w))
    np.testing.assert_allclose(np.asarray(updates["kernel"]), expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(updates["bias"]), -lr * np.asarray(grads["bias"]), rtol=1e-6)
    # without masks= the chain falls back to the magnitude masks
    updates2, _ = tx.update(grads, tx.init(params), params)
    expected2 = -lr * (g + alpha * np.where(_np_mask24_axis0(w), 0.0, w))
    np.testing.assert_allclose(np.asarray(updates2["kernel"]), expected2, rtol=1e-6)
    # and it composes with adamw (which ignores the extra argument)
    tx = optax.chain(masked_decay(alpha), optax.adamw(1e-3))
    updates3, _ = tx.update(grads, tx.init(params), params, masks=masks)
    assert np.isfinite(np.asarray(updates3["kernel"])).all()


def test_masked_decay_inject_hyperparams_change_takes_effect():
    params = {"kernel": jnp.full((4, 2), 2.0)}
    grads = {"kernel": jnp.zeros((4, 2))}
    masks = {"kernel": jnp.array([[True, False]] * 4)}
    tx = optax.inject_hyperparams(masked_decay)(alpha=0.1)
    state = tx.init(params)
    updates, state = tx.update(grads, state, params, masks=masks)  # masks through inject
    np.testing.assert_allclose(np.asarray(updates["kernel"])[:, 1], 0.2, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(updates["kernel"])[:, 0], 0.0)
    state.hyperparams["alpha"] = jnp.asarray(0.3)
    updates, state = tx.update(grads, state, params, masks=masks)
    np.testing.assert_allclose(np.asarray(updates["kernel"])[:, 1], 0.6, rtol=1e-6)
    # scheduled alpha through inject_hyperparams, inside a chain, with masks passed through both
    tx = optax.chain(
        optax.inject_hyperparams(masked_decay)(alpha=lambda c: 0.1 * (c + 1)), optax.sgd(1.0)
    )
    state = tx.init(params)
    for step in range(3):
        updates, state = tx.update(grads, state, params, masks=masks)
        np.testing.assert_allclose(
            np.asarray(updates["kernel"])[:, 1], -2.0 * 0.1 * (step + 1), rtol=1e-6
        )
    # callables that are not schedules must be static
    where = lambda path, x: x.ndim == 2  # noqa: E731
    tx = optax.inject_hyperparams(masked_decay, static_args=("where",))(alpha=0.5, where=where)
    updates, _ = tx.update(grads, tx.init(params), params)
    assert np.count_nonzero(np.asarray(updates["kernel"])) == 4  # 2 of every 4 rows pruned


def test_masked_decay_jit():
    rng = np.random.default_rng(5)
    params = _toy_params(rng)
    grads = jax.tree.map(lambda x: _rand(rng, x.shape), params)
    tx = optax.chain(masked_decay(0.01), optax.adamw(1e-3))
    state = tx.init(params)
    masks = magnitude_masks(params)
    eager, _ = tx.update(grads, state, params, masks=masks)
    jitted, _ = jax.jit(tx.update)(grads, state, params, masks=masks)
    jitted_default, _ = jax.jit(tx.update)(grads, state, params)
    for a, b, c in zip(*(jax.tree.leaves(t) for t in (eager, jitted, jitted_default))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-6, atol=1e-9)


def test_masked_decay_errors():
    params = {"kernel": jnp.ones((4, 2))}
    tx = masked_decay(0.1)
    with pytest.raises(ValueError, match="params"):
        tx.update(params, tx.init(params))
    with pytest.raises(ValueError, match="mask shape"):
        tx.update(params, tx.init(params), params, masks={"kernel": jnp.ones((2, 4), bool)})
    with pytest.raises(ValueError, match="structure"):
        tx.update(params, tx.init(params), params, masks={"other": None})


# ----------------------------------------------------------------------------------------------
# adamw_step
# ----------------------------------------------------------------------------------------------


def _adam_params(rng):
    return {"dense": {"kernel": _rand(rng, (8, 4)), "bias": _rand(rng, (4,))}}


def _matrices_only(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


@pytest.mark.parametrize("schedule", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
@pytest.mark.parametrize("mask", [None, "callable", "tree"])
def test_adamw_step_phase0_equals_optax_adamw(schedule, weight_decay, mask):
    rng = np.random.default_rng(6)
    params = _adam_params(rng)
    lr = optax.linear_schedule(1e-2, 1e-3, 10) if schedule else 3e-3
    mask = {None: None, "callable": _matrices_only, "tree": _matrices_only(params)}[mask]
    ref = optax.adamw(lr, b1=0.8, b2=0.95, eps=1e-7, weight_decay=weight_decay, mask=mask)
    tx = adamw_step(lr, b1=0.8, b2=0.95, eps=1e-7, weight_decay=weight_decay, clipping=(100, 200), mask=mask)
    ref_update, tx_update = jax.jit(ref.update), jax.jit(tx.update)
    s_ref, s_tx = ref.init(params), tx.init(params)
    p_ref = p_tx = params
    for _ in range(12):
        grads = jax.tree.map(lambda x: _rand(rng, x.shape), params)
        u_ref, s_ref = ref_update(grads, s_ref, p_ref)
        u_tx, s_tx = tx_update(grads, s_tx, p_tx)
        for a, b in zip(jax.tree.leaves(u_ref), jax.tree.leaves(u_tx)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bit-exact under jit
        p_ref, p_tx = optax.apply_updates(p_ref, u_ref), optax.apply_updates(p_tx, u_tx)
    assert int(step_state(s_tx).phase) == 0 and int(step_state(s_tx).count) == 12
    # eager (op-by-op) agrees to rounding
    u_eager, _ = tx.update(grads, s_tx, p_tx)
    u_ref, _ = ref.update(grads, s_ref, p_ref)
    for a, b in zip(jax.tree.leaves(u_ref), jax.tree.leaves(u_eager)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


@pytest.mark.parametrize("t_max", [1, 7])
def test_adamw_step_switches_at_t_max_when_statistic_never_falls(t_max):
    rng = np.random.default_rng(7)
    params = _adam_params(rng)
    tx = adamw_step(1e-3, b2=0.9, clipping=(0, t_max), switch_eps=0.0)  # avg < 0 never holds
    update = jax.jit(tx.update)
    state = tx.init(params)
    phases = []
    for _ in range(t_max + 3):
        grads = jax.tree.map(lambda x: _rand(rng, x.shape), params)
        _, state = update(grads, state, params)
        phases.append(int(step_state(state).phase))
    assert phases == [0] * t_max + [1] * 3
    assert int(step_state(state).switch_step) == t_max + 1
    assert int(step_phase(state)) == 1


def _constant_grad_switch_step(b2, window, eps, t_min, t_max):
    """Closed form for a constant gradient g = 1: v_t = 1 − b2^t, Z_t = (1 − b2)·b2^(t−1)."""
    zs = []
    for t in range(1, t_max + 2):
        zs.append((1 - b2) * b2 ** (t - 1))
        avg = sum(zs[-window:]) / min(len(zs), window)
        if t > t_max or (avg < eps and t > t_min):
            return t
    raise AssertionError


@pytest.mark.parametrize("option", [1, 2])
@pytest.mark.parametrize("t_min", [0, 60])
def test_adamw_step_switch_between_t_min_and_t_max_constant_gradient(option, t_min):
    b2, eps_switch, t_max = 0.9, 1e-3, 200
    params = {"kernel": jnp.zeros((8, 4))}
    grads = {"kernel": jnp.ones((8, 4))}
    tx = adamw_step(1e-2, b2=b2, clipping=(t_min, t_max), switch_eps=eps_switch, option=option)
    state = tx.init(params)
    assert step_state(state).z_buffer.shape == (10,)  # ⌊1/(1 − 0.9)⌋
    expected = _constant_grad_switch_step(b2, 10, eps_switch, t_min, t_max)
    assert t_min < expected < t_max
    if t_min == 0:
        assert expected == 50  # windowed average 1.07e-3 at t = 49, 0.96e-3 at t = 50
    else:
        assert expected == t_min + 1  # statistic already small: switch right after t_min

    def body(carry, _):
        state, params = carry
        updates, state = tx.update(grads, state, params)
        return (state, optax.apply_updates(params, updates)), step_state(state).phase

    n = 80
    (state, _), phases = jax.jit(lambda s, p: jax.lax.scan(body, (s, p), None, length=n))(
        state, params
    )
    phases = np.asarray(phases)
    assert int(step_state(state).switch_step) == expected
    np.testing.assert_array_equal(phases, (np.arange(1, n + 1) >= expected).astype(np.int32))
    # Z_t is recorded exactly (all |Δv| equal, so both options agree); float32 vs the closed form: each Z is a
    # difference of two float32 second moments near 1, exact to an ulp of 1 (eps) whatever the code generation
    zs = np.asarray(step_state(state).z_buffer)
    ts = np.arange(expected - 10 + 1, expected + 1)
    np.testing.assert_allclose(
        np.sort(zs)[::-1], (1 - b2) * b2 ** (ts - 1.0), rtol=2e-4, atol=float(np.finfo(np.float32).eps)
    )


def _np_step_sim(w0, target, lr, b1, b2, eps, wd, window, switch_eps, t_min, t_max, steps, option):
    """Independent float64 NumPy STEP on f(w) = ½‖w − target‖² (gradient w − target)."""
    w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    zs, phase, switch = [], 0, 0
    for t in range(1, steps + 1):
        g = w - target
        m = b1 * m + (1 - b1) * g
        if phase == 0:
            v_new = b2 * v + (1 - b2) * g * g
            d = np.abs(v_new - v)
            z = d.mean() if option == 1 else np.exp(np.log(np.maximum(d, 1.1754944e-38)).mean())
            v = v_new
            zs.append(z)
            avg = np.mean(zs[-window:])
            if t > t_max or (avg < switch_eps and t > t_min):
                phase, switch = 1, t
        vc = switch if phase else t
        u = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**vc)) + eps) + wd * w
        w = w - lr * u
    return switch, w


@pytest.mark.parametrize("option", [1, 2])
def test_adamw_step_toy_quadratic_switch_is_deterministic(option):
    rng = np.random.default_rng(8)
    w0 = rng.normal(size=(8, 4)).astype(np.float32)
    target = rng.normal(size=(8, 4)).astype(np.float32)
    hp = dict(lr=0.05, b1=0.9, b2=0.9, eps=1e-8, wd=0.0)
    eps_switch = 1e-4  # float64 NumPy: switches at t = 125 (option 1) / 100 (option 2)
    t_min, t_max, steps = 5, 150, 160
    sw_np, _ = _np_step_sim(
        w0.astype(np.float64), target.astype(np.float64), **hp, window=10,
        switch_eps=eps_switch, t_min=t_min, t_max=t_max, steps=steps, option=option,
    )
    assert t_min + 5 < sw_np < t_max  # the statistic falls: an AutoSwitch, not the clip

    tx = adamw_step(hp["lr"], b1=hp["b1"], b2=hp["b2"], eps=hp["eps"], weight_decay=0.0,
                    clipping=(t_min, t_max), switch_eps=eps_switch, option=option)
    loss_grad = jax.grad(lambda p: 0.5 * jnp.sum((p["kernel"] - target) ** 2))

    def body(carry, _):
        state, params = carry
        updates, state = tx.update(loss_grad(params), state, params)
        return (state, optax.apply_updates(params, updates)), None

    params = {"kernel": jnp.asarray(w0)}
    (state, params), _ = jax.jit(lambda s, p: jax.lax.scan(body, (s, p), None, length=steps))(
        tx.init(params), params
    )
    assert abs(int(step_state(state).switch_step) - sw_np) <= 1  # float32 vs float64 threshold crossing
    assert int(step_state(state).phase) == 1


def test_adamw_step_nu_frozen_after_switch_and_update_formula():
    rng = np.random.default_rng(9)
    params = {"dense": {"kernel": _rand(rng, (8, 4)), "bias": _rand(rng, (4,))}}
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.99, 1e-8, 1e-2
    # freeze="all": every leaf's v frozen (the default freezes only the sparse kernels, below)
    tx = adamw_step(lr, b1=b1, b2=b2, eps=eps, weight_decay=wd, clipping=(0, 3), switch_eps=0.0, freeze="all")
    update = jax.jit(tx.update)
    state = tx.init(params)
    for _ in range(4):  # switches at update 4 (t > t_max = 3)
        _, state = update(jax.tree.map(lambda x: _rand(rng, x.shape), params), state, params)
    assert int(step_state(state).phase) == 1 and int(step_state(state).switch_step) == 4
    nu_frozen = jax.tree.map(np.asarray, step_state(state).nu)
    mu = jax.tree.map(lambda x: np.asarray(x, np.float64), step_state(state).mu)
    for t in range(5, 9):
        grads = jax.tree.map(lambda x: _rand(rng, x.shape), params)
        updates, state = update(grads, state, params)
        for a, b in zip(jax.tree.leaves(nu_frozen), jax.tree.leaves(step_state(state).nu)):
            np.testing.assert_array_equal(a, np.asarray(b))  # frozen
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * np.asarray(g, np.float64), mu, grads)
        expected = jax.tree.map(
            lambda m, v, p: -lr * ((m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**4)) + eps) + wd * np.asarray(p)),
            mu, nu_frozen, params,
        )
        for e, u in zip(jax.tree.leaves(expected), jax.tree.leaves(updates)):
            np.testing.assert_allclose(np.asarray(u), e, rtol=2e-5, atol=1e-9)
        params = optax.apply_updates(params, updates)
    assert int(step_state(state).count) == 8 and int(step_state(state).switch_step) == 4


def test_adamw_step_freezes_only_sparse_leaves_by_default():
    """Phase 1 freezes v of the leaves ``where`` selects (the 2:4 kernels) only; the others stay AdamW.

    Issue 23: with every v frozen, GPT-2 diverged 33 steps after the switch — the dense attention
    and LayerNorm gradients grew far beyond their frozen v, so their steps lr·m̂/√v̂ grew with them.
    Here the bias gradient grows 100x after the switch: its step must stay Adam-sized (≤ ~lr), the
    kernel's (frozen) v must not move, and both updates must follow the formulas."""
    rng = np.random.default_rng(10)
    params = {"dense": {"kernel": _rand(rng, (8, 4)), "bias": _rand(rng, (4,))}}
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.99, 1e-8, 1e-2
    tx = adamw_step(lr, b1=b1, b2=b2, eps=eps, weight_decay=wd, clipping=(0, 3), switch_eps=0.0)
    update = jax.jit(tx.update)
    state = tx.init(params)
    for _ in range(4):  # switches at update 4
        _, state = update(jax.tree.map(lambda x: _rand(rng, x.shape), params), state, params)
    assert int(step_state(state).phase) == 1 and int(step_state(state).switch_step) == 4
    k_frozen = np.asarray(step_state(state).nu["dense"]["kernel"])
    mu = jax.tree.map(lambda x: np.asarray(x, np.float64), step_state(state).mu)
    v_bias = np.asarray(step_state(state).nu["dense"]["bias"], np.float64)
    for t in range(5, 25):
        grads = {"dense": {"kernel": _rand(rng, (8, 4)), "bias": 100.0 * _rand(rng, (4,))}}
        updates, state = update(grads, state, params)
        np.testing.assert_array_equal(np.asarray(step_state(state).nu["dense"]["kernel"]), k_frozen)
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * np.asarray(g, np.float64), mu, grads)
        v_bias = b2 * v_bias + (1 - b2) * np.asarray(grads["dense"]["bias"], np.float64) ** 2
        np.testing.assert_allclose(np.asarray(step_state(state).nu["dense"]["bias"]), v_bias, rtol=1e-5)
        m_hat = jax.tree.map(lambda m: m / (1 - b1**t), mu)
        p = jax.tree.map(np.asarray, params)
        expected_k = -lr * (m_hat["dense"]["kernel"] / (np.sqrt(k_frozen / (1 - b2**4)) + eps)
                            + wd * p["dense"]["kernel"])
        expected_b = -lr * (m_hat["dense"]["bias"] / (np.sqrt(v_bias / (1 - b2**t)) + eps) + wd * p["dense"]["bias"])
        np.testing.assert_allclose(np.asarray(updates["dense"]["kernel"]), expected_k, rtol=2e-5, atol=1e-9)
        np.testing.assert_allclose(np.asarray(updates["dense"]["bias"]), expected_b, rtol=2e-5, atol=1e-9)
        assert np.max(np.abs(np.asarray(updates["dense"]["bias"]))) < 3 * lr
        params = optax.apply_updates(params, updates)
    # the same run with every v frozen: the bias steps grow with its gradient (what diverged)
    tx_all = adamw_step(lr, b1=b1, b2=b2, eps=eps, weight_decay=wd, clipping=(0, 3), switch_eps=0.0, freeze="all")
    params = {"dense": {"kernel": jnp.zeros((8, 4)), "bias": jnp.zeros((4,))}}
    state = tx_all.init(params)
    for t in range(12):
        scale = 1.0 if t < 4 else 100.0
        updates, state = tx_all.update({"dense": {"kernel": jnp.ones((8, 4)), "bias": jnp.full((4,), scale)}},
                                       state, params)
    assert float(jnp.max(jnp.abs(updates["dense"]["bias"]))) > 30 * lr
    with pytest.raises(ValueError, match="freeze"):
        adamw_step(1e-3, clipping=(1, 5), freeze="kernels")


def test_adamw_step_option2_value_and_zero_guard():
    params = {"kernel": jnp.zeros((4, 2))}
    g = np.array([[1.0, 2.0], [3.0, 4.0], [0.5, 1.5], [2.5, 3.5]], np.float32)
    for option, expected in ((1, 0.1 * np.mean(g**2)), (2, 0.1 * np.exp(np.mean(np.log(g**2))))):
        tx = adamw_step(1e-3, b2=0.9, clipping=(10, 20), option=option)
        _, state = tx.update({"kernel": jnp.asarray(g)}, tx.init(params), params)
        np.testing.assert_allclose(float(step_state(state).z_buffer[0]), expected, rtol=1e-5)
        np.testing.assert_allclose(float(step_state(state).z_avg), expected, rtol=1e-5)
    # a zero Δv (zero gradient entry at t = 1) must not give -inf / nan
    tx = adamw_step(1e-3, b2=0.9, clipping=(10, 20), option=2)
    g0 = g.copy()
    g0[0, 0] = 0.0
    _, state = tx.update({"kernel": jnp.asarray(g0)}, tx.init(params), params)
    z = float(step_state(state).z_buffer[0])
    assert np.isfinite(z) and 0.0 < z < 0.1 * np.exp(np.mean(np.log(g**2)))


def test_adamw_step_statistic_tracks_only_selected_leaves():
    params = {"kernel": jnp.zeros((4, 2)), "bias": jnp.zeros((2,))}
    grads = {"kernel": jnp.full((4, 2), 2.0), "bias": jnp.full((2,), 100.0)}
    tx = adamw_step(1e-3, b2=0.9, clipping=(10, 20))
    _, state = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(float(step_state(state).z_buffer[0]), 0.1 * 4.0, rtol=1e-6)  # bias ignored
    # where selecting nothing: all leaves tracked
    tx = adamw_step(1e-3, b2=0.9, clipping=(10, 20), where=lambda path, x: False)
    _, state = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(float(step_state(state).z_buffer[0]), 0.1 * (8 * 4.0 + 2 * 1e4) / 10, rtol=1e-6)


def test_is_sparse_phase_in_chain_inject_and_multisteps():
    params = {"kernel": jnp.zeros((8, 4))}
    grads = {"kernel": jnp.ones((8, 4))}
    makers = {
        "plain": lambda: adamw_step(1e-3, clipping=(0, 2), switch_eps=0.0),
        "chain": lambda: optax.chain(
            masked_decay(1e-4), optax.clip_by_global_norm(1.0),
            adamw_step(1e-3, clipping=(0, 2), switch_eps=0.0),
        ),
        "inject": lambda: optax.inject_hyperparams(adamw_step)(
            learning_rate=optax.constant_schedule(1e-3), clipping=(0, 2), switch_eps=0.0
        ),
        "chain_of_inject": lambda: optax.chain(
            optax.inject_hyperparams(masked_decay)(alpha=1e-4),
            optax.inject_hyperparams(adamw_step)(learning_rate=1e-3, clipping=(0, 2), option=2),
        ),
    }
    for name, make in makers.items():
        tx = make()
        state = tx.init(params)
        update = jax.jit(tx.update)
        got = [bool(is_sparse_phase(state))]
        for _ in range(4):
            _, state = update(grads, state, params)
            got.append(bool(jax.jit(is_sparse_phase)(state)))
        assert got == [False, False, False, True, True], name
    ms = optax.MultiSteps(adamw_step(1e-3, clipping=(0, 2)), every_k_schedule=2)
    assert int(step_phase(ms.init(params))) == 0
    with pytest.raises(ValueError, match="no AdamWStepState"):
        is_sparse_phase(optax.adam(1e-3).init(params))
    two = optax.chain(adamw_step(1e-3, clipping=(0, 2)), adamw_step(1e-3, clipping=(0, 2)))
    with pytest.raises(ValueError, match="found 2"):
        is_sparse_phase(two.init(params))


def test_step_state_for_logging():
    """step_state: the AdamWStepState inside any opt_state (phase, z_avg, switch_step), under jit too."""
    from jax_sparse24.optim import step_state

    params = {"kernel": jnp.zeros((8, 4))}
    grads = {"kernel": jnp.ones((8, 4))}
    tx = optax.chain(optax.clip_by_global_norm(1.0), adamw_step(1e-3, clipping=(0, 2), switch_eps=0.0))
    state = tx.init(params)
    for _ in range(3):
        _, state = jax.jit(tx.update)(grads, state, params)
    st = jax.jit(step_state)(state)
    assert isinstance(st, AdamWStepState) and st.z_avg.dtype == jnp.float32
    assert int(st.phase) == int(step_phase(state)) == 1 and int(st.switch_step) == 3
    np.testing.assert_array_equal(np.asarray(st.z_avg), np.asarray(step_state(state).z_avg))
    with pytest.raises(ValueError, match="no AdamWStepState"):
        step_state(optax.adam(1e-3).init(params))


def test_adamw_step_inject_hyperparams_lr_change_takes_effect():
    params = {"kernel": jnp.zeros((8, 4))}
    grads = {"kernel": jnp.ones((8, 4))}
    tx = optax.inject_hyperparams(adamw_step)(learning_rate=0.1, weight_decay=0.0, clipping=(5, 9))
    state = tx.init(params)
    assert isinstance(step_state(state.inner_state), AdamWStepState)
    u1, state = tx.update(grads, state, params)
    state.hyperparams["learning_rate"] = jnp.asarray(0.2)
    u2, state = tx.update(grads, state, params)
    # constant gradient: m̂/(√v̂ + eps) == 1 / (1 + eps) at every step
    np.testing.assert_allclose(np.asarray(u1["kernel"]), -0.1, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(u2["kernel"]), -0.2, rtol=1e-5)


def test_adamw_step_argument_errors():
    with pytest.raises(ValueError, match="clipping"):
        adamw_step(1e-3, clipping=(0.1, 0.5))
    with pytest.raises(ValueError, match="t_min <= t_max"):
        adamw_step(1e-3, clipping=(10, 5))
    with pytest.raises(ValueError, match="option"):
        adamw_step(1e-3, clipping=(1, 5), option=3)
    tx = adamw_step(1e-3, clipping=(1, 5))
    params = {"kernel": jnp.zeros((8, 4))}
    with pytest.raises(ValueError, match="params"):
        tx.update(params, tx.init(params))
    # weight_decay=0 does not need params
    tx = adamw_step(1e-3, weight_decay=0.0, clipping=(1, 5))
    tx.update(params, tx.init(params))
    # a decay mask of another structure
    tx = adamw_step(1e-3, weight_decay=0.1, clipping=(1, 5), mask={"bias": False})
    with pytest.raises(ValueError, match="mask must be a pytree"):
        tx.update(params, tx.init(params), params)


def test_adamw_step_decay_mask_leaves_unmasked_leaves_undecayed():
    """With mask, a bias with zero gradient is not decayed (its update is 0) in both phases; the
    kernel still is."""
    params = {"kernel": jnp.full((8, 4), 2.0), "bias": jnp.full((4,), 2.0)}
    grads = jax.tree.map(jnp.zeros_like, params)
    tx = adamw_step(0.1, weight_decay=0.5, clipping=(1, 2), mask=_matrices_only)
    state = tx.init(params)
    for _ in range(4):  # through the switch (t_max = 2)
        u, state = jax.jit(tx.update)(grads, state, params)
        np.testing.assert_array_equal(np.asarray(u["bias"]), 0.0)
        np.testing.assert_allclose(np.asarray(u["kernel"]), -0.1 * 0.5 * 2.0, rtol=1e-6)
    assert int(step_state(state).phase) == 1


def test_adamw_step_bfloat16_and_inject_init_under_jit():
    params = {"kernel": jnp.ones((8, 4), jnp.bfloat16), "bias": jnp.ones((4,), jnp.bfloat16)}
    grads = jax.tree.map(lambda x: 0.5 * x, params)
    tx = optax.chain(masked_decay(1e-2), adamw_step(1e-3, clipping=(1, 3), switch_eps=0.0))
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(5):
        updates, state = update(grads, state, params)
    assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(updates))
    assert step_state(state).nu["kernel"].dtype == jnp.bfloat16
    assert bool(is_sparse_phase(state)) and int(step_state(state).switch_step) == 4
    # the window needs a concrete b2 at init: clear error under jit, fixed by static_args
    injected = optax.inject_hyperparams(adamw_step)(learning_rate=1e-3, clipping=(1, 3))
    with pytest.raises(ValueError, match="static_args"):
        jax.jit(injected.init)(params)
    injected = optax.inject_hyperparams(adamw_step, static_args=("b2",))(
        learning_rate=1e-3, clipping=(1, 3)
    )
    assert step_state(jax.jit(injected.init)(params)).z_buffer.shape == (1000,)


@pytest.mark.parametrize("b2,window", [(0.9, 10), (0.99, 100), (0.999, 1000), (0.95, 20)])
def test_adamw_step_window(b2, window):
    tx = adamw_step(1e-3, b2=b2, clipping=(1, 5))
    assert step_state(tx.init({"w": jnp.zeros(3)})).z_buffer.shape == (window,)
    assert step_state(adamw_step(1e-3, b2=b2, clipping=(1, 5), z_window=7).init({"w": jnp.zeros(3)})).z_buffer.shape == (7,)


# ----------------------------------------------------------------------------------------------
# schedules
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "total,fraction,switch", [(600, 1 / 6, 500), (100, 0.0, 100), (100, 1.0, 0), (10, 0.25, 8)]
)
def test_sparsity_schedule(total, fraction, switch):
    fn = sparsity_schedule(total, dense_finetune_fraction=fraction)
    steps = np.arange(total + 2)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(fn))(steps)), steps < switch)
    assert not bool(fn(switch)) and not bool(fn(total))
    if switch > 0:
        assert bool(fn(switch - 1)) and bool(fn(0))


def test_dense_finetune_schedule_and_errors():
    fn = dense_finetune_schedule(3)
    assert [bool(fn(s)) for s in range(5)] == [True, True, True, False, False]
    assert jax.jit(fn)(jnp.int32(2)).dtype == jnp.bool_
    with pytest.raises(ValueError):
        sparsity_schedule(100, dense_finetune_fraction=1.5)
    with pytest.raises(ValueError):
        dense_finetune_schedule(2.5)


def test_masked_decay_stops_at_dense_finetune():
    total = 12
    fn = sparsity_schedule(total, dense_finetune_fraction=0.25)  # switch at 9
    switch = next(s for s in range(total) if not bool(fn(s)))
    tx = masked_decay(1.0, active_until=switch)
    params = {"kernel": jnp.ones((4, 1))}
    state = tx.init(params)
    decayed = []
    for _ in range(total):
        u, state = tx.update({"kernel": jnp.zeros((4, 1))}, state, params)
        decayed.append(bool(np.asarray(u["kernel"]).any()))
    assert decayed == [True] * 9 + [False] * 3


def test_sparse_lr_scale_scales_selected_updates_until_switch():
    """The 2:4 weights' updates x factor (default selection: 2-D kernels with in % 4 == 0), every
    other leaf unchanged; after active_until everything passes unchanged; a schedule factor; jit."""
    params = {"fc": {"kernel": jnp.ones((8, 4))}, "head": {"kernel": jnp.ones((3, 4))}, "b": jnp.ones(4), "n": None}
    ups = jax.tree.map(lambda x: 0.5 * x, params)
    tx = sparse_lr_scale(2.0, active_until=2)
    state = tx.init(params)
    step = jax.jit(tx.update)
    seen = []
    for _ in range(3):
        out, state = step(ups, state)
        assert out["n"] is None and float(out["head"]["kernel"][0, 0]) == 0.5 and float(out["b"][0]) == 0.5
        seen.append(float(out["fc"]["kernel"][0, 0]))
    assert seen == [1.0, 1.0, 0.5]
    only_head = sparse_lr_scale(lambda count: 3.0 + count, where=lambda path, leaf: path.startswith("head"))
    out, st = only_head.update(ups, only_head.init(params))
    assert float(out["head"]["kernel"][0, 0]) == 1.5 and float(out["fc"]["kernel"][0, 0]) == 0.5
    assert float(only_head.update(ups, st)[0]["head"]["kernel"][0, 0]) == 2.0  # factor(1) = 4
    # after an Adam-type optimizer: the selected leaves move `factor` times as far
    chain = optax.chain(optax.adam(1e-2), sparse_lr_scale(2.0))
    u, _ = chain.update(ups, chain.init(params))
    np.testing.assert_allclose(np.asarray(u["fc"]["kernel"]), 2 * np.asarray(u["head"]["kernel"][:1, :1]).item())
    for bad in (dict(factor=0.0), dict(factor=-1.0), dict(active_until=-1), dict(active_until=2.5),
                dict(active_until=True)):
        with pytest.raises(ValueError, match="sparse_lr_scale"):
            sparse_lr_scale(**bad)


def test_all_exported():
    for name in optim.__all__:
        assert hasattr(optim, name), name
