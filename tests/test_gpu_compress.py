"""GPU tests of the fused 2:4 compressors (xla_ffi/compress_kernels.cu, ``cuda_compress_ops``).

Run on the H100: ``pytest -m gpu tests/test_gpu_compress.py -v``. Skipped without a GPU/extension.

Oracle: CUTLASS's own compressor (``cutlass_compress``, already tested against dense products in
test_gpu_spmm.py) applied to the dense op result — every fused output must match it **bit for bit**
(values and metadata, padding included). Dense op results come from numpy (prune, mask) or from the
element-wise CUDA kernels (MVUE: same Philox draws; soft threshold), so the fused kernel must also
reproduce their group numbering and rounding. Outputs are written into donated buffers pre-filled
with poison (NaN values, 0xFF metadata = an illegal nibble), so an unwritten byte fails.
A numpy decompressor (the closed-form layout of compress_layout.h) checks round trips and MVUE
statistics; one round trip also goes through the sparse GEMM with B = I. The many-tensor compressor
(``masked_compress_many``: many weights in one launch) must equal the one-tensor kernel bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp


pytestmark = pytest.mark.gpu

from gpu_util import skip_module_without_kernels  # noqa: E402

skip_module_without_kernels()

from jax_sparse24._src import cuda_compress_ops as cc  # noqa: E402
from jax_sparse24._src import cuda_mask_ops as cm  # noqa: E402
from jax_sparse24._src import cuda_spmm_ops as cs  # noqa: E402
from jax_sparse24._src import reference_ops  # noqa: E402
from gpu_util import LEGAL_NIBBLES, assert_same_compressed, mask24_np, poisoned, skip_uncompiled  # noqa: E402
from gpu_util import fresh_rng as _rng  # noqa: E402

DTYPES = [jnp.bfloat16, jnp.float16]
DT_IDS = ["bf16", "f16"]
# (R, C) of x: partial 128x128 tiles with metadata padding in M (not % 64) and K (not % 128), the
# smallest legal shape, a tall-thin one and a multi-tile shape. Both compressed directions need R, C % 16.
SHAPES = [(144, 272), (16, 16), (400, 48), (512, 384)]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]


def _x(rng, shape, dtype, special=True):
    """Normal values rounded to dtype, with exact zeros, -0.0 and ties mixed in (never all zero)."""
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(rng.uniform(0.5, 3.0))
    if special:
        u = rng.random(shape)
        x = np.where(u < 0.04, np.float32(0.0), x)
        x = np.where((u >= 0.04) & (u < 0.06), np.float32(-0.0), x)
        x = np.where((u >= 0.06) & (u < 0.09), np.float32(0.75), x)
        x = np.where((u >= 0.09) & (u < 0.11), np.float32(-0.75), x)
    return jnp.asarray(x, dtype)


def decompress_np(values, meta, m: int, k: int) -> np.ndarray:
    """Dense (m, k) float32 from the CUTLASS SM90 compressed form (closed-form layout)."""
    v = np.asarray(jnp.asarray(values).astype(jnp.float32)).reshape(m, k // 4, 2)
    e = np.asarray(meta).reshape(-1)
    mal = -(-m // 64) * 64
    rows = np.arange(m)[:, None].astype(np.int64)
    kk = (4 * np.arange(k // 4))[None, :].astype(np.int64)
    off = ((kk >> 7) * mal * 16 + (rows >> 4) * 256 + ((kk >> 4) & 1) * 128 + (rows & 7) * 16
           + ((kk >> 5) & 3) * 4 + ((rows >> 3) & 1) * 2 + ((kk >> 3) & 1))
    nib = (e[off] >> (4 * ((kk >> 2) & 1))) & 0xF
    i0, i1 = nib & 3, nib >> 2
    out = np.zeros((m, k // 4, 4), np.float32)
    np.put_along_axis(out, i0[..., None], v[..., :1], axis=-1)
    np.put_along_axis(out, i1[..., None], v[..., 1:], axis=-1)
    return out.reshape(m, k)


def _ref(a):
    """CUTLASS's compressor on the dense operand a (m, k)."""
    return jax.jit(cs.cutlass_compress)(jnp.asarray(a))


# ------------------------------------------------------------------------------------------------
# Bit-exact against CUTLASS's compressor.


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_masked_compress_bit_exact(shape, dtype):
    """One direction each, and both in one pass, with a transposable mask (2:4 along both axes)."""
    skip_uncompiled(dtype)
    rng, seed = _rng()
    w = _x(rng, shape, dtype)
    mask = cm.transposable_mask24_cuda(w)
    # drop a few kept elements: groups with fewer than 2 nonzeros exercise CUTLASS's corner cases
    mask = mask & jnp.asarray(rng.random(shape) > 0.1)
    wm = jnp.where(mask, w, jnp.zeros((), dtype))
    ref_t, ref_d = _ref(wm.T), _ref(wm)
    what = f"seed={seed} shape={shape}"
    assert_same_compressed(poisoned(functools.partial(cc.masked_compress, transposed=True))(w, mask), ref_t,
                           what + " transposed")
    assert_same_compressed(poisoned(functools.partial(cc.masked_compress, transposed=False))(w, mask), ref_d,
                           what + " direct")
    got_t, got_d = poisoned(cc.masked_compress_both)(w, mask)
    assert_same_compressed(got_t, ref_t, what + " both/transposed")
    assert_same_compressed(got_d, ref_d, what + " both/direct")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_packed_compress_is_masked_compress_of_the_unpacked_weight(shape, dtype):
    """``packed_compress`` of ``pack24(w, mask)`` (an FSDP weight gathered packed) equals
    ``masked_compress`` of ``unpack24`` of it, bit for bit, into poisoned outputs: both directions with a
    transposable mask, CUTLASS's layout and cuSPARSELt's (where the operand's shape allows); the forward's
    direction (groups along rows) also with a mask that keeps 3 or 4 of some groups, which the packing
    cuts to their first two."""
    from jax_sparse24._src import packed24

    skip_uncompiled(dtype)
    rng, seed = _rng()
    w = _x(rng, shape, dtype)
    tmask = cm.transposable_mask24_cuda(w) & jnp.asarray(rng.random(shape) > 0.1)
    over = tmask | jnp.asarray(rng.random(shape) < 0.1)  # some row groups keep 3 or 4
    assert bool(((np.asarray(over).reshape(shape[0] // 4, 4, -1).sum(1)) > 2).any())
    compared = 0
    for name, mask, directions in (("transposable", tmask, (True, False)), ("over-full", over, (True,))):
        values, bits = jax.jit(packed24.pack24)(w, mask)
        wu, mu = jax.jit(packed24.unpack24)(values, bits)
        for transposed in directions:
            for layout in ("cutlass", "cusparselt"):
                if not cc.compress_supports(w, transposed=transposed, layout=layout):
                    continue
                kw = dict(transposed=transposed, layout=layout)
                got = poisoned(functools.partial(cc.packed_compress, **kw))(values, bits)
                ref = jax.jit(functools.partial(cc.masked_compress, **kw))(wu, mu)
                what = f"seed={seed} shape={shape} {name} mask transposed={transposed} {layout}"
                if layout == "cutlass":
                    assert_same_compressed(got, ref, what)
                else:
                    _assert_same_bytes(np.asarray(got), np.asarray(ref), what)
                compared += 1
    assert compared >= 3, f"shape {shape}: only {compared} comparisons ran"  # CUTLASS's layout: every direction


def test_packed_compress_errors_at_trace_time():
    """Bits of the wrong shape or dtype, or a weight the compressed operand cannot take: ValueError naming
    the constraint, before any kernel runs."""
    v = jnp.ones((64, 128), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"bits must be uint8 of shape \(rows / 8, cols\) = \(16, 128\)"):
        cc.packed_compress(v, jnp.zeros((8, 128), jnp.uint8))
    with pytest.raises(ValueError, match="bits must be uint8"):
        cc.packed_compress(v, jnp.zeros((16, 128), jnp.int8))
    with pytest.raises(ValueError, match="unpacked weight x of shape \\(8, 16\\)"):
        cc.packed_compress(jnp.ones((4, 16), jnp.bfloat16), jnp.zeros((1, 16), jnp.uint8), transposed=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_mvue24_compress_matches_mvue_kernel(shape, dtype):
    """Same Philox draws and numbering as the element-wise MVUE kernel, bit for bit."""
    skip_uncompiled(dtype)
    rng, seed = _rng()
    _assert_mvue_compress_matches_kernel(_x(rng, shape, dtype), seed, f"shape={shape}")


def _assert_mvue_compress_matches_kernel(g, seed, what):
    """mvue24_compress(key, g) == compress(mvue24_cuda(key, g)) bit for bit, both directions."""
    key = jax.random.key(seed % 2**31)
    for transposed in (True, False):
        axis = 0 if transposed else 1
        dense = jax.jit(lambda k, g: cm.mvue24_cuda(k, g, axis=axis))(key, g)
        ref = _ref(dense.T if transposed else dense)
        got = poisoned(functools.partial(cc.mvue24_compress, transposed=transposed))(key, g)
        assert_same_compressed(got, ref, f"seed={seed} {what} transposed={transposed}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_mvue24_compress_special_groups_match_mvue_kernel(dtype):
    """Groups with 0, 1 or 2 nonzeros, ±0, huge and tiny magnitudes: the fused kernel's fast path
    (two nonzero kept lanes) and its general path give the element-wise kernel's bits."""
    skip_uncompiled(dtype)
    rng, seed = _rng()
    shape = (256, 192)
    g = np.array(_x(rng, shape, dtype).astype(jnp.float32))  # writable copy
    big = 1e36 if dtype == jnp.bfloat16 else 2e3   # bf16: s > 2^100 takes the scaled probabilities
    tiny = 1e-38 if dtype == jnp.bfloat16 else 6e-8  # subnormal in float16
    kind = rng.integers(0, 6, size=(shape[0] // 4, shape[1]))  # per group of 4 rows (transposed)
    for gi, c in zip(*np.nonzero(kind)):
        grp = g[4 * gi:4 * gi + 4, c]
        k = kind[gi, c]
        if k == 1:
            grp[:] = 0.0                                  # all zero
        elif k == 2:
            grp[:] = 0.0
            grp[rng.integers(0, 4)] = rng.standard_normal()  # one nonzero
        elif k == 3:
            grp[rng.permutation(4)[:2]] = -0.0             # two signed zeros
        elif k == 4:
            grp[:] = grp * big                             # huge
        elif k == 5:
            grp[:] = np.sign(grp) * tiny                   # tiny
    _assert_mvue_compress_matches_kernel(jnp.asarray(g, dtype), seed, "special groups")


# ------------------------------------------------------------------------------------------------
# Round trips and statistics.


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_round_trip_through_spmm_identity(dtype):
    """decompress(compress(x)) == the masked input, through the sparse GEMM with B = I (exact)."""
    skip_uncompiled(dtype)
    rng, seed = _rng()
    r, c = 272, 144  # transposed: A = pruned(x).T is (144, 272): M % 64 != 0, K % 128 != 0
    x = _x(rng, (r, c), dtype)
    keep = mask24_np(np.asarray(x.astype(jnp.float32)), 0)
    values, meta = jax.jit(functools.partial(cc.masked_compress, transposed=True))(x, jnp.asarray(keep))
    a = np.where(keep, np.asarray(x.astype(jnp.float32)), 0.0).T
    eye = jnp.eye(r, dtype=dtype)
    d = cs.cutlass_spmm(values, meta, eye, m=c, k=r)  # (K, M) = A.T
    np.testing.assert_array_equal(np.asarray(d.astype(jnp.float32)).T, a, err_msg=f"seed={seed}")
    np.testing.assert_array_equal(decompress_np(values, meta, c, r), a, err_msg=f"seed={seed} (numpy)")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_mvue24_compress_unbiased_two_per_group(dtype):
    """E[decompress(mvue24_compress(key, g))] = g; exactly 2 kept per group of 4 tokens (g nonzero)."""
    skip_uncompiled(dtype)
    rng, seed = _rng()
    t, o = 64, 32
    g = jnp.asarray(rng.standard_normal((t, o)) * rng.uniform(0.2, 5.0, size=(1, o)) + 0.01, dtype)
    gf = np.asarray(g.astype(jnp.float32)).astype(np.float64)
    assert (gf != 0).all()
    n = 256
    keys = jax.random.split(jax.random.key(seed % 2**31), n)
    f = jax.jit(lambda k: cc.mvue24_compress(k, g, transposed=True))
    total = np.zeros((o, t))
    sq = np.zeros((o, t))
    for i in range(n):
        values, meta = f(keys[i])
        a = decompress_np(values, meta, o, t).astype(np.float64)  # (O, T) = MVUE(g).T
        kept = (a != 0).reshape(o, t // 4, 4).sum(-1)
        assert (kept == 2).all(), f"seed={seed} key {i}: kept per group {np.unique(kept)}"
        total += a
        sq += a * a
    mean = total / n
    # Exact standard error of the mean from the inclusion probabilities, Var = g²(1/p − 1) — not
    # the sample variance, which is 0 for an element that is rarely kept and never drawn in n
    # tries (that made this test fail on the H100 with z = 1/half_ulp exactly) — plus the
    # dtype's rounding of g / p (a fixed bias per configuration).
    a_abs = np.abs(gf.T).reshape(o, t // 4, 4) + reference_ops.MVUE_EPS
    p = np.asarray(reference_ops.mvue24_inclusion_probabilities(jnp.asarray(a_abs, jnp.float32)), np.float64)
    p = p.reshape(o, t)
    half_ulp = 2.0**-8 if jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16) else 2.0**-11
    std = np.abs(gf.T) * np.sqrt((1.0 / p - 1.0) / n) + half_ulp * np.abs(gf.T)
    z = np.abs(mean - gf.T) / std
    # 2048 elements: a z-score above 6 is a bias, not chance
    assert z.max() < 6.0, f"seed={seed}: max z-score {z.max():.2f} at {np.unravel_index(z.argmax(), z.shape)}"


def test_inside_fori_loop_matches_direct_call():
    """Under jit in a loop (command buffers) the fused compressor gives the same bytes as a direct call."""
    dtype = jnp.bfloat16
    rng, seed = _rng()
    g = _x(rng, (128, 256), dtype)
    key = jax.random.key(seed % 2**31)
    ref = jax.jit(lambda k, g: cc.mvue24_compress(k, g))(key, g)

    @jax.jit
    def loop(key, g):
        def body(i, acc):
            v, m = cc.mvue24_compress(key, g)
            return acc[0] + v.astype(jnp.float32), acc[1] + m.astype(jnp.int32)

        z = jax.eval_shape(lambda: ref)
        init = (jnp.zeros(z[0].shape, jnp.float32), jnp.zeros(z[1].shape, jnp.int32))
        return jax.lax.fori_loop(0, 3, body, init)

    v3, m3 = loop(key, g)
    np.testing.assert_array_equal(np.asarray(v3), 3 * np.asarray(ref[0].astype(jnp.float32)))
    np.testing.assert_array_equal(np.asarray(m3), 3 * np.asarray(ref[1]).astype(np.int32))


# ------------------------------------------------------------------------------------------------
# Errors.


def test_errors_at_trace_time():
    x = jnp.ones((128, 120), jnp.bfloat16)
    with pytest.raises(ValueError, match="k % 16"):
        cc.masked_compress(x, jnp.ones(x.shape, bool))  # K = 120
    assert cc.compress_supports(x, transposed=True) and not cc.compress_supports(x)
    with pytest.raises(ValueError, match="multiples of 8"):
        cc.masked_compress(jnp.ones((100, 128), jnp.bfloat16), jnp.ones((100, 128), bool))
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        cc.masked_compress(jnp.ones((128, 128), jnp.float32), jnp.ones((128, 128), bool))
    with pytest.raises(ValueError, match="mask must have"):
        cc.masked_compress(jnp.ones((128, 128), jnp.bfloat16), jnp.ones((128, 64), bool))
    with pytest.raises(ValueError, match="k % 16"):
        cc.masked_compress_both(jnp.ones((128, 136), jnp.bfloat16), jnp.ones((128, 136), bool))
    with pytest.raises(ValueError, match="single PRNG key"):
        cc.mvue24_compress(jax.random.split(jax.random.key(0), 2), jnp.ones((128, 128), jnp.bfloat16))


def test_handler_validates_on_its_own():
    """Bypass the Python checks: the handlers refuse bad output shapes / inputs with clear messages."""
    x = jnp.ones((128, 256), jnp.bfloat16)
    (vs, ms) = cs.cutlass_compressed_shapes(128, 256, jnp.bfloat16)
    good = (jax.ShapeDtypeStruct(vs, jnp.bfloat16), jax.ShapeDtypeStruct(ms, jnp.uint8))
    bad_values = (jax.ShapeDtypeStruct((vs[0], vs[1] - 8), jnp.bfloat16), good[1])
    bad_meta = (good[0], jax.ShapeDtypeStruct((ms[0] + 64, ms[1]), jnp.uint8))
    call = lambda outs, x, t=0: jax.block_until_ready(  # noqa: E731
        jax.ffi.ffi_call("jax_sparse24_masked_compress", outs)(x, jnp.ones(x.shape, bool), transposed=np.int64(t)))
    call(good, x)
    with pytest.raises(Exception, match="values must have shape"):
        call(bad_values, x)
    with pytest.raises(Exception, match="meta must have shape"):
        call(bad_meta, x)
    with pytest.raises(Exception, match="multiples of 8"):
        call(good, jnp.ones((124, 256), jnp.bfloat16))
    with pytest.raises(Exception, match="key must be uint32"):
        jax.block_until_ready(jax.ffi.ffi_call("jax_sparse24_mvue24_compress", good)(
            jnp.ones((5,), jnp.uint32), x, transposed=np.int64(0)))


# ------------------------------------------------------------------------------------------------
# cuSPARSELt's layout (layout="cusparselt"): the same compressors writing cuSPARSELt's operand.

from jax_sparse24._src import cuda_cusparselt_ops as lt  # noqa: E402

# (R, C) of x; every compressed direction has m % 64 == 0 and k % 32 == 0. 384 x 192 ends in
# partial 128 x 128 tiles along both axes.
LT_SHAPES = [(128, 128), (256, 384), (384, 192), (1024, 512)]
LT_IDS = ["x".join(map(str, s)) for s in LT_SHAPES]


def _skip_no_cusparselt():
    if not lt.cusparselt_available():
        pytest.skip(f"cuSPARSELt unavailable: {lt.cusparselt_error()}")


def _lt_ref(a):
    """cusparseLtSpMMACompress of the dense operand a (m, k), stored (m, k)."""
    m, k = a.shape
    return np.asarray(lt.cusparselt_compress(jnp.asarray(a), m=m, n=128, k=k, a_layout=lt.A_MK))


def decompress_lt_np(buf, m: int, k: int, dtype) -> np.ndarray:
    """Dense (m, k) float32 from cuSPARSELt's compressed operand (compress_layout.h LtMetaNibble)."""
    buf = np.asarray(buf)
    assert buf.shape == (m * k + m * k // 8,), buf.shape
    vals = jax.lax.bitcast_convert_type(jnp.asarray(buf[: m * k].view(np.uint16)), dtype)
    v = np.asarray(vals.astype(jnp.float32)).reshape(m, k // 4, 2)
    e = buf[m * k:]
    r = np.arange(m)[:, None].astype(np.int64)
    c = np.arange(k // 4)[None, :].astype(np.int64)
    rl, cl = r & 63, c & 7
    byte = 256 * ((c >> 3) + (k // 32) * (r >> 6)) + (cl >> 2) + 2 * (cl & 3) + 8 * (rl & 7) + 64 * (rl >> 4)
    nib = (e[byte] >> (4 * ((rl >> 3) & 1))) & 0xF
    bad = sorted(set(np.unique(nib).tolist()) - LEGAL_NIBBLES)
    assert not bad, f"illegal metadata nibbles {bad} (0xF = unwritten poison)"
    out = np.zeros((m, k // 4, 4), np.float32)
    np.put_along_axis(out, (nib & 3)[..., None], v[..., :1], axis=-1)
    np.put_along_axis(out, (nib >> 2)[..., None], v[..., 1:], axis=-1)
    return out.reshape(m, k)


def _assert_same_bytes(got, ref, what):
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape and got.dtype == np.uint8, f"{what}: {got.dtype} {got.shape} vs {ref.shape}"
    if not np.array_equal(got, ref):
        idx = np.nonzero(got != ref)[0]
        raise AssertionError(f"{what}: {idx.size} of {got.size} bytes differ, first at {idx[0]} "
                             f"({'values' if idx[0] < ref.size * 8 // 9 else 'metadata'}): "
                             f"{got[idx[0]]:#04x} vs {ref[idx[0]]:#04x}")


def _assert_lt_matches(got, dense, what):
    """Our buffer vs cusparseLtSpMMACompress of the dense operand (m, k): both decode (our decoder)
    to the operand; byte for byte when every group has exactly two nonzeros (a group with fewer may
    legitimately get another index pair: CUTLASS's rule (0, 3) where cuSPARSELt writes (2, 3))."""
    m, k = dense.shape
    want = np.asarray(dense.astype(jnp.float32))
    ref = _lt_ref(dense)
    np.testing.assert_array_equal(decompress_lt_np(ref, m, k, dense.dtype), want,
                                  err_msg=f"{what}: the library's buffer, decoded by the layout formula")
    np.testing.assert_array_equal(decompress_lt_np(got, m, k, dense.dtype), want, err_msg=f"{what}: ours, decoded")
    if ((want.reshape(m, k // 4, 4) != 0).sum(-1) == 2).all():
        _assert_same_bytes(got, ref, what)
    return ((want.reshape(m, k // 4, 4) != 0).sum(-1) == 2).mean()


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", LT_SHAPES, ids=LT_IDS)
def test_cusparselt_layout_equals_cusparselt_compressor(shape, dtype):
    """Every fused compressor with layout='cusparselt' against cusparseLtSpMMACompress of the dense op
    result (_assert_lt_matches; magnitude masks and MVUE of inputs without zeros have two nonzeros in
    every group, so their bytes are compared), into poisoned buffers."""
    skip_uncompiled(dtype)
    _skip_no_cusparselt()
    rng, seed = _rng()
    x = _x(rng, shape, dtype, special=False)
    xn = np.asarray(x.astype(jnp.float32))
    what = f"seed={seed} shape={shape}"
    key = jax.random.key(seed % 2**31)
    mask = cm.transposable_mask24_cuda(x)
    wm = jnp.where(mask, x, jnp.zeros((), dtype))
    for transposed in (False, True):
        axis = 0 if transposed else 1
        orient = (lambda a: a.T) if transposed else (lambda a: a)
        kw = dict(transposed=transposed, layout="cusparselt")
        keep = jnp.asarray(mask24_np(xn, axis))
        pruned = jnp.where(keep, x, jnp.zeros((), dtype))
        full = _assert_lt_matches(poisoned(functools.partial(cc.masked_compress, **kw))(x, keep), orient(pruned),
                                  f"{what} magnitude mask transposed={transposed}")
        assert full == 1.0, f"{what}: the magnitude mask left a group with fewer than two nonzeros"
        _assert_lt_matches(poisoned(functools.partial(cc.masked_compress, **kw))(x, mask), orient(wm),
                           f"{what} mask transposed={transposed}")
        mv = jax.jit(lambda k, g: cm.mvue24_cuda(k, g, axis=axis))(key, x)
        full = _assert_lt_matches(poisoned(functools.partial(cc.mvue24_compress, **kw))(key, x), orient(mv),
                                  f"{what} mvue transposed={transposed}")
        assert full == 1.0, f"{what}: MVUE left a group with fewer than two nonzeros"
    got_t, got_d = poisoned(functools.partial(cc.masked_compress_both, layout="cusparselt"))(x, mask)
    _assert_lt_matches(got_t, wm.T, what + " both/transposed")
    _assert_lt_matches(got_d, wm, what + " both/direct")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_cusparselt_layout_corner_groups_round_trip(dtype):
    """Zeros, -0.0 and groups with fewer than two nonzeros (where compressors may pick different
    index pairs): our buffer decompresses to the masked input and multiplies like it in cuSPARSELt."""
    skip_uncompiled(dtype)
    _skip_no_cusparselt()
    rng, seed = _rng()
    r, c = 256, 384
    x = _x(rng, (r, c), dtype)  # zeros, -0.0, ties mixed in
    mask = cm.transposable_mask24_cuda(x) & jnp.asarray(rng.random((r, c)) > 0.2)
    wm = np.asarray(jnp.where(mask, x, jnp.zeros((), dtype)).astype(jnp.float32))
    buf_t, buf_d = poisoned(functools.partial(cc.masked_compress_both, layout="cusparselt"))(x, mask)
    np.testing.assert_array_equal(decompress_lt_np(buf_t, c, r, dtype), wm.T, err_msg=f"seed={seed} transposed")
    np.testing.assert_array_equal(decompress_lt_np(buf_d, r, c, dtype), wm, err_msg=f"seed={seed} direct")
    if jnp.dtype(dtype) != jnp.dtype(jnp.bfloat16):
        return  # float16 GEMMs stay on the library's compressor (cuda_cusparselt_ops.fused_compress_ok)
    # through the library's GEMM with B = I: D (n, m) = (A I)^T = A^T exactly
    eye = jnp.eye(r, dtype=dtype)
    d = lt.cusparselt_spmm(buf_t, eye, m=c, n=r, k=r, a_layout=lt.A_MK)
    np.testing.assert_array_equal(np.asarray(d.astype(jnp.float32)), wm, err_msg=f"seed={seed} spmm")


def test_cusparselt_fused_compress_check_passes_on_layer_shapes():
    """The run-time check that lets the cusparselt GEMM paths use our compressors holds here (else
    they would silently fall back to cusparseLtSpMMACompress), and refuses shapes it cannot write."""
    _skip_no_cusparselt()
    for m, n, k, b in [(384, 256, 256, lt.B_NK), (256, 256, 384, lt.B_NK), (384, 256, 256, lt.B_KN),
                       (3072, 8192, 768, lt.B_NK), (768, 3072, 8192, lt.B_KN)]:
        assert lt.fused_compress_ok(m, n, k, jnp.bfloat16, b), (m, n, k, b)
    assert not lt.fused_compress_ok(384, 256, 256, jnp.float16)  # float16: the library's compressor
    assert not lt.fused_compress_ok(96, 256, 256, jnp.bfloat16)  # m % 64 != 0
    assert not lt.fused_compress_ok(128, 256, 48, jnp.bfloat16)  # k % 32 != 0


def test_cusparselt_layout_errors():
    x = jnp.ones((128, 96), jnp.bfloat16)
    ones = jnp.ones(x.shape, bool)
    with pytest.raises(ValueError, match="m % 64 == 0 and k % 32 == 0"):
        cc.masked_compress(x, ones, transposed=True, layout="cusparselt")  # m = 96
    with pytest.raises(ValueError, match="layout must be one of"):
        cc.masked_compress(x, ones, layout="cublas")
    assert cc.compress_supports(x, layout="cusparselt") and not cc.compress_supports(x, transposed=True,
                                                                                     layout="cusparselt")
    out = (jax.ShapeDtypeStruct((128 * 96,), jnp.uint8),)  # values only: too short
    with pytest.raises(Exception, match="cuSPARSELt layout"):
        jax.block_until_ready(jax.ffi.ffi_call("jax_sparse24_masked_compress_lt", out)(x, ones, transposed=np.int64(0)))


# ------------------------------------------------------------------------------------------------
# Many (x, mask) pairs in one launch (masked_compress_many, Sparse24MaskCompressMany): every output
# bit for bit the one-tensor kernel's, poisoned outputs (an unwritten byte fails).

# (R, C) per direction: GPT-2's weight shapes, partial tiles (odd multiples of 16 / 8), the smallest
# legal shapes, tall-thin and wide ones; both directions need R, C % 16, direct C % 16, transposed R % 16.
MANY_SHAPES = {
    "both": [(768, 3072), (3072, 768), (768, 2304), (144, 272), (16, 16), (400, 48), (512, 384), (768, 768)],
    "direct": [(768, 3072), (136, 272), (40, 208), (8, 16), (3072, 768), (264, 144)],
    "transposed": [(3072, 768), (272, 136), (208, 40), (16, 8), (768, 3072), (144, 264)],
}
# cuSPARSELt's layout: every written operand m % 64, k % 32
MANY_LT_SHAPES = [(768, 3072), (3072, 768), (128, 128), (384, 192), (256, 384), (768, 2304)]


def _many_inputs(rng, shapes, dtype):
    ws = [_x(rng, s, dtype) for s in shapes]
    # transposable masks (2:4 along both axes), a few kept elements dropped (CUTLASS's corner cases)
    masks = [cm.transposable_mask24_cuda(w) & jnp.asarray(rng.random(w.shape) > 0.1) for w in ws]
    return ws, masks


def _assert_many_equals_one(got, want, direction, layout, what):
    assert len(got) == len(want), what
    for j, (g, w) in enumerate(zip(got, want)):
        pairs = list(zip(g, w)) if direction == "both" else [(g, w)]
        for (gg, ww), side in zip(pairs, ("transposed", "direct") if direction == "both" else (direction,)):
            tag = f"{what} tensor {j} {side}"
            if layout == "cusparselt":
                _assert_same_bytes(gg, ww, tag)
            else:
                assert_same_compressed(gg, ww, tag)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("direction", ["both", "transposed", "direct"])
def test_masked_compress_many_is_the_one_tensor_kernel_bit_for_bit(direction, dtype):
    skip_uncompiled(dtype)
    rng, seed = _rng()
    ws, masks = _many_inputs(rng, MANY_SHAPES[direction], dtype)
    many = poisoned(lambda ws, ms: cc.masked_compress_many(ws, ms, direction=direction))(ws, masks)
    one = [poisoned(lambda w, m: cc._one(w, m, direction, "cutlass"))(w, m) for w, m in zip(ws, masks)]
    _assert_many_equals_one(many, one, direction, "cutlass", f"seed={seed} {direction}")
    # and the one-tensor kernel is CUTLASS's compressor (test_masked_compress_bit_exact): spot-check one
    w, m = ws[1], masks[1]
    wm = jnp.where(m, w, jnp.zeros((), dtype))
    ref = _ref(wm.T) if direction != "direct" else _ref(wm)
    assert_same_compressed(many[1][0] if direction == "both" else many[1], ref, f"seed={seed} vs CUTLASS")


@pytest.mark.parametrize("direction", ["both", "transposed", "direct"])
def test_masked_compress_many_cusparselt_layout_bit_for_bit(direction):
    rng, seed = _rng()
    ws, masks = _many_inputs(rng, MANY_LT_SHAPES, jnp.bfloat16)
    many = poisoned(lambda ws, ms: cc.masked_compress_many(ws, ms, direction=direction, layout="cusparselt"))(
        ws, masks)
    one = [poisoned(lambda w, m: cc._one(w, m, direction, "cusparselt"))(w, m) for w, m in zip(ws, masks)]
    _assert_many_equals_one(many, one, direction, "cusparselt", f"seed={seed} {direction} cusparselt")


def test_masked_compress_many_splits_long_lists():
    """More pairs than one launch takes (64): near-equal launches, same bits; a smaller
    max_per_launch too (chunks of one run the one-tensor op)."""
    rng, seed = _rng()
    shapes = [(16 * (1 + j % 5), 32 * (1 + j % 3)) for j in range(70)]
    ws, masks = _many_inputs(rng, shapes, jnp.bfloat16)
    one = jax.jit(lambda ws, ms: [cc.masked_compress_both(w, m) for w, m in zip(ws, ms)])(ws, masks)
    for per in (64, 9, 1):
        f = jax.jit(lambda ws, ms, per=per: cc.masked_compress_many(ws, ms, max_per_launch=per))
        hlo = f.lower(ws, masks).compile().as_text()
        n_many = hlo.count('custom_call_target="jax_sparse24_masked_compress_many"')
        assert n_many == {64: 2, 9: 8, 1: 0}[per], (per, n_many)
        _assert_many_equals_one(f(ws, masks), one, "both", "cutlass", f"seed={seed} max_per_launch={per}")


def test_masked_compress_many_handler_validates_on_its_own():
    """Bypass the Python checks: the many-tensor handler refuses bad tables with messages naming the tensor."""
    x = jnp.ones((128, 256), jnp.bfloat16)
    m = jnp.ones((128, 256), jnp.bool_)
    (vs, ms) = cs.cutlass_compressed_shapes(128, 256, jnp.bfloat16)
    good = [jax.ShapeDtypeStruct(vs, jnp.bfloat16), jax.ShapeDtypeStruct(ms, jnp.uint8)]

    def call(outs, *args, direct=1, transposed=0, target="jax_sparse24_masked_compress_many"):
        return jax.block_until_ready(jax.ffi.ffi_call(target, outs)(
            *args, direct=np.int64(direct), transposed=np.int64(transposed)))

    call(good + good, x, m, x, m)
    with pytest.raises(Exception, match="tensor 1: direct .* values must have shape"):
        call(good + [jax.ShapeDtypeStruct((128, 120), jnp.bfloat16), good[1]], x, m, x, m)
    with pytest.raises(Exception, match="tensor 1: all x must have one dtype"):
        call(good + [jax.ShapeDtypeStruct(vs, jnp.float16), good[1]], x, m, x.astype(jnp.float16), m)
    with pytest.raises(Exception, match=r"tensor 0: mask must have x's shape"):
        call(good, x, m[:, :128])
    with pytest.raises(Exception, match=r"\(x, mask\) pairs"):
        call(good, x, m, x)
    with pytest.raises(Exception, match="2 tensors need 4 results"):
        call(good, x, m, x, m)
    with pytest.raises(Exception, match="1 to 64 tensors"):
        call(good * 65, *([x, m] * 65))
    with pytest.raises(Exception, match="needs the direct or the transposed output"):
        call(good, x, m, direct=0)
    with pytest.raises(Exception, match=r"tensor 0: direct \(A = x\) output \(cuSPARSELt layout\) must be uint8"):
        call([jax.ShapeDtypeStruct((128 * 256,), jnp.uint8)], x, m, target="jax_sparse24_masked_compress_many_lt")


def test_masked_compress_many_errors_at_trace_time():
    x = jnp.ones((128, 256), jnp.bfloat16)
    m = jnp.ones((128, 256), bool)
    with pytest.raises(ValueError, match="tensor 1: .*k % 16"):
        cc.masked_compress_many([x, jnp.ones((120, 256), jnp.bfloat16)], [m, jnp.ones((120, 256), bool)])
    with pytest.raises(ValueError, match="one dtype"):
        cc.masked_compress_many([x, x.astype(jnp.float16)], [m, m])


# ------------------------------------------------------------------------------------------------
# Special values: the fused compressors keep what the documented rule keeps.


def _x_special(rng, shape, dtype):
    """_x's values with ~6% NaN (both signs), ±inf, subnormals (float32/bf16 and float16) mixed in."""
    x = np.array(_x(rng, shape, dtype).astype(jnp.float32))
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 1e-39, -3e-41, 6e-8, -0.0], np.float32)
    pick = specials[rng.integers(0, len(specials), size=shape)]
    return jnp.asarray(np.where(rng.random(shape) < 0.06, pick, x), dtype)


def _assert_same_compressed_nan_ok(got, ref, what):
    """assert_same_compressed, except that any NaN equals any NaN (the NaN payload a conversion or
    an arithmetic instruction produces is not part of the rule)."""
    (gv, gm), (rv, rm) = got, ref
    assert gv.shape == rv.shape and gm.shape == rm.shape, what
    gm, rm = np.asarray(gm), np.asarray(rm)
    nib = np.concatenate([gm & 0xF, gm >> 4]).ravel()
    assert not sorted(set(np.unique(nib).tolist()) - LEGAL_NIBBLES), f"{what}: illegal metadata nibbles"
    np.testing.assert_array_equal(gm, rm, err_msg=f"{what}: metadata")
    g32, r32 = np.asarray(jnp.asarray(gv).astype(jnp.float32)), np.asarray(jnp.asarray(rv).astype(jnp.float32))
    np.testing.assert_array_equal(np.isnan(g32), np.isnan(r32), err_msg=f"{what}: NaN positions")
    from gpu_util import bit_patterns

    ok = ~np.isnan(g32)
    np.testing.assert_array_equal(bit_patterns(gv)[ok], bit_patterns(rv)[ok], err_msg=f"{what}: values")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_fused_compressors_special_values(dtype):
    """NaN, ±inf, ±0, subnormals and ties: masked_compress of reference_ops.mask24's (CPU) mask keeps those
    values as CUTLASS's compressor does, mvue24_compress equals the element-wise MVUE kernel."""
    skip_uncompiled(dtype)
    rng, seed = _rng()
    shape = (144, 272)
    x = _x_special(rng, shape, dtype)
    cpu = jax.devices("cpu")[0]
    for transposed in (False, True):
        axis = 0 if transposed else 1
        what = f"seed={seed} transposed={transposed}"
        with jax.default_device(cpu):
            keep = np.asarray(reference_ops.mask24(jax.device_put(x, cpu), axis))
        nf = ~np.isfinite(np.asarray(x.astype(jnp.float32)))
        a = jnp.where(jnp.asarray(keep), x, jnp.zeros((), dtype))
        got = poisoned(functools.partial(cc.masked_compress, transposed=transposed))(x, jnp.asarray(keep))
        _assert_same_compressed_nan_ok(got, _ref(a.T if transposed else a), what + " magnitude mask")
        key = jax.random.key(seed % 2**31)
        mv = jax.jit(lambda k, g: cm.mvue24_cuda(k, g, axis=axis))(key, x)
        got = poisoned(functools.partial(cc.mvue24_compress, transposed=transposed))(key, x)
        _assert_same_compressed_nan_ok(got, _ref(mv.T if transposed else mv), what + " mvue")
        # A kept non-finite input is non-finite in the compressed values (surfaced, not hidden).
        vals = np.asarray(jnp.asarray(got[0]).astype(jnp.float32))
        assert np.isnan(vals).any() == bool(nf.any())
