"""GPU tests of the element-wise 2:4 CUDA kernels (xla_ffi/mask_kernels.cu) against the reference.

Each kernel is called directly through its wrapper in ``cuda_mask_ops`` under ``jax.jit`` on the
GPU and compared with ``reference`` run on the CPU backend (an independent oracle: different
compiler, HIGHEST-precision matmul for the transposable scores).

Poisoning: XLA owns the output buffers, so every kernel call whose output is checked goes through
:func:`poisoned` (not the empty-input and fori_loop cases, whose outputs the kernel does not own), which
passes a buffer of the output's shape and dtype filled with a poison value (NaN for floats, True
for masks) as a *donated*, kept argument of the jitted call. XLA then reuses that memory for the
output of the same shape and dtype, so an element the kernel fails to write keeps its poison —
and the checks catch it: floats must be NaN-free and masks must have exactly 2 True per group
(poison True gives 4). ``poisoned`` fails if XLA declines the donation.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

from jax_sparse24._src import ffi
from jax_sparse24._src import reference_ops

pytestmark = pytest.mark.gpu

from gpu_util import skip_module_without_kernels  # noqa: E402

skip_module_without_kernels()

from jax_sparse24._src import cuda_mask_ops as cm  # noqa: E402
from gpu_util import poisoned  # noqa: E402

GPU = jax.devices("gpu")[0]
CPU = jax.devices("cpu")[0]

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
DTYPE_IDS = ["f32", "bf16", "f16"]

# (shape, axis): inner == 1 (contiguous kernel, incl. an odd number of groups), inner > 1 with
# every vector width (inner % 8 == 0, % 4, % 2, odd), 3-D and 4-D views, sizes that are not
# multiples of the block size, one large enough for many blocks.
ELEMENTWISE_CASES = [
    ((64, 128), -1),
    ((5, 12), -1),  # 15 groups: odd tail group
    ((3, 4), -1),
    ((96, 36), 1),
    ((7, 1000), -1),
    ((128, 40), 0),  # inner 40
    ((36, 6), 0),  # inner 6
    ((12, 7), 0),  # inner 7
    ((16, 12), 0),  # inner 12 (bf16: W = 4)
    ((3, 8, 20), 1),
    ((2, 3, 16, 5), 2),
    ((2, 4, 3), 1),
    ((1028, 520), 0),
    ((777, 1024), -1),
]
CASE_IDS = [f"{'x'.join(map(str, s))}-ax{a}" for s, a in ELEMENTWISE_CASES]


def _rand(shape, dtype, seed, kind="normal"):
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(shape) * rng.uniform(0.5, 3.0)
    elif kind == "int":  # many exact ties
        x = rng.integers(-3, 4, size=shape).astype(np.float64)
    else:
        raise ValueError(kind)
    return np.array(jnp.asarray(x, dtype))  # writable numpy array in the target dtype (ml_dtypes for bf16)


def _seed(*parts) -> int:
    """A different, reproducible seed per test case."""
    return zlib.crc32(repr(parts).encode())


def _gpu(x):
    return jax.device_put(x, GPU)


def _cpu(x):
    return jax.device_put(x, CPU)


def _on_cpu(fn, x, *args):
    """The reference on the CPU backend (an oracle independent of the GPU compiler)."""
    with jax.default_device(CPU):
        return fn(_cpu(x), *args)


def _groups(a, axis):
    """(..., G, 4) view of an array with groups of 4 along axis."""
    a = np.moveaxis(np.asarray(a), axis, -1)
    return a.reshape(*a.shape[:-1], a.shape[-1] // 4, 4)


def _assert_two_per_group(mask, axis):
    counts = _groups(mask, axis).sum(-1)
    assert counts.min() == 2 and counts.max() == 2, (
        f"groups must keep exactly 2 (poison or skipped elements?): counts in [{counts.min()}, {counts.max()}]"
    )


# --------------------------------------------------------------------------------------------
# mask24


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", ELEMENTWISE_CASES, ids=CASE_IDS)
def test_mask24_matches_reference(shape, axis, dtype):
    x = _rand(shape, dtype, _seed("mask24", shape, axis, dtype))
    got = np.asarray(poisoned(lambda x: cm.mask24_cuda(x, axis))(_gpu(x)))
    assert got.dtype == np.bool_ and got.shape == shape
    _assert_two_per_group(got, axis)
    want = np.asarray(_on_cpu(reference_ops.mask24, x, axis))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["int", "normal"])
def test_mask24_ties_match_reference(dtype, kind):
    # Integer values: most groups contain ties, broken toward the lower index like lax.top_k.
    for shape, axis in [((64, 64), -1), ((64, 40), 0)]:
        x = _rand(shape, dtype, _seed("ties", kind, shape, dtype), kind=kind)
        got = np.asarray(poisoned(lambda x: cm.mask24_cuda(x, axis))(_gpu(x)))
        want = np.asarray(_on_cpu(reference_ops.mask24, x, axis))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_mask24_explicit_ties(dtype):
    rows = [
        ([1, 1, 1, 1], [1, 1, 0, 0]),
        ([0, 0, 0, 0], [1, 1, 0, 0]),
        ([3, -3, 1, 3], [1, 1, 0, 0]),
        ([1, 2, 2, 2], [0, 1, 1, 0]),
        ([-0.0, 0.0, 0.0, -0.0], [1, 1, 0, 0]),
        ([1, -5, 3, 0], [0, 1, 1, 0]),
        ([0.5, 0.5, -2, 0.5], [1, 0, 1, 0]),
    ]
    x = jnp.asarray([r for r, _ in rows], dtype)
    want = np.array([w for _, w in rows], bool)
    got = np.asarray(poisoned(lambda x: cm.mask24_cuda(x, -1))(_gpu(x)))
    np.testing.assert_array_equal(got, want)
    # Same groups along axis 0 (strided kernel, inner = 7).
    got_t = np.asarray(poisoned(lambda x: cm.mask24_cuda(x, 0))(_gpu(jnp.asarray(x).T)))
    np.testing.assert_array_equal(got_t, want.T)


def test_mask24_inside_loop_and_vmap():
    # fori_loop bodies may be captured into CUDA graphs (command buffers).
    xs = _rand((3, 32, 64), jnp.bfloat16, 7)

    def run(xs):
        def body(i, acc):
            return acc + cm.mask24_cuda(xs[i], -1).astype(jnp.int32)

        return lax.fori_loop(0, 3, body, jnp.zeros(xs.shape[1:], jnp.int32))

    got = jax.jit(run)(_gpu(xs))
    want = sum(np.asarray(_on_cpu(reference_ops.mask24, xs[i], -1)).astype(np.int32) for i in range(3))
    np.testing.assert_array_equal(np.asarray(got), want)
    # vmap ("broadcast_all"): the batch folds into `outer`.
    xb = _rand((3, 8, 12), jnp.float32, 8)
    got_b = poisoned(jax.vmap(lambda x: cm.mask24_cuda(x, 0)))(_gpu(xb))
    want_b = np.stack([np.asarray(_on_cpu(reference_ops.mask24, xi, 0)) for xi in xb])
    np.testing.assert_array_equal(np.asarray(got_b), want_b)


def test_empty_inputs():
    for shape, axis in [((0, 8), -1), ((8, 0), 0), ((0, 4, 3), 1)]:
        x = jnp.zeros(shape, jnp.float32)
        assert jax.jit(lambda x: cm.mask24_cuda(x, axis))(_gpu(x)).shape == shape
        y, m = jax.jit(lambda x: cm.soft_threshold24_cuda(x, axis))(_gpu(x))
        assert y.shape == shape and m.shape == shape
        assert jax.jit(lambda x: cm.mvue24_cuda(jax.random.key(0), x, axis))(_gpu(x)).shape == shape
    x = jnp.zeros((0, 8), jnp.bfloat16)
    assert jax.jit(cm.transposable_mask24_cuda)(_gpu(x)).shape == (0, 8)


# --------------------------------------------------------------------------------------------
# soft threshold


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", ELEMENTWISE_CASES, ids=CASE_IDS)
def test_soft_threshold24_matches_reference(shape, axis, dtype):
    x = _rand(shape, dtype, _seed("soft", shape, axis, dtype))
    y, mask = poisoned(lambda x: cm.soft_threshold24_cuda(x, axis))(_gpu(x))
    y, mask = np.asarray(y), np.asarray(mask)
    assert y.dtype == x.dtype and mask.dtype == np.bool_
    assert not np.isnan(y.astype(np.float32)).any(), "unwritten (poisoned) y elements"
    _assert_two_per_group(mask, axis)
    y_ref, m_ref = _on_cpu(reference_ops.soft_threshold24, x, axis)
    np.testing.assert_array_equal(mask, np.asarray(m_ref))
    # Same float32 arithmetic, one rounding to the output dtype: bit-exact.
    np.testing.assert_array_equal(y.astype(np.float32), np.asarray(y_ref).astype(np.float32))
    assert (y.astype(np.float32)[~mask] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_soft_threshold24_ties(dtype):
    x = jnp.asarray([[1, 1, 1, 1], [0.1, -3.0, 2.0, 0.5], [2, -2, 1, 2], [0, 0, 0, 0]], dtype)
    y, m = poisoned(lambda x: cm.soft_threshold24_cuda(x, -1))(_gpu(x))
    y_ref, m_ref = _on_cpu(reference_ops.soft_threshold24, x, -1)
    np.testing.assert_array_equal(np.asarray(m), np.asarray(m_ref))
    np.testing.assert_array_equal(np.asarray(y).astype(np.float32), np.asarray(y_ref).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(m)[0], [True, True, False, False])


# --------------------------------------------------------------------------------------------
# transposable mask

TRANSPOSABLE_SHAPES = [(4, 4), (8, 12), (64, 128), (128, 36), (36, 200), (260, 1028), (1024, 512)]


def _all_patterns() -> np.ndarray:
    return np.asarray(reference_ops.transposable_patterns(), np.float64)  # (90, 16), canonical order


def _blocks(a):
    r, c = a.shape
    return np.asarray(a).reshape(r // 4, 4, c // 4, 4).transpose(0, 2, 1, 3).reshape(-1, 16)


def _check_transposable_structure(mask):
    b = _blocks(mask).reshape(-1, 4, 4).astype(np.int64)
    assert (b.sum(1) == 2).all() and (b.sum(2) == 2).all(), "every 4x4 block needs 2 per row and column"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", TRANSPOSABLE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_transposable_mask24_matches_reference(shape, dtype):
    x = _rand(shape, dtype, _seed("transposable", shape, dtype))
    got = np.asarray(poisoned(cm.transposable_mask24_cuda)(_gpu(x)))
    assert got.dtype == np.bool_ and got.shape == shape
    _check_transposable_structure(got)
    absx = np.abs(_blocks(x.astype(np.float64)))  # (blocks, 16)
    best = (absx @ _all_patterns().T).max(-1)  # exact optimum in float64
    score = (absx * _blocks(got)).sum(-1)
    np.testing.assert_allclose(score, best, rtol=1e-5, atol=0)
    want = np.asarray(_on_cpu(reference_ops.transposable_mask24, x))  # HIGHEST-precision scores
    agree = (_blocks(got) == _blocks(want)).all(-1).mean()
    assert agree >= 0.999, f"only {agree:.5f} of blocks agree with the reference"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_transposable_mask24_ties(dtype):
    # All-zero blocks: every pattern ties; the first in canonical order is p = 0x33CC.
    z = jnp.zeros((8, 16), dtype)
    got = np.asarray(poisoned(cm.transposable_mask24_cuda)(_gpu(z)))
    first = np.array([(0x33CC >> i) & 1 for i in range(16)], bool)
    assert (_blocks(got) == first).all()
    # Small integers: many exact ties, every score exact in any summation order -> identical.
    x = _rand((64, 96), dtype, 3, kind="int")
    got = np.asarray(poisoned(cm.transposable_mask24_cuda)(_gpu(x)))
    want = np.asarray(_on_cpu(reference_ops.transposable_mask24, x))  # HIGHEST-precision scores
    np.testing.assert_array_equal(got, want)
    # A matrix that already is transposable-sparse keeps its support.
    rng = np.random.default_rng(4)
    pats = _all_patterns().astype(bool)
    pick = pats[rng.integers(0, 90, size=(16 // 4) * (32 // 4))]
    support = pick.reshape(4, 8, 4, 4).transpose(0, 2, 1, 3).reshape(16, 32)
    w = np.where(support, rng.uniform(0.5, 2.0, support.shape), 0.0)
    got = np.asarray(poisoned(cm.transposable_mask24_cuda)(_gpu(jnp.asarray(w, dtype))))
    np.testing.assert_array_equal(got, support)


def test_transposable_mask24_vmap():
    # Small integers: every block score is exact, so the kernel equals the reference bit for bit.
    xs = _rand((3, 16, 24), jnp.bfloat16, 11, kind="int")
    got = np.asarray(poisoned(jax.vmap(cm.transposable_mask24_cuda))(_gpu(xs)))
    for i in range(3):
        np.testing.assert_array_equal(got[i], np.asarray(_on_cpu(reference_ops.transposable_mask24, xs[i])), f"batch {i}")


# --------------------------------------------------------------------------------------------
# MVUE

MVUE_RTOL = {jnp.float32: 2e-5, jnp.bfloat16: 1e-2, jnp.float16: 2e-3}


def _inclusion_probs(g64, axis):
    """p_i in float64 from the input (groups along axis), returned in g's layout."""
    a = np.abs(_groups(g64, axis)) + reference_ops.MVUE_EPS
    s = a.sum(-1, keepdims=True)
    rest = np.stack([a[..., [m for m in range(4) if m != k]].sum(-1) for k in range(4)], -1)
    p = a / s
    for k in range(4):
        for m in range(4):
            if m != k:
                p[..., k] += a[..., m] / s[..., 0] * a[..., k] / rest[..., m]
    moved_shape = np.moveaxis(g64, axis, -1).shape
    return np.moveaxis(p.reshape(moved_shape), -1, axis)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", ELEMENTWISE_CASES, ids=CASE_IDS)
def test_mvue24_support_and_values(shape, axis, dtype):
    g = _rand(shape, dtype, _seed("mvue", shape, axis, dtype))
    key = jax.random.key(_seed("key", shape, axis))
    out = np.asarray(poisoned(lambda k, g: cm.mvue24_cuda(k, g, axis))(key, _gpu(g)))
    assert out.dtype == g.dtype and out.shape == shape
    out32 = out.astype(np.float32)
    assert not np.isnan(out32).any(), "unwritten (poisoned) output elements"
    kept = out32 != 0
    _assert_two_per_group(kept, axis)  # random normal g has no zeros
    g64 = g.astype(np.float64)
    want = g64 / _inclusion_probs(g64, axis)
    np.testing.assert_allclose(out32[kept], want[kept], rtol=MVUE_RTOL[dtype], atol=0)


def test_mvue24_reproducible_and_keyed():
    g = _gpu(_rand((64, 256), jnp.bfloat16, 21))
    f = poisoned(lambda k, g: cm.mvue24_cuda(k, g, -1))  # equal draws must not come from a stale buffer
    k0, k1 = jax.random.key(0), jax.random.key(1)
    a, b, c = np.asarray(f(k0, g)), np.asarray(f(k0, g)), np.asarray(f(k1, g))
    np.testing.assert_array_equal(a, b)
    assert (_groups(a != c, -1).any(-1)).mean() > 0.3, "another key must give other draws"
    # A raw uint32 key with the same words gives the same draws as the typed key.
    np.testing.assert_array_equal(np.asarray(f(jax.random.PRNGKey(0), g)), a)
    # 4-word keys (rbg) use all their words.
    kr = jax.random.key(0, impl="rbg")
    kr2 = jax.random.wrap_key_data(jax.random.key_data(kr).at[3].add(1), impl="rbg")
    r1, r2 = np.asarray(f(kr, g)), np.asarray(f(kr2, g))
    assert (_groups(r1 != r2, -1).any(-1)).mean() > 0.3, "the 4th key word must change the draws"


def test_mvue24_vmap_over_keys_matches_single_calls():
    # inner == 1: a single call uses the contiguous kernel, the vmapped call (per-batch keys) the
    # strided one — identical results show the draws do not depend on the launch configuration.
    g = _gpu(_rand((8, 36), jnp.float32, 5))
    keys = jax.random.split(jax.random.key(3), 4)
    f = poisoned(lambda k, g: cm.mvue24_cuda(k, g, -1))
    batched = np.asarray(poisoned(jax.vmap(lambda k: cm.mvue24_cuda(k, g, -1)))(keys))
    for i in range(4):
        np.testing.assert_array_equal(batched[i], np.asarray(f(keys[i], g)))
    # Batched keys and batched x.
    gs = _gpu(_rand((3, 16, 12), jnp.bfloat16, 6))
    keys3 = jax.random.split(jax.random.key(4), 3)
    both = np.asarray(poisoned(jax.vmap(lambda k, g: cm.mvue24_cuda(k, g, 0)))(keys3, gs))
    single = poisoned(lambda k, g: cm.mvue24_cuda(k, g, 0))
    for i in range(3):
        np.testing.assert_array_equal(both[i], np.asarray(single(keys3[i], gs[i])))


@pytest.mark.parametrize("axis", [-1, 0])
def test_mvue24_unbiased(axis):
    n = 2000
    g = _rand((32, 64), jnp.float32, 99)
    g[0, :4] = [1e-3, 2.0, 0.0, -0.5]  # a zero and a small value in one group
    keys = jax.random.split(jax.random.key(2024), n)
    gd = _gpu(g)
    draws = jax.jit(jax.vmap(lambda k: cm.mvue24_cuda(k, gd, axis)))(keys)
    mean = np.asarray(jnp.mean(draws.astype(jnp.float32), axis=0), np.float64)
    g64 = g.astype(np.float64)
    p = _inclusion_probs(g64, axis)
    # Sampling sd of the mean, plus a float32 floor (the kernel's p is float32).
    sd = np.abs(g64) * np.sqrt(np.maximum(1.0 / p - 1.0, 0.0) / n + 1e-12)
    nz = sd > 0
    z = (mean[nz] - g64[nz]) / sd[nz]
    assert np.abs(z).max() < 7.0, f"max |z| = {np.abs(z).max():.2f}"
    assert 0.8 < np.mean(z**2) < 1.2, f"mean z^2 = {np.mean(z**2):.3f} (expected ~1)"
    np.testing.assert_array_equal(mean[~nz], 0.0)  # g == 0 stays exactly 0


# --------------------------------------------------------------------------------------------
# bad input


def test_wrapper_rejects_unsupported():
    xi = jnp.zeros((8, 8), jnp.int32)
    assert not cm.dtype_supported(xi.dtype) and cm.dtype_supported(jnp.bfloat16)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        cm.mask24_cuda(xi)
    with pytest.raises(ValueError, match="divisible by 4"):
        cm.soft_threshold24_cuda(jnp.zeros((8, 6), jnp.float32), -1)
    with pytest.raises(ValueError, match="divisible by 4"):
        cm.transposable_mask24_cuda(jnp.zeros((6, 8), jnp.float32))
    with pytest.raises(ValueError, match="uint32"):
        cm.mvue24_cuda(jnp.zeros((2,), jnp.float32), jnp.zeros((4, 4), jnp.float32))


def _raw(target, out, *args):
    # Block: handler errors surface when the computation runs, not at dispatch.
    return jax.block_until_ready(
        jax.jit(lambda *a: jax.ffi.ffi_call(target, out, vmap_method="sequential")(*a))(*args)
    )


def test_handler_errors_name_the_constraint():
    ffi.require_extension()
    bad_l = _gpu(jnp.ones((2, 6, 1), jnp.float32))
    with pytest.raises(Exception, match=r"divisible by 4.*\(2, 6, 1\)"):
        _raw("jax_sparse24_mask24", jax.ShapeDtypeStruct((2, 6, 1), jnp.bool_), bad_l)
    with pytest.raises(Exception, match="float32, bfloat16 or float16"):
        _raw("jax_sparse24_mask24", jax.ShapeDtypeStruct((2, 4, 1), jnp.bool_), _gpu(jnp.ones((2, 4, 1), jnp.int32)))
    with pytest.raises(Exception, match="rank >= 3"):
        _raw("jax_sparse24_mask24", jax.ShapeDtypeStruct((4, 4), jnp.bool_), _gpu(jnp.ones((4, 4), jnp.float32)))
    with pytest.raises(Exception, match="must be bool"):
        _raw("jax_sparse24_mask24", jax.ShapeDtypeStruct((1, 4, 1), jnp.float32), _gpu(jnp.ones((1, 4, 1))))
    with pytest.raises(Exception, match="input's shape"):
        _raw(
            "jax_sparse24_soft_threshold24",
            (jax.ShapeDtypeStruct((1, 8, 1), jnp.float32), jax.ShapeDtypeStruct((1, 4, 1), jnp.bool_)),
            _gpu(jnp.ones((1, 8, 1))),
        )
    with pytest.raises(Exception, match=r"divisible by 4.*\(6, 8\)"):
        _raw("jax_sparse24_transposable_mask24", jax.ShapeDtypeStruct((6, 8), jnp.bool_), _gpu(jnp.ones((6, 8))))
    with pytest.raises(Exception, match="uint32"):
        _raw(
            "jax_sparse24_mvue24",
            jax.ShapeDtypeStruct((1, 4, 1), jnp.float32),
            _gpu(jnp.ones((2,), jnp.float32)),
            _gpu(jnp.ones((1, 4, 1))),
        )
    with pytest.raises(Exception, match="1 <= n <= 4"):
        _raw(
            "jax_sparse24_mvue24",
            jax.ShapeDtypeStruct((1, 4, 1), jnp.float32),
            _gpu(jnp.ones((5,), jnp.uint32)),
            _gpu(jnp.ones((1, 4, 1))),
        )


# --------------------------------------------------------------------------------------------
# Special values: NaN, ±inf, ±0, subnormals and ties follow the one documented rule
# (reference_ops.py module docstring) in every kernel, bit for bit on the masks.

# NaN of both signs, ±inf, ±0, float32 subnormals (bf16 subnormals too; 0 in f16), float16
# subnormals (normal in float32), the largest finite values (inf in f16) and small integers (ties).
SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3e-41, 1e-39, 6e-8, -1.2e-7,
                     3e-5, 3.38e38, 65504.0, 1.0, -1.0, 2.0, -2.0, 3.0])
# Those that keep every transposable score exact in any summation order with small integers
# (subnormals and magnitudes below 2^-122 score 0; non-finite ones are counted, not summed).
SPECIALS_EXACT = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3e-41, 1e-39, 1.0, -2.0, 3.0])


def _special(shape, dtype, seed, p_special=0.3, ints=False):
    """Random values with a fraction p_special of SPECIALS; ints: small integers instead of normals
    (every transposable score is then exact in any summation order)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(-4, 5, size=shape).astype(np.float64) if ints else rng.standard_normal(shape)
    pool = SPECIALS_EXACT if ints else SPECIALS
    pick = pool[rng.integers(0, len(pool), size=shape)]
    with np.errstate(over="ignore"):
        return np.array(jnp.asarray(np.where(rng.random(shape) < p_special, pick, base), dtype))


SPECIAL_CASES = [((16, 64), -1), ((5, 12), -1), ((64, 40), 0), ((12, 7), 0), ((2, 8, 6), 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", SPECIAL_CASES, ids=lambda c: str(c))
def test_mask24_special_values_match_reference(shape, axis, dtype):
    for p in (0.1, 0.6):
        x = _special(shape, dtype, _seed("mask24-special", shape, axis, dtype, p), p)
        got = np.asarray(poisoned(lambda x: cm.mask24_cuda(x, axis))(_gpu(x)))
        _assert_two_per_group(got, axis)
        np.testing.assert_array_equal(got, np.asarray(_on_cpu(reference_ops.mask24, x, axis)))
        # Non-finite elements are kept (up to two per group).
        nf = _groups(~np.isfinite(x.astype(np.float32)), axis)
        assert ((_groups(got, axis) & nf).sum(-1) == np.minimum(nf.sum(-1), 2)).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_mask24_special_value_rows(dtype):
    nan, inf = np.nan, np.inf
    rows = [
        ([1.0, nan, -inf, 2.0], [0, 1, 1, 0]),
        ([inf, -inf, inf, nan], [1, 0, 0, 1]),
        ([-nan, nan, nan, nan], [1, 1, 0, 0]),
        ([-0.0, 0.0, 0.0, -0.0], [1, 1, 0, 0]),
        ([0.0, 1e-40, -2e-40, 0.0], [0, 1, 1, 0]),  # bf16/f32 subnormals ranked exactly (f16: all 0)
        ([3.0, -3.0, 3.0, inf], [1, 0, 0, 1]),
    ]
    x = jnp.asarray(np.array([r for r, _ in rows]), dtype)
    got = np.asarray(poisoned(lambda x: cm.mask24_cuda(x, -1))(_gpu(x)))
    np.testing.assert_array_equal(got, np.asarray(_on_cpu(reference_ops.mask24, x, -1)))
    want = np.array([w for _, w in rows], bool)
    keep_rows = [0, 1, 2, 3, 5] + ([4] if dtype != jnp.float16 else [])
    np.testing.assert_array_equal(got[keep_rows], want[keep_rows])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", SPECIAL_CASES, ids=lambda c: str(c))
def test_soft_threshold24_special_values_match_reference(shape, axis, dtype):
    for p in (0.1, 0.6):
        x = _special(shape, dtype, _seed("soft-special", shape, axis, dtype, p), p)
        y, mask = poisoned(lambda x: cm.soft_threshold24_cuda(x, axis))(_gpu(x))
        y, mask = np.asarray(y), np.asarray(mask)
        _assert_two_per_group(mask, axis)
        y_ref, m_ref = _on_cpu(reference_ops.soft_threshold24, x, axis)
        np.testing.assert_array_equal(mask, np.asarray(m_ref))
        # NaN where the reference has NaN, ±inf where it has ±inf, equal values elsewhere
        # (subnormal differences flushed to zero on both sides).
        np.testing.assert_array_equal(y.astype(np.float32), np.asarray(y_ref).astype(np.float32))
        assert (y.astype(np.float32)[~mask] == 0).all()
    y, _ = poisoned(lambda x: cm.soft_threshold24_cuda(x, -1))(_gpu(jnp.asarray([[np.inf] * 3 + [1.0],
                                                                                 [-np.inf, 2.0, -3.0, 1.0]], dtype)))
    np.testing.assert_array_equal(np.asarray(y).astype(np.float32), [[np.nan, np.nan, 0, 0], [-np.inf, 0, -1, 0]])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_transposable_mask24_special_values(dtype):
    for shape, p in [((8, 12), 0.1), ((64, 96), 0.05), ((64, 96), 0.4), ((260, 36), 0.02)]:
        # Small integers + specials: every score exact -> identical to the reference, ties included.
        x = _special(shape, dtype, _seed("transposable-special", shape, dtype, p), p, ints=True)
        got = np.asarray(poisoned(cm.transposable_mask24_cuda)(_gpu(x)))
        _check_transposable_structure(got)
        np.testing.assert_array_equal(got, np.asarray(_on_cpu(reference_ops.transposable_mask24, x)))
        # Random normals + specials: as many non-finite kept as possible in every block; the
        # blocks' choices agree with the reference (float32 summation order may differ on near-ties).
        x = _special(shape, dtype, _seed("transposable-special-n", shape, dtype, p), p)
        got = np.asarray(poisoned(cm.transposable_mask24_cuda)(_gpu(x)))
        _check_transposable_structure(got)
        nf = (~np.isfinite(_blocks(x.astype(np.float32)))).astype(np.float64)
        np.testing.assert_array_equal((nf * _blocks(got)).sum(-1), (nf @ _all_patterns().T).max(-1))
        # ...and among those, the finite kept Σ|x| is the reference's (optimal) one: patterns may differ
        # where two score the same up to float32 summation order (near-ties), never by more.
        want = np.asarray(_on_cpu(reference_ops.transposable_mask24, x))
        a = np.abs(_blocks(x.astype(np.float32)).astype(np.float64))
        a = np.where(np.isfinite(a) & (a >= 2.0 ** -122), a, 0.0)
        kept_got, kept_want = (a * _blocks(got)).sum(-1), (a * _blocks(want)).sum(-1)
        np.testing.assert_allclose(kept_got, kept_want, rtol=1e-5, atol=0,
                                   err_msg=f"{shape} p={p}: a block's finite kept sum is not the optimal one")
    # One NaN in a 4x4 block is kept, and the other 15 are still chosen optimally.
    rng = np.random.default_rng(41)
    x = rng.standard_normal((4, 4)).astype(np.float32)
    x[1, 2] = np.nan
    got = np.asarray(poisoned(cm.transposable_mask24_cuda)(_gpu(jnp.asarray(x, dtype))))
    assert got[1, 2]
    np.testing.assert_array_equal(got, np.asarray(_on_cpu(reference_ops.transposable_mask24, jnp.asarray(x, dtype))))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", SPECIAL_CASES, ids=lambda c: str(c))
def test_mvue24_special_values(shape, axis, dtype):
    x = _special(shape, dtype, _seed("mvue-special", shape, axis, dtype), 0.15)
    x.flat[0] = np.nan  # at least one group with a non-finite element, whatever the draw
    key = jax.random.key(_seed("mvue-special-key", shape, axis))
    f = poisoned(lambda k, g: cm.mvue24_cuda(k, g, axis))
    out = np.asarray(f(key, _gpu(x))).astype(np.float32)
    og, xg = _groups(out, axis), _groups(x.astype(np.float32), axis)
    bad = ~np.isfinite(xg).all(-1)
    assert bad.any() and (~bad).any()
    # Groups with NaN/inf: NaN exactly where mask24 (reference, CPU) keeps, 0 elsewhere.
    keep = _groups(np.asarray(_on_cpu(reference_ops.mask24, x, axis)), axis)
    np.testing.assert_array_equal(np.isnan(og[bad]), keep[bad])
    assert (og[bad][~keep[bad]] == 0).all()
    # Other groups: finite, at most two nonzeros, and untouched by the bad groups (same key, bad
    # groups zeroed -> the same bits in every finite group).
    assert not np.isnan(og[~bad]).any()
    assert ((og[~bad] != 0).sum(-1) <= 2).all()
    clean = np.moveaxis(np.where(bad[..., None], np.float32(0), xg).reshape(np.moveaxis(x, axis, -1).shape), -1, axis)
    out2 = _groups(np.asarray(f(key, _gpu(jnp.asarray(clean, dtype)))).astype(np.float32), axis)
    np.testing.assert_array_equal(out2[~bad], og[~bad])
    # The reference (other random bits) has NaN in the same places.
    ref = _groups(np.asarray(_on_cpu(lambda x, a: reference_ops.mvue24(jax.random.key(0), x, a), x, axis)), axis)
    np.testing.assert_array_equal(np.isnan(ref.astype(np.float32)), np.isnan(og))
