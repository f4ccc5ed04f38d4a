"""Property-based tests (hypothesis) of the reference 2:4 ops: random shapes, dtypes and special
values (NaN, ±inf, ±0, subnormals, ties) against independent NumPy oracles of the documented rule
(reference_ops.py module docstring), and the bad-input errors.

The oracles work on the exact float64 values of the inputs (ml_dtypes conversions, no flush-to-zero),
so they are independent of XLA's CPU arithmetic. The hypothesis profile (tests/conftest.py) is
derandomized: CI runs the same examples every time.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import jax_sparse24 as s24
from jax_sparse24._src import reference_ops

DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
TINY32 = float(np.finfo(np.float32).tiny)

# Special values (float64; rounded to the test's dtype): NaN of both signs, ±inf, ±0, float32
# subnormals (0 in f16), float16 subnormals (normal in float32), the largest finite values, and a
# few small integers that make ties.
SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 3e-45, -2e-40, 1e-39, 6e-8, -1.2e-7,
            3e-5, 3.4e38, -3.0e38, 65504.0, 1.0, -1.0, 2.0, -2.0, 0.5, 3.0]

# Few shapes, so each op compiles a handful of times (the whole file stays well under 40 s).
SHAPES_1D = [(4,), (8,)]
SHAPES_ND = [(8, 4), (4, 8), (2, 4, 4)]

# The reference ops jitted (static axis): one compilation per (shape, dtype, axis) instead of one
# per primitive, which keeps the many small examples fast. Eager calls are tested in test_ops.py.
_mask24 = jax.jit(reference_ops.mask24, static_argnames="axis")
_nm_mask = jax.jit(reference_ops.nm_mask, static_argnames=("n", "m", "axis"))
_soft = jax.jit(reference_ops.soft_threshold24, static_argnames="axis")
_mvue = jax.jit(reference_ops.mvue24, static_argnames="axis")
_transposable = jax.jit(reference_ops.transposable_mask24)


def _values(finite_max=float(np.finfo(np.float32).max)):
    finite = st.floats(-finite_max, finite_max, allow_nan=False, allow_infinity=False, width=32)
    return st.one_of(st.sampled_from(SPECIALS), finite, st.integers(-3, 3).map(float))


@st.composite
def arrays(draw, shapes=SHAPES_1D + SHAPES_ND, dtypes=tuple(DTYPES), values=None):
    """(numpy array in the dtype, dtype name); values mix specials, finite floats and ties."""
    shape = draw(st.sampled_from(shapes))
    name = draw(st.sampled_from(dtypes))
    n = int(np.prod(shape))
    vals = draw(st.lists(_values() if values is None else values, min_size=n, max_size=n))
    with np.errstate(over="ignore"):  # values beyond the dtype's range become ±inf: more specials
        return np.array(vals, np.float64).astype(DTYPES[name]).reshape(shape), name


def _axes(shape, m=4):
    """Grouping axes (negative and positive) whose size is divisible by m."""
    nd = len(shape)
    return st.sampled_from([a for a in range(-nd, nd) if shape[a] % m == 0])


# --------------------------------------------------------------------------------------------
# NumPy oracles of the documented rule.


def _rank_key(v):
    """Sort key per element (float64 values): (class, magnitude), NaN > inf > finite, -0 == +0."""
    cls = np.where(np.isnan(v), 2, np.where(np.isinf(v), 1, 0))
    mag = np.where(np.isfinite(v), np.abs(v), 0.0)
    return cls, mag


def _groups(a, axis, m=4):
    a = np.moveaxis(np.asarray(a), axis, -1)
    return a.reshape(*a.shape[:-1], a.shape[-1] // m, m)


def _ungroup(g, axis, shape):
    moved = np.moveaxis(np.empty(shape), axis, -1).shape
    return np.moveaxis(g.reshape(moved), -1, axis)


def _np_nm_mask(x, n, m, axis):
    v = _groups(x.astype(np.float64), axis, m)
    cls, mag = _rank_key(v)
    keep = np.zeros(v.shape, bool)
    for idx in np.ndindex(*v.shape[:-1]):
        order = sorted(range(m), key=lambda i: (-cls[idx][i], -mag[idx][i], i))
        keep[idx + (order[:n],)] = True
    return _ungroup(keep, axis, x.shape)


def _np_soft(x, axis):
    keep = _np_nm_mask(x, 2, 4, axis)
    xf = _groups(x.astype(np.float32), axis)
    kg = _groups(keep, axis)
    a = np.abs(xf)
    cls, mag = _rank_key(xf.astype(np.float64))
    t = np.zeros(xf.shape[:-1], np.float32)
    for idx in np.ndindex(*xf.shape[:-1]):
        dropped = [i for i in range(4) if not kg[idx][i]]
        j = max(dropped, key=lambda i: (cls[idx][i], mag[idx][i]))
        t[idx] = a[idx][j]

    def flush(z):
        return np.where(np.abs(z) < TINY32, np.float32(0), z).astype(np.float32)

    with np.errstate(invalid="ignore"):
        d = flush(flush(a) - flush(t)[..., None])
    y = np.where(kg, np.copysign(d, xf), np.float32(0))
    return _ungroup(y, axis, x.shape).astype(x.dtype), keep


def _patterns():
    return reference_ops.transposable_patterns().astype(bool)  # (90, 16), canonical order


def _blocks(a):
    r, c = a.shape
    return np.asarray(a).reshape(r // 4, 4, c // 4, 4).transpose(0, 2, 1, 3).reshape(-1, 16)


def _np_transposable_scores(x):
    """(non-finite kept, finite kept Σ|x| in float64 with |x| < 2^-122 as 0) for every block and
    pattern: (blocks, 90) each."""
    v = _blocks(x.astype(np.float64))
    nf = ~np.isfinite(v)
    a = np.where(nf, 0.0, np.abs(v))
    a = np.where(a < 2.0**-122, 0.0, a)  # float32 subnormals and the smallest normals -> 0
    pats = _patterns().astype(np.float64)
    return nf.astype(np.float64) @ pats.T, a @ pats.T


def _np_inclusion(a):
    """MVUE inclusion probabilities of the groups a (..., 4) > 0, float64."""
    s = a.sum(-1, keepdims=True)
    p = a / s
    for k in range(4):
        for m in range(4):
            if m != k:
                rest = sum(a[..., j] for j in range(4) if j != m)  # S - a_m without cancellation
                p[..., k] += a[..., m] / s[..., 0] * a[..., k] / rest
    return p


def _f32(a):
    return np.asarray(a).astype(np.float32)


PROPS = settings(max_examples=20, deadline=None)


# --------------------------------------------------------------------------------------------
# Masks


@PROPS
@given(data=st.data())
def test_mask24_rule(data):
    x, _ = data.draw(arrays())
    axis = data.draw(_axes(x.shape))
    got = np.asarray(_mask24(jnp.asarray(x), axis=axis))
    want = _np_nm_mask(x, 2, 4, axis)
    np.testing.assert_array_equal(got, want)
    g, v = _groups(got, axis), _groups(x.astype(np.float64), axis)
    assert (g.sum(-1) == 2).all()
    # Every non-finite element is kept when its group has at most two; NaN before inf otherwise.
    nf = ~np.isfinite(v)
    assert (g[nf.sum(-1) <= 2] >= nf[nf.sum(-1) <= 2]).all()
    assert ((g & nf).sum(-1) == np.minimum(nf.sum(-1), 2)).all()
    nan = np.isnan(v)
    assert ((g & nan).sum(-1) == np.minimum(nan.sum(-1), 2)).all()


@PROPS
@given(data=st.data(), nm=st.sampled_from([(1, 4), (3, 4), (2, 8), (5, 8), (1, 2)]))
def test_nm_mask_rule(data, nm):
    n, m = nm
    x, _ = data.draw(arrays(shapes=[(8,), (8, 8), (16, 8)]))
    axis = data.draw(_axes(x.shape, m))
    got = np.asarray(_nm_mask(jnp.asarray(x), n=n, m=m, axis=axis))
    np.testing.assert_array_equal(got, _np_nm_mask(x, n, m, axis))
    assert (_groups(got, axis, m).sum(-1) == n).all()


@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_public_ops_equal_reference(data):
    x, _ = data.draw(arrays(shapes=[(8, 8)]))
    axis = data.draw(st.sampled_from([0, 1]))
    xj = jnp.asarray(x)
    np.testing.assert_array_equal(np.asarray(s24.mask24(xj, axis=axis)), np.asarray(reference_ops.mask24(xj, axis)))
    np.testing.assert_array_equal(np.asarray(s24.transposable_mask24(xj)), np.asarray(reference_ops.transposable_mask24(xj)))
    y, m = s24.soft_threshold24(xj, axis=axis)
    yr, mr = reference_ops.soft_threshold24(xj, axis)
    np.testing.assert_array_equal(np.asarray(m), np.asarray(mr))
    np.testing.assert_array_equal(_f32(y), _f32(yr))


@PROPS
@given(data=st.data())
def test_transposable_mask24_structure_and_optimum(data):
    x, _ = data.draw(arrays(shapes=[(4, 4), (8, 4), (4, 8), (8, 8)]))
    got = np.asarray(_transposable(jnp.asarray(x)))
    b = _blocks(got)
    bb = b.reshape(-1, 4, 4)
    assert (bb.sum(1) == 2).all() and (bb.sum(2) == 2).all(), "2:4 along both axes in every block"
    counts, sums = _np_transposable_scores(x)
    chosen = np.array([np.flatnonzero((_patterns() == row).all(-1))[0] for row in b])
    rows = np.arange(len(b))
    # As many non-finite elements kept as any pattern can keep ...
    np.testing.assert_array_equal(counts[rows, chosen], counts.max(-1))
    # ... and, among those patterns, the largest finite Σ|x| (float32 scores: relative rounding).
    best = np.where(counts == counts.max(-1, keepdims=True), sums, -1.0).max(-1)
    np.testing.assert_allclose(sums[rows, chosen], best, rtol=1e-6, atol=0)


@PROPS
@given(data=st.data())
def test_transposable_mask24_exact_on_exact_sums(data):
    # Small integers and specials whose finite sums are exact in float32: the first best pattern
    # in canonical order, exactly (ties included).
    vals = st.one_of(st.integers(-4, 4).map(float), st.sampled_from([np.nan, np.inf, -np.inf, -0.0, 1e-40]))
    x, _ = data.draw(arrays(shapes=[(4, 4), (8, 8)], values=vals))
    got = _blocks(np.asarray(_transposable(jnp.asarray(x))))
    counts, sums = _np_transposable_scores(x)
    score = np.where(counts == counts.max(-1, keepdims=True), sums, -1.0)
    want = _patterns()[np.argmax(score, -1)]
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------------------------
# Soft threshold and MVUE


@PROPS
@given(data=st.data())
def test_soft_threshold24_rule(data):
    x, _ = data.draw(arrays())
    axis = data.draw(_axes(x.shape))
    y, m = _soft(jnp.asarray(x), axis=axis)
    y_want, m_want = _np_soft(x, axis)
    np.testing.assert_array_equal(np.asarray(m), m_want)
    assert np.asarray(y).dtype == x.dtype
    np.testing.assert_array_equal(_f32(y), _f32(y_want))  # NaN where NaN, ±inf where ±inf
    assert (_f32(y)[~m_want] == 0).all()
    # Surfaced, not hidden: a group with a non-finite element has a non-finite output.
    bad = (~np.isfinite(_groups(x.astype(np.float64), axis))).any(-1)
    assert (~np.isfinite(_groups(_f32(y), axis))).any(-1)[bad].all()


@PROPS
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_mvue24_structure(data, seed):
    x, name = data.draw(arrays())
    axis = data.draw(_axes(x.shape))
    key = jax.random.key(seed)
    out = _f32(_mvue(key, jnp.asarray(x), axis=axis))
    assert out.shape == x.shape
    og, xg = _groups(out, axis), _groups(x.astype(np.float64), axis)
    bad = ~np.isfinite(xg).all(-1)
    # A group with NaN/inf: NaN exactly where mask24 keeps, 0 elsewhere.
    keep24 = _groups(_np_nm_mask(x, 2, 4, axis), axis)
    np.testing.assert_array_equal(np.isnan(og[bad]), keep24[bad])
    assert (og[bad][~keep24[bad]] == 0).all()
    # Finite groups: no NaN, at most 2 nonzeros, zero where x is zero, same sign, |out| >= |x|
    # (scaled by 1/p >= 1) up to rounding; subnormal x may flush to 0.
    fo, fx = og[~bad], xg[~bad]
    assert not np.isnan(fo).any()
    assert ((fo != 0).sum(-1) <= 2).all()
    assert (fo[fx == 0] == 0).all()
    nz = fo != 0
    assert (np.sign(fo[nz]) == np.sign(fx[nz])).all()
    # Kept values are x / p (p from |x| + eps in float64); skip near-overflow groups.
    tol = {"f32": 1e-4, "bf16": 2e-2, "f16": 4e-3}[name]
    ok = nz & (np.abs(fx).max(-1, keepdims=True) < 1e30) & (np.abs(fx) >= TINY32)
    if ok.any():
        p = _np_inclusion(np.abs(fx) + reference_ops.MVUE_EPS)
        want = (fx / p).astype(DTYPES[name]).astype(np.float64)
        np.testing.assert_allclose(fo[ok], want[ok], rtol=tol, atol=0)
    # Non-finite groups do not touch the others: same key, bad groups zeroed -> same finite groups.
    if bad.any():
        clean = np.where(bad[..., None], 0.0, xg).astype(x.dtype)
        clean = _ungroup(clean, axis, x.shape)
        out2 = _groups(_f32(_mvue(key, jnp.asarray(clean), axis=axis)), axis)
        np.testing.assert_array_equal(out2[~bad], fo)


# --------------------------------------------------------------------------------------------
# Bad input


@settings(max_examples=15, deadline=None)
@given(size=st.integers(1, 15).filter(lambda s: s % 4), op=st.sampled_from(["mask24", "soft", "mvue", "nm"]))
def test_wrong_axis_size_is_a_clear_error(size, op):
    x = jnp.ones((size, 4))
    call = {
        "mask24": lambda: reference_ops.mask24(x, axis=0),
        "soft": lambda: reference_ops.soft_threshold24(x, axis=0),
        "mvue": lambda: reference_ops.mvue24(jax.random.key(0), x, axis=0),
        "nm": lambda: reference_ops.nm_mask(x, 2, 4, axis=0),
    }[op]
    with pytest.raises(ValueError, match=rf"axis 0 must be divisible by 4.*\({size}, 4\)"):
        call()


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int8, jnp.uint8, jnp.bool_])
@pytest.mark.parametrize("op", ["mask24", "nm_mask", "transposable_mask24", "soft_threshold24", "mvue24"])
def test_non_float_dtype_is_a_clear_error(op, dtype):
    x = jnp.ones((4, 4), dtype)
    call = {
        "mask24": lambda: s24.mask24(x, axis=0),
        "nm_mask": lambda: s24.nm_mask(x, 2, 4, axis=0),
        "transposable_mask24": lambda: s24.transposable_mask24(x),
        "soft_threshold24": lambda: s24.soft_threshold24(x, axis=0),
        "mvue24": lambda: s24.mvue24(jax.random.key(0), x, axis=0),
    }[op]
    with pytest.raises(ValueError, match=rf"{op}: `x` must be a floating-point array.*{jnp.dtype(dtype).name}"):
        call()


@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_python_lists_work_like_arrays(data):
    x, _ = data.draw(arrays(shapes=[(8,), (4, 4)], dtypes=("f32",)))
    lst = x.tolist()
    np.testing.assert_array_equal(np.asarray(s24.mask24(lst, axis=0)), np.asarray(s24.mask24(jnp.asarray(x), axis=0)))
    np.testing.assert_array_equal(np.asarray(s24.nm_mask(lst, 1, 4, axis=0)), _np_nm_mask(x, 1, 4, 0))
    y, _ = s24.soft_threshold24(lst, axis=0)
    np.testing.assert_array_equal(_f32(y), _f32(_np_soft(x, 0)[0]))


def test_bad_lists_name_the_argument():
    with pytest.raises(ValueError, match=r"mask24: `x` must be a floating-point array.*int32"):
        s24.mask24([1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"mask24: `x` must be an array or a \(nested\) list of numbers"):
        s24.mask24([[1.0, 2.0], [3.0]])
    with pytest.raises(ValueError, match=r"transposable_mask24: `x` must be an array or a \(nested\) list"):
        s24.transposable_mask24([[1.0, 2.0, 3.0, 4.0], [1.0]])


def test_special_value_examples():
    """The documented results, spelled out (the issue's cases)."""
    nan, inf = np.nan, np.inf
    np.testing.assert_array_equal(s24.mask24(jnp.array([1.0, nan, -inf, 2.0])), [False, True, True, False])
    np.testing.assert_array_equal(s24.mask24(jnp.array([inf, 5.0, nan, 1.0])), [True, False, True, False])
    np.testing.assert_array_equal(s24.mask24(jnp.array([inf, -inf, inf, nan])), [True, False, False, True])
    np.testing.assert_array_equal(s24.mask24(jnp.array([-0.0, 0.0, 1e-45, 0.0])), [True, False, True, False])
    y, m = s24.soft_threshold24(jnp.array([inf, inf, inf, 1.0]))
    np.testing.assert_array_equal(np.asarray(y), [nan, nan, 0, 0])  # a dropped inf: NaN, surfaced
    y, m = s24.soft_threshold24(jnp.array([-inf, 2.0, -3.0, 1.0]))
    np.testing.assert_array_equal(np.asarray(y), [-inf, 0, -1.0, 0])
    out = np.asarray(s24.mvue24(jax.random.key(0), jnp.array([inf, 2.0, -3.0, 1.0, 1.0, 2.0, 3.0, 4.0])))
    np.testing.assert_array_equal(np.isnan(out[:4]), [True, False, True, False])
    assert (out[[1, 3]] == 0).all() and np.isfinite(out[4:]).all() and ((out[4:] != 0).sum() == 2)
    # One NaN in a 4x4 block: the NaN is kept and the 15 finite weights are still chosen optimally.
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    x[1, 2] = nan
    got = np.asarray(s24.transposable_mask24(jnp.asarray(x)))
    assert got[1, 2]
    counts, sums = _np_transposable_scores(x)
    best = np.where(counts == 1, sums, -1).max()
    assert sums[0, np.flatnonzero((_patterns() == _blocks(got)[0]).all(-1))[0]] == pytest.approx(best, rel=1e-6)


def test_axis_none_warns_for_rank_2_and_not_otherwise():
    x2, x1 = jnp.ones((4, 8)), jnp.ones((8,))
    for call in (lambda x: s24.mask24(x), lambda x: s24.nm_mask(x, 2, 4), lambda x: s24.soft_threshold24(x),
                 lambda x: reference_ops.mask24(x), lambda x: s24.soft_threshold_beta(x)):
        with pytest.warns(FutureWarning, match=r"\(in, out\).*axis=0.*future version will require `axis`"):
            out = call(x2)
        # The old default (last axis) is kept while deprecated.
        m = out[1] if isinstance(out, tuple) else out
        if m.dtype == jnp.bool_:
            np.testing.assert_array_equal(np.asarray(m), np.asarray(reference_ops.mask24(x2, axis=-1)))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s24.mask24(x1), s24.nm_mask(x1, 1, 4), s24.soft_threshold24(x1)  # 1-D: axis 0, no warning
        for ax in (0, 1, -1):
            s24.mask24(x2[:, :4], axis=ax), s24.soft_threshold24(x2[:, :4], axis=ax), s24.nm_mask(x2[:, :4], 1, 4, axis=ax)
        jax.jit(lambda w: s24.mask24(w, axis=0))(x2)
