"""Sparse24Array (compressed values + 2-bit metadata), to_sparse and matmul."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse24 as s24


def _x(shape, seed=0, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape", [(4, 8), (3, 12), (2, 3, 16), (4,)])
def test_roundtrip_magnitude(dtype, shape):
    x = _x(shape, dtype=dtype)
    s = s24.to_sparse(x)
    assert s.values.shape == shape[:-1] + (shape[-1] // 2,)
    assert s.meta.dtype == jnp.uint8 and s.meta.shape == shape[:-1] + (-(-shape[-1] // 8),)
    assert s.dtype == dtype and s.shape == shape
    np.testing.assert_array_equal(np.asarray(s.todense()), np.asarray(jnp.where(s24.mask24(x, axis=-1), x, 0)))


def test_metadata_bits_are_the_documented_layout():
    # group 0 keeps lanes (1, 2): nibble 0b1001; group 1 keeps lanes (0, 3): nibble 0b1100.
    x = jnp.array([0.0, 5.0, -3.0, 0.0, 7.0, 0.0, 0.0, 1.0])
    s = s24.to_sparse(x)
    np.testing.assert_array_equal(np.asarray(s.values), [5.0, -3.0, 7.0, 1.0])
    assert int(s.meta[0]) == (1 | (2 << 2)) | ((0 | (3 << 2)) << 4)


def test_roundtrip_with_mask_and_sparser_groups():
    x = _x((4, 8), seed=1)
    mask = jnp.zeros((4, 8), bool).at[0, 1].set(True).at[1, 4].set(True).at[1, 6].set(True)
    s = s24.to_sparse(x, mask)
    np.testing.assert_array_equal(np.asarray(s.todense()), np.asarray(jnp.where(mask, x, 0)))


def test_mvue_method_is_unbiased_support():
    x = _x((8, 16), seed=2)
    s = s24.to_sparse(x, method="mvue", key=jax.random.key(0))
    d = np.asarray(s.todense())
    np.testing.assert_allclose(d, np.asarray(s24.mvue24(jax.random.key(0), x)), rtol=1e-6)


def test_transpose_and_axis0():
    w = _x((12, 6), seed=3)
    sw = s24.to_sparse(w, axis=0)
    assert sw.sparse_axis == 0 and sw.shape == (12, 6)
    np.testing.assert_array_equal(np.asarray(sw.todense()), np.asarray(jnp.where(s24.mask24(w, axis=0), w, 0)))
    t = sw.T
    assert t.shape == (6, 12) and t.sparse_axis == 1
    np.testing.assert_array_equal(np.asarray(t.todense()), np.asarray(sw.todense()).T)
    assert t.T.shape == sw.shape


def test_matmul_dense_and_sparse_operands():
    x = _x((5, 12), seed=4)
    w = _x((12, 8), seed=5)
    b = _x((8,), seed=6)
    sw = s24.to_sparse(w, axis=0)
    dense = sw.todense()
    np.testing.assert_allclose(np.asarray(s24.matmul(x, sw)), np.asarray(x @ dense), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(x @ sw), np.asarray(x @ dense), rtol=1e-5)
    sa = s24.to_sparse(x.T @ x)  # (12, 12), groups along the contraction (last) axis
    np.testing.assert_allclose(np.asarray(s24.matmul(sa, w)), np.asarray(sa.todense() @ w), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(s24.matmul(x, sw) + b), np.asarray(x @ dense + b), rtol=1e-5)


def test_pytree_jit_and_vmap():
    xs = _x((3, 4, 8), seed=7)
    s = jax.vmap(s24.to_sparse)(xs)
    assert s.values.shape == (3, 4, 4)
    dense = jax.jit(lambda s: s.todense())(s24.to_sparse(xs[0]))
    np.testing.assert_array_equal(np.asarray(dense), np.asarray(s24.to_sparse(xs[0]).todense()))
    leaves = jax.tree_util.tree_leaves(s24.to_sparse(xs[0]))
    assert len(leaves) == 2


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: s24.to_sparse(jnp.ones((4, 6))), "divisible by 4"),
        (lambda: s24.to_sparse(jnp.ones((4, 8), jnp.int32)), "floating-point"),
        (lambda: s24.to_sparse(jnp.ones((4, 8)), jnp.ones((4, 8), bool)), "not 2:4"),
        (lambda: s24.to_sparse(jnp.ones((4, 8)), method="random"), "method must be"),
        (lambda: s24.to_sparse(jnp.ones((4, 8)), method="mvue"), "needs a PRNG"),
        (lambda: s24.to_sparse(jnp.ones((4, 8, 4)), axis=1), "first or the last axis"),
        (lambda: s24.to_sparse(jnp.ones((4, 8)), layout="dense"), "layout must be"),
        (lambda: s24.to_sparse(jnp.ones((3, 4, 8)), layout="cutlass"), "layout='cutlass' needs"),
        (lambda: s24.matmul(jnp.ones((2, 8)), s24.to_sparse(jnp.ones((8, 4)))), "groups along axis 1"),
        (lambda: s24.matmul(s24.to_sparse(jnp.ones((8, 8))), s24.to_sparse(jnp.ones((8, 8)), axis=0)), "at most one"),
        (lambda: s24.matmul(jnp.ones((2, 4)), s24.to_sparse(jnp.ones((8, 4)), axis=0)), "contraction sizes differ"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
