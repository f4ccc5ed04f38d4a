"""Tests for jax_sparse24.swap (layer swapping and the activation-sparse dense layer)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import jax_sparse24 as s24
from jax_sparse24 import swap
from jax_sparse24.nn import Sparse24Dense
from jax_sparse24.swap import SemiSparseActivationDense, semi_sparse_activation


class Inner(nn.Module):
    """Dense made in setup() and called twice (weight sharing)."""

    def setup(self):
        self.shared = nn.Dense(16)

    def __call__(self, x):
        return self.shared(nn.gelu(self.shared(x)))


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(16, name="fc")(x)
        h = Inner(name="inner")(h)
        return nn.Dense(8, use_bias=False)(h)  # auto-named Dense_0


class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(16, name="embed")(x)
        x = Block(name="mlp")(x)
        return nn.LayerNorm()(x)


class TwoMethods(nn.Module):
    def setup(self):
        self.embed = nn.Dense(16)
        self.head = nn.Dense(4)

    def __call__(self, x):
        return self.head(self.features(x))

    def features(self, x):
        return self.embed(x)


def _tree_equal(a, b):
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


@pytest.fixture
def setup():
    x = jax.random.normal(jax.random.key(1), (2, 5, 16))
    model = Model()
    variables = model.init(jax.random.key(0), x)
    return model, variables, x


def test_swap_to_dense_method_preserves_params_outputs_and_grads(setup):
    model, variables, x = setup
    swapped = swap.swap_dense(model, "*", method="dense")
    # Same tree and same initial values (the replacement draws from the Dense's RNG scope).
    assert _tree_equal(swapped.init(jax.random.key(0), x), variables)
    np.testing.assert_array_equal(swapped.apply(variables, x), model.apply(variables, x))
    loss = lambda m: lambda p: jnp.sum(m.apply({"params": p}, x) ** 2)  # noqa: E731
    g0 = jax.grad(loss(model))(variables["params"])
    g1 = jax.grad(loss(swapped))(variables["params"])
    assert _tree_equal(g0, g1)
    back = swap.unswap(swapped)
    assert back is model
    np.testing.assert_array_equal(back.apply(variables, x), model.apply(variables, x))


def test_patterns_select_layers_and_sparsity_state(setup):
    model, variables, x = setup
    seen = []

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, Sparse24Dense) and context.method_name == "__call__":
            seen.append(context.module.path)
        return next_fun(*args, **kwargs)

    swapped = swap.swap_dense(model, ["mlp/fc", "mlp/inner/*"], method="srste")
    with nn.intercept_methods(record):
        sparsity = swap.init_sparsity(swapped, variables["params"], x)
    # fc and the shared inner Dense (called twice) are sparse; embed and Dense_0 are not.
    assert set(sparsity) == {"mlp"} and set(sparsity["mlp"]) == {"fc", "inner"}
    assert set(sparsity["mlp"]["inner"]["shared"]) == {"mask_every", "transposable_mask"}
    assert len(seen) == 3 and all(p[:2] == ("mlp", "fc") or p[:3] == ("mlp", "inner", "shared") for p in seen)
    # Masks come from the given (existing) kernels.
    k = variables["params"]["mlp"]["fc"]["kernel"]
    np.testing.assert_array_equal(sparsity["mlp"]["fc"]["transposable_mask"], s24.transposable_mask24(k))
    y = swapped.apply({"params": variables["params"], "sparsity": sparsity}, x, rngs={"mvue": jax.random.key(2)})
    assert y.shape == (2, 5, 8) and jnp.isfinite(y).all()
    # The unswapped model ignores the sparsity collection and runs dense again.
    np.testing.assert_array_equal(swap.unswap(swapped).apply(variables, x), model.apply(variables, x))


def test_ste_swap_matches_masked_reference():
    x = jax.random.normal(jax.random.key(1), (2, 5, 16))
    model = TwoMethods()
    variables = model.init(jax.random.key(0), x)
    p = variables["params"]
    swapped = swap.swap_dense(model, lambda path, m: path == "embed", method="ste", mvue=False)
    # another method than __call__, through SwappedModule.invoke
    y = swapped.apply(variables, "features", x, method=swap.SwappedModule.invoke)
    k, b = p["embed"]["kernel"], p["embed"]["bias"]
    ref = x @ (k * s24.mask24(k, axis=0)) + b
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert not np.allclose(y, x @ k + b)
    full = swapped.apply(variables, x)
    np.testing.assert_allclose(full, ref @ p["head"]["kernel"] + p["head"]["bias"], rtol=1e-5, atol=1e-5)


def test_swap_context_uses_absolute_paths(setup):
    model, variables, x = setup
    with swap.swap_context("mlp/*", layer=SemiSparseActivationDense):
        y = model.apply(variables, x)
    y_wrapped = swap.swap_dense(model, "mlp/*", layer=SemiSparseActivationDense).apply(variables, x)
    np.testing.assert_array_equal(y, y_wrapped)
    assert not np.allclose(y, model.apply(variables, x))


def test_nested_swapped_model_paths_are_relative():
    class Outer(nn.Module):
        @nn.compact
        def __call__(self, x):
            return swap.swap_dense(Block(name="block"), "fc", method="ste")(x) + nn.Dense(8, name="fc")(x)

    x = jnp.ones((3, 16))
    v = Outer().init(jax.random.key(0), x)
    assert set(v["params"]) == {"block", "fc"} and set(v["params"]["block"]) == {"fc", "inner", "Dense_0"}
    seen = []

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, Sparse24Dense) and context.method_name == "__call__":
            seen.append(context.module.path)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        Outer().apply(v, x)
    assert seen == [("block", "fc")]  # only block/fc, not the top-level fc


def test_swap_errors():
    with pytest.raises(TypeError, match="expected a flax.linen Module"):
        swap.swap_dense(object(), "*")
    with pytest.raises(TypeError, match="has no field"):
        swap.swap_dense(Model(), "*", methd="ste")
    with pytest.raises(TypeError, match="name the wrapped"):
        swap.swap_dense(Model(), "*", name="x")
    with pytest.raises(TypeError, match="taken from each swapped"):
        swap.swap_dense(Model(), "*", features=3)
    with pytest.raises(ValueError, match="patterns must be"):
        swap.swap_dense(Model(), [])
    with pytest.raises(TypeError, match="returned by swap_dense"):
        swap.unswap(Model())
    with pytest.raises(ValueError, match="method must be one of"):
        x = jnp.ones((2, 16))
        swap.swap_dense(Model(), "*", method="bogus").init(jax.random.key(0), x)


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", [(6, 16), (2, 3, 8)])
def test_semi_sparse_activation_dense_matches_reference(shape, dtype, tol):
    kx, kg = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, shape, dtype)
    layer = SemiSparseActivationDense(12, dtype=dtype)
    v = layer.init(jax.random.key(1), x)
    assert jax.tree.map(jnp.shape, v["params"]) == {"kernel": (shape[-1], 12), "bias": (12,)}
    k, b = v["params"]["kernel"], v["params"]["bias"]
    mask = s24.mask24(x, axis=-1)
    assert int(mask.sum()) * 2 == x.size  # exactly 2 of every 4 features kept
    xs = jnp.where(mask, x, 0).astype(jnp.float32)
    ref = xs @ k + b
    y, vjp = jax.vjp(lambda p, x: layer.apply({"params": p}, x), v["params"], x)
    np.testing.assert_allclose(np.asarray(y, np.float32), ref, rtol=tol, atol=tol)
    g = jax.random.normal(kg, y.shape, y.dtype)
    dp, dx = vjp(g)
    g32 = g.astype(jnp.float32)
    # straight-through to x: dx = g·Wᵀ (dense, not masked); dW = (x ⊙ mask)ᵀ·g
    np.testing.assert_allclose(np.asarray(dx, np.float32), g32 @ k.T, rtol=tol, atol=tol * 4)
    np.testing.assert_allclose(dp["kernel"], xs.reshape(-1, shape[-1]).T @ g32.reshape(-1, 12), rtol=tol, atol=tol * 4)
    np.testing.assert_allclose(dp["bias"], g32.reshape(-1, 12).sum(0), rtol=tol, atol=tol * 4)


def test_semi_sparse_activation_function():
    x = jnp.array([[1.0, -5.0, 3.0, 0.5, 0.0, 2.0, -2.5, 1.0]])
    np.testing.assert_array_equal(semi_sparse_activation(x), [[0, -5, 3, 0, 0, 2, -2.5, 0]])
    g = jax.grad(lambda x: jnp.sum(semi_sparse_activation(x) * jnp.arange(8.0)))(x)
    np.testing.assert_array_equal(g, jnp.arange(8.0)[None])  # straight-through
    with pytest.raises(ValueError, match="divisible by 4"):
        SemiSparseActivationDense(3).init(jax.random.key(0), jnp.ones((2, 6)))


class Classifier(nn.Module):
    """An existing model: a 2:4-friendly body, attention (DenseGeneral projections) and a 10-class head."""

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(32, name="fc")(x)
        h = h + nn.MultiHeadDotProductAttention(num_heads=2, name="attn")(h)
        return nn.Dense(10, name="head")(nn.gelu(h))


def test_swap_error_names_the_dense_path_and_the_exclude_argument():
    x = jnp.ones((2, 3, 16))
    with pytest.raises(ValueError) as e:
        swap.swap_dense(Classifier(), "*", method="srste").init(jax.random.key(0), x)
    msg = str(e.value)
    assert "nn.Dense at 'head'" in msg and "features=10" in msg and "exclude=['head']" in msg
    assert "Sparse24Dense_0" not in msg
    # following the advice: the head stays dense, everything else is swapped
    with pytest.warns(UserWarning, match="attn/query"):
        v = swap.swap_dense(Classifier(), "*", method="srste", exclude=["head"]).init(jax.random.key(0), x)
    assert set(v["sparsity"]) == {"fc"}
    assert v["params"]["head"]["kernel"].shape == (32, 10)
    # input features not a multiple of 4 (srste or not): the path and the exclude argument
    with pytest.raises(ValueError, match=r"nn.Dense at 'fc' has 10 input features.*exclude=\['fc'\]"):
        swap.swap_dense(Classifier(), "fc", method="ste").init(jax.random.key(0), jnp.ones((2, 3, 10)))
    # other errors of the replacement carry the path as well
    with pytest.raises(ValueError, match="nn.Dense at 'fc' .*method must be one of"):
        swap.swap_dense(Classifier(), "fc", method="bogus").init(jax.random.key(0), x)


def test_pattern_matching_nothing_is_an_error_and_unused_patterns_warn():
    x = jnp.ones((2, 3, 16))
    with pytest.raises(ValueError, match=r"the pattern\(s\) \['\*mpl\*'\] swapped no nn.Dense.*'fc', 'head'"):
        swap.swap_dense(Classifier(), "*mpl*").init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="swapped no nn.Dense"):  # everything matching is excluded
        swap.swap_dense(Classifier(), "fc", exclude="f*").init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="predicate swapped no nn.Dense"):
        swap.swap_dense(Classifier(), lambda path, m: False).init(jax.random.key(0), x)
    with pytest.warns(UserWarning, match=r"pattern\(s\) \['nothing'\] matched no nn.Dense"):
        swap.swap_dense(Classifier(), ["fc", "nothing"], method="ste").init(jax.random.key(0), x)
    v = Classifier().init(jax.random.key(0), x)
    with pytest.warns(UserWarning, match=r"\['nothing'\] matched no nn.Dense"):
        with swap.swap_context("nothing", method="ste"):
            Classifier().apply(v, x)


def test_attention_projections_are_listed_as_left_dense():
    """nn.MultiHeadDotProductAttention's DenseGeneral projections are not swapped: a warning names them."""
    x = jnp.ones((2, 3, 16))
    with pytest.warns(UserWarning) as rec:
        v = swap.swap_dense(Classifier(), "*", method="ste", exclude="head").init(jax.random.key(0), x)
    msgs = [str(r.message) for r in rec if "stay dense" in str(r.message)]
    assert len(msgs) == 1
    for name in ("query", "key", "value", "out"):
        assert f"'attn/{name}' (DenseGeneral)" in msgs[0]
    ref = Classifier().init(jax.random.key(0), x)
    assert jax.tree.structure(v["params"]) == jax.tree.structure(ref["params"])
