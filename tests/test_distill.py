"""Tests of jax_sparse24.distill (CPU): KD / hidden-state losses, ast_loss, the adaptive 2:4
low-rank layer and the student-from-dense parameter helper."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_sparse24 import distill
from jax_sparse24._src import reference_ops


def _rand(shape, seed=0, scale=1.0):
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _kl_np(s, t, temp):
    s = np.asarray(s, np.float64) / temp
    t = np.asarray(t, np.float64) / temp
    logq = s - np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1, keepdims=True)) - s.max(-1, keepdims=True)
    logp = t - np.log(np.exp(t - t.max(-1, keepdims=True)).sum(-1, keepdims=True)) - t.max(-1, keepdims=True)
    return (np.exp(logp) * (logp - logq)).sum(-1) * temp**2  # per token


# ---------------------------------------------------------------------------------------------
# losses


def test_kd_zero_for_equal_logits():
    t = _rand((2, 5, 11), seed=1, scale=3.0)
    assert float(distill.distillation_loss(t, t)) == pytest.approx(0.0, abs=1e-6)
    assert float(distill.distillation_loss(t, t, temperature=2.0)) == pytest.approx(0.0, abs=1e-6)
    # a constant shift per token leaves the softmax unchanged
    assert float(distill.distillation_loss(t + 5.0, t)) == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("temp", [1.0, 2.0, 0.5])
def test_kd_matches_numpy_kl(temp):
    s, t = _rand((3, 4, 17), seed=2, scale=2.0), _rand((3, 4, 17), seed=3, scale=2.0)
    got = float(distill.distillation_loss(s, t, temperature=temp))
    want = _kl_np(s, t, temp).mean()
    assert got > 0
    assert got == pytest.approx(want, rel=1e-5)
    # direction: KL(teacher || student), not the reverse
    rev = _kl_np(t, s, temp).mean()
    assert abs(rev - want) > 1e-3 and got != pytest.approx(rev, rel=1e-5)


def test_kd_mask_and_gradients():
    s, t = _rand((2, 6, 9), seed=4), _rand((2, 6, 9), seed=5)
    mask = np.zeros((2, 6), np.float32)
    mask[0, :3] = 1
    got = float(distill.distillation_loss(s, t, mask=mask))
    assert got == pytest.approx(_kl_np(s, t, 1.0)[0, :3].mean(), rel=1e-5)
    gs, gt = jax.grad(lambda a, b: distill.distillation_loss(a, b, temperature=2.0), argnums=(0, 1))(s, t)
    assert (gt == 0).all()  # no gradient into the teacher
    # d/ds T²·KL = T·(softmax(s/T) − softmax(t/T)) / tokens
    want = 2.0 * (jax.nn.softmax(s / 2.0) - jax.nn.softmax(t / 2.0)) / 12
    np.testing.assert_allclose(gs, want, rtol=1e-4, atol=1e-7)


def test_kd_bad_inputs():
    with pytest.raises(ValueError) as e:
        distill.distillation_loss(jnp.zeros((2, 4, 65)), jnp.zeros((2, 4, 64)))
    assert "65" in str(e.value) and "64" in str(e.value) and "vocabulary" in str(e.value)
    with pytest.raises(ValueError, match="same token shape"):
        distill.distillation_loss(jnp.zeros((2, 4, 8)), jnp.zeros((2, 5, 8)))
    with pytest.raises(ValueError, match="temperature"):
        distill.distillation_loss(jnp.zeros((2, 8)), jnp.zeros((2, 8)), temperature=0.0)


def test_hidden_state_loss():
    s, t = _rand((2, 3, 8), seed=6), _rand((2, 3, 8), seed=7)
    want = float(np.mean((np.asarray(s) - np.asarray(t)) ** 2))
    assert float(distill.hidden_state_loss(s, t)) == pytest.approx(want, rel=1e-6)
    norm = want / float(np.mean(np.asarray(t) ** 2))
    assert float(distill.hidden_state_loss(s, t, normalize=True)) == pytest.approx(norm, rel=1e-3)
    assert float(distill.hidden_state_loss([s, s], [t, s])) == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="2 student layers but 1 teacher"):
        distill.hidden_state_loss([s, s], [t])
    with pytest.raises(ValueError, match=r"layer 0: student shape \(2, 3, 8\) != teacher shape \(3, 8\)"):
        distill.hidden_state_loss([s], [t[0]])


def test_ast_loss_combines_terms():
    s, t = _rand((4, 10), seed=8), _rand((4, 10), seed=9)
    hs, ht = [_rand((4, 6), seed=10)], [_rand((4, 6), seed=11)]
    total, aux = distill.ast_loss(2.0, s, t, alpha=0.5, beta=0.25, temperature=2.0,
                                  student_hidden=hs, teacher_hidden=ht)
    kd = distill.distillation_loss(s, t, temperature=2.0)
    hid = distill.hidden_state_loss(hs, ht, normalize=True)
    assert float(total) == pytest.approx(2.0 + 0.5 * float(kd) + 0.25 * float(hid), rel=1e-6)
    assert float(aux["kd"]) == pytest.approx(float(kd)) and float(aux["hidden"]) == pytest.approx(float(hid))
    with pytest.raises(ValueError, match="beta"):
        distill.ast_loss(1.0, s, t, beta=1.0)
    # usable directly with has_aux
    (val, _), g = jax.value_and_grad(lambda a: distill.ast_loss(0.0, a, t), has_aux=True)(s)
    assert float(val) > 0 and g.shape == s.shape


# ---------------------------------------------------------------------------------------------
# Sparse24LowRankDense


def _init(layer, x, seed=0):
    return jax.jit(layer.init)(jax.random.key(seed), x)


def _masked_dense(x, kernel, bias, n=2, m=4):
    w = jnp.where(reference_ops.nm_mask(kernel, n, m, 0), kernel, 0.0)
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64) + np.asarray(bias, np.float64)


@pytest.mark.parametrize("rank", [0, 4])
def test_lora_init_starts_as_masked_dense(rank):
    x = _rand((3, 5, 16), seed=1)
    layer = distill.Sparse24LowRankDense(features=8, rank=rank, low_rank_init="lora",
                                         bias_init=nn.initializers.normal(1.0))
    params = _init(layer, x)
    p = params["params"]
    if rank:
        assert p["lora_a"].shape == (16, rank) and p["lora_b"].shape == (rank, 8)
        assert (p["lora_b"] == 0).all() and (p["lora_a"] != 0).any()
    else:
        assert set(p) == {"kernel", "bias"}
    y = layer.apply(params, x)
    np.testing.assert_allclose(y, _masked_dense(x, p["kernel"], p["bias"]), rtol=1e-5, atol=1e-5)


def test_slorb_init_term():
    x = _rand((4, 16), seed=2)
    layer = distill.Sparse24LowRankDense(features=8, rank=4)
    params = _init(layer, x)
    p = params["params"]
    assert set(p) == {"kernel", "bias", "lora_b"}  # the projection is fixed, not a parameter
    w = np.asarray(p["kernel"], np.float64)
    pruned = np.where(np.asarray(reference_ops.mask24(p["kernel"], axis=0)), 0.0, w)
    b_want = pruned.reshape(4, 4, 8).mean(1)
    np.testing.assert_allclose(p["lora_b"], b_want, rtol=1e-6, atol=1e-7)
    xa = np.asarray(x, np.float64).reshape(4, 4, 4).sum(-1)
    want = _masked_dense(x, p["kernel"], p["bias"]) + xa @ b_want
    np.testing.assert_allclose(layer.apply(params, x), want, rtol=1e-5, atol=1e-5)
    # trainable projection: same function at init, A is a parameter equal to the projection
    layer_t = distill.Sparse24LowRankDense(features=8, rank=4, trainable_projection=True)
    pt = _init(layer_t, x)
    np.testing.assert_array_equal(pt["params"]["lora_a"], distill.group_projection(16, 4))
    np.testing.assert_allclose(layer_t.apply(pt, x), want, rtol=1e-5, atol=1e-5)


def test_slorb_full_rank_recovers_dense():
    # rank == in (groups of one channel): x·A·B = x·(W⊙(1−M)), so the layer starts as x·W + b
    x = _rand((6, 8), seed=3)
    layer = distill.Sparse24LowRankDense(features=4, rank=8)
    params = _init(layer, x)
    p = params["params"]
    np.testing.assert_allclose(layer.apply(params, x), x @ p["kernel"] + p["bias"], rtol=1e-5, atol=1e-5)


def test_straight_through_gradient_and_adaptive_mask():
    x = _rand((5, 8), seed=4)
    layer = distill.Sparse24LowRankDense(features=4)
    params = _init(layer, x)
    g = _rand((5, 4), seed=5)
    grads = jax.grad(lambda p: jnp.sum(layer.apply(p, x) * g))(params)["params"]
    np.testing.assert_allclose(grads["kernel"], x.T @ g, rtol=1e-5, atol=1e-5)  # dense, ST
    np.testing.assert_allclose(grads["bias"], g.sum(0), rtol=1e-5)
    # the mask follows the weight: swap two magnitudes in a group and the kept set moves
    k = np.asarray(params["params"]["kernel"]).copy()
    k[:4, 0] = [5.0, 4.0, 0.1, 0.2]
    y1 = layer.apply({"params": {**params["params"], "kernel": jnp.asarray(k)}}, x)
    k[:4, 0] = [0.1, 0.2, 5.0, 4.0]
    y2 = layer.apply({"params": {**params["params"], "kernel": jnp.asarray(k)}}, x)
    np.testing.assert_allclose(y1[:, 0], x[:, 0] * 5.0 + x[:, 1] * 4.0 + x[:, 4:] @ _kept(k)[4:, 0],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y2[:, 0], x[:, 2] * 5.0 + x[:, 3] * 4.0 + x[:, 4:] @ _kept(k)[4:, 0],
                               rtol=1e-5, atol=1e-5)


def _kept(k):
    return np.where(np.asarray(reference_ops.mask24(jnp.asarray(k), axis=0)), k, 0.0)


def test_other_nm_and_jit_and_dtype():
    x = _rand((3, 16), seed=6)
    layer = distill.Sparse24LowRankDense(features=4, n=1, m=8, low_rank_init="lora", rank=2)
    params = _init(layer, x)
    p = params["params"]
    y = jax.jit(layer.apply)(params, x)
    np.testing.assert_allclose(y, _masked_dense(x, p["kernel"], p["bias"], 1, 8), rtol=1e-5, atol=1e-5)
    gk = jax.grad(lambda q: jnp.sum(layer.apply(q, x)))(params)["params"]["kernel"]
    np.testing.assert_allclose(gk, np.broadcast_to(np.asarray(x).sum(0)[:, None], (16, 4)), rtol=1e-5)
    bf = distill.Sparse24LowRankDense(features=4, rank=4, dtype=jnp.bfloat16)
    pb = _init(bf, x)
    assert bf.apply(pb, x).dtype == jnp.bfloat16 and pb["params"]["kernel"].dtype == jnp.float32


def test_layer_bad_config():
    x = jnp.ones((2, 6))
    with pytest.raises(ValueError, match="divisible by m=4"):
        distill.Sparse24LowRankDense(features=4).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="divisible by rank=3"):
        distill.Sparse24LowRankDense(features=4, rank=3).init(jax.random.key(0), jnp.ones((2, 8)))
    with pytest.raises(ValueError, match="low_rank_init"):
        distill.Sparse24LowRankDense(features=4, rank=2, low_rank_init="svd").init(jax.random.key(0), jnp.ones((2, 8)))


# ---------------------------------------------------------------------------------------------
# student parameters from a dense model


class _Tiny(nn.Module):
    sparse: bool = False
    low_rank_init: str = "slorb_mean"

    @nn.compact
    def __call__(self, x):
        dense = (lambda f, name: distill.Sparse24LowRankDense(f, rank=4, name=name,
                                                              low_rank_init=self.low_rank_init)) \
            if self.sparse else (lambda f, name: nn.Dense(f, name=name))
        x = nn.Embed(10, 16, name="embed")(x)
        x = jax.nn.relu(dense(32, "fc1")(x))
        x = dense(16, "fc2")(x)
        return nn.Dense(10, name="head")(x)


@pytest.mark.parametrize("init", ["slorb_mean", "lora"])
def test_student_params_from_dense(init):
    tok = jnp.arange(8).reshape(2, 4)
    dense_p = jax.jit(_Tiny().init)(jax.random.key(0), tok)
    student = _Tiny(sparse=True, low_rank_init=init)
    sp = jax.jit(student.init)(jax.random.key(1), tok)
    out = distill.student_params_from_dense(sp, dense_p, low_rank_init=init)
    for path in (("embed", "embedding"), ("fc1", "kernel"), ("fc2", "bias"), ("head", "kernel")):
        np.testing.assert_array_equal(out["params"][path[0]][path[1]], dense_p["params"][path[0]][path[1]])
    for layer in ("fc1", "fc2"):
        b = out["params"][layer]["lora_b"]
        if init == "lora":
            assert (b == 0).all()
        else:
            np.testing.assert_allclose(b, distill.slorb_init(dense_p["params"][layer]["kernel"], 4))
    # with the low-rank term at zero the student is the one-shot 2:4-pruned dense model
    if init == "lora":
        pruned = jax.tree.map(lambda a: a, dense_p)
        for layer in ("fc1", "fc2"):
            k = dense_p["params"][layer]["kernel"]
            pruned["params"][layer]["kernel"] = jnp.where(reference_ops.mask24(k, axis=0), k, 0.0)
        np.testing.assert_allclose(jax.jit(student.apply)(out, tok), jax.jit(_Tiny().apply)(pruned, tok),
                                   rtol=1e-5, atol=1e-5)
    bad = jax.tree.map(lambda a: a, dense_p)
    bad["params"]["fc1"]["kernel"] = jnp.zeros((8, 32))
    with pytest.raises(ValueError, match=r"'params/fc1/kernel' has shape \(8, 32\)"):
        distill.student_params_from_dense(sp, bad)
