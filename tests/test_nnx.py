"""Flax NNX Sparse24Linear: the linen layer's math, Sparsity variables, refresh, masked decay, training."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

import jax_sparse24 as s24
from jax_sparse24.nn import Sparse24Dense
from jax_sparse24.nnx import Sparse24Linear, Sparse24Mask, Sparsity, masks_for_params, refresh_masks

_get = s24.nnx._get
_set = s24.nnx._set


def _x(shape=(6, 16), seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _optimizer_update(optimizer, model, grads, **kwargs):
    """``nnx.Optimizer.update``: ``update(model, grads)`` from flax 0.11 on, ``update(grads)`` in flax 0.10."""
    if "model" in inspect.signature(optimizer.update).parameters:
        return optimizer.update(model, grads, **kwargs)
    return optimizer.update(grads, **kwargs)


def _pure(state):
    """A State of arrays (``nnx.as_pure``, flax >= 0.11), or the State itself on flax 0.10."""
    return nnx.as_pure(state) if hasattr(nnx, "as_pure") else state


def _is_24(mask, axis):
    m = np.moveaxis(np.asarray(mask), axis, -1)
    return bool((m.reshape(m.shape[:-1] + (-1, 4)).sum(-1) == 2).all())


# --- the layer -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["srste", "ste", "soft", "dense"])
@pytest.mark.parametrize("use_bias", [True, False])
def test_params_and_init_identical_to_nnx_linear(method, use_bias):
    ours = Sparse24Linear(16, 8, use_bias=use_bias, method=method, rngs=nnx.Rngs(0))
    theirs = nnx.Linear(16, 8, use_bias=use_bias, rngs=nnx.Rngs(0))
    a, b = nnx.to_pure_dict(nnx.state(ours, nnx.Param)), nnx.to_pure_dict(nnx.state(theirs, nnx.Param))
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    sparsity = nnx.to_pure_dict(nnx.state(ours, Sparsity))
    want = {"srste": {"mask"}, "soft": {"beta"}}.get(method, set())
    assert set(sparsity) == want
    if method == "srste":
        assert isinstance(ours.mask, Sparse24Mask) and not isinstance(ours.mask, nnx.Param)
        np.testing.assert_array_equal(np.asarray(sparsity["mask"]), np.asarray(s24.transposable_mask24(_get(ours.kernel))))


def _linen_and_nnx(method, transposable=True, out=8, x=None, dtype=None):
    """A linen Sparse24Dense and a Sparse24Linear holding the same kernel, bias, mask and β."""
    x = _x() if x is None else x
    layer = Sparse24Dense(out, method=method, transposable=transposable, dtype=dtype)
    v = layer.init(jax.random.key(3), x)
    ours = Sparse24Linear(x.shape[-1], out, method=method, transposable=transposable, dtype=dtype, rngs=nnx.Rngs(0))
    _set(ours.kernel, v["params"]["kernel"])
    _set(ours.bias, v["params"]["bias"])
    sp = v.get("sparsity", {})
    if method == "srste":
        _set(ours.mask, sp["transposable_mask" if transposable else "mask"])
    if method == "soft":
        _set(ours.beta, sp["beta"])
    return layer, v, ours


@pytest.mark.parametrize("method,transposable,dtype", [
    ("srste", True, None), ("srste", False, None), ("ste", False, None), ("soft", False, None),
    ("dense", False, None), ("srste", True, jnp.bfloat16), ("soft", False, jnp.bfloat16)])
def test_forward_and_gradients_match_the_linen_layer(method, transposable, dtype):
    x = _x((2, 3, 16))
    layer, v, ours = _linen_and_nnx(method, transposable, x=x, dtype=dtype)
    assert ours(x).dtype == layer.apply(v, x).dtype == (dtype or jnp.float32)
    np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(layer.apply(v, x)))

    def linen_loss(p, x):
        return jnp.sum(jnp.sin(layer.apply({**v, "params": p}, x).astype(jnp.float32)))

    def nnx_loss(model, x):
        return jnp.sum(jnp.sin(model(x).astype(jnp.float32)))

    gp, gx = jax.grad(linen_loss, argnums=(0, 1))(v["params"], x)
    grads, gx_nnx = nnx.grad(nnx_loss, argnums=(0, 1))(ours, x)
    grads = nnx.to_pure_dict(grads)
    assert set(grads) == {"kernel", "bias"}  # masks and β get no gradient
    np.testing.assert_allclose(np.asarray(grads["kernel"]), np.asarray(gp["kernel"]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grads["bias"]), np.asarray(gp["bias"]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gx_nnx), np.asarray(gx), rtol=1e-6, atol=1e-6)


def test_srste_uses_the_stored_mask_and_the_sparse_flag():
    x = _x()
    layer = Sparse24Linear(16, 8, rngs=nnx.Rngs(0))
    k, b, m = _get(layer.kernel), _get(layer.bias), _get(layer.mask)
    np.testing.assert_allclose(np.asarray(layer(x)), np.asarray(x @ (k * m) + b), rtol=1e-5, atol=1e-6)
    _set(layer.kernel, -k)  # the stored mask, not a fresh one, is used
    np.testing.assert_allclose(np.asarray(layer(x)), np.asarray(x @ (-k * m) + b), rtol=1e-5, atol=1e-6)
    _set(layer.kernel, k)
    dense, sparse = x @ k + b, layer(x)
    np.testing.assert_allclose(np.asarray(layer(x, sparse=False)), np.asarray(dense), rtol=1e-5, atol=1e-6)
    f = nnx.jit(lambda layer, s: layer(x, sparse=s))
    np.testing.assert_allclose(np.asarray(f(layer, jnp.asarray(False))), np.asarray(dense), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(f(layer, jnp.asarray(True))), np.asarray(sparse), rtol=1e-5, atol=1e-6)


def test_mvue_stream_changes_the_weight_gradient_only():
    x = _x((8, 16))

    def grads(layer_rngs, **call):
        layer = Sparse24Linear(16, 8, backend="dense", rngs=layer_rngs)  # 'auto' on a CPU keeps the exact gradient
        return nnx.grad(lambda m, x: (m(x, **call) ** 2).sum(), argnums=(0, 1))(layer, x)

    (g0, gx0), (g1, gx1) = grads(nnx.Rngs(0)), grads(nnx.Rngs(0, mvue=1))
    k0, k1 = np.asarray(nnx.to_pure_dict(g0)["kernel"]), np.asarray(nnx.to_pure_dict(g1)["kernel"])
    np.testing.assert_allclose(np.asarray(gx0), np.asarray(gx1), rtol=1e-5)
    assert not np.allclose(k0, k1) and (k1 != 0).mean() > 0.5  # xᵀ·MVUE(∇y) is dense
    # A key at call time: the weight gradient of sparse24_linear with that key.
    key = jax.random.key(7)
    g2, _ = grads(nnx.Rngs(0), rngs=key)
    layer = Sparse24Linear(16, 8, backend="dense", rngs=nnx.Rngs(0))
    k, b, m = _get(layer.kernel), _get(layer.bias), _get(layer.mask)
    want = jax.grad(lambda k: (s24.sparse24_linear(x, k, m, b, key=key, backend="dense") ** 2).sum())(k)
    np.testing.assert_allclose(np.asarray(nnx.to_pure_dict(g2)["kernel"]), np.asarray(want), rtol=1e-6)
    # mvue=False: no stream is kept, the gradient is exact.
    assert Sparse24Linear(16, 8, mvue=False, rngs=nnx.Rngs(0, mvue=1)).mvue_rngs is None


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda r: Sparse24Linear(6, 8, rngs=r), "in_features must be divisible by 4"),
        (lambda r: Sparse24Linear(8, 6, rngs=r), "out_features divisible by 4"),
        (lambda r: Sparse24Linear(8, 8, method="magic", rngs=r), "method must be one of"),
        (lambda r: Sparse24Linear(8, 8, backend="magic", rngs=r), "backend must be one of"),
        (lambda r: Sparse24Linear(8, 8, mask_every=0, rngs=r), "mask_every must be a positive integer"),
    ],
)
def test_bad_config(make, match):
    with pytest.raises(ValueError, match=match):
        make(nnx.Rngs(0))


def test_valid_odd_shapes_and_wrong_input_size():
    Sparse24Linear(8, 6, transposable=False, rngs=nnx.Rngs(0))  # 2:4 along in only
    Sparse24Linear(8, 6, method="ste", rngs=nnx.Rngs(0))
    Sparse24Linear(6, 5, method="dense", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="inputs must have 8 features"):
        Sparse24Linear(8, 8, rngs=nnx.Rngs(0))(jnp.ones((2, 12)))


# --- refresh_masks and masks_for_params --------------------------------------------------------------


class _Two(nnx.Module):
    def __init__(self, rngs, method="srste"):
        self.a = Sparse24Linear(16, 16, method=method, mask_every=2, rngs=rngs)
        self.b = Sparse24Linear(16, 8, method=method, transposable=False, mask_every=3, rngs=rngs)
        self.head = nnx.Linear(8, 4, rngs=rngs)

    def __call__(self, x):
        return self.head(self.b(nnx.gelu(self.a(x))))


@pytest.mark.parametrize("skip_idle", [True, False])
def test_refresh_masks_per_layer_periods_in_place(skip_idle):
    """Each layer on its own period, in place; skip_idle=False (no lax.cond in the program) the same."""
    model = _Two(nnx.Rngs(0))
    rng = np.random.default_rng(2)
    for layer in (model.a, model.b):
        k = _get(layer.kernel)
        _set(layer.kernel, k + 0.5 * jnp.asarray(rng.normal(size=k.shape), k.dtype))
    old_a, old_b = np.asarray(_get(model.a.mask)), np.asarray(_get(model.b.mask))
    fresh_a = np.asarray(s24.transposable_mask24(_get(model.a.kernel)))
    fresh_b = np.asarray(s24.mask24(_get(model.b.kernel), axis=0))
    assert (fresh_a != old_a).any() and (fresh_b != old_b).any()
    f = nnx.jit(lambda model, step: refresh_masks(model, step=step, skip_idle=skip_idle))
    jaxpr = str(jax.make_jaxpr(lambda k, m, st: s24.masks.refresh_masks({"a": {"kernel": k}}, {"a": {
        "transposable_mask": m, "mask_every": 2}}, step=st, skip_idle=skip_idle))(
        _get(model.a.kernel), _get(model.a.mask), jnp.asarray(4)))
    assert ("cond[" in jaxpr) == skip_idle
    for step, (want_a, want_b) in {4: (fresh_a, old_b), 9: (old_a, fresh_b), 7: (old_a, old_b),
                                   6: (fresh_a, fresh_b)}.items():
        _set(model.a.mask, old_a)
        _set(model.b.mask, old_b)
        rate = f(model, jnp.asarray(step))
        np.testing.assert_array_equal(np.asarray(_get(model.a.mask)), want_a, err_msg=f"step {step}")
        np.testing.assert_array_equal(np.asarray(_get(model.b.mask)), want_b, err_msg=f"step {step}")
        flips = (want_a != old_a).sum() + (want_b != old_b).sum()
        total = old_a.size * (want_a is fresh_a) + old_b.size * (want_b is fresh_b)
        assert float(rate) == pytest.approx(flips / total if total else 0.0)
    # The linen refresh on the same kernels and masks gives the same masks and flip rate.
    params = {"a": {"kernel": _get(model.a.kernel)}, "b": {"kernel": _get(model.b.kernel)}}
    sparsity = {"a": {"transposable_mask": jnp.asarray(old_a), "mask_every": 2},
                "b": {"mask": jnp.asarray(old_b), "mask_every": 3}}
    _set(model.a.mask, old_a)
    _set(model.b.mask, old_b)
    new, linen_rate = s24.masks.refresh_masks(params, sparsity, step=None)
    rate = refresh_masks(model)  # step=None: every layer
    np.testing.assert_array_equal(np.asarray(_get(model.a.mask)), np.asarray(new["a"]["transposable_mask"]))
    np.testing.assert_array_equal(np.asarray(_get(model.b.mask)), np.asarray(new["b"]["mask"]))
    assert float(rate) == float(linen_rate)


def test_masks_for_params_matches_the_param_state():
    model = _Two(nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    masks = masks_for_params(model)
    assert jax.tree_util.tree_structure(masks, is_leaf=lambda x: x is None) == jax.tree_util.tree_structure(
        params, is_leaf=lambda x: isinstance(x, nnx.Variable))  # the Param state's layout, masks at kernels
    d = masks
    np.testing.assert_array_equal(np.asarray(d["a"]["kernel"]), np.asarray(_get(model.a.mask)))
    np.testing.assert_array_equal(np.asarray(d["b"]["kernel"]), np.asarray(_get(model.b.mask)))
    assert d["a"]["bias"] is None and d["head"]["kernel"] is None and d["head"]["bias"] is None
    # Only srste layers have masks.
    d = masks_for_params(_Two(nnx.Rngs(0), method="ste"))
    assert all(leaf is None for leaf in jax.tree_util.tree_leaves(d, is_leaf=lambda x: x is None))


# --- masked_decay with NNX state ---------------------------------------------------------------------


def test_masked_decay_takes_nnx_state_and_dict_masks():
    model = _Two(nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    grads = jax.tree.map(jnp.zeros_like, params)
    d = nnx.to_pure_dict(params)
    masks_dict = jax.tree.map(lambda _: None, d)
    masks_dict["a"]["kernel"], masks_dict["b"]["kernel"] = _get(model.a.mask), _get(model.b.mask)
    tx = s24.optim.masked_decay(0.5)
    want, _ = tx.update(jax.tree.map(jnp.zeros_like, d), tx.init(d), d, masks=masks_dict)  # all dicts
    # Params and grads as State of Variables or of arrays (what nnx.Optimizer passes from flax 0.11
    # on); masks as an NNX State or as a plain dict (e.g. linen's masks_for_params under ToNNX).
    for p, g in ((params, grads), (_pure(params), _pure(grads))):
        for masks in (masks_for_params(model), masks_dict):
            upd, _ = tx.update(g, tx.init(p), p, masks=masks)
            assert jax.tree_util.tree_structure(upd) == jax.tree_util.tree_structure(g)
            for a, b in zip(jax.tree_util.tree_leaves(upd), jax.tree_util.tree_leaves(want)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    k = d["a"]["kernel"]
    np.testing.assert_allclose(np.asarray(want["a"]["kernel"]),
                               np.asarray(0.5 * jnp.where(_get(model.a.mask), 0.0, k)), rtol=1e-6)
    assert not np.asarray(want["head"]["kernel"]).any()
    # A mask at a path that is not a parameter: still the structure error.
    bad = dict(masks_dict, c={"kernel": _get(model.a.mask)})
    with pytest.raises(ValueError, match="must have the structure of `params`"):
        tx.update(grads, tx.init(params), params, masks=bad)


def test_masked_decay_with_a_linen_model_under_to_nnx():
    """The issue's case: linen Sparse24Dense through nnx.bridge.ToNNX, masks from s24.masks.masks_for_params."""

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return Sparse24Dense(4, transposable=False)(nn.gelu(Sparse24Dense(32)(x)))

    x, y = _x((8, 16)), jnp.zeros((8, 4))
    model = nnx.bridge.ToNNX(MLP(), rngs=nnx.Rngs(0))
    nnx.bridge.lazy_init(model, x)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    sparsity = nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param)))
    masks = s24.masks.masks_for_params(params, sparsity)  # a plain dict
    tx = optax.chain(s24.optim.masked_decay(0.1), optax.sgd(1.0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    grads = nnx.grad(lambda m: ((m(x) - y) ** 2).mean())(model)
    _optimizer_update(optimizer, model, grads, masks=masks)
    want = jax.tree.map(lambda p, g, m: p - g - (0.0 if m is None else 0.1 * jnp.where(m, 0.0, p)),
                        params, nnx.to_pure_dict(grads), masks, is_leaf=lambda v: v is None)
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


# --- training ---------------------------------------------------------------------------------------


class _MLP(nnx.Module):
    def __init__(self, method, rngs):
        self.up = Sparse24Linear(16, 64, method=method, mask_every=10, rngs=rngs)
        self.down = Sparse24Linear(64, 4, method=method, transposable=False, mask_every=10, rngs=rngs)

    def __call__(self, x):
        return self.down(nnx.gelu(self.up(x)))


def _regression(n=256):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(n, 16)), jnp.float32)
    return x, jnp.tanh(x @ jnp.asarray(rng.normal(size=(16, 4)), jnp.float32))


def test_srste_training_with_optimizer_masked_decay_and_refresh():
    x, y = _regression()
    model = _MLP("srste", nnx.Rngs(0, mvue=1))
    tx = optax.chain(s24.optim.masked_decay(0.05), optax.adam(3e-3))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        _optimizer_update(optimizer, model, grads, masks=masks_for_params(model))
        return loss, refresh_masks(model, step=optimizer.step)

    def pruned_norm():
        return float(jnp.linalg.norm(jnp.where(_get(model.up.mask), 0.0, _get(model.up.kernel))))

    before = pruned_norm()
    losses, rates = [], []
    for _ in range(150):
        loss, rate = step(model, optimizer)
        losses.append(float(loss))
        rates.append(float(rate))
    assert int(_get(optimizer.step)) == 150
    assert np.isfinite(losses).all()
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5]), (losses[:5], losses[-10:])
    assert all(r == 0.0 for j, r in enumerate(rates) if (j + 1) % 10)  # refresh every 10 steps only
    assert 0.0 < max(rates) < 0.5
    assert pruned_norm() < before  # masked decay shrinks the pruned weights
    up, down = np.asarray(_get(model.up.mask)), np.asarray(_get(model.down.mask))
    assert _is_24(up, 0) and _is_24(up, 1)  # transposable: 2:4 along in and out
    assert _is_24(down, 0)
    np.testing.assert_array_equal(up, np.asarray(s24.transposable_mask24(_get(model.up.kernel))))


@pytest.mark.parametrize("method", ["ste", "soft", "dense"])
def test_other_methods_train(method):
    x, y = _regression()
    model = _MLP(method, nnx.Rngs(0, mvue=1))
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        _optimizer_update(optimizer, model, grads)
        return loss

    losses = [float(step(model, optimizer)) for _ in range(150)]
    assert np.isfinite(losses).all()
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5]), (losses[:5], losses[-10:])


def test_fp8_delayed_scaling_state_and_update():
    """fp8_scaling='delayed': the state lives in Fp8Meta variables (not nnx.Param, so the optimizer
    leaves it); differentiated with DiffState(Param, Fp8Meta), update_fp8_meta writes the new state into
    the model and hands the optimizer only the params' gradients; the second step quantizes x with the
    first step's amax (scale = amax / 448), as Sparse24Dense does."""
    import optax

    from jax_sparse24 import fp8 as f8

    layer = s24.nnx.Sparse24Linear(64, 32, fp8=True, fp8_scaling="delayed", amax_history_length=4,
                                   rngs=nnx.Rngs(0, mvue=1))
    assert set(nnx.to_pure_dict(nnx.state(layer, nnx.Param))) == {"kernel", "bias"}
    assert set(nnx.to_pure_dict(nnx.state(layer, s24.nnx.Fp8Meta))) == {f"fp8_{n}" for n in f8.META_NAMES}
    x = jax.random.normal(jax.random.key(1), (8, 64))
    opt = nnx.Optimizer(layer, optax.adam(1e-3), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt):
        diff = nnx.DiffState(0, (nnx.Param, s24.nnx.Fp8Meta))
        grads = nnx.grad(lambda m: (m(x) ** 2).mean(), argnums=diff)(model)
        param_grads = s24.nnx.update_fp8_meta(model, grads)
        assert set(nnx.to_pure_dict(param_grads)) == {"kernel", "bias"}
        _optimizer_update(opt, model, param_grads)

    step(layer, opt)
    assert float(layer.fp8_input_scale.get_value()[0]) == 1.0  # the first step: an empty history
    step(layer, opt)
    np.testing.assert_allclose(float(layer.fp8_input_scale.get_value()[0]), float(f8.amax(x)) / f8.FP8_MAX,
                               rtol=1e-6)
    assert float(layer.fp8_output_grad_amax_history.get_value()[0]) > 0
    with pytest.raises(ValueError, match="needs fp8=True"):
        s24.nnx.Sparse24Linear(64, 32, fp8_scaling="delayed", rngs=nnx.Rngs(0))
    # differentiated with respect to nnx.Param only, the state would never move: refused
    grads = nnx.grad(lambda m: (m(x) ** 2).mean())(layer)
    with pytest.raises(ValueError, match="DiffState"):
        s24.nnx.update_fp8_meta(layer, grads)
