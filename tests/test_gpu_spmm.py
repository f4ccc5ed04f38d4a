"""GPU tests of the CUTLASS SM90 2:4 sparse GEMM and compressor (jax_sparse24._src.cuda_spmm_ops).

Run on the H100: ``pytest -m gpu tests/test_gpu_spmm.py -v``. Skipped when the extension is not
built or no CUDA device is visible.

The oracle is a float64 numpy product of the same (bf16/f16-exact) masked operands, so the only
error of the kernel is its fp32 accumulation plus the final rounding to the output dtype: checks are
elementwise (a skipped or stale tile cannot hide) plus the relative Frobenius error. Inputs are drawn
from fresh seeds (printed on failure) and are never zero.
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

from jax_sparse24._src import cuda_spmm_ops as ops  # noqa: E402
from gpu_util import LEGAL_NIBBLES, mask24_np, poisoned, skip_uncompiled  # noqa: E402
from gpu_util import fresh_rng as _rng  # noqa: E402

DTYPES = [jnp.bfloat16, jnp.float16]
# (M, N, K): M = rows of the 2:4 operand (O), N = tokens (T), K = contraction (I).
SHAPES = [
    (256, 128, 128),     # one tile
    (384, 512, 256),     # several tiles, 2 K tiles
    (1024, 264, 512),    # N not a multiple of any tile
    (768, 520, 3072),    # long K (24 K tiles), M = 768 like GPT-2 fc2 forward
    (264, 136, 144),     # minimally aligned: M % 64, N % 128, K % 128 all nonzero
    (8, 8, 16),          # smallest legal problem
]
# Output rounding (2^-8 bf16, 2^-11 f16) dominates; inputs are exact in both.
RTOL = {jnp.dtype(jnp.bfloat16): 1e-2, jnp.dtype(jnp.float16): 2e-3}


def nonzero_normal(rng, shape, dtype) -> np.ndarray:
    """Normal samples rounded to `dtype` (as float32), never zero."""
    x = rng.standard_normal(shape).astype(np.float32)
    x = np.where(np.abs(x) < 1e-2, np.float32(0.5), x)
    return np.asarray(jnp.asarray(x, dtype).astype(jnp.float32))


def sparse_operand(rng, m, k, dtype) -> np.ndarray:
    w = nonzero_normal(rng, (m, k), dtype)
    return w * mask24_np(w)


def check_close(d, ref, dtype, what: str):
    d = np.asarray(jnp.asarray(d).astype(jnp.float32), dtype=np.float64)
    assert d.shape == ref.shape, f"{what}: shape {d.shape} != {ref.shape}"
    assert np.isfinite(d).all(), f"{what}: non-finite output ({np.count_nonzero(~np.isfinite(d))} elements)"
    scale = np.sqrt(np.mean(ref**2))
    rtol = RTOL[jnp.dtype(dtype)]
    err = np.abs(d - ref)
    bad = err > rtol * np.abs(ref) + 1e-2 * scale
    if bad.any():
        rows, cols = np.nonzero(bad)
        raise AssertionError(
            f"{what}: {bad.sum()} of {bad.size} elements off (first at row {rows[0]}, col {cols[0]}: "
            f"{d[rows[0], cols[0]]} vs {ref[rows[0], cols[0]]}); rows {np.unique(rows)[:8]}..., "
            f"cols {np.unique(cols)[:8]}..."
        )
    rel = np.linalg.norm(d - ref) / np.linalg.norm(ref)
    assert rel < 1e-2, f"{what}: relative Frobenius error {rel:.3g}"
    return rel


def _config_ids():
    return list(range(len(ops.cutlass_configs())))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_spmm_matches_dense_every_config(shape, dtype):
    skip_uncompiled(dtype)
    m, n, k = shape
    rng, seed = _rng()
    a = sparse_operand(rng, m, k, dtype)
    b = nonzero_normal(rng, (n, k), dtype)
    ref = b.astype(np.float64) @ a.astype(np.float64).T  # (n, m)
    values, meta = jax.jit(ops.cutlass_compress)(jnp.asarray(a, dtype))
    b = jnp.asarray(b, dtype)
    for config in [-1] + _config_ids():
        d = poisoned(functools.partial(ops.cutlass_spmm, m=m, k=k, config=config))(values, meta, b)
        name = "default" if config == -1 else ops.cutlass_configs()[config]
        check_close(d, ref, dtype, f"seed={seed} shape={shape} config={name}")


@pytest.mark.parametrize("kn", [False, True], ids=["nk", "kn"])
def test_spmm_every_tile_order(kn):
    """raster/swizzle only reorder the output tiles: every order, every config, same result."""
    dtype = jnp.bfloat16
    if kn and not ops.cutlass_configs_kn():
        pytest.skip("no 'kn' configuration compiled in this (minimal) build")
    # 3 x 5 tiles of 128 (M and N both partial): the orders really differ.
    m, n, k = 392, 648, 512
    rng, seed = _rng()
    a = sparse_operand(rng, m, k, dtype)
    b = nonzero_normal(rng, (k, n) if kn else (n, k), dtype)
    ref = (b.T if kn else b).astype(np.float64) @ a.astype(np.float64).T
    values, meta = jax.jit(ops.cutlass_compress)(jnp.asarray(a, dtype))
    spmm = ops.cutlass_spmm_kn if kn else ops.cutlass_spmm
    names = ops.cutlass_configs_kn() if kn else ops.cutlass_configs()
    b = jnp.asarray(b, dtype)
    for config in range(len(names)):
        for raster in ops.RASTERS:
            for swizzle in ops.SWIZZLES:
                f = poisoned(functools.partial(spmm, m=m, k=k, config=config, raster=raster, swizzle=swizzle))
                d = f(values, meta, b)
                check_close(d, ref, dtype, f"seed={seed} config={names[config]} raster={raster} swizzle={swizzle}")


def test_error_bad_tile_order():
    values, meta, b = _operands()
    with pytest.raises(ValueError, match="raster must be one of"):
        ops.cutlass_spmm(values, meta, b, m=256, k=256, raster="k")
    for bad in (3, True, 2.0):
        with pytest.raises(ValueError, match="swizzle must be one of"):
            ops.cutlass_spmm(values, meta, b, m=256, k=256, swizzle=bad)
    with pytest.raises(Exception, match="raster must be 0"):
        jax.block_until_ready(_raw_spmm(values, meta, b, (128, 256), m=256, n=128, k=256, config=-1, raster=3))
    with pytest.raises(Exception, match="swizzle must be 1, 2, 4 or 8"):
        jax.block_until_ready(_raw_spmm(values, meta, b, (128, 256), m=256, n=128, k=256, config=-1, swizzle=16))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_no_stale_results(dtype):
    """Same jitted function, new inputs: the second result must match the second inputs."""
    skip_uncompiled(dtype)
    m, n, k = 384, 264, 256
    rng, seed = _rng()

    @poisoned
    def f(a, b):
        values, meta = ops.cutlass_compress(a)
        return ops.cutlass_spmm(values, meta, b, m=m, k=k)

    for trial in range(2):
        a = sparse_operand(rng, m, k, dtype)
        b = nonzero_normal(rng, (n, k), dtype)
        d = f(jnp.asarray(a, dtype), jnp.asarray(b, dtype))
        ref = b.astype(np.float64) @ a.astype(np.float64).T
        check_close(d, ref, dtype, f"seed={seed} trial={trial}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("mk", [(384, 256), (264, 144), (64, 128)], ids=lambda s: "x".join(map(str, s)))
def test_round_trip_identity_is_exact(mk, dtype):
    """compress + spmm with B = I gives A back bit for bit: proves the values/metadata layout.

    The operand includes all-zero groups and single-nonzero groups at every position (the
    compressor's corner cases and the metadata fix-up), and one all-zero row.
    """
    skip_uncompiled(dtype)
    m, k = mk
    rng, seed = _rng()
    a = sparse_operand(rng, m, k, dtype)
    groups = a.reshape(m, k // 4, 4)
    pick = rng.random((m, k // 4))
    groups[pick < 0.1] = 0.0  # all-zero groups
    for pos in range(4):  # single nonzero at position `pos`
        sel = (pick >= 0.1 + 0.05 * pos) & (pick < 0.15 + 0.05 * pos)
        keep = groups[sel][:, pos].copy()
        groups[sel] = 0.0
        groups[sel, pos] = np.where(keep == 0, 1.0, keep)
    a = groups.reshape(m, k)
    a[m // 2] = 0.0
    eye = np.eye(k, dtype=np.float32)
    values, meta = ops.cutlass_compress(jnp.asarray(a, dtype))
    # Every metadata byte, padding included (M to 64 rows, K to 128), holds legal index pairs.
    e = np.asarray(meta)
    assert set(np.unique(np.concatenate([e & 0xF, e >> 4])).tolist()) <= LEGAL_NIBBLES, f"seed={seed}"
    eye = jnp.asarray(eye, dtype)
    for config in _config_ids():  # poisoned: every config gives the same bits, a stale buffer would pass
        d = poisoned(functools.partial(ops.cutlass_spmm, m=m, k=k, config=config))(values, meta, eye)
        got = np.asarray(d.astype(jnp.float32)).T
        np.testing.assert_array_equal(
            got, a, err_msg=f"seed={seed} config={ops.cutlass_configs()[config]}"
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_compress_shapes_and_determinism(dtype):
    skip_uncompiled(dtype)
    m, k = 3072, 768
    rng, _ = _rng()
    a = jnp.asarray(sparse_operand(rng, m, k, dtype), dtype)
    (vs, ms) = ops.cutlass_compressed_shapes(m, k, dtype)
    assert vs == (3072, 384) and ms == (3072, 96)
    v1, e1 = jax.jit(ops.cutlass_compress)(a)
    v2, e2 = jax.jit(ops.cutlass_compress)(a)
    assert v1.shape == vs and v1.dtype == jnp.dtype(dtype)
    assert e1.shape == ms and e1.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(v1.astype(jnp.float32)), np.asarray(v2.astype(jnp.float32)))
    np.testing.assert_array_equal(np.asarray(e1), np.asarray(e2))
    # Every metadata nibble is one of Hopper's six legal index pairs (the all-zero fix-up).
    nib = np.concatenate([np.asarray(e1) & 0xF, np.asarray(e1) >> 4]).ravel()
    assert set(np.unique(nib).tolist()) <= LEGAL_NIBBLES
    # The values are the kept elements (in order) of each group.
    kept = np.asarray(a.astype(jnp.float32)).reshape(m, k // 4, 4)
    nz_count = (kept != 0).sum(-1)
    full = nz_count == 2
    expect = kept[full][kept[full] != 0].reshape(-1, 2)
    got = np.asarray(v1.astype(jnp.float32)).reshape(m, k // 4, 2)[full]
    np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_default_config_is_a_compiled_config(dtype):
    skip_uncompiled(dtype)
    m, n, k = 768, 256, 512
    cfg = ops.cutlass_default_config(m, n, k)
    assert 0 <= cfg < len(ops.cutlass_configs())
    rng, _ = _rng()
    a = jnp.asarray(sparse_operand(rng, m, k, dtype), dtype)
    b = jnp.asarray(nonzero_normal(rng, (n, k), dtype), dtype)
    values, meta = ops.cutlass_compress(a)
    d_default = ops.cutlass_spmm(values, meta, b, m=m, k=k)
    d_explicit = ops.cutlass_spmm(values, meta, b, m=m, k=k, config=cfg)
    np.testing.assert_array_equal(np.asarray(d_default.astype(jnp.float32)), np.asarray(d_explicit.astype(jnp.float32)))


def test_inside_fori_loop_and_vmap():
    """Under jit in a loop (XLA may capture it in a command buffer) and under vmap (sequential)."""
    dtype = jnp.bfloat16
    m, n, k = 256, 128, 256
    rng, seed = _rng()
    a = sparse_operand(rng, m, k, dtype)
    bs = [nonzero_normal(rng, (n, k), dtype) for _ in range(3)]
    values, meta = ops.cutlass_compress(jnp.asarray(a, dtype))
    b_stack = jnp.asarray(np.stack(bs), dtype)

    @jax.jit
    def loop(values, meta, b_stack):
        def body(i, acc):
            d = ops.cutlass_spmm(values, meta, b_stack[i % 3], m=m, k=k)
            return acc + d.astype(jnp.float32)

        return jax.lax.fori_loop(0, 6, body, jnp.zeros((n, m), jnp.float32))

    ref = 2 * sum(b.astype(np.float64) @ a.astype(np.float64).T for b in bs)
    got = np.asarray(loop(values, meta, b_stack), dtype=np.float64)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert np.isfinite(got).all() and rel < 1e-2, f"seed={seed} rel={rel}"

    d_v = jax.vmap(lambda b: ops.cutlass_spmm(values, meta, b, m=m, k=k))(b_stack)
    for i, b in enumerate(bs):
        check_close(d_v[i], b.astype(np.float64) @ a.astype(np.float64).T, dtype, f"seed={seed} vmap[{i}]")


# ------------------------------------------------------------------------------------------------
# Errors: clear ValueErrors at trace time, and the handlers' own checks behind them.


def _operands(m=256, n=128, k=256, dtype=jnp.bfloat16):
    rng, _ = _rng()
    a = jnp.asarray(sparse_operand(rng, m, k, dtype), dtype)
    b = jnp.asarray(nonzero_normal(rng, (n, k), dtype), dtype)
    values, meta = ops.cutlass_compress(a)
    return values, meta, b


def test_error_misaligned_shapes():
    am, an, ak = ops.cutlass_alignment()
    assert (am, an, ak) == (8, 8, 16)
    with pytest.raises(ValueError, match="k % 16"):
        ops.cutlass_compressed_shapes(256, 120, jnp.bfloat16)
    with pytest.raises(ValueError, match="m % 8"):
        ops.cutlass_compress(jnp.ones((100, 128), jnp.bfloat16))
    values, meta, b = _operands()
    with pytest.raises(ValueError, match="n % 8"):
        ops.cutlass_spmm(values, meta, b[:12], m=256, k=256)
    with pytest.raises(ValueError, match=r"shape \(n, k\)"):
        ops.cutlass_spmm(values, meta, b[:, :128], m=256, k=256)
    with pytest.raises(ValueError, match="compressed shape"):
        ops.cutlass_spmm(values[:128], meta, b, m=256, k=256)
    assert ops.cutlass_supports(256, 128, 256, jnp.bfloat16)
    assert not ops.cutlass_supports(256, 12, 256, jnp.bfloat16)
    assert not ops.cutlass_supports(250, 128, 256, jnp.bfloat16)
    assert not ops.cutlass_supports(256, 128, 200, jnp.bfloat16)
    assert not ops.cutlass_supports(256, 128, 256, jnp.float32)


def test_error_mismatched_dtypes():
    values, meta, b = _operands()
    with pytest.raises(ValueError, match="same dtype"):
        ops.cutlass_spmm(values, meta, b.astype(jnp.float16), m=256, k=256)
    with pytest.raises(ValueError, match="bfloat16 and float16"):
        ops.cutlass_spmm(values.astype(jnp.float32), meta, b.astype(jnp.float32), m=256, k=256)
    with pytest.raises(ValueError, match="uint8"):
        ops.cutlass_spmm(values, meta.astype(jnp.int8), b, m=256, k=256)
    with pytest.raises(ValueError, match="bfloat16, float16 and float8_e4m3fn"):
        ops.cutlass_compress(jnp.ones((256, 256), jnp.float32))


def test_error_bad_config():
    values, meta, b = _operands()
    n_cfg = len(ops.cutlass_configs())
    for bad in (n_cfg, 99, -2):
        with pytest.raises(ValueError, match="config must be -1"):
            ops.cutlass_spmm(values, meta, b, m=256, k=256, config=bad)


def _raw_spmm(values, meta, b, d_shape, **attrs):
    out = jax.ShapeDtypeStruct(d_shape, b.dtype)
    attrs = {"raster": 0, "swizzle": 1, **attrs}
    attrs = {key: np.int64(v) for key, v in attrs.items()}
    return jax.ffi.ffi_call("jax_sparse24_cutlass_spmm", out)(values, meta, b, **attrs)


def test_handler_validates_on_its_own():
    """Bypass the Python checks: the C++ handler must refuse with a message naming the constraint."""
    values, meta, b = _operands()
    with pytest.raises(Exception, match="config must be -1"):
        jax.block_until_ready(_raw_spmm(values, meta, b, (128, 256), m=256, n=128, k=256, config=57))
    with pytest.raises(Exception, match="m % 8"):
        jax.block_until_ready(_raw_spmm(values, meta, b, (128, 252), m=252, n=128, k=256, config=-1))
    with pytest.raises(Exception, match=r"d must have shape \(n, m\)"):
        jax.block_until_ready(_raw_spmm(values, meta, b, (128, 128), m=256, n=128, k=256, config=-1))
    with pytest.raises(Exception, match="compressed shape"):
        jax.block_until_ready(_raw_spmm(values[:, :64], meta, b, (128, 256), m=256, n=128, k=256, config=-1))


# ------------------------------------------------------------------------------------------------
# "kn" formulation (weight gradient): b stored (k, n), N-major — dW (I, O) = x^T MVUE(dy).

from jax_sparse24._src import cuda_mask_ops as _cm  # noqa: E402
from jax_sparse24._src import gemm as _gemm  # noqa: E402

# (M, N, K) = (O, I, T): one tile, N not a multiple of the tile, M partial + long K, smallest.
KN_SHAPES = [(256, 128, 256), (384, 264, 512), (264, 136, 1040), (8, 8, 16)]


def _skip_no_kn(dtype):
    skip_uncompiled(dtype)
    if not ops.cutlass_configs_kn():
        pytest.skip("no 'kn' configuration compiled in this (minimal) build")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", KN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_spmm_kn_matches_dense_every_config(shape, dtype):
    _skip_no_kn(dtype)
    m, n, k = shape
    rng, seed = _rng()
    a = sparse_operand(rng, m, k, dtype)
    b = nonzero_normal(rng, (k, n), dtype)
    ref = (a.astype(np.float64) @ b.astype(np.float64)).T  # (n, m)
    values, meta = jax.jit(ops.cutlass_compress)(jnp.asarray(a, dtype))
    b = jnp.asarray(b, dtype)
    for config in [-1] + list(range(len(ops.cutlass_configs_kn()))):
        d = poisoned(functools.partial(ops.cutlass_spmm_kn, m=m, k=k, config=config))(values, meta, b)
        name = "default" if config == -1 else ops.cutlass_configs_kn()[config]
        check_close(d, ref, dtype, f"seed={seed} shape={shape} kn config={name}")


def _pad_rows(a, multiple):
    pad = (-a.shape[0]) % multiple
    return jnp.concatenate([a, jnp.zeros((pad,) + a.shape[1:], a.dtype)]) if pad else a


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_weight_grad_mvue_fused_is_the_gemm_of_the_mvue_sample(dtype):
    """Fused MVUE + compress + "kn" GEMM == x^T @ mvue24_cuda(key, dy) (the same draws), T not % 16."""
    _skip_no_kn(dtype)
    rng, seed = _rng()
    t, i, o = 200, 136, 256
    x = jnp.asarray(nonzero_normal(rng, (t, i), dtype), dtype)
    g = jnp.asarray(nonzero_normal(rng, (t, o), dtype), dtype)
    key = jax.random.key(seed % 2**31)
    dw = jax.jit(functools.partial(_gemm.weight_grad_mvue, backend="cutlass"))(key, x, g)
    assert dw.shape == (i, o) and dw.dtype == jnp.dtype(dtype)
    gs = jax.jit(lambda k, g: _cm.mvue24_cuda(k, _pad_rows(g, 16), axis=0))(key, g)
    xp = np.asarray(_pad_rows(x, 16).astype(jnp.float32), dtype=np.float64)
    ref = xp.T @ np.asarray(gs.astype(jnp.float32), dtype=np.float64)
    check_close(dw, ref, dtype, f"seed={seed} fused weight_grad_mvue")
    # the unfused path (MVUE op, dense GEMM) draws the same sample on the GPU
    dw_dense = jax.jit(functools.partial(_gemm.weight_grad_mvue, backend="dense"))(key, x, g)
    check_close(dw_dense, ref, dtype, f"seed={seed} dense weight_grad_mvue")


def _layer_grads_vs_dense(backend, t, dtype=jnp.bfloat16):
    """Loss and (dx, dW) of sparse24_linear with ``backend`` and with 'dense' (same inputs, same
    MVUE key); the gradients are checked against each other here, the losses are returned."""
    import jax_sparse24 as s24

    rng, seed = _rng()
    i, o = 256, 384
    x = jnp.asarray(nonzero_normal(rng, (t, i), dtype), dtype)
    w = jnp.asarray(nonzero_normal(rng, (i, o), dtype) / 16, dtype)
    mask = s24.transposable_mask24(w)
    key = jax.random.key(seed % 2**31)

    def grads(backend):
        f = lambda x, w: (s24.sparse24_linear(x, w, mask, key=key, backend=backend, transposable=True)  # noqa: E731
                          .astype(jnp.float32) ** 2).sum()
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(x, w)

    (v1, g1), (v0, g0) = grads(backend), grads("dense")
    for got, ref, what in zip(g1, g0, ("dx", "dW")):
        ref = np.asarray(ref.astype(jnp.float32), dtype=np.float64)
        got = np.asarray(got.astype(jnp.float32), dtype=np.float64)
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert np.isfinite(got).all() and rel < 2e-2, f"seed={seed} {backend} {what}: rel {rel:.3g}"
    return v1, v0, seed


def test_sparse24_linear_cutlass_backward_matches_dense():
    """Whole layer, backend='cutlass' (fused compressors, three sparse GEMMs) vs 'dense', same key."""
    _skip_no_kn(jnp.bfloat16)
    v1, v0, seed = _layer_grads_vs_dense("cutlass", t=264)
    assert abs(float(v1) - float(v0)) <= 2e-2 * abs(float(v0)), f"seed={seed} loss {v1} vs {v0}"


@pytest.mark.parametrize("method", ["srste", "ste", "soft"])
def test_sparse24dense_every_method_differentiates_on_gpu(method):
    """Every Sparse24Dense method under jax.grad with the CUDA ops (the masks / soft threshold run as
    custom calls, which have no derivative of their own) agrees with the reference ops on the CPU.
    srste's stored mask is recomputed from the kernel inside the differentiated function, so its
    transposable-mask kernel runs there too."""
    import jax_sparse24 as s24

    rng, seed = _rng()
    x = rng.normal(size=(64, 128)).astype(np.float32)
    layer = s24.nn.Sparse24Dense(256, method=method, backend="dense", mvue=False)
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        variables = layer.init(jax.random.key(seed % 2**31), x)

    def grads(device):
        v, xx = jax.device_put((variables, x), device)

        def f(p):
            vv = {**v, "params": p}
            if method == "srste":  # the transposable mask from the kernel, in the differentiated program
                vv["sparsity"] = s24.masks.refresh_masks(p, v["sparsity"])[0]
            return (layer.apply(vv, xx) ** 2).sum()

        return jax.jit(jax.grad(f))(v["params"])

    g_gpu, g_cpu = grads(jax.devices("gpu")[0]), grads(cpu)
    for name in ("kernel", "bias"):
        got, ref = np.asarray(g_gpu[name], np.float64), np.asarray(g_cpu[name], np.float64)
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        # f32 GEMMs run as TF32 on the GPU (~4e-4 here); a wrong mask or a missing gradient is O(0.1).
        assert np.isfinite(got).all() and rel < 3e-3, f"seed={seed} {method} d{name}: rel {rel:.3g}"


@pytest.mark.parametrize("backend", ["cutlass", "cusparselt"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("transposable", [True, False], ids=["transposable", "in-only"])
def test_prepared_weight_is_the_per_call_path_bit_for_bit(transposable, dtype, backend):
    """prepare_weight holds exactly the operands the per-call path compresses — CUTLASS:
    masked_compress_both == the two one-direction passes == cutlass_compress of W̃ᵀ / W̃;
    cuSPARSELt: the bytes of cusparseLtSpMMACompress of the per-call path's A (bfloat16: W̃ᵀ / W̃
    stored (M, K); float16: W̃ as stored) — and sparse24_linear(prepared=) gives the same y, ∇x, ∇W
    bit for bit, also under a scan; y and ∇x also against the exact product."""
    import jax_sparse24 as s24

    skip_uncompiled(dtype)
    if backend == "cusparselt":
        _skip_no_cusparselt()
    rng, seed = _rng()
    t, i, o = 272, 256, 384
    x = jnp.asarray(nonzero_normal(rng, (t, i), dtype), dtype)
    w = jnp.asarray(nonzero_normal(rng, (i, o), dtype) / 16, dtype)
    mask = s24.transposable_mask24(w) if transposable else s24.mask24(w, axis=0)
    prep = jax.jit(lambda w, m: s24.prepare_weight(w, m, tokens=t, backend=backend, transposable=transposable))
    if backend == "cusparselt":
        _skip_float16_refused(dtype, lambda: prep(w, mask))
    pw = prep(w, mask)
    assert set(pw) == ({"forward", "input_grad"} if transposable else {"forward", "masked"}), seed
    wm = np.asarray(jnp.where(mask, w, 0))
    for name, a in (("forward", wm.T), ("input_grad", wm)):
        if name not in pw:
            continue
        a = jnp.asarray(np.ascontiguousarray(a))
        if backend == "cusparselt":  # every group holds exactly two nonzeros: one legal encoding
            (mm, kk) = a.shape
            a_layout = _lt.A_MK
            if name == "forward" and jnp.dtype(dtype) == jnp.dtype(jnp.float16):
                a, a_layout = jnp.asarray(wm), _lt.A_KM
            theirs = _lt.cusparselt_compress(a, m=mm, n=t, k=kk, a_layout=a_layout, b_layout=_lt.B_NK)
            np.testing.assert_array_equal(np.asarray(pw[name]["cusparselt"]), np.asarray(theirs), f"seed={seed} {name}")
            continue
        values, meta = ops.cutlass_compress(a)
        np.testing.assert_array_equal(np.asarray(pw[name]["values"]), np.asarray(values), f"seed={seed} {name}")
        np.testing.assert_array_equal(np.asarray(pw[name]["meta"]), np.asarray(meta), f"seed={seed} {name}")
    def loss(x, w, prepared):
        y = s24.sparse24_linear(x, w, mask, backend=backend, transposable=transposable, prepared=prepared)
        return (y.astype(jnp.float32) ** 2).sum(), y

    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    ((l0, y0), g0), ((l1, y1), g1) = f(x, w, None), f(x, w, pw)
    check_close(y1, np.asarray(x, np.float64) @ wm.astype(np.float64), dtype, f"seed={seed} prepared forward")
    if transposable:
        g = 2 * np.asarray(y1, np.float64)
        check_close(g1[0], g @ wm.T.astype(np.float64), dtype, f"seed={seed} prepared dx")
    for a, b, what in ((y0, y1, "y"), (g0[0], g1[0], "dx"), (g0[1], g1[1], "dW"), (l0, l1, "loss")):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), f"seed={seed} {what}")
    # The GEMMs really read the prepared operands: prepared from 2 W (exact), they give x (2 W̃).
    y2 = jax.jit(lambda x, w, p: loss(x, w, p)[1])(x, w, prep(2 * w, mask))
    check_close(y2, np.asarray(x, np.float64) @ (2 * wm.astype(np.float64)), dtype, f"seed={seed} prepared from 2W")

    xs = jnp.stack([x, -x, 2 * x])  # gradient accumulation: prepared once, outside the scan
    acc = jax.jit(lambda w, p: jax.lax.scan(
        lambda c, xb: (c + jax.grad(lambda w: loss(xb, w, p)[0])(w).astype(jnp.float32), None),
        jnp.zeros(w.shape, jnp.float32), xs)[0])
    np.testing.assert_array_equal(np.asarray(acc(w, None)), np.asarray(acc(w, pw)), f"seed={seed} scan")


def test_auto_prepared_weight_takes_cusparselt_where_the_table_says(monkeypatch):
    """nn-level: with a table that measured cuSPARSELt faster with the compression amortized,
    prepare_weight(backend='auto') holds cuSPARSELt operands and the layer's results match the
    per-call path (bfloat16)."""
    import jax_sparse24 as s24
    from jax_sparse24._src import autotune

    _skip_no_cusparselt()
    t, i, o = 256, 256, 384
    table = {"entries": [dict(m=m, n=t, k=k, dtype="bfloat16", config="x", gemm_speedup=1.1, speedup_with_compress=0.9,
                              cusparselt_speedup_with_compress=1.0, cusparselt_gemm_speedup=1.5)
                         for m, k in ((o, i), (i, o))], "entries_kn": []}
    monkeypatch.setattr(autotune, "_table", lambda: table)
    rng, seed = _rng()
    x = jnp.asarray(nonzero_normal(rng, (t, i), jnp.bfloat16), jnp.bfloat16)
    w = jnp.asarray(nonzero_normal(rng, (i, o), jnp.bfloat16) / 16, jnp.bfloat16)
    mask = s24.transposable_mask24(w)
    pw = s24.prepare_weight(w, mask, tokens=t, reuse=4)
    assert {k: set(v) for k, v in pw.items()} == {"forward": {"cusparselt"}, "input_grad": {"cusparselt"}}, seed
    layer = jax.jit(lambda x, w, p: s24.sparse24_linear(x, w, mask, prepared=p))
    wm = np.asarray(jnp.where(mask, w, 0), np.float64)
    check_close(layer(x, w, pw), np.asarray(x, np.float64) @ wm, jnp.bfloat16, f"seed={seed}")
    # ... and the GEMM reads them: operands prepared from 2 W (exact) give x (2 W̃).
    pw2 = s24.prepare_weight(2 * w, mask, tokens=t, reuse=4)
    check_close(layer(x, w, pw2), np.asarray(x, np.float64) @ (2 * wm), jnp.bfloat16, f"seed={seed} from 2W")


def test_nn_prepare_on_gpu_matches_the_per_call_path():
    """preparation.prepare under jit with backend='cutlass' layers: same loss and gradients as without it."""
    import jax_sparse24 as s24
    from flax import linen as nn

    class Two(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = s24.nn.Sparse24Dense(512, backend="cutlass", dtype=jnp.bfloat16)(x)
            return s24.nn.Sparse24Dense(256, backend="cutlass", dtype=jnp.bfloat16)(jax.nn.relu(h))

    rng, seed = _rng()
    x = jnp.asarray(rng.normal(size=(2, 128, 256)), jnp.bfloat16)
    m = Two()
    v = m.init(jax.random.key(seed % 2**31), x)
    prep = jax.jit(lambda v, x: s24.preparation.prepare(m, v, x, reuse=2))(v, x)
    assert all(set(layer["weight"]) == {"forward", "input_grad"} for layer in prep.values()), seed

    def loss(p, prep):
        vv = {**v, "params": p, **({s24.preparation.PREPARED: prep} if prep is not None else {})}
        return (m.apply(vv, x).astype(jnp.float32) ** 2).sum()

    f = jax.jit(jax.value_and_grad(loss))
    for a, b in zip(jax.tree.leaves(f(v["params"], None)), jax.tree.leaves(f(v["params"], prep))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), f"seed={seed}")
    # The layers really use the prepared operands: prepared from kernels scaled by 2 (exact), the
    # loss is the loss of the model with those kernels.
    p2 = jax.tree_util.tree_map_with_path(
        lambda path, leaf: 2 * leaf if jax.tree_util.keystr(path).endswith("['kernel']") else leaf, v["params"])
    prep2 = jax.jit(lambda v, x: s24.preparation.prepare(m, v, x, reuse=2))({**v, "params": p2}, x)
    np.testing.assert_array_equal(np.asarray(jax.jit(loss)(v["params"], prep2)), np.asarray(jax.jit(loss)(p2, None)),
                                  f"seed={seed} prepared from 2W")


def test_nn_prepare_batched_equals_per_layer_on_gpu():
    """A GPT-like model — blocks of attention qkv / projection and FFN up / down weights, CUTLASS and
    cuSPARSELt layers, bfloat16 (and a float16 block where compiled) — prepared with every layer's
    compressions in a few many-tensor launches (``batch=True``, and ``"auto"`` on one GPU) gives the
    per-layer preparation bit for bit, and the model the same loss and gradients with either."""
    import jax_sparse24 as s24
    from flax import linen as nn

    from gpu_util import bit_patterns, cutlass_compiled
    from jax_sparse24._src import cuda_cusparselt_ops as lt

    d = 256
    t = 256  # tokens of x below
    lt_ok = lt.cusparselt_available() and all(lt.cusparselt_supports(mm, t, kk, jnp.bfloat16)
                                              for mm, kk in ((d, 4 * d), (4 * d, d)))
    lt_backend = "cusparselt" if lt_ok else "cutlass"

    class Block(nn.Module):
        dtype: object
        backend: str

        @nn.compact
        def __call__(self, x):
            def dense(n, name, backend=self.backend):
                return s24.nn.Sparse24Dense(n, backend=backend, dtype=self.dtype, name=name)

            x = x + dense(d, "proj")(dense(3 * d, "qkv")(x)[..., :d])
            return x + dense(d, "down", lt_backend if self.dtype == jnp.bfloat16 else self.backend)(
                jax.nn.gelu(dense(4 * d, "fc")(x)))

    class GPT(nn.Module):
        @nn.compact
        def __call__(self, x):
            for j in range(4):
                x = Block(jnp.bfloat16, "cutlass", name=f"h_{j}")(x)
            if cutlass_compiled(jnp.float16):
                x = Block(jnp.float16, "cutlass", name="h_f16")(x).astype(x.dtype)
            return x

    rng, seed = _rng()
    x = jnp.asarray(rng.normal(size=(2, t // 2, d)), jnp.bfloat16)
    m = GPT()
    v = m.init(jax.random.key(seed % 2**31), x)
    preps, hlos = {}, {}
    for batch in (False, True, "auto"):
        f = jax.jit(lambda v, x, b=batch: s24.preparation.prepare(m, v, x, reuse=2, batch=b))
        hlos[batch] = f.lower(v, x).compile().as_text()
        preps[batch] = f(v, x)
    assert 'custom_call_target="jax_sparse24_masked_compress_many' not in hlos[False]
    # "auto" batches where it is known at trace time that no array is split: with one visible device.
    # With several visible, a jit without shardings may still be partitioned later: "auto" does not batch.
    auto_batches = jax.device_count() == 1
    assert ('custom_call_target="jax_sparse24_masked_compress_many"' in hlos["auto"]) == auto_batches
    for batch in (True, "auto") if auto_batches else (True,):
        assert 'custom_call_target="jax_sparse24_masked_compress_many"' in hlos[batch], (batch, seed)
        assert hlos[batch].count("custom-call(") < hlos[False].count("custom-call("), (batch, seed)
        assert jax.tree.structure(preps[batch]) == jax.tree.structure(preps[False])
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(preps[batch]), jax.tree.leaves(preps[False])):
            np.testing.assert_array_equal(bit_patterns(a), bit_patterns(b), f"seed={seed} {batch} "
                                          f"{jax.tree_util.keystr(path)}")
    assert set(preps[True]["h_0"]["qkv"]["weight"]) == {"forward", "input_grad"}

    def loss(p, prep):
        return (m.apply({**v, "params": p, s24.preparation.PREPARED: prep}, x).astype(jnp.float32) ** 2).sum()

    g = jax.jit(jax.value_and_grad(loss))
    for a, b in zip(jax.tree.leaves(g(v["params"], preps[False])), jax.tree.leaves(g(v["params"], preps[True]))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), f"seed={seed}")


def test_error_kn_shapes():
    if not ops.cutlass_configs_kn():
        pytest.skip("no 'kn' configuration compiled")
    values, meta, _ = _operands()  # A: m=256, k=256
    b = jnp.ones((256, 128), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"shape \(k, n\)"):
        ops.cutlass_spmm_kn(values, meta, b.T, m=256, k=256)
    with pytest.raises(ValueError, match="config must be -1"):
        ops.cutlass_spmm_kn(values, meta, b, m=256, k=256, config=len(ops.cutlass_configs_kn()))
    out = jax.ShapeDtypeStruct((128, 256), jnp.bfloat16)
    attrs = {a: np.int64(v) for a, v in dict(m=256, n=128, k=256, config=-1, raster=0, swizzle=1).items()}
    with pytest.raises(Exception, match=r"b must have shape \(k, n\)"):
        jax.block_until_ready(jax.ffi.ffi_call("jax_sparse24_cutlass_spmm_kn", out)(values, meta, b.T, **attrs))


# ------------------------------------------------------------------------------------------------
# cuSPARSELt backend (backend="cusparselt").

from jax_sparse24._src import cuda_cusparselt_ops as _lt  # noqa: E402


def _skip_no_cusparselt():
    if not _lt.cusparselt_available():
        pytest.skip(f"cuSPARSELt unavailable: {_lt.cusparselt_error()}")


def _skip_float16_refused(dtype, call):
    """float16 cuSPARSELt GEMMs are refused unless FLOAT16_ENV is set (cuda_cusparselt_ops.float16_gemm_error):
    then check that ``call()`` raises the message naming it and skip the rest of the test (it
    reports as skipped, not passed: the GEMM itself did not run)."""
    if not _lt.float16_gemm_error(dtype):
        return
    with pytest.raises((ValueError, RuntimeError), match="float16 GEMMs are disabled"):
        call()
    pytest.skip(f"float16 cuSPARSELt GEMMs are refused (the refusal was checked); set {_lt.FLOAT16_ENV}=1 to run them")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("layouts", [(0, 0), (1, 0), (1, 1), (0, 1)], ids=["mk-nk", "km-nk", "km-kn", "mk-kn"])
@pytest.mark.parametrize("mnk", [(384, 272, 512), (384, 272, 256), (256, 272, 384)], ids=lambda s: "x".join(map(str, s)))
def test_cusparselt_matches_dense(layouts, dtype, mnk):
    _skip_no_cusparselt()
    skip_uncompiled(dtype)
    a_layout, b_layout = layouts
    rng, seed = _rng()
    m, n, k = mnk
    a = sparse_operand(rng, m, k, dtype)  # (m, k), 2:4 along k
    b = nonzero_normal(rng, (n, k), dtype)
    ref = b.astype(np.float64) @ a.astype(np.float64).T  # (n, m)
    a_st = jnp.asarray(a if a_layout == _lt.A_MK else a.T, dtype)
    b_st = jnp.asarray(b if b_layout == _lt.B_NK else b.T, dtype)
    kw = dict(m=m, n=n, k=k, a_layout=a_layout, b_layout=b_layout)

    @poisoned
    def f(a_st, b_st):
        return _lt.cusparselt_spmm(_lt.cusparselt_compress(a_st, **kw), b_st, **kw)

    _skip_float16_refused(dtype, lambda: f(a_st, b_st))
    for trial in range(2):  # the first call searches the algorithm, the second uses the cached plan
        check_close(f(a_st, b_st), ref, dtype, f"seed={seed} layouts={layouts} trial={trial}")
    code = 0 if jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16) else 1
    plans = [p for p in _lt.cusparselt_plans() if p[1:7] == (m, n, k, code, a_layout, b_layout)]
    assert len(plans) == 1 and plans[0][7], f"one searched plan per shape, got {plans}"


def test_cusparselt_layer_matches_dense():
    """Operands written by our fused compressors in cuSPARSELt's layout (the check passes here:
    test_gpu_compress.py::test_cusparselt_fused_compress_check_passes_on_layer_shapes)."""
    _skip_no_cusparselt()
    assert _lt.fused_compress_ok(384, 256, 256, jnp.bfloat16) and _lt.fused_compress_ok(256, 256, 384, jnp.bfloat16)
    _layer_grads_vs_dense("cusparselt", t=256)


def test_cusparselt_layer_matches_dense_float16():
    """float16: operands from cusparseLtSpMMACompress (the forward's A = W̃ᵀ read as W̃ is stored)."""
    _skip_no_cusparselt()
    skip_uncompiled(jnp.float16)
    _skip_float16_refused(jnp.float16, lambda: _layer_grads_vs_dense("cusparselt", t=272, dtype=jnp.float16))
    v1, v0, seed = _layer_grads_vs_dense("cusparselt", t=272, dtype=jnp.float16)
    assert abs(float(v1) - float(v0)) <= 1e-2 * abs(float(v0)), f"seed={seed} loss {v1} vs {v0}"


def test_cusparselt_layer_falls_back_to_library_compressor(monkeypatch):
    """If the layout check fails (another cuSPARSELt version), one warning and cusparseLtSpMMACompress."""
    _skip_no_cusparselt()
    monkeypatch.setattr(_lt, "_fused_compress_check", lambda *a: False)
    monkeypatch.setattr(_lt, "_warned", set())
    with pytest.warns(RuntimeWarning, match="falling back to cusparseLtSpMMACompress"):
        _layer_grads_vs_dense("cusparselt", t=256)


def test_cusparselt_errors():
    _skip_no_cusparselt()
    a = jnp.ones((256, 256), jnp.bfloat16)
    with pytest.raises(ValueError, match="multiples of 16"):
        _lt.cusparselt_compress(a[:, :248], m=256, n=128, k=248, a_layout=_lt.A_MK)
    with pytest.raises(ValueError, match="must have shape"):
        _lt.cusparselt_compress(a[:128], m=256, n=128, k=256, a_layout=_lt.A_MK)
    c = _lt.cusparselt_compress(a, m=256, n=128, k=256, a_layout=_lt.A_MK)
    with pytest.raises(ValueError, match="compressed"):
        _lt.cusparselt_spmm(c[:-16], jnp.ones((128, 256), jnp.bfloat16), m=256, n=128, k=256, a_layout=_lt.A_MK)
    import jax_sparse24 as s24

    with pytest.raises(RuntimeError, match="cusparselt"):
        s24.sparse24_linear(jnp.ones((8, 24), jnp.bfloat16), jnp.ones((24, 40), jnp.bfloat16),
                            jnp.ones((24, 40), bool) & (jnp.arange(24)[:, None] % 4 < 2), backend="cusparselt")


def test_kernels_inside_shard_map_on_one_gpu():
    """The real kernels inside shard_map (check_vma=True) on a one-GPU mesh: the operands vary over the
    mesh axis, so each FFI call's results must be typed as varying too (they failed to trace before,
    `switch branches must have equal output types`). The deterministic ops equal their results outside
    shard_map; the MVUE draw (key folded with the shard index 0) keeps 2 of every 4 with |value| >= |g|."""
    import jax_sparse24 as s24
    from jax.sharding import PartitionSpec as P

    from jax_sparse24._src import reference_ops

    rng, seed = _rng()
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    x = jnp.asarray(rng.standard_normal((256, 128)), jnp.bfloat16)
    w = jnp.asarray(0.1 * rng.standard_normal((128, 64)), jnp.bfloat16)
    m = reference_ops.transposable_mask24(w)
    key = jax.random.key(int(rng.integers(1 << 30)))

    def grads(x, fp8):
        return jax.grad(lambda x: jnp.sum(s24.sparse24_linear(x, w, m, transposable=True, backend="cutlass",
                                                              fp8=fp8).astype(jnp.float32) ** 2))(x)

    cases = {"bf16 linear": functools.partial(grads, fp8=False), "fp8 linear": functools.partial(grads, fp8=True),
             "mask24": lambda x: s24.mask24(x, axis=-1)}
    for name, fn in cases.items():
        inside = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("data"), out_specs=P("data")))(x)
        np.testing.assert_array_equal(np.asarray(inside), np.asarray(jax.jit(fn)(x)), err_msg=f"{name} seed={seed}")
    g = jax.jit(jax.shard_map(lambda g: s24.mvue24(key, g, axis=0), mesh=mesh, in_specs=P("data"),
                              out_specs=P("data")))(x)
    kept = np.asarray(g, np.float32).reshape(64, 4, 128) != 0
    assert (kept.sum(axis=1) <= 2).all(), f"seed={seed}"
    big = np.abs(np.asarray(g, np.float32)) >= np.abs(np.asarray(x, np.float32)) * (1 - 2 ** -7)
    assert big[np.asarray(g) != 0].all(), f"seed={seed}"


# --- masks that are not 2:4 never reach the sparse kernels unnoticed --------------------------------

@pytest.mark.parametrize("backend", ["cutlass", "cusparselt"])
@pytest.mark.parametrize("case", ["ones", "axis -1", "in only + transposable"])
def test_bad_masks_under_jit_are_errors_on_the_kernels(backend, case):
    """The cases a user hit on the H100 (relative error 0.69 / 0.45 / 0.42 of a silent wrong product):
    under jit with a forced sparse backend each is now a MaskCheckError naming the axis, and the
    same call with a valid mask matches x·(w⊙m)."""
    import jax_sparse24 as s24

    rng, seed = _rng()
    x = jnp.asarray(rng.normal(size=(256, 512)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(512, 256)), jnp.bfloat16)
    transposable = case.endswith("transposable")
    m = {"ones": jnp.ones(w.shape, bool), "axis -1": s24.mask24(w, axis=-1),
         "in only + transposable": s24.mask24(w, axis=0)}[case]
    axis = "1 \\(out" if transposable else "0 \\(in\\)"

    def loss(x, w, m):
        y = s24.sparse24_linear(x, w, m, backend=backend, transposable=transposable)
        return (y.astype(jnp.float32) ** 2).sum()

    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    with pytest.raises(jax.errors.JaxRuntimeError, match=f"not 2:4 along axis {axis}"):
        jax.block_until_ready(f(x, w, m))
    good = s24.transposable_mask24(w) if transposable else s24.mask24(w, axis=0)
    (val, (dx, _)) = f(x, w, good)
    wm = np.asarray((w * good).astype(jnp.float32), np.float64)
    xf = np.asarray(x.astype(jnp.float32), np.float64)
    y = xf @ wm
    np.testing.assert_allclose(float(val), float((y ** 2).sum()), rtol=2e-2, err_msg=f"seed={seed}")
    dx_ref = (2 * y) @ wm.T
    err = np.linalg.norm(np.asarray(dx, np.float64) - dx_ref) / np.linalg.norm(dx_ref)
    assert err < 2e-2, (seed, err)


# --- FSDP: a sharded 2:4 weight gathered packed (values + mask bits) on several GPUs ----------------

@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("backend", ["cutlass", "cusparselt"])
def test_fsdp_packed_weight_gather_equals_dense_gather_on_gpus(backend, fp8):
    """Weight and tokens split over every visible GPU (FSDP), the weight along ``in`` or ``out``: the
    default packed gather (each GPU packs its shard; the op all-gathers the values and mask bits, and the
    sparse GEMMs' compressors read them as gathered) gives the same loss and gradients, bit for bit, as XLA's
    gather of the weight and its bool mask; both match the one-device reference; the packed program
    gathers no bool mask."""
    import re

    import jax_sparse24 as s24
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jax_sparse24 import sharding as shd
    from jax_sparse24._src import reference_ops

    n = len(jax.devices())
    if n < 2:
        pytest.skip("needs 2 or more GPUs")
    if backend == "cusparselt":
        _skip_no_cusparselt()
        if fp8:
            pytest.skip("fp8 has no cuSPARSELt path")
    rng, seed = _rng()
    mesh = shd.make_mesh(f"fsdp={n}")
    x = jnp.asarray(rng.standard_normal((512 * n, 256)), jnp.bfloat16)
    w = jnp.asarray(0.1 * rng.standard_normal((256, 128 * n)), jnp.bfloat16)
    m = reference_ops.transposable_mask24(w)

    def loss(x, w, m):
        y = s24.sparse24_linear(x, w, m, transposable=True, backend=backend, fp8=fp8, check_mask=False)
        return jnp.sum(y.astype(jnp.float32) ** 2) / y.size

    ref = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w, m)
    for wspec in (P("fsdp", None), P(None, "fsdp")):
        xs, ws = NamedSharding(mesh, P("fsdp", None)), NamedSharding(mesh, wspec)
        got = {}
        for mode in ("packed", "dense"):
            f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), in_shardings=(xs, ws, ws),
                        out_shardings=(NamedSharding(mesh, P()), (xs, ws)))
            with shd.weight_gather(mode):
                exe = f.lower(x, w, m).compile()
            # the shapes of every all-gather (XLA may combine gathers into one, with a tuple of tuples of shapes)
            lhs = re.findall(r"= (.+?) all-gather(?:-start)?\(", exe.as_text())
            gathered = [t for f in lhs for t in re.findall(r"[a-z]+[0-9]*\[[0-9,]*\]", f)]
            # packed: the values (half the rows) and the mask bits (uint8); dense: the weight and its bool mask
            o = 128 * n
            expect = (f"bf16[128,{o}]", f"u8[32,{o}]") if mode == "packed" else (f"bf16[256,{o}]", f"pred[256,{o}]")
            assert all(any(s.startswith(e) for s in gathered) for e in expect), (mode, gathered)
            assert not (mode == "packed" and any(s.startswith(("pred", f"bf16[256,{o}]")) for s in gathered)), gathered
            if backend == "cutlass":  # the packed weight goes to the compressor as gathered
                target = "jax_sparse24_fp8_packed_compress" if fp8 else "jax_sparse24_packed_compress"
                assert (target in exe.as_text()) == (mode == "packed"), mode
            got[mode] = jax.device_get(exe(x, w, m))
        for a, b in zip(jax.tree.leaves(got["packed"]), jax.tree.leaves(got["dense"])):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                          err_msg=f"{wspec} seed={seed}")
        tol = 0.1 if fp8 else 2e-2  # relative to the norm (bf16 / fp8 GEMMs against XLA's on one device)
        for a, b in zip(jax.tree.leaves(got["packed"]), jax.tree.leaves(ref)):
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            rel = np.linalg.norm(a - b) / np.linalg.norm(b)
            assert np.isfinite(a).all() and rel < tol, f"{wspec}: relative error {rel:.3g} seed={seed}"


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_checkpoint_policy_keeps_the_sparse_forward_gemm_out_of_the_backward_pass(fp8):
    """Under jax.checkpoint the 2:4 forward GEMM (a custom call) runs once with s24.checkpoint_policy,
    as without remat, and twice with JAX's own dots policy (which keeps only dot_general outputs)."""
    import jax_sparse24 as s24

    rng, seed = _rng()
    x = jnp.asarray(rng.standard_normal((2048, 1024)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((1024, 2048)), jnp.bfloat16)
    m = s24.transposable_mask24(w)

    def block(x, w, m):
        y = s24.sparse24_linear(x, w, m, transposable=True, backend="cutlass", fp8=fp8, check_mask=False)
        return jnp.sum(jnp.tanh(y.astype(jnp.float32)) ** 2)

    def n_calls(f):  # value_and_grad: with grad alone XLA drops the forward pass whose residuals remat recomputes
        hlo = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(x, w, m).compile().as_text()
        return hlo.count('custom_call_target="jax_sparse24_')

    plain = n_calls(block)
    ours = n_calls(jax.checkpoint(block, policy=s24.checkpoint_policy("dots")))
    jaxs = n_calls(jax.checkpoint(block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable))
    assert ours == plain < jaxs, (plain, ours, jaxs, seed)
    want = jax.jit(jax.grad(block, argnums=(0, 1)))(x, w, m)
    got = jax.jit(jax.grad(jax.checkpoint(block, policy=s24.checkpoint_policy("dots")), argnums=(0, 1)))(x, w, m)
    for a, b in zip(got, want):  # the same GEMMs on the same operands; elementwise recomputation may fuse otherwise
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.isfinite(a).all() and np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(b), f"seed={seed}"
