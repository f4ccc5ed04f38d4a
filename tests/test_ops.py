"""The public 2:4 ops against brute-force NumPy (CPU: the reference lowering)."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse24 as s24
from jax_sparse24._src import reference_ops

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


def _rand(shape, dtype=jnp.float32, seed=0):
    # Distinct magnitudes (no ties) in every dtype: a random permutation of spaced values.
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    vals = (np.arange(1, n + 1) / n * 8.0 + 0.01) * rng.choice([-1.0, 1.0], size=n)
    vals = rng.permutation(vals).reshape(shape)
    x = jnp.asarray(vals, dtype)
    return x


def _np_nm_mask(x, n, m, axis):
    a = np.moveaxis(np.abs(np.asarray(x, np.float64)), axis, -1)
    g = a.reshape(*a.shape[:-1], -1, m)
    keep = np.zeros_like(g, dtype=bool)
    it = np.ndindex(*g.shape[:-1])
    for idx in it:
        order = sorted(range(m), key=lambda i: (-g[idx][i], i))  # largest first, lower index on ties
        keep[idx + (order[:n],)] = True
    return np.moveaxis(keep.reshape(a.shape), -1, axis)


@pytest.mark.parametrize("n,m", [(2, 4), (1, 4), (4, 8), (3, 8), (5, 16), (2, 16), (8, 32), (3, 32)])
@pytest.mark.parametrize("axis", [-1, 0])
def test_nm_mask_matches_bruteforce(n, m, axis):
    x = _rand((2 * m, 3 * m), seed=n * 100 + m)
    got = np.asarray(s24.nm_mask(x, n, m, axis=axis))
    np.testing.assert_array_equal(got, _np_nm_mask(x, n, m, axis))
    assert got.dtype == np.bool_


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", [((8, 12), -1), ((8, 12), 0), ((3, 4, 8, 5), 2), ((16,), 0)])
def test_mask24(dtype, shape, axis):
    x = _rand(shape, dtype, seed=len(shape))
    got = np.asarray(s24.mask24(x, axis=axis))
    np.testing.assert_array_equal(got, _np_nm_mask(np.asarray(x.astype(jnp.float32)), 2, 4, axis))
    counts = np.moveaxis(got, axis, -1).reshape(-1, 4).sum(-1)
    assert (counts == 2).all()


def test_mask24_ties_go_to_lower_index():
    np.testing.assert_array_equal(s24.mask24(jnp.ones(4)), [True, True, False, False])
    np.testing.assert_array_equal(s24.mask24(jnp.array([0.0, 2.0, -2.0, 2.0])), [False, True, True, False])


def _np_transposable_best(block):
    """Exhaustive search over all 4x4 0/1 matrices with two ones per row and column."""
    best, best_score = None, -1.0
    rows = list(itertools.combinations(range(4), 2))
    for choice in itertools.product(rows, repeat=4):
        pat = np.zeros((4, 4))
        for r, cols in enumerate(choice):
            pat[r, list(cols)] = 1
        if not (pat.sum(0) == 2).all():
            continue
        score = float((np.abs(block) * pat).sum())
        if score > best_score + 1e-12:
            best, best_score = pat, score
    return best, best_score


def test_transposable_patterns_are_the_90():
    pats = s24.transposable_patterns().reshape(-1, 4, 4)
    assert pats.shape == (90, 4, 4)
    assert (pats.sum(1) == 2).all() and (pats.sum(2) == 2).all()
    assert len({p.tobytes() for p in pats}) == 90


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8, 12), (4, 4), (16, 8)])
def test_transposable_mask24_is_exact_optimum(dtype, shape):
    x = _rand(shape, dtype, seed=shape[0] + shape[1])
    m = np.asarray(s24.transposable_mask24(x))
    xf = np.asarray(x.astype(jnp.float32), np.float64)
    assert (m.reshape(shape[0], -1, 4).sum(-1) == 2).all()  # 2:4 along axis 1
    assert (m.T.reshape(shape[1], -1, 4).sum(-1) == 2).all()  # 2:4 along axis 0
    for i in range(0, shape[0], 4):
        for j in range(0, shape[1], 4):
            blk = xf[i:i + 4, j:j + 4]
            _, best = _np_transposable_best(blk)
            got = float((np.abs(blk) * m[i:i + 4, j:j + 4]).sum())
            assert got == pytest.approx(best, rel=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [-1, 0])
def test_soft_threshold24(dtype, axis):
    x = _rand((8, 16), dtype, seed=3)
    y, mask = s24.soft_threshold24(x, axis=axis)
    assert y.dtype == x.dtype
    xf = np.moveaxis(np.asarray(x.astype(jnp.float32), np.float64), axis, -1).reshape(-1, 4)
    t = np.sort(np.abs(xf), axis=-1)[:, 1:2]  # second smallest |x|
    want = np.sign(xf) * np.maximum(np.abs(xf) - t, 0.0)
    got = np.moveaxis(np.asarray(y.astype(jnp.float32), np.float64), axis, -1).reshape(-1, 4)
    tol = {jnp.float32: 1e-6, jnp.bfloat16: 2e-2, jnp.float16: 2e-3}[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_array_equal(np.asarray(mask), np.asarray(s24.mask24(x, axis=axis)))


def test_soft_threshold_beta():
    w = _rand((16, 8), seed=5)
    s, _ = s24.soft_threshold24(w, axis=0)
    beta = float(s24.soft_threshold_beta(w, axis=0))
    want = float(np.vdot(np.asarray(w), np.asarray(s)) / np.vdot(np.asarray(s), np.asarray(s)))
    assert beta == pytest.approx(want, rel=1e-5)
    assert beta > 1.0  # the soft threshold shrinks magnitudes; beta compensates


def _np_inclusion(a):
    s = a.sum()
    return np.array([a[i] / s + sum(a[j] / s * a[i] / (s - a[j]) for j in range(4) if j != i) for i in range(4)])


def test_mvue_inclusion_probabilities():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.01, 3.0, size=(50, 4))
    got = np.asarray(reference_ops.mvue24_inclusion_probabilities(jnp.asarray(a, jnp.float32)))
    want = np.stack([_np_inclusion(r) for r in a])
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(got.sum(-1), 2.0, rtol=1e-5)  # exactly two kept per group


def test_mvue24_unbiased_statistical():
    # Fixed seed; a 5-sigma bound per element from the exact per-element variance.
    x = jnp.asarray(np.random.default_rng(1).normal(size=(4, 8)), jnp.float32)
    n = 20000
    keys = jax.random.split(jax.random.key(42), n)
    draws = jax.jit(jax.vmap(lambda k: s24.mvue24(k, x, axis=-1)))(keys)
    mean = np.asarray(draws.mean(0), np.float64)
    a = np.abs(np.asarray(x, np.float64)).reshape(-1, 4) + s24.MVUE_EPS
    p = np.stack([_np_inclusion(r) for r in a]).reshape(x.shape)
    var = np.asarray(x, np.float64) ** 2 * (1.0 / p - 1.0)
    bound = 5.0 * np.sqrt(var / n) + 1e-6
    assert (np.abs(mean - np.asarray(x)) <= bound).all(), np.abs(mean - np.asarray(x)) / bound
    # A biased estimator (plain top-2 magnitude) fails the same test: the test can fail.
    biased = np.asarray(x * s24.mask24(x, axis=-1))
    assert (np.abs(biased - np.asarray(x)) > bound).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_mvue24_support_values_and_reproducibility(dtype):
    x = _rand((12, 8), dtype, seed=7)
    k = jax.random.key(3)
    out = s24.mvue24(k, x, axis=0)
    assert out.dtype == x.dtype
    nz = np.moveaxis(np.asarray(out) != 0, 0, -1).reshape(-1, 4).sum(-1)
    assert (nz == 2).all()
    np.testing.assert_array_equal(np.asarray(out), np.asarray(s24.mvue24(k, x, axis=0)))
    assert not np.array_equal(np.asarray(out), np.asarray(s24.mvue24(jax.random.key(4), x, axis=0)))
    # kept values are x_i / p_i
    xf = np.moveaxis(np.asarray(x.astype(jnp.float32), np.float64), 0, -1).reshape(-1, 4)
    of = np.moveaxis(np.asarray(out.astype(jnp.float32), np.float64), 0, -1).reshape(-1, 4)
    p = np.stack([_np_inclusion(np.abs(r) + s24.MVUE_EPS) for r in xf])
    kept = of != 0
    tol = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2, jnp.float16: 2e-3}[dtype]
    np.testing.assert_allclose(of[kept], (xf / p)[kept], rtol=tol)


def test_mvue24_extreme_values_are_finite():
    x = jnp.array([[1e30, 0, 0, 0], [0, 0, 0, 0], [1e-30, 0, 0, 1e-30]], jnp.float32)
    out = np.asarray(s24.mvue24(jax.random.key(0), x))
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[1], 0)


def test_flip_rate():
    a = jnp.array([[True, False], [True, True]])
    b = jnp.array([[True, True], [False, True]])
    assert float(s24.flip_rate(a, b)) == 0.5
    assert float(s24.flip_rate(a, a)) == 0.0


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: s24.mask24(x, axis=0),
        lambda x: s24.nm_mask(x, 1, 4, axis=0),
        lambda x: s24.transposable_mask24(x),
        lambda x: s24.soft_threshold24(x, axis=0)[0],
        lambda x: s24.mvue24(jax.random.key(0), x, axis=0),
    ],
)
def test_ops_jit_and_vmap(fn):
    x = _rand((3, 8, 12), seed=11)
    direct = np.stack([np.asarray(fn(xi)) for xi in x])
    # Masks must agree exactly; float outputs up to XLA fusion rounding (1 ulp).
    check = np.testing.assert_array_equal if direct.dtype == np.bool_ else (
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6))
    check(np.asarray(jax.vmap(fn)(x)), direct)
    check(np.asarray(jax.jit(jax.vmap(fn))(x)), direct)
    check(np.asarray(jax.jit(fn)(x[0])), direct[0])


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: s24.mask24(jnp.ones((4, 6)), axis=-1), r"divisible by 4.*\(4, 6\)"),
        (lambda: s24.nm_mask(jnp.ones((8,)), 4, 4), r"1 <= n < m"),
        (lambda: s24.nm_mask(jnp.ones((64,)), 2, 64), r"m <= 32"),
        (lambda: s24.nm_mask(jnp.ones((8,)), 2, 4, axis=3), r"axis 3 is out of range"),
        (lambda: s24.mask24(jnp.ones((8,), jnp.int32)), r"floating-point.*int32"),
        (lambda: s24.mask24(jnp.ones((8,), jnp.bool_)), r"floating-point.*bool"),
        (lambda: s24.mask24(jnp.float32(1.0)), r"at least 1 dimension"),
        (lambda: s24.transposable_mask24(jnp.ones((8,))), r"rank 2.*\(8,\)"),
        (lambda: s24.transposable_mask24(jnp.ones((8, 6))), r"divisible by 4.*\(8, 6\)"),
        (lambda: s24.soft_threshold24(jnp.ones((5,))), r"divisible by 4"),
        (lambda: s24.mvue24(jax.random.key(0), jnp.ones((6,))), r"divisible by 4"),
        (lambda: s24.flip_rate(jnp.ones((4,), bool), jnp.ones((8,), bool)), r"same shape"),
    ],
)
def test_bad_input_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_errors_raise_at_trace_time():
    with pytest.raises(ValueError, match="divisible by 4"):
        jax.jit(lambda x: s24.mask24(x, axis=-1)).lower(jax.ShapeDtypeStruct((4, 6), jnp.float32))


def _opaque_kernel(name, x, **kwargs):
    """Stand-in for a CUDA custom call: the reference behind ``pure_callback`` (no derivative)."""
    ref = functools.partial(getattr(reference_ops, name.removesuffix("_cuda")), **kwargs)

    def call(*args):
        shapes = jax.eval_shape(ref, *args)
        return jax.pure_callback(lambda *a: jax.tree.map(np.asarray, ref(*a)), shapes, *args)

    return call


def test_ops_differentiable_through_the_kernel_branch(monkeypatch):
    """On one GPU the op lowers to a custom call that has no JVP; gradients must still come from
    the reference (this failed for the S-STE layer on a single H100 before the fix)."""
    from jax_sparse24._src import ffi, ops as ops_mod, partitioning

    # As on a GPU: the kernel branch is the one traced and differentiated.
    monkeypatch.setattr(ffi, "per_platform", lambda ref, cuda, *a, **kw: (cuda or ref)(*a))
    monkeypatch.setattr(ops_mod, "_kernel", _opaque_kernel)
    monkeypatch.setattr(partitioning, "_single_device", lambda: True)
    w = jax.random.normal(jax.random.key(0), (8, 12))

    def loss(w):
        s, m = s24.soft_threshold24(w, axis=0)
        return (s * s).sum() + (w * s24.mask24(w, axis=0)).sum() + (w[:, :8] * s24.transposable_mask24(w[:, :8])).sum()

    def loss_ref(w):
        s, m = reference_ops.soft_threshold24(w, axis=0)
        return (s * s).sum() + (w * reference_ops.mask24(w, axis=0)).sum() + (w[:, :8] * reference_ops.transposable_mask24(w[:, :8])).sum()

    np.testing.assert_allclose(jax.grad(loss)(w), jax.grad(loss_ref)(w), rtol=1e-6)
    # The layers that differentiate through the ops: S-STE (soft) and STE.
    for method in ("soft", "ste"):
        layer = s24.nn.Sparse24Dense(12, method=method, backend="dense")
        variables = layer.init(jax.random.key(1), jnp.ones((4, 8)))
        g = jax.grad(lambda p: layer.apply({**variables, "params": p}, jnp.ones((4, 8))).sum())(variables["params"])
        assert np.isfinite(np.asarray(g["kernel"])).all() and np.abs(np.asarray(g["kernel"])).sum() > 0
