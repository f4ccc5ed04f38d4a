"""Sparse24Dense: drop-in param tree, methods, sparsity collection, mask refresh, training."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

import jax_sparse24 as s24
from jax_sparse24.nn import Sparse24Dense
from jax_sparse24.masks import apply_sparsity, masks_for_params, refresh_masks


def _x(shape=(6, 16), seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


@pytest.mark.parametrize("method", ["srste", "ste", "soft", "dense"])
@pytest.mark.parametrize("use_bias", [True, False])
def test_param_tree_identical_to_dense(method, use_bias):
    x = _x()
    ours = Sparse24Dense(8, use_bias=use_bias, method=method).init(jax.random.key(0), x)["params"]
    theirs = nn.Dense(8, use_bias=use_bias).init(jax.random.key(0), x)["params"]
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # same init too


def test_dense_method_equals_nn_dense():
    x = _x()
    v = nn.Dense(8).init(jax.random.key(0), x)
    np.testing.assert_allclose(
        np.asarray(Sparse24Dense(8, method="dense").apply(v, x)), np.asarray(nn.Dense(8).apply(v, x)), rtol=1e-6
    )


def test_srste_forward_uses_the_stored_transposable_mask():
    x = _x()
    layer = Sparse24Dense(8)
    v = layer.init(jax.random.key(0), x)
    m = v["sparsity"]["transposable_mask"]
    k, b = v["params"]["kernel"], v["params"]["bias"]
    np.testing.assert_array_equal(np.asarray(m), np.asarray(s24.transposable_mask24(k)))
    np.testing.assert_allclose(np.asarray(layer.apply(v, x)), np.asarray(x @ (k * m) + b), rtol=1e-5, atol=1e-6)
    # the stored mask, not a fresh one, is used
    v2 = {"params": {"kernel": -k, "bias": b}, "sparsity": v["sparsity"]}
    np.testing.assert_allclose(np.asarray(layer.apply(v2, x)), np.asarray(x @ (-k * m) + b), rtol=1e-5, atol=1e-6)


def test_ste_recomputes_and_soft_uses_frozen_beta():
    x = _x()
    v = Sparse24Dense(8, method="ste").init(jax.random.key(0), x)
    k, b = v["params"]["kernel"], v["params"]["bias"]
    y = Sparse24Dense(8, method="ste").apply(v, x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(x @ (k * s24.mask24(k, axis=0)) + b), rtol=1e-5, atol=1e-6)
    vs = Sparse24Dense(8, method="soft").init(jax.random.key(0), x)
    beta = vs["sparsity"]["beta"]
    np.testing.assert_allclose(float(beta), float(s24.soft_threshold_beta(k, axis=0)), rtol=1e-6)
    s, _ = s24.soft_threshold24(k, axis=0)
    ys = Sparse24Dense(8, method="soft").apply(vs, x)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(x @ (beta * s) + b), rtol=1e-5, atol=1e-5)
    # straight-through: gradient wrt kernel is x^T g, not masked
    g = jax.grad(lambda p: Sparse24Dense(8, method="soft").apply({**vs, "params": p}, x).sum())(vs["params"])
    np.testing.assert_allclose(np.asarray(g["kernel"]), np.asarray(x.T @ jnp.ones((6, 8))), rtol=1e-5)


def test_sparse_flag_static_and_traced():
    x = _x()
    layer = Sparse24Dense(8)
    v = layer.init(jax.random.key(0), x)
    k, b = v["params"]["kernel"], v["params"]["bias"]
    dense = x @ k + b
    sparse = layer.apply(v, x)
    np.testing.assert_allclose(np.asarray(layer.apply(v, x, sparse=False)), np.asarray(dense), rtol=1e-5, atol=1e-6)
    f = jax.jit(lambda v, s: layer.apply(v, x, sparse=s))
    np.testing.assert_allclose(np.asarray(f(v, jnp.asarray(False))), np.asarray(dense), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(f(v, jnp.asarray(True))), np.asarray(sparse), rtol=1e-5, atol=1e-6)


def test_mvue_rng_changes_weight_grad_only():
    x = _x((8, 16))
    layer = Sparse24Dense(8, backend="dense")  # 'auto' on a CPU keeps the exact weight gradient
    v = layer.init(jax.random.key(0), x)

    def grads(rngs):
        return jax.grad(lambda p, x: (layer.apply({**v, "params": p}, x, rngs=rngs) ** 2).sum(), argnums=(0, 1))(
            v["params"], x)

    (gp0, gx0), (gp1, gx1) = grads({}), grads({"mvue": jax.random.key(1)})
    np.testing.assert_allclose(np.asarray(gx0), np.asarray(gx1), rtol=1e-5)
    assert not np.allclose(np.asarray(gp0["kernel"]), np.asarray(gp1["kernel"]))
    nz = (np.asarray(gp1["kernel"]) != 0).mean()
    assert nz > 0.5  # xᵀ·MVUE(∇y) is dense


def test_refresh_masks_and_flip_rate():
    x = _x()
    v = Sparse24Dense(8, mask_every=5).init(jax.random.key(0), x)
    params = jax.tree_util.tree_map(lambda a: a + 0.3 * jnp.asarray(
        np.random.default_rng(1).normal(size=a.shape), a.dtype), v["params"])
    new, rate = refresh_masks(params, v["sparsity"], step=3)  # 3 % 5 != 0: no refresh
    assert float(rate) == 0.0
    np.testing.assert_array_equal(np.asarray(new["transposable_mask"]), np.asarray(v["sparsity"]["transposable_mask"]))
    new, rate = jax.jit(refresh_masks)(params, v["sparsity"], step=10)
    fresh = s24.transposable_mask24(params["kernel"])
    np.testing.assert_array_equal(np.asarray(new["transposable_mask"]), np.asarray(fresh))
    want = float(s24.flip_rate(v["sparsity"]["transposable_mask"], fresh))
    assert float(rate) == pytest.approx(want) and want > 0


def test_refresh_masks_per_layer_periods():
    """Layers with different mask_every refresh on their own steps (one cond for the model)."""

    class Two(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = Sparse24Dense(16, mask_every=2, name="a")(x)
            return Sparse24Dense(8, transposable=False, mask_every=3, name="b")(x)

    x = _x()
    v = Two().init(jax.random.key(0), x)
    params = jax.tree_util.tree_map(lambda a: a + 0.5 * jnp.asarray(
        np.random.default_rng(2).normal(size=a.shape), a.dtype), v["params"])
    fresh_a = np.asarray(s24.transposable_mask24(params["a"]["kernel"]))
    fresh_b = np.asarray(s24.mask24(params["b"]["kernel"], axis=0))
    old_a, old_b = np.asarray(v["sparsity"]["a"]["transposable_mask"]), np.asarray(v["sparsity"]["b"]["mask"])
    assert (fresh_a != old_a).any() and (fresh_b != old_b).any()
    f = jax.jit(refresh_masks)
    for step, (want_a, want_b) in {4: (fresh_a, old_b), 9: (old_a, fresh_b), 6: (fresh_a, fresh_b),
                                   7: (old_a, old_b)}.items():
        new, rate = f(params, v["sparsity"], step=step)
        np.testing.assert_array_equal(np.asarray(new["a"]["transposable_mask"]), want_a, err_msg=f"step {step}")
        np.testing.assert_array_equal(np.asarray(new["b"]["mask"]), want_b, err_msg=f"step {step}")
        flips = (want_a != old_a).sum() + (want_b != old_b).sum()
        total = old_a.size * (want_a is fresh_a) + old_b.size * (want_b is fresh_b)
        assert float(rate) == pytest.approx(flips / total if total else 0.0)


def test_masks_for_params_and_apply_sparsity_in_a_model():
    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(Sparse24Dense(16, name="up")(x))
            x = Sparse24Dense(8, transposable=False, name="down")(x)
            return nn.Dense(4, name="head")(x)

    x = _x()
    v = MLP().init(jax.random.key(0), x)
    masks = masks_for_params(v["params"], v["sparsity"])
    assert masks["up"]["kernel"].shape == (16, 16) and masks["down"]["kernel"].shape == (16, 8)
    assert masks["head"]["kernel"] is None and masks["up"]["bias"] is None
    pruned = apply_sparsity(v["params"], v["sparsity"])
    np.testing.assert_array_equal(np.asarray(pruned["down"]["kernel"] != 0), np.asarray(v["sparsity"]["down"]["mask"]))
    np.testing.assert_array_equal(np.asarray(pruned["head"]["kernel"]), np.asarray(v["params"]["head"]["kernel"]))
    new, rate = refresh_masks(v["params"], v["sparsity"])
    assert float(rate) == 0.0  # unchanged params: same masks


class _TinyMLP(nn.Module):
    method: str

    @nn.compact
    def __call__(self, x):
        x = nn.gelu(Sparse24Dense(64, method=self.method, mask_every=10)(x))
        return Sparse24Dense(4, method=self.method, transposable=False, mask_every=10)(x)


@pytest.mark.parametrize("method", ["srste", "ste", "soft", "dense"])
def test_tiny_mlp_training_loss_falls(method):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(256, 16)), jnp.float32)
    w_true = jnp.asarray(rng.normal(size=(16, 4)), jnp.float32)
    y = jnp.tanh(x @ w_true)
    model = _TinyMLP(method)
    v = model.init(jax.random.key(0), x)
    params, sparsity = v["params"], v.get("sparsity", {})
    tx = optax.adam(3e-3)
    opt = tx.init(params)

    @jax.jit
    def step(params, sparsity, opt, i):
        def loss_fn(p):
            pred = model.apply({"params": p, "sparsity": sparsity}, x, rngs={"mvue": jax.random.fold_in(jax.random.key(1), i)})
            return jnp.mean((pred - y) ** 2)

        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt = tx.update(g, opt, params)
        params = optax.apply_updates(params, upd)
        sparsity, _ = refresh_masks(params, sparsity, step=i + 1)
        return params, sparsity, opt, loss

    losses = []
    for i in range(150):
        params, sparsity, opt, loss = step(params, sparsity, opt, i)
        losses.append(float(loss))
    assert np.isfinite(losses).all()
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5]), (losses[:5], losses[-10:])


@pytest.mark.parametrize(
    "make,x,match",
    [
        (lambda: Sparse24Dense(8), jnp.ones((2, 6)), "divisible by 4"),
        (lambda: Sparse24Dense(6), jnp.ones((2, 8)), "features divisible by 4"),
        (lambda: Sparse24Dense(8, method="magic"), jnp.ones((2, 8)), "method must be one of"),
        (lambda: Sparse24Dense(8, backend="magic"), jnp.ones((2, 8)), "backend must be one of"),
    ],
)
def test_bad_config(make, x, match):
    with pytest.raises(ValueError, match=match):
        make().init(jax.random.key(0), x)


def test_missing_sparsity_collection_is_a_clear_error():
    x = _x()
    v = Sparse24Dense(8).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="needs 'sparsity/transposable_mask'"):
        Sparse24Dense(8).apply({"params": v["params"]}, x)


def test_srste_recipe_with_masked_decay_shrinks_pruned_weights():
    """The full SR-STE step: MVUE grads, masked decay with the layer's masks, refresh every 10 steps."""
    from jax_sparse24 import optim

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(128, 16)), jnp.float32)
    y = jnp.tanh(x @ jnp.asarray(rng.normal(size=(16, 4)), jnp.float32))
    model = _TinyMLP("srste")
    v = model.init(jax.random.key(0), x)
    params, sparsity = v["params"], v["sparsity"]
    tx = optax.chain(optim.masked_decay(0.2), optax.sgd(0.05))
    opt = tx.init(params)

    @jax.jit
    def step(params, sparsity, opt, i):
        loss, g = jax.value_and_grad(lambda p: jnp.mean(
            (model.apply({"params": p, "sparsity": sparsity}, x, rngs={"mvue": jax.random.key(i)}) - y) ** 2))(params)
        upd, opt = tx.update(g, opt, params, masks=masks_for_params(params, sparsity))
        params = optax.apply_updates(params, upd)
        sparsity, rate = refresh_masks(params, sparsity, step=i + 1)
        return params, sparsity, opt, loss, rate

    def pruned_norm(params, sparsity):
        m = masks_for_params(params, sparsity)
        k, mk = params["Sparse24Dense_0"]["kernel"], m["Sparse24Dense_0"]["kernel"]
        return float(jnp.linalg.norm(jnp.where(mk, 0.0, k)))

    before = pruned_norm(params, sparsity)
    rates, losses = [], []
    for i in range(60):
        params, sparsity, opt, loss, rate = step(params, sparsity, opt, i)
        rates.append(float(rate))
        losses.append(float(loss))
    assert pruned_norm(params, sparsity) < 0.8 * before
    assert losses[-1] < losses[0]
    assert all(r == 0.0 for j, r in enumerate(rates) if (j + 1) % 10)  # refresh only every 10 steps
    assert 0.0 <= max(rates) < 0.5


# --- prepared weights (gradient accumulation) ----------------------------------------------------


class _TwoLayer(nn.Module):
    method: str

    @nn.compact
    def __call__(self, x, sparse=None):
        h = nn.gelu(Sparse24Dense(32, method=self.method, dtype=jnp.bfloat16)(x, sparse=sparse))
        return Sparse24Dense(16, method=self.method, dtype=jnp.bfloat16, name="out")(h, sparse=sparse)


@pytest.mark.parametrize("method", ["srste", "ste", "soft"])
def test_prepare_gives_the_same_loss_and_gradients(method):
    from jax_sparse24.preparation import PREPARED, prepare

    m = _TwoLayer(method)
    x = _x((3, 8, 16))
    v = m.init(jax.random.key(0), x)
    prepared = jax.jit(lambda v, x: prepare(m, v, x, reuse=4))(v, x)
    assert set(prepared) == {"Sparse24Dense_0", "out"}
    assert jax.tree.map(jnp.shape, prepared["out"]) == {"weight": {"masked": (32, 16)}}  # CPU: dense W̃
    assert prepared["out"]["weight"]["masked"].dtype == jnp.bfloat16

    def loss(p, prep):
        vv = dict(v, params=p, **({PREPARED: prep} if prep is not None else {}))
        return jnp.sum(m.apply(vv, x, rngs={"mvue": jax.random.key(1)}).astype(jnp.float32) ** 2)

    plain = jax.jit(jax.value_and_grad(loss))(v["params"], None)
    prep = jax.jit(jax.value_and_grad(loss))(v["params"], prepared)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(prep)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_prepared_collection_is_what_the_layers_use():
    """A preparation from other params drives the forward (it is read, not recomputed); a stale one
    therefore computes with the old weights — rebuild it whenever params change."""
    from jax_sparse24.preparation import PREPARED, prepare

    m = _TwoLayer("srste")
    x = _x((3, 8, 16))
    v = m.init(jax.random.key(0), x)
    v2 = dict(v, params=jax.tree.map(lambda a: 2 * a, v["params"]))
    prep2 = prepare(m, v2, x)
    np.testing.assert_array_equal(np.asarray(m.apply(dict(v, **{PREPARED: prep2}), x)),
                                  np.asarray(m.apply(v2, x)))
    assert not np.array_equal(np.asarray(m.apply(v, x)), np.asarray(m.apply(v2, x)))


def test_prepare_skips_dense_layers_and_the_prepare_pass_is_dropped_by_xla():
    from jax_sparse24.preparation import prepare

    x = _x((3, 8, 16))
    for method, sparse in (("dense", None), ("srste", False)):
        m = _TwoLayer(method)
        assert prepare(m, m.init(jax.random.key(0), x), x, sparse=sparse) == {}
    m = _TwoLayer("srste")
    v = m.init(jax.random.key(0), x)
    hlo = jax.jit(lambda v, x: prepare(m, v, x)).lower(v, x).compile().as_text()
    apply_hlo = jax.jit(lambda v, x: m.apply(v, x)).lower(v, x).compile().as_text()
    # Only the weight work is left: no GEMM and no GELU (nn.gelu defaults to the tanh approximation,
    # so its marker is the " tanh(" instruction). Each marker must be present in the apply program,
    # otherwise its absence from the prepare program would prove nothing.
    for marker in (" dot(", " tanh("):
        assert marker in apply_hlo, marker
        assert marker not in hlo, marker
    with pytest.raises(ValueError, match="reuse must be a positive integer"):
        prepare(m, v, x, reuse=0)
    with pytest.raises(ValueError, match="tokens must be a positive integer"):
        prepare(m, v, x, tokens=-1)


def _ste_mlp_params(seed=0):
    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = Sparse24Dense(32, method="ste", name="up")(x)
            x = Sparse24Dense(16, method="soft", name="down")(nn.gelu(x))
            return nn.Dense(6, name="head")(x)

    return MLP().init(jax.random.key(seed), _x())["params"]


def test_kernel_flip_rate_is_the_mask24_flip_rate_over_the_layers():
    """ste/soft layers: the masks the layers compute (2:4 along in) before and after an update."""
    from jax_sparse24.masks import kernel_flip_rate

    old = _ste_mlp_params()
    new = jax.tree_util.tree_map(lambda a: a + 0.05 * jnp.asarray(
        np.random.default_rng(3).normal(size=a.shape), a.dtype), old)
    paths = [("up",), "down"]
    rate = kernel_flip_rate(old, new, paths=paths)
    changed = total = 0
    for name in ("up", "down"):
        a, b = s24.mask24(old[name]["kernel"], axis=0), s24.mask24(new[name]["kernel"], axis=0)
        changed += int(np.sum(np.asarray(a) != np.asarray(b)))
        total += a.size
    assert rate.dtype == jnp.float32 and float(rate) == pytest.approx(changed / total) and changed > 0
    # one layer: s24.flip_rate of its two masks
    one = kernel_flip_rate(old, new, paths=["up"])
    assert float(one) == pytest.approx(float(s24.flip_rate(s24.mask24(old["up"]["kernel"], axis=0),
                                                           s24.mask24(new["up"]["kernel"], axis=0))))
    # the same under jit, and on trees holding only the compared kernels
    only = lambda p: {k: {"kernel": p[k]["kernel"]} for k in ("up", "down")}  # noqa: E731
    assert float(jax.jit(lambda a, b: kernel_flip_rate(a, b, paths))(only(old), only(new))) == float(rate)
    assert float(kernel_flip_rate(only(old), only(new))) == float(rate)  # paths=None: every kernel
    assert float(kernel_flip_rate(old, old, paths=paths)) == 0.0
    assert float(kernel_flip_rate(old, new, paths=[])) == 0.0


def test_kernel_flip_rate_from_kernel_masks():
    """The old masks (kernel_masks, 1 byte per entry) in place of the old params give the same rate;
    kernel_masks holds just the layers' bool masks, and refuses what kernel_flip_rate refuses."""
    from jax_sparse24.masks import kernel_flip_rate, kernel_masks

    old = _ste_mlp_params()
    new = jax.tree_util.tree_map(lambda a: a + 0.05 * jnp.asarray(
        np.random.default_rng(4).normal(size=a.shape), a.dtype), old)
    paths = ["up", "down"]
    masks = jax.jit(lambda p: kernel_masks(p, paths))(old)
    assert set(masks) == {"up", "down"} and set(masks["up"]) == {"kernel"}
    for name in paths:
        assert masks[name]["kernel"].dtype == jnp.bool_
        np.testing.assert_array_equal(masks[name]["kernel"], s24.mask24(old[name]["kernel"], axis=0))
    rate = kernel_flip_rate(masks, new, paths=paths)
    assert float(rate) == float(kernel_flip_rate(old, new, paths=paths)) and float(rate) > 0
    assert float(kernel_flip_rate(masks, old, paths=paths)) == 0.0
    assert set(kernel_masks(old)) == {"up", "down", "head"}  # paths=None: every kernel
    with pytest.raises(ValueError, match="params has no 'nope/kernel'"):
        kernel_masks(old, ["nope"])
    with pytest.raises(ValueError, match="divisible"):
        kernel_masks({"h": {"kernel": jnp.ones((6, 4))}})


def test_kernel_flip_rate_stacked_kernels_and_errors():
    from jax_sparse24.masks import kernel_flip_rate

    k0 = _x((3, 8, 4), seed=1)
    k1 = k0 + 0.5 * _x((3, 8, 4), seed=2)
    rate = kernel_flip_rate({"blocks": {"kernel": k0}}, {"blocks": {"kernel": k1}})  # (layers, in, out)
    want = np.mean([np.asarray(s24.mask24(k0[i], axis=0)) != np.asarray(s24.mask24(k1[i], axis=0))
                    for i in range(3)])
    assert float(rate) == pytest.approx(float(want))
    old = _ste_mlp_params()
    with pytest.raises(ValueError, match="old_params has no 'nope/kernel'"):
        kernel_flip_rate(old, old, paths=["nope"])
    with pytest.raises(ValueError, match="new_params has no 'up/kernel'"):
        kernel_flip_rate(old, {"down": old["down"]}, paths=["up"])
    with pytest.raises(ValueError, match="same"):
        kernel_flip_rate(old, {"up": {"kernel": old["up"]["kernel"][:8]}}, paths=["up"])
    with pytest.raises(ValueError, match="list of layer paths"):
        kernel_flip_rate(old, old, paths="up")
    with pytest.raises(ValueError, match="divisible"):  # in = 6 is not a whole number of 2:4 groups
        kernel_flip_rate({"h": {"kernel": jnp.ones((6, 4))}}, {"h": {"kernel": jnp.ones((6, 4))}})


@pytest.mark.parametrize("features", [0, -4, 2.5, True])
def test_bad_features_name_the_field(features):
    with pytest.raises(ValueError, match=r"Sparse24Dense: features must be a positive integer"):
        Sparse24Dense(features).init(jax.random.key(0), jnp.ones((2, 8)))
