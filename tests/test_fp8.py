"""fp8 (float8_e4m3fn) training on the CPU: the quantization math (jax_sparse24._src.fp8_math), the fp8
linear op and layers against a NumPy restatement, the FFI wrappers' trace-time checks (with a
stand-in extension object) and the errors.

The NumPy restatement (``_np_*``) rounds with ml_dtypes (JAX's own float8 type) and multiplies in
float64: products of two e4m3 values are exact in float32 and float64, so the op (float32
accumulation) and the restatement differ only by the float32 accumulation error before the single
rounding to bfloat16 — the tolerances below are one bfloat16 ulp (2^-8 relative) plus K·2^-24 of
Σ|terms|.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_sparse24 as s24
from jax_sparse24._src import cuda_fp8_ops as cf
from jax_sparse24._src import cuda_spmm_ops as cs
from jax_sparse24._src import ffi, fp8_gemm
from jax_sparse24._src.backends import CUTLASS, CUTLASS_FP8, DENSE
from jax_sparse24._src import fp8_math as f8

E4M3 = ml_dtypes.float8_e4m3fn


# --- NumPy restatement of the math ---------------------------------------------------------------


def _np_scale(t) -> np.float32:
    a = np.max(np.abs(np.asarray(t, np.float32))) if np.size(t) else np.float32(0)
    return np.float32(a / np.float32(448)) if np.isfinite(a) and a > 0 else np.float32(1)


def _np_quantize(t, s) -> np.ndarray:
    inv = np.float32(1) / np.float32(s)
    return np.clip(np.asarray(t, np.float32) * inv, -448, 448).astype(E4M3)


def _np_gemm(qa, qb, alpha):
    """(float64 product of the e4m3 values) · alpha, and the bound of Σ|terms|·alpha."""
    a, b = np.asarray(qa, np.float64), np.asarray(qb, np.float64)
    return (a @ b) * np.float64(alpha), (np.abs(a) @ np.abs(b)) * np.float64(alpha)


def _assert_gemm_close(got, exact, abs_terms, k: int, what: str):
    got = np.asarray(jnp.asarray(got).astype(jnp.float32), np.float64)
    tol = 2.0**-8 * np.abs(exact) + (k + 2) * 2.0**-24 * abs_terms + 1e-30
    bad = np.abs(got - exact) > tol
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} off, e.g. {got[bad][:3]} vs {exact[bad][:3]}"


def _rand(key, shape, dtype=jnp.float32, scale=1.0):
    return (jax.random.normal(jax.random.key(key), shape) * scale).astype(dtype)


# --- quantize and scales ---------------------------------------------------------------------------


def test_quantize_rounds_to_nearest_even_at_every_midpoint():
    codes = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32)
    vals = np.unique(codes[np.isfinite(codes)])
    mids = ((vals[:-1].astype(np.float64) + vals[1:]) / 2).astype(np.float32)  # exact in float32
    got = np.asarray(f8.quantize(jnp.asarray(mids), jnp.float32(1.0)).astype(jnp.float32))
    want = mids.astype(E4M3).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    # ties to even: 1 + 1/16 (between 1 and 1.125) goes down, 1.125 + 1/16 goes up to 1.25
    q = f8.quantize(jnp.array([1.0625, 1.1875]), jnp.float32(1.0)).astype(jnp.float32)
    np.testing.assert_array_equal(np.asarray(q), [1.0, 1.25])


def test_quantize_saturates_propagates_nan_keeps_signed_zero():
    t = jnp.array([1e6, -1e6, 449.0, 464.0, jnp.inf, -jnp.inf, jnp.nan, -0.0, 0.0, 1e-12], jnp.float32)
    q = np.asarray(f8.quantize(t, jnp.float32(1.0)).astype(jnp.float32))
    np.testing.assert_array_equal(q[:6], [448, -448, 448, 448, 448, -448])
    assert np.isnan(q[6]) and q[7] == 0 and np.signbit(q[7]) and q[8] == 0 and q[9] == 0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_quantize_matches_numpy_bit_for_bit(dtype):
    t = _rand(0, (64, 96), dtype, 3.0)
    for s in (f8.current_scale(t), jnp.float32(0.37), jnp.float32(3e-3)):
        got = np.asarray(jax.lax.bitcast_convert_type(jax.jit(f8.quantize)(t, s), jnp.uint8))
        want = _np_quantize(np.asarray(t.astype(jnp.float32)), np.float32(s)).view(np.uint8)
        np.testing.assert_array_equal(got, want)


def test_current_scale_edge_cases():
    assert float(f8.current_scale(jnp.zeros((4, 4)))) == 1.0  # all zero
    assert float(f8.current_scale(jnp.array([1.0, jnp.inf]))) == 1.0  # non-finite amax
    assert float(f8.current_scale(jnp.array([1.0, jnp.nan]))) == 1.0
    assert float(f8.current_scale(jnp.zeros((0,)))) == 1.0  # empty
    t = _rand(1, (32, 32), jnp.bfloat16, 5.0)
    s = f8.current_scale(t)
    assert s.dtype == jnp.float32 and s.shape == ()
    assert float(s) == _np_scale(np.asarray(t.astype(jnp.float32)))
    # the largest |t| lands on (or rounds to) ±448: the full e4m3 range is used
    assert float(jnp.max(jnp.abs(f8.quantize(t, s).astype(jnp.float32)))) == 448.0
    assert float(f8.scale_from_amax(jnp.float32(-1.0))) == 1.0


def test_quantize_and_scale_errors():
    with pytest.raises(ValueError, match="must be a scalar"):
        f8.quantize(jnp.ones(4), jnp.ones(2))
    with pytest.raises(ValueError, match="float32"):
        f8.quantize(jnp.ones(4), jnp.int32(1))
    with pytest.raises(ValueError, match="bfloat16/float16/float32"):
        f8.quantize(jnp.ones(4, jnp.int32), jnp.float32(1))
    with pytest.raises(ValueError, match="bfloat16/float16/float32"):
        f8.quantize(jnp.ones(4, jnp.float8_e4m3fn), jnp.float32(1))
    with pytest.raises(ValueError, match="2-D float8_e4m3fn"):
        f8.scaled_matmul(jnp.ones((4, 4)), jnp.ones((4, 4), jnp.float8_e4m3fn), jnp.float32(1))


def test_scaled_matmul_float32_accumulation_one_rounding():
    k = 512
    qa = f8.quantize(_rand(2, (24, k)), jnp.float32(1 / 64))
    qb = f8.quantize(_rand(3, (k, 40)), jnp.float32(1 / 64))
    alpha = jnp.float32(0.013)
    got = f8.scaled_matmul(qa, qb, alpha)
    assert got.dtype == jnp.bfloat16
    exact, terms = _np_gemm(qa, qb, alpha)
    _assert_gemm_close(got, exact, terms, k, "scaled_matmul")
    got_t = f8.scaled_matmul(qa, qb.T, alpha, transpose_b=True)
    np.testing.assert_array_equal(np.asarray(got_t.astype(jnp.float32)), np.asarray(got.astype(jnp.float32)))


# --- the fp8 linear op -----------------------------------------------------------------------------


def _layer_case(dtype, t=48, i=64, o=32, seed=0):
    w = _rand(seed, (i, o), jnp.float32, 0.2)
    mask = s24.transposable_mask24(w)
    x = _rand(seed + 1, (t, i), dtype, 2.0)
    return x, w, mask


def _np_forward(x, wm):
    xn, wn = np.asarray(x.astype(jnp.float32)), np.asarray(wm.astype(jnp.float32))
    s_x, s_w = _np_scale(xn), _np_scale(wn)
    exact, terms = _np_gemm(_np_quantize(xn, s_x), _np_quantize(wn, s_w), np.float32(s_x * s_w))
    return exact, terms, s_w


def _np_input_grad(g, wm, s_w):
    gn, wn = np.asarray(g.astype(jnp.float32)), np.asarray(wm.astype(jnp.float32))
    s_g = _np_scale(gn)
    return _np_gemm(_np_quantize(gn, s_g), _np_quantize(wn, s_w).T, np.float32(s_g * s_w))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("transposable", [True, False], ids=["transposable", "plain-mask"])
def test_fp8_linear_forward_backward_match_restatement(dtype, transposable):
    x, w, mask = _layer_case(dtype)
    if not transposable:
        mask = s24.mask24(w, axis=0)
    w = w.astype(dtype)
    bias = _rand(9, (w.shape[1],), dtype)
    wm = jnp.where(mask, w, 0).astype(dtype)  # W̃ in the compute dtype: what is quantized
    g = _rand(7, (x.shape[0], w.shape[1]), dtype, 1e-3)  # a small cotangent: its own scale matters

    f = jax.jit(functools.partial(s24.sparse24_linear, fp8=True))
    y, vjp = jax.vjp(lambda x, w, b: f(x, w, mask, b), x, w, bias)
    exact, terms, s_w = _np_forward(x, wm)
    assert y.dtype == dtype
    # the GEMM result is rounded to bfloat16, then cast to the compute dtype and the bias added
    y_gemm = f(x, w, mask, None)
    _assert_gemm_close(y_gemm, exact, terms, x.shape[1], "y")
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_gemm + bias))

    dx, dw, db = vjp(g)
    ex, tx = _np_input_grad(g, wm, s_w)
    _assert_gemm_close(dx, ex, tx, w.shape[1], "dx")
    # weight and bias gradients without a key: the 16-bit path, unchanged by fp8
    _, vjp16 = jax.vjp(lambda x, w, b: s24.sparse24_linear(x, w, mask, b), x, w, bias)
    _, dw16, db16 = vjp16(g)
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(dw16))
    np.testing.assert_array_equal(np.asarray(db), np.asarray(db16))
    plan = s24.linear_plan(x.shape[0], *w.shape, dtype, transposable=transposable, fp8=True)
    assert plan["forward"] == plan["input_grad"] == "xla (fp8)"  # CPU: XLA's fp8 math
    assert plan["weight_grad"] == "dense (exact)"  # auto on a CPU: the 16-bit exact gradient


def _np_mvue_weight_grad(x, g, sample):
    """q(x)ᵀ·q(MVUE(∇y)) with the sample's scale twice ∇y's: the exact product and the |terms|."""
    xn, gn = np.asarray(x.astype(jnp.float32)), np.asarray(g.astype(jnp.float32))
    s_x, s_m = _np_scale(xn), np.float32(2.0) * _np_scale(gn)
    qs = _np_quantize(np.asarray(sample.astype(jnp.float32)), s_m)
    return _np_gemm(_np_quantize(xn, s_x).T, qs, np.float32(s_x * s_m))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_fp8_mvue_weight_grad_matches_restatement_and_is_unbiased(dtype):
    """With a key and backend='reference' the weight gradient is q(x)ᵀ·q(MVUE(∇y)) with the MVUE
    sample's scale twice ∇y's; its mean over draws is xᵀ·∇y up to the fp8 quantization. 'auto' on a
    CPU takes the 16-bit exact gradient."""
    from jax_sparse24._src import reference_ops

    x, w, mask = _layer_case(dtype, t=42)  # T not a multiple of 4: the token axis is padded
    w = w.astype(dtype)
    g = _rand(7, (x.shape[0], w.shape[1]), dtype, 1e-3)
    key = jax.random.key(3)

    def dw_of(key, backend):
        _, vjp = jax.vjp(lambda w: s24.sparse24_linear(x, w, mask, key=key, fp8=True, backend=backend), w)
        return vjp(g)[0]

    dw = jax.jit(dw_of, static_argnums=1)(key, "reference")
    assert dw.dtype == w.dtype
    t = x.shape[0]  # the op pads the tokens with zero rows to a multiple of 4 before drawing
    sample = reference_ops.mvue24(key, jnp.pad(g, ((0, -t % 4), (0, 0))), axis=0)[:t]
    ew, tw = _np_mvue_weight_grad(x, g, sample)
    _assert_gemm_close(dw, ew, tw, x.shape[0], "dw (MVUE)")
    plan = s24.linear_plan(x.shape[0], *w.shape, dtype, fp8=True, backend="reference")
    assert plan["weight_grad"] == "xla (fp8, MVUE)"
    # auto on a CPU: the 16-bit exact gradient (the sample pays only through the sparse kernel)
    exact = jax.jit(dw_of, static_argnums=1)(key, "auto")
    _, vjp = jax.vjp(lambda w: s24.sparse24_linear(x, w, mask), w)
    np.testing.assert_array_equal(np.asarray(exact), np.asarray(vjp(g)[0]))
    # unbiased up to the sample's fp8 rounding: the mean of 1024 draws against q(x)ᵀ·∇y (x's
    # quantization is deterministic, so it is in the oracle) — per element within 4 standard errors
    # plus 2⁻⁴ of Σ|q(x)||∇y| (e4m3's relative rounding of the sample), and on average within 5% of
    # |q(x)ᵀ·∇y| (measured ~3%: the draws' standard error; a gradient off by 10% — a wrong alpha — is
    # ~10% off). The constant MVUE_SCALE_FACTOR itself is pinned by test_mvue_scale_bounds_every_sample.
    keys = jax.random.split(jax.random.key(11), 1024)
    draws = np.asarray(jax.jit(jax.vmap(lambda k: dw_of(k, "reference")))(keys).astype(jnp.float32))
    s_x = f8.current_scale(x)
    xq = np.asarray(f8.dequantize(f8.quantize(x, s_x), s_x), np.float64)
    gn = np.asarray(g, np.float64)
    want = xq.T @ gn
    dev = np.abs(draws.mean(0) - want)
    tol = 4 * draws.std(0) / np.sqrt(len(keys)) + 2.0**-4 * (np.abs(xq).T @ np.abs(gn))
    assert (dev < tol).mean() > 0.99
    assert dev.mean() < 0.05 * np.abs(want).mean(), dev.mean() / np.abs(want).mean()
    assert draws.std(0).max() > 0


def test_mvue_scale_bounds_every_sample():
    """|MVUE(g)| <= MVUE_SCALE_FACTOR · max|g| (the fp8 sample's scale), reached by equal magnitudes."""
    from jax_sparse24._src import fp8_math as f
    from jax_sparse24._src import reference_ops

    rng = np.random.default_rng(0)
    g = rng.standard_normal((4096, 64)).astype(np.float32) * rng.choice([1e-3, 1.0, 30.0], (4096, 1))
    g[:1024] = np.sign(g[:1024]) * 0.75  # groups of four equal magnitudes: each kept value is 2·|g|
    out = np.asarray(reference_ops.mvue24(jax.random.key(0), jnp.asarray(g), axis=0))
    assert np.abs(out).max() <= f.MVUE_SCALE_FACTOR * np.abs(g).max() * (1 + 1e-6)
    np.testing.assert_allclose(np.abs(out[:1024][out[:1024] != 0]), 1.5, rtol=1e-6)
    s = float(f.mvue_scale(jnp.asarray(g)))
    assert s == 2 * float(f.current_scale(jnp.asarray(g)))
    assert float(f.mvue_scale(jnp.zeros((8, 8)))) == 2.0


def test_fp8_linear_leading_axes_and_reference_backend_agree():
    x, w, mask = _layer_case(jnp.bfloat16)
    x3 = x.reshape(3, 16, -1)
    y3 = s24.sparse24_linear(x3, w, mask, fp8=True)
    y_ref = s24.sparse24_linear(x, w, mask, fp8=True, backend="reference")
    np.testing.assert_array_equal(np.asarray(y3.reshape(x.shape[0], -1)), np.asarray(y_ref))
    # fp8 changes the numbers (so a test that passes with fp8 ignored would fail here) but not by much
    y16 = s24.sparse24_linear(x, w, mask)
    rel = float(jnp.linalg.norm((y_ref - y16).astype(jnp.float32)) / jnp.linalg.norm(y16.astype(jnp.float32)))
    assert 1e-3 < rel < 0.08, rel


def test_fp8_linear_errors():
    x, w, mask = _layer_case(jnp.float32)
    pw = s24.prepare_weight(w, mask, tokens=x.shape[0])
    with pytest.raises(ValueError, match="fp8=True does not take prepared"):
        s24.sparse24_linear(x, w, mask, prepared=pw, fp8=True)
    with pytest.raises(ValueError, match="backend='cusparselt' has no fp8 path"):
        s24.sparse24_linear(x, w, mask, backend="cusparselt", fp8=True)
    with pytest.raises(ValueError, match="fp8 must be a Python bool"):
        s24.sparse24_linear(x, w, mask, fp8="yes")
    with pytest.raises(ValueError, match="floating-point"):
        s24.sparse24_linear(x.astype(jnp.int32), w, mask, fp8=True)
    with pytest.raises(ValueError, match="no prepared weights"):
        s24.linear_plan(64, 64, 32, fp8=True, reuse=2)
    if ffi.extension() is None:  # the forced kernel needs the extension, as without fp8
        with pytest.raises(RuntimeError, match="backend='cutlass' with fp8=True"):
            s24.sparse24_linear(x, w, mask, backend="cutlass", fp8=True)
    with pytest.raises(ValueError, match="fp8 must be a Python bool"):
        s24.nn.Sparse24Dense(8, fp8=1).init(jax.random.key(0), jnp.ones((2, 16)))
    with pytest.raises(ValueError, match="backend='cusparselt' has no fp8 path"):
        s24.nn.Sparse24Dense(8, fp8=True, backend="cusparselt").init(jax.random.key(0), jnp.ones((2, 16)))


# --- layers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["srste", "ste", "soft", "dense"])
def test_sparse24dense_fp8_every_method(method):
    from jax_sparse24._src import layer as _layer

    x = _rand(11, (2, 16, 32), jnp.float32, 1.5)
    model = s24.nn.Sparse24Dense(16, method=method, fp8=True)
    v = model.init(jax.random.key(0), x)
    kernel, bias = v["params"]["kernel"], v["params"]["bias"]
    if method == "dense":
        w_eff = kernel
    else:
        sp = v.get("sparsity", {})
        w_used, m, _ = _layer.effective(method, kernel, sp.get("transposable_mask"), sp.get("beta"), True)
        w_eff = jnp.where(m, w_used, 0)
    y = model.apply(v, x)
    exact, terms, _ = _np_forward(x.reshape(-1, 32), w_eff)
    _assert_gemm_close(np.asarray(y.reshape(-1, 16) - bias, np.float64), exact, terms + 1e-6, 32, method)
    # ∇kernel (straight through) is the 16-bit xᵀ·∇y: the same as without fp8 for a loss linear in y
    # (a CPU runs no MVUE sample; the fp8 MVUE gradient is tested above and on the GPU)
    c = _rand(12, y.shape)
    grad = lambda mdl: jax.grad(lambda p: jnp.sum(mdl.apply({**v, "params": p}, x) * c))(v["params"])  # noqa: E731
    g8, g16 = grad(model), grad(model.clone(fp8=False))
    np.testing.assert_allclose(np.asarray(g8["kernel"]), np.asarray(g16["kernel"]), rtol=1e-6, atol=1e-6)
    assert "sparse24_prepared" not in jax.tree.leaves(s24.preparation.prepare(model, v, x)) and not s24.preparation.prepare(model, v, x)
    if method != "dense":  # the dense phase of a sparse layer is the fp8 dense op
        y_dense = model.apply(v, x, sparse=False)
        np.testing.assert_array_equal(np.asarray(y_dense), np.asarray(s24.fp8.fp8_dense_linear(x, kernel, bias)))


def test_nnx_sparse24linear_fp8_matches_linen():
    from flax import nnx

    x = _rand(13, (4, 32), jnp.float32)
    layer = s24.nnx.Sparse24Linear(32, 16, fp8=True, rngs=nnx.Rngs(0))
    linen = s24.nn.Sparse24Dense(16, fp8=True)
    v = {"params": {"kernel": layer.kernel.get_value() if hasattr(layer.kernel, "get_value") else layer.kernel.value,
                    "bias": layer.bias.get_value() if hasattr(layer.bias, "get_value") else layer.bias.value},
         "sparsity": {"transposable_mask": layer.mask.get_value() if hasattr(layer.mask, "get_value")
                      else layer.mask.value, "mask_every": jnp.int32(40)}}
    np.testing.assert_array_equal(np.asarray(layer(x)), np.asarray(linen.apply(v, x)))
    assert not np.array_equal(np.asarray(layer(x)), np.asarray(s24.nn.Sparse24Dense(16).apply(v, x)))


# --- FFI wrappers: trace-time checks with a stand-in extension ------------------------------------


class _FakeExt:
    """The fp8 part of the extension's Python interface (shapes, alignment, config names)."""

    @staticmethod
    def cutlass_configs_fp8():
        return ["fp8_a", "fp8_b"]

    @staticmethod
    def cutlass_alignment_fp8():
        return (8, 16, 32)

    @staticmethod
    def cutlass_configs():
        return ["a"]

    @staticmethod
    def cutlass_alignment():
        return (8, 16, 16)

    @staticmethod
    def cutlass_compressed_shapes(m, k, code):
        if code not in (0, 1, 2):
            raise ValueError("bad dtype code")
        r = lambda a, b: -(-a // b) * b  # noqa: E731
        if code == 2:
            return (m, k // 2), (r(m, 64), r(k, 128) // 8)
        return (m, k // 2), (r(m, 64), r(k, 128) // 16)


def _clear_caches():
    for fn in (cf.cutlass_configs_fp8, cf.cutlass_alignment_fp8, cs._compressed_shapes, cs.cutlass_configs,
               cs.cutlass_alignment):
        fn.cache_clear()


@pytest.fixture
def fake_ext(monkeypatch):
    _clear_caches()
    monkeypatch.setattr(ffi, "_load", lambda: (_FakeExt(), None))
    yield
    _clear_caches()


def test_fp8_wrappers_shapes_and_checks(fake_ext):
    x = jax.ShapeDtypeStruct((96, 64), jnp.bfloat16)
    mask = jax.ShapeDtypeStruct((96, 64), jnp.bool_)
    s = jax.ShapeDtypeStruct((), jnp.float32)
    v, m = jax.eval_shape(functools.partial(cf.fp8_masked_compress, transposed=True), x, mask, s)
    assert (v.shape, v.dtype, m.shape, m.dtype) == ((64, 48), jnp.float8_e4m3fn, (64, 16), jnp.uint8)
    v, m = jax.eval_shape(functools.partial(cf.fp8_masked_compress, transposed=False), x, mask, s)
    assert (v.shape, m.shape) == ((96, 32), (128, 16))
    b = jax.ShapeDtypeStruct((48, 64), jnp.float8_e4m3fn)
    d = jax.eval_shape(functools.partial(cf.cutlass_spmm_fp8, m=96, k=64), v, m, b, s)
    assert (d.shape, d.dtype) == ((48, 96), jnp.bfloat16)
    assert cf.fp8_gemm_supports(96, 48, 64) and not cf.fp8_gemm_supports(96, 40, 64)
    assert cf.fp8_compress_supports((96, 64), jnp.float32, transposed=False)
    assert not cf.fp8_compress_supports((96, 48), jnp.float32, transposed=False)  # K = 48
    assert cs.cutlass_compressed_shapes(64, 128, jnp.float8_e4m3fn) == ((64, 64), (64, 16))

    def raises(match, fn, *args, **kw):
        with pytest.raises(ValueError, match=match):
            jax.eval_shape(functools.partial(fn, **kw), *args)

    xf = jax.ShapeDtypeStruct((96, 48), jnp.bfloat16)
    raises("K % 32 == 0", cf.fp8_masked_compress, xf, jax.ShapeDtypeStruct((96, 48), jnp.bool_), s)
    raises("M % 8 == 0", cf.fp8_masked_compress, jax.ShapeDtypeStruct((64, 44), jnp.bfloat16),
           jax.ShapeDtypeStruct((64, 44), jnp.bool_), s, transposed=True)
    raises("bfloat16, float16 or float32", cf.fp8_masked_compress, jax.ShapeDtypeStruct((96, 64), jnp.int8),
           mask, s)
    raises("mask must have x's shape", cf.fp8_masked_compress, x, jax.ShapeDtypeStruct((64, 96), jnp.bool_), s)
    raises("must be a scalar", cf.fp8_masked_compress, x, mask, jax.ShapeDtypeStruct((2,), jnp.float32))
    raises("float32", cf.fp8_masked_compress, x, mask, jax.ShapeDtypeStruct((), jnp.int32))
    raises("`b` must be float8_e4m3fn", cf.cutlass_spmm_fp8, v, m, jax.ShapeDtypeStruct((48, 64), jnp.bfloat16), s,
           m=96, k=64)
    raises("n % 16 == 0", cf.cutlass_spmm_fp8, v, m, jax.ShapeDtypeStruct((40, 64), jnp.float8_e4m3fn), s, m=96, k=64)
    raises("compressed shape", cf.cutlass_spmm_fp8, jax.ShapeDtypeStruct((96, 30), jnp.float8_e4m3fn), m, b, s,
           m=96, k=64)
    raises("config must be -1", cf.cutlass_spmm_fp8, v, m, b, s, m=96, k=64, config=2)
    raises("`meta` must be uint8", cf.cutlass_spmm_fp8, v, jax.ShapeDtypeStruct((128, 2), jnp.int8), b, s, m=96, k=64)
    raises("must be a scalar", cf.cutlass_spmm_fp8, v, m, b, jax.ShapeDtypeStruct((1, 2), jnp.float32), m=96, k=64)
    raises("k % 32 == 0", cs.cutlass_compress, jax.ShapeDtypeStruct((64, 48), jnp.float8_e4m3fn))
    # the MVUE compressor: A = q(MVUE(g))ᵀ (C, R), groups along g's rows
    key = jax.random.key(0)
    v, m = jax.eval_shape(cf.fp8_mvue24_compress, key, x, s)
    assert (v.shape, v.dtype, m.shape, m.dtype) == ((64, 48), jnp.float8_e4m3fn, (64, 16), jnp.uint8)
    raises(r"A = g.T needs M % 8 == 0 and K % 32 == 0", cf.fp8_mvue24_compress, key,
           jax.ShapeDtypeStruct((48, 64), jnp.bfloat16), s)
    raises("M % 8 == 0", cf.fp8_mvue24_compress, key, jax.ShapeDtypeStruct((64, 44), jnp.bfloat16), s)
    raises("g must be bfloat16, float16 or float32", cf.fp8_mvue24_compress, key,
           jax.ShapeDtypeStruct((64, 64), jnp.int8), s)
    raises("fp8_mvue24_compress: a raw key must be uint32", cf.fp8_mvue24_compress,
           jax.ShapeDtypeStruct((2,), jnp.int32), x, s)
    raises("must be a scalar", cf.fp8_mvue24_compress, key, x, jax.ShapeDtypeStruct((2,), jnp.float32))
    # the quantize-transpose: q(x)ᵀ (C, R)
    qt = jax.eval_shape(cf.fp8_quantize_transpose, x, s)
    assert (qt.shape, qt.dtype) == ((64, 96), jnp.float8_e4m3fn)
    raises(r"rows % 16 == 0 and columns % 8 == 0", cf.fp8_quantize_transpose, jax.ShapeDtypeStruct((40, 64), jnp.bfloat16), s)
    raises(r"rows % 16 == 0 and columns % 8 == 0", cf.fp8_quantize_transpose, jax.ShapeDtypeStruct((48, 12), jnp.bfloat16), s)
    raises("bfloat16, float16 or float32", cf.fp8_quantize_transpose, jax.ShapeDtypeStruct((48, 64), jnp.int8), s)
    raises("must be a scalar", cf.fp8_quantize_transpose, x, jax.ShapeDtypeStruct((2,), jnp.float32))
    # the 16-bit GEMM refuses fp8 operands and says where they go
    raises("cutlass_spmm_fp8", cs.cutlass_spmm, v, m, b, m=96, k=64)


def test_fp8_dispatch_traces_the_kernel_branch_and_runs_the_reference_on_cpu(fake_ext, monkeypatch):
    """With the kernels 'available', auto picks the fp8 kernel for aligned shapes and traces its
    branch (every trace-time check of the CUDA path runs); a CPU executes the XLA math of the same
    op — the same numbers as backend='reference'. A misaligned shape falls back to XLA's math."""
    monkeypatch.setattr(ffi, "cuda_kernels_available", lambda: True)
    x, w, mask = _layer_case(jnp.bfloat16, t=48, i=64, o=32)
    assert fp8_gemm.plan("auto", 48, 64, 32, transposable=True) == ("cutlass", "cutlass")
    assert fp8_gemm.plan("auto", 40, 64, 32, transposable=True) == ("xla", "xla")  # T % 16
    assert fp8_gemm.plan("auto", 48, 64, 32, transposable=False) == ("cutlass", "xla")
    assert fp8_gemm.plan("dense", 48, 64, 32, transposable=True) == ("xla", "xla")
    calls = []
    real = cf.cutlass_spmm_fp8
    monkeypatch.setattr(cf, "cutlass_spmm_fp8", lambda *a, **k: calls.append(k) or real(*a, **k))

    def loss(x, w, backend):
        return jnp.sum(s24.sparse24_linear(x, w, mask, fp8=True, backend=backend).astype(jnp.float32) ** 2)

    lowered = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2).lower(x, w, "auto")
    assert sorted((k["m"], k["k"]) for k in calls) == [(32, 64), (64, 32)]  # forward (O, I) and ∇x (I, O)
    got = lowered.compile()(x, w)
    want = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)(x, w, "reference")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fp8_mvue_weight_grad_traces_the_kernel_branch(fake_ext, monkeypatch):
    """With a key and the kernels 'available', the sparse fp8 weight gradient runs the MVUE
    compressor on ∇y padded to 32 tokens and the fp8 GEMM with m = O, k = padded T, b = q(x)ᵀ; a
    CPU runs the XLA branch of the same op (backend='reference''s numbers, same draws). auto plans
    it only where the 16-bit planner runs the sparse MVUE gradient, and the shape is aligned."""
    from jax_sparse24._src import autotune

    monkeypatch.setattr(ffi, "cuda_kernels_available", lambda: True)
    x, w, mask = _layer_case(jnp.bfloat16, t=48, i=64, o=32)
    bf16 = jnp.bfloat16
    sparse16 = {"path": autotune.WeightGradPath(CUTLASS, mvue=True)}
    monkeypatch.setattr(autotune, "weight_grad_path", lambda *a: sparse16["path"])
    assert autotune.fp8_weight_grad_backend("auto", 48, 64, 32, bf16, mvue=True) is CUTLASS_FP8
    assert autotune.fp8_weight_grad_backend("auto", 48, 64, 36, bf16, mvue=True) is None  # O % 8: the 16-bit gradient
    assert autotune.fp8_weight_grad_backend("auto", 48, 72, 32, bf16, mvue=True) is None  # I % 16
    assert autotune.fp8_weight_grad_backend("auto", 48, 64, 32, bf16, mvue=False) is None
    assert autotune.fp8_weight_grad_backend("dense", 48, 64, 32, bf16, mvue=True) is DENSE  # XLA's fp8 dot of the sample
    assert s24.linear_plan(48, 64, 32, fp8=True)["weight_grad"] == "cutlass (fp8, MVUE)"
    # where the 16-bit planner takes the exact gradient, so does fp8
    sparse16["path"] = autotune.WeightGradPath(DENSE, mvue=False)
    assert autotune.fp8_weight_grad_backend("auto", 48, 64, 32, bf16, mvue=True) is None
    assert s24.linear_plan(48, 64, 32, fp8=True)["weight_grad"] == "dense (exact)"
    assert autotune.fp8_weight_grad_backend("cutlass", 48, 64, 32, bf16, mvue=True) is CUTLASS_FP8
    with pytest.raises(RuntimeError, match="n % 16"):
        autotune.fp8_weight_grad_backend("cutlass", 48, 72, 32, bf16, mvue=True)
    gemm_calls, mvue_calls, qt_calls = [], [], []
    real_gemm, real_mvue, real_qt = cf.cutlass_spmm_fp8, cf.fp8_mvue24_compress, cf.fp8_quantize_transpose
    monkeypatch.setattr(cf, "cutlass_spmm_fp8", lambda *a, **k: gemm_calls.append((a[2].shape, k)) or real_gemm(*a, **k))
    monkeypatch.setattr(cf, "fp8_mvue24_compress", lambda *a: mvue_calls.append(a[1].shape) or real_mvue(*a))
    monkeypatch.setattr(cf, "fp8_quantize_transpose", lambda *a: qt_calls.append(a[0].shape) or real_qt(*a))
    key = jax.random.key(5)

    def loss(x, w, backend):
        y = s24.sparse24_linear(x, w, mask, key=key, fp8=True, backend=backend)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    lowered = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2).lower(x, w, "cutlass")
    assert mvue_calls == [(64, 32)]  # ∇y (48, 32) padded to 64 tokens
    assert qt_calls == [(64, 64)]  # x (48, 64) padded to 64 tokens, written transposed
    wgrad = [(b, k) for b, k in gemm_calls if k["m"] == 32 and k["k"] == 64 and b == (64, 64)]
    assert len(wgrad) == 1, gemm_calls  # b = q(x)ᵀ (I, padded T)
    got = lowered.compile()(x, w)
    want = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)(x, w, "reference")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fp8_weight_grad_limits_of_the_kernels_grid(fake_ext, monkeypatch):
    """The weight-gradient kernels put the tokens on CUDA's grid.y (at most 65535 blocks): the
    quantize-transpose takes at most 65535·64 rows and the compressors K <= 65535·128. The wrappers
    refuse larger operands at trace time, and the planner falls back instead of planning a kernel
    that would fail when the step runs (``cutlass`` raises, naming the limit)."""
    from jax_sparse24._src import autotune

    s = jax.ShapeDtypeStruct((), jnp.float32)
    big = cf.QUANTIZE_TRANSPOSE_MAX_ROWS + 64
    with pytest.raises(ValueError, match=f"rows <= {cf.QUANTIZE_TRANSPOSE_MAX_ROWS}"):
        jax.eval_shape(cf.fp8_quantize_transpose, jax.ShapeDtypeStruct((big, 16), jnp.bfloat16), s)
    jax.eval_shape(cf.fp8_quantize_transpose,
                   jax.ShapeDtypeStruct((cf.QUANTIZE_TRANSPOSE_MAX_ROWS, 16), jnp.bfloat16), s)  # the limit itself
    with pytest.raises(ValueError, match=f"K <= {cf.COMPRESS_MAX_K}"):
        jax.eval_shape(cf.fp8_mvue24_compress, jax.random.key(0),
                       jax.ShapeDtypeStruct((cf.COMPRESS_MAX_K + 128, 8), jnp.bfloat16), s)
    assert cf.fp8_weight_grad_supports(32, 64, 4096)
    assert not cf.fp8_weight_grad_supports(32, 64, big)
    monkeypatch.setattr(ffi, "cuda_kernels_available", lambda: True)
    monkeypatch.setattr(autotune, "weight_grad_path", lambda *a: autotune.WeightGradPath(CUTLASS, mvue=True))
    bf16 = jnp.bfloat16
    assert autotune.fp8_weight_grad_backend("auto", 4096, 64, 32, bf16, mvue=True) is CUTLASS_FP8
    assert autotune.fp8_weight_grad_backend("auto", big, 64, 32, bf16, mvue=True) is None
    with pytest.raises(RuntimeError, match="at most .* tokens"):
        autotune.fp8_weight_grad_backend("cutlass", big, 64, 32, bf16, mvue=True)


def test_fp8_weight_grad_partitioned_data_parallel(fake_ext, monkeypatch):
    """Under jit + NamedSharding with the tokens sharded, the sparse fp8 MVUE weight gradient runs on
    each device's token shard (its own fold_in(key, shard) sample, the global scales) and ends in a
    psum — no all-gather of x or ∇y: Σ_shards q(x_d)ᵀ·q(MVUE_d(∇y_d))·s_x·s_m."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jax_sparse24 import sharding as shd
    from jax_sparse24._src import autotune, reference_ops

    cpus = jax.devices("cpu")
    if len(cpus) < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    monkeypatch.setattr(ffi, "cuda_kernels_available", lambda: True)
    monkeypatch.setattr(autotune, "weight_grad_path", lambda *a: autotune.WeightGradPath(CUTLASS, mvue=True))
    mesh = shd.make_mesh("data=8", devices=cpus[:8])
    # token shards of very different magnitudes: a scale taken per shard instead of over the whole
    # tensor would change the quantization of every shard but the largest
    skew = np.repeat(2.0 ** np.arange(-4, 4), 32)[:, None]
    x = (_rand(20, (256, 64), jnp.float32, 2.0) * skew).astype(jnp.bfloat16)
    g = (_rand(21, (256, 32), jnp.float32, 0.5) * skew[::-1]).astype(jnp.bfloat16)
    key = jax.random.key(7)
    s_x = jax.jit(f8.current_scale)(x)
    ns = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    f = jax.jit(lambda key, x, g, s: fp8_gemm.weight_grad_mvue(key, x, g, s, backend="cutlass"),
                in_shardings=(ns(), ns("data"), ns("data"), ns()), out_shardings=ns())
    hlo = f.lower(key, x, g, s_x).compile().as_text()
    assert "all-reduce" in hlo and "all-gather" not in hlo
    # On a GPU the same op calls the kernels on the shards: trace that branch with the kernels stubbed
    # (a CPU computes the reference branch) — they must see 32 local tokens, not the 256 global ones.
    calls = []

    def compress(key, gp, scale):
        calls.append(("mvue_compress", gp.shape))
        vs, ms = cf.fp8_compressed_shapes(gp.shape[1], gp.shape[0])
        return jnp.zeros(vs, jnp.float8_e4m3fn), jnp.zeros(ms, jnp.uint8)

    def quantize_t(xp, scale):
        calls.append(("quantize_transpose", xp.shape))
        return jnp.zeros(xp.shape[::-1], jnp.float8_e4m3fn)

    def spmm(values, meta, b, alpha, *, m, k, config=-1):
        calls.append(("spmm", m, b.shape[0], k))
        return jnp.zeros((b.shape[0], m), jnp.bfloat16)

    monkeypatch.setattr(cf, "fp8_mvue24_compress", compress)
    monkeypatch.setattr(cf, "fp8_quantize_transpose", quantize_t)
    monkeypatch.setattr(cf, "cutlass_spmm_fp8", spmm)
    real_pp = ffi.per_platform
    monkeypatch.setattr(ffi, "per_platform", lambda ref, cuda, *a, **kw: (cuda(*a), real_pp(ref, None, *a))[1])
    jax.jit(lambda key, x, g, s: fp8_gemm.weight_grad_mvue(key, x, g, s, backend="cutlass"),
            in_shardings=(ns(), ns("data"), ns("data"), ns()), out_shardings=ns()).lower(key, x, g, s_x).compile()
    flat = lambda c: [d for v in c[1:] for d in (v if isinstance(v, tuple) else (v,))]  # noqa: E731
    local = [c for c in calls if 256 not in flat(c)]  # (the partitioner also traces the op on global shapes)
    assert local == [("mvue_compress", (32, 32)), ("quantize_transpose", (32, 64)), ("spmm", 32, 64, 32)], calls
    monkeypatch.setattr(ffi, "per_platform", real_pp)
    dw = np.asarray(f(key, x, g, s_x).astype(jnp.float32))
    s_m = jax.jit(f8.mvue_scale)(g)  # as the op computes it (under jit XLA rounds amax/448 as amax·fl(1/448))
    want = np.zeros((64, 32), np.float32)
    for d in range(8):
        xd, gd = x[32 * d:32 * (d + 1)], g[32 * d:32 * (d + 1)]
        gs = reference_ops.mvue24(jax.random.fold_in(key, d), gd, axis=0)
        want += np.asarray(f8.scaled_matmul(f8.quantize(xd, s_x).T, f8.quantize(gs, s_m), s_x * s_m), np.float32)
    scale = np.abs(want).max()
    np.testing.assert_allclose(dw, want, rtol=0, atol=2 ** -6 * scale)  # bf16 partial sums, psum order
    assert np.abs(dw - want).max() < 2 ** -6 * scale and np.abs(want).max() > 0


# --- delayed scaling ------------------------------------------------------------------------------


def test_delayed_scale_and_history_are_flax_recipe():
    """delayed_scale / update_amax_history are Flax's fp8 recipe (flax.linen.fp8_ops, the oracle):
    the scale from the history's maximum, the stored scale where that is 0; the history rolled with
    the new amax at index 0; the collection is Flax's OVERWRITE_WITH_GRADIENT. Two deliberate
    differences: non-finite history entries are skipped (Flax would keep the stored scale for the whole
    window), and a stored scale of 0 or non-finite (a zeroed state) falls back to 1."""
    from flax.linen import fp8_ops

    assert f8.META_COLLECTION == fp8_ops.OVERWRITE_WITH_GRADIENT
    rng = np.random.default_rng(0)
    for hist in (rng.uniform(0, 5, 16), np.zeros(16), np.r_[0.0, rng.uniform(0, 5, 7)]):
        h = jnp.asarray(hist, jnp.float32)
        prev = jnp.asarray([0.37], jnp.float32)
        want = fp8_ops.compute_scale(jnp.max(h), prev, jnp.float32(f8.FP8_MAX))
        np.testing.assert_allclose(np.asarray(f8.delayed_scale(prev, h)), np.asarray(want).reshape(()), rtol=1e-7)
        x = jnp.asarray(rng.standard_normal((4, 8)) * 3, jnp.float32)
        np.testing.assert_array_equal(np.asarray(f8.update_amax_history(h, f8.amax(x))),
                                      np.asarray(fp8_ops.compute_amax_history(x, h)))
    assert float(f8.delayed_scale(jnp.ones((1,)), jnp.zeros(4))) == 1.0  # the first step: the stored scale
    # the differences: a non-finite amax in the history is skipped; a zero / non-finite stored scale gives 1
    for bad in (np.inf, np.nan):
        h = jnp.asarray([bad, 3.0, 1.0, 0.0], jnp.float32)
        np.testing.assert_allclose(float(f8.delayed_scale(jnp.ones((1,)), h)), 3.0 / f8.FP8_MAX, rtol=1e-7)
    for prev in (0.0, np.inf, np.nan):
        assert float(f8.delayed_scale(jnp.asarray([prev], jnp.float32), jnp.zeros(4))) == 1.0
    meta = f8.init_meta(8)
    assert set(meta) == set(f8.META_NAMES) and meta["input_scale"].shape == (1,) \
        and meta["output_grad_amax_history"].shape == (8,)
    with pytest.raises(ValueError, match="positive int"):
        f8.init_meta(0)
    a, b = f8.init_meta(4), f8.init_meta(4)
    a["input_amax_history"] = a["input_amax_history"].at[0].set(3.0)
    b["input_amax_history"] = b["input_amax_history"].at[0].set(5.0)
    assert float(f8.combine_meta(a, b)["input_amax_history"][0]) == 5.0  # max, never the sum
    # a layer whose new state is all zero (it got no gradient) keeps its old state; others update
    old = {"l1": f8.init_meta(4), "l2": f8.init_meta(4)}
    old["l1"]["kernel_amax_history"] = old["l1"]["kernel_amax_history"].at[0].set(7.0)
    new = {"l1": jax.tree.map(jnp.zeros_like, old["l1"]), "l2": dict(old["l2"], input_scale=jnp.full((1,), 0.5))}
    kept = f8.keep_unupdated(old, new)
    assert float(kept["l1"]["kernel_amax_history"][0]) == 7.0 and float(kept["l1"]["input_scale"][0]) == 1.0
    assert float(kept["l2"]["input_scale"][0]) == 0.5


def _delayed_case(dtype, key=None, backend="reference"):
    x, w, mask = _layer_case(dtype, t=48, i=64, o=32)
    w = w.astype(dtype)
    g = _rand(9, (48, 32), dtype, 1e-2)

    def run(meta):
        def f(w, meta):
            return s24.sparse24_linear(x, w, mask, key=key, fp8=True, fp8_meta=meta, backend=backend)

        y, vjp = jax.vjp(f, w, meta)
        dw, dmeta = vjp(g)
        return y, dw, dmeta

    return x, w, mask, g, run


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_delayed_scaling_layer_uses_history_scales_and_returns_the_new_state(dtype):
    """With fp8_meta the layer quantizes x, W̃ and ∇y with the scales of their amax histories (values
    above 448·s saturate), and the gradient with respect to fp8_meta is the new state: the scales used
    and each history with this call's amax at index 0."""
    x, w, mask, g, run = _delayed_case(dtype)
    wm = jnp.where(mask, w, 0)
    meta = f8.init_meta(4)
    hx, hw, hg = 0.5 * float(f8.amax(x)), 2.0 * float(f8.amax(wm)), float(f8.amax(g))  # x saturates
    meta = dict(meta, input_amax_history=meta["input_amax_history"].at[2].set(hx),
                kernel_amax_history=meta["kernel_amax_history"].at[1].set(hw),
                output_grad_amax_history=meta["output_grad_amax_history"].at[3].set(hg))
    y, dw, dmeta = jax.jit(run)(meta)
    s_x, s_w, s_g = (jnp.float32(h) / jnp.float32(f8.FP8_MAX) for h in (hx, hw, hg))
    want_y = f8.scaled_matmul(f8.quantize(x, s_x), f8.quantize(wm, s_w), s_x * s_w)
    # (one bfloat16 rounding of a float32 accumulation whose order jit may change: 1 ulp)
    np.testing.assert_allclose(np.asarray(y.astype(jnp.float32)), np.asarray(want_y.astype(jnp.float32)),
                               rtol=2.0**-7, atol=1e-6)
    assert float(jnp.max(jnp.abs(f8.quantize(x, s_x).astype(jnp.float32)))) == f8.FP8_MAX  # saturated
    for op, s, t in (("input", s_x, x), ("kernel", s_w, wm), ("output_grad", s_g, g)):
        np.testing.assert_allclose(np.asarray(dmeta[f"{op}_scale"]), np.full((1,), s, np.float32), rtol=1e-6)
        hist = np.asarray(meta[f"{op}_amax_history"])
        want = np.roll(hist, -1)
        want[0] = float(f8.amax(t))
        np.testing.assert_array_equal(np.asarray(dmeta[f"{op}_amax_history"]), want)
    # a history whose maximum is the tensor's amax gives current scaling's numbers exactly
    exact = dict(meta, input_amax_history=jnp.full((4,), f8.amax(x)),
                 kernel_amax_history=jnp.full((4,), f8.amax(wm)), output_grad_amax_history=jnp.full((4,), f8.amax(g)))
    y2, dw2, _ = jax.jit(run)(exact)
    yc, vjp = jax.vjp(lambda w: s24.sparse24_linear(x, w, mask, fp8=True, backend="reference"), w)
    np.testing.assert_array_equal(np.asarray(y2), np.asarray(yc))
    np.testing.assert_array_equal(np.asarray(dw2), np.asarray(vjp(g)[0]))
    assert not np.array_equal(np.asarray(y), np.asarray(yc))  # the saturated run differs


def test_delayed_scaling_mvue_weight_grad_and_dense_layer():
    """The MVUE weight gradient takes twice ∇y's delayed scale; fp8_dense_linear takes fp8_meta too."""
    key = jax.random.key(4)
    x, w, mask, g, run = _delayed_case(jnp.bfloat16, key=key)
    wm = jnp.where(mask, w, 0)
    exact = dict(f8.init_meta(2), input_amax_history=jnp.full((2,), f8.amax(x)),
                 kernel_amax_history=jnp.full((2,), f8.amax(wm)), output_grad_amax_history=jnp.full((2,), f8.amax(g)))
    _, dw, _ = jax.jit(run)(exact)
    _, vjp = jax.vjp(lambda w: s24.sparse24_linear(x, w, mask, key=key, fp8=True, backend="reference"), w)
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(vjp(g)[0]))
    half = dict(exact, output_grad_amax_history=exact["output_grad_amax_history"] * 0.25)  # s_g 4x smaller
    _, dw_half, _ = jax.jit(run)(half)
    assert not np.array_equal(np.asarray(dw_half), np.asarray(dw))
    y, vjp = jax.vjp(lambda w, m: s24.fp8.fp8_dense_linear(x, w, fp8_meta=m), w, exact)
    yc = s24.fp8.fp8_dense_linear(x, w)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(yc))
    assert set(vjp(g)[1]) == set(f8.META_NAMES)


def test_delayed_scaling_bad_input():
    x, w, mask = _layer_case(jnp.bfloat16)
    meta = f8.init_meta(4)
    with pytest.raises(ValueError, match="needs fp8=True"):
        s24.sparse24_linear(x, w, mask, fp8_meta=meta)
    with pytest.raises(ValueError, match="keys"):
        s24.sparse24_linear(x, w, mask, fp8=True, fp8_meta={"input_scale": jnp.ones(1)})
    with pytest.raises(ValueError, match=r"shape \(1,\)"):
        s24.sparse24_linear(x, w, mask, fp8=True, fp8_meta=dict(meta, kernel_scale=jnp.ones(3)))
    with pytest.raises(ValueError, match="1-D and non-empty"):
        s24.sparse24_linear(x, w, mask, fp8=True, fp8_meta=dict(meta, input_amax_history=jnp.ones((2, 2))))
    with pytest.raises(ValueError, match="float32"):
        s24.sparse24_linear(x, w, mask, fp8=True, fp8_meta=dict(meta, input_scale=jnp.ones(1, jnp.int32)))
    for kw, match in ((dict(fp8_scaling="delayed"), "needs fp8=True"), (dict(fp8=True, fp8_scaling="late"), "one of"),
                      (dict(fp8=True, fp8_scaling="delayed", amax_history_length=0), "positive int")):
        with pytest.raises(ValueError, match=match):
            s24.nn.Sparse24Dense(8, **kw).init(jax.random.key(0), jnp.ones((2, 16)))


def test_delayed_scaling_module_and_train_state():
    """Sparse24Dense(fp8_scaling='delayed') keeps its state in Flax's overwrite-with-gradient collection;
    SparseTrainState carries it (fp8_meta=), the loss is differentiated with respect to it and
    apply_gradients writes its gradient over it; forgetting either is a clear error."""
    import optax

    model = s24.nn.Sparse24Dense(32, fp8=True, fp8_scaling="delayed", amax_history_length=8)
    x = _rand(3, (4, 12, 64), jnp.float32)
    y = jnp.zeros((4, 12, 32))
    v = model.init(jax.random.key(0), x)
    meta0 = v[s24.nn.FP8_META]
    assert s24.nn.FP8_META == "_overwrite_with_gradient"
    assert jax.tree.map(jnp.shape, meta0) == jax.tree.map(jnp.shape, f8.init_meta(8))
    with pytest.raises(ValueError, match="_overwrite_with_gradient"):
        model.apply({"params": v["params"], "sparsity": v["sparsity"]}, x)
    with pytest.raises(ValueError, match="fp8_meta="):
        s24.training.SparseTrainState.create(apply_fn=model.apply, params={**v["params"], s24.nn.FP8_META: meta0},
                                             tx=optax.sgd(1e-2), sparsity=v["sparsity"])
    state = s24.training.SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=optax.adam(1e-3),
                                                 sparsity=v["sparsity"], rng=jax.random.key(1), fp8_meta=meta0)

    @jax.jit
    def step(state):
        loss_fn = lambda p, m: ((state.apply(x, params=p, fp8_meta=m) - y) ** 2).mean()  # noqa: E731
        loss, (g, new_meta) = jax.value_and_grad(loss_fn, argnums=(0, 1))(state.params, state.fp8_meta)
        return state.apply_gradients(grads=g, fp8_meta=new_meta), loss

    state1, _ = step(state)
    state2, _ = step(state1)
    assert float(state1.fp8_meta["input_scale"][0]) == 1.0  # step 0 had an empty history
    np.testing.assert_allclose(float(state2.fp8_meta["input_scale"][0]), float(f8.amax(x)) / f8.FP8_MAX, rtol=1e-6)
    assert float(state2.fp8_meta["output_grad_amax_history"][0]) > 0
    assert jax.tree.structure(state2) == jax.tree.structure(state)  # one pytree (jit, orbax)
    with pytest.raises(ValueError, match="pass fp8_meta="):
        state.apply_gradients(grads=jax.grad(lambda p: state.apply(x, params=p).sum())(state.params))


def test_delayed_scaling_layer_without_gradient_keeps_its_state():
    """A delayed-scaling layer whose output does not reach the loss gets a zero "gradient" for its
    state; apply_gradients keeps its old state instead of zeroing it (a zero stored scale would make
    the next forward divide by 0), while the other layer's state updates."""
    import optax
    from flax import linen as nn

    class Two(nn.Module):
        @nn.compact
        def __call__(self, x):
            a = s24.nn.Sparse24Dense(32, fp8=True, fp8_scaling="delayed", amax_history_length=4, name="a")(x)
            b = s24.nn.Sparse24Dense(32, fp8=True, fp8_scaling="delayed", amax_history_length=4, name="b")(x)
            return a + jax.lax.stop_gradient(b)  # b's output does not reach the loss's gradient

    model = Two()
    x = _rand(3, (8, 64), jnp.float32)
    v = model.init(jax.random.key(0), x)
    meta = v[s24.nn.FP8_META]
    meta = dict(meta, b=dict(meta["b"], input_amax_history=meta["b"]["input_amax_history"].at[0].set(5.0)))
    state = s24.training.SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=optax.sgd(1e-2),
                                                 sparsity=v["sparsity"], fp8_meta=meta)
    loss_fn = lambda p, m: (state.apply(x, params=p, fp8_meta=m) ** 2).mean()  # noqa: E731
    _, (g, new_meta) = jax.value_and_grad(loss_fn, argnums=(0, 1))(state.params, state.fp8_meta)
    assert float(new_meta["b"]["input_scale"][0]) == 0.0  # the zero cotangent
    state = state.apply_gradients(grads=g, fp8_meta=new_meta)
    assert float(state.fp8_meta["b"]["input_amax_history"][0]) == 5.0 and float(state.fp8_meta["b"]["input_scale"][0]) == 1.0
    assert float(state.fp8_meta["a"]["input_amax_history"][0]) > 0
    assert bool(jnp.isfinite(state.apply(x)).all())
