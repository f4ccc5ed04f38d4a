"""GPU tests of the fp8 (float8_e4m3fn) 2:4 kernels (``cuda_fp8_ops``) and ``sparse24_linear(fp8=True)``.

Run on the H100: ``pytest -m gpu tests/test_gpu_fp8.py -v``. Skipped without a GPU/extension, and
per test where the extension has no fp8 kernels.

Oracles (the single definition of the math is ``jax_sparse24._src.fp8_math``):

* ``fp8_masked_compress`` against CUTLASS's own compressor on float8_e4m3fn applied to the reference
  quantization, ``cutlass_compress(quantize(x ⊙ mask, s))`` — **bit for bit** (values and metadata,
  padding included), outputs written into donated buffers poisoned first (NaN values, 0xFF metadata).
* ``fp8_mvue24_compress`` against CUTLASS's compressor applied to the reference quantization of the
  element-wise MVUE kernel's sample, ``cutlass_compress(quantize(mvue24_cuda(key, g, axis=0), s).T)``
  (same draws) — bit for bit, poisoned outputs; ``fp8_quantize_transpose`` against ``quantize(x, s).T``.
* ``cutlass_spmm_fp8`` against a float64 product of the same e4m3 operands times alpha: the kernel's
  errors are its accumulation and the one rounding to bfloat16 (2^-8 relative). Hopper's fp8 tensor
  cores accumulate with fewer bits than float32 between promotions to float32 registers (about 14,
  DeepSeek-V3 report §3.3.2; the "fastaccum" configurations never promote), so the accumulation
  term is ACC_REL (2^-12) of Σ|terms| rather than K·2^-24 — still far below what a wrong or stale
  tile gives. Checked elementwise plus the relative Frobenius error, every configuration, poisoned
  outputs.
* ``sparse24_linear(fp8=True)`` on the GPU against the same op lowered to the CPU reference (XLA's fp8
  math on the CPU device): same quantized operands, so the same elementwise bound. With an MVUE key
  the GPU's sparse fp8 weight gradient against ``backend="dense"`` on the GPU (the same draws through
  XLA's fp8 dot), the same bound.
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

import jax_sparse24 as s24  # noqa: E402
from jax_sparse24._src import cuda_fp8_ops as cf  # noqa: E402
from jax_sparse24._src import cuda_mask_ops as cm  # noqa: E402
from jax_sparse24._src import cuda_spmm_ops as cs  # noqa: E402
from jax_sparse24._src import fp8_math as f8  # noqa: E402
from gpu_util import assert_same_compressed, gpu, mask24_np, poisoned, quantize_on_cpu  # noqa: E402
from gpu_util import fresh_rng as _rng  # noqa: E402

FP8 = jnp.float8_e4m3fn
# (R, C) of x: both directions compress (M % 8, K % 32 both ways). M not a multiple of 64 and K not
# a multiple of 128 (metadata padding), the smallest legal shape, a multi-tile shape.
SHAPES = [(160, 224), (32, 32), (96, 416), (544, 384)]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]
IN_DTYPES = [jnp.bfloat16, jnp.float32, jnp.float16]


@pytest.fixture(autouse=True)
def _need_fp8_kernels():
    if not cf.fp8_kernels_built():
        pytest.skip("the extension has no fp8 kernels (cutlass_configs_fp8 missing or empty)")


def _x(rng, shape, dtype):
    """Normal values with exact zeros, -0.0, ties and a spread of magnitudes (never all zero)."""
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(rng.uniform(0.5, 30.0))
    u = rng.random(shape)
    x = np.where(u < 0.04, np.float32(0.0), x)
    x = np.where((u >= 0.04) & (u < 0.06), np.float32(-0.0), x)
    x = np.where((u >= 0.06) & (u < 0.08), np.float32(1e-6), x)  # below e4m3's range after scaling
    return jnp.asarray(x, dtype)


def assert_same_fp8_compressed(got, ref, what: str):
    assert got[0].dtype == FP8, f"{what}: values dtype {got[0].dtype}"
    assert_same_compressed(got, ref, what)


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_fp8_masked_compress_bit_exact(shape, dtype):
    rng, seed = _rng()
    x = _x(rng, shape, dtype)
    mask = cm.transposable_mask24_cuda(x.astype(jnp.bfloat16)) & jnp.asarray(rng.random(shape) > 0.1)
    xm = jnp.where(mask, x, jnp.zeros((), dtype))
    for s in (f8.current_scale(xm), jnp.float32(rng.uniform(1e-3, 0.3)), jnp.float32(1.0)):
        q = quantize_on_cpu(xm, s)  # the reference quantization (float32 math, RNE, saturating)
        for transposed in (True, False):
            ref = jax.jit(cs.cutlass_compress)(q.T if transposed else q)
            got = poisoned(functools.partial(cf.fp8_masked_compress, transposed=transposed))(x, mask, s)
            assert_same_fp8_compressed(got, ref, f"seed={seed} shape={shape} {jnp.dtype(dtype).name} "
                                             f"s={float(s)} transposed={transposed}")


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_fp8_packed_compress_is_masked_compress_of_the_unpacked_weight(shape, dtype):
    """``fp8_packed_compress`` of ``pack24(x, mask)`` (an FSDP weight gathered packed) equals
    ``fp8_masked_compress`` of ``unpack24`` of it bit for bit, into poisoned outputs: both directions with a
    transposable mask; the forward's (groups along rows) also with a mask that keeps 3 or 4 of some row
    groups (the packing keeps their first two)."""
    from jax_sparse24._src import packed24

    if shape[0] % 8:
        pytest.skip("the packing needs rows % 8 == 0")
    rng, seed = _rng()
    x = _x(rng, shape, dtype)
    tmask = cm.transposable_mask24_cuda(x.astype(jnp.bfloat16)) & jnp.asarray(rng.random(shape) > 0.1)
    over = tmask | jnp.asarray(rng.random(shape) < 0.1)
    s = jnp.float32(rng.uniform(1e-3, 0.3))
    compared = 0
    for name, mask, directions in (("transposable", tmask, (True, False)), ("over-full", over, (True,))):
        values, bits = jax.jit(packed24.pack24)(x, mask)
        xu, mu = jax.jit(packed24.unpack24)(values, bits)
        for transposed in directions:
            if not cf.fp8_compress_supports(shape, dtype, transposed=transposed):
                continue
            ref = jax.jit(functools.partial(cf.fp8_masked_compress, transposed=transposed))(xu, mu, s)
            got = poisoned(functools.partial(cf.fp8_packed_compress, transposed=transposed))(values, bits, s)
            assert_same_fp8_compressed(got, ref, f"seed={seed} shape={shape} {jnp.dtype(dtype).name} {name} "
                                             f"transposed={transposed}")
            compared += 1
    assert compared >= 1, f"shape {shape}: no direction the fp8 compressor takes"


def test_fp8_masked_compress_saturates_and_keeps_nan():
    """Values beyond ±448·s saturate, a NaN stays NaN (as ``fp8.quantize``), bit for bit."""
    rng, seed = _rng()
    x = np.array(_x(rng, (64, 128), jnp.float32))  # a writable copy
    x[0, :8] = [1e9, -1e9, np.inf, -np.inf, np.nan, 449.0, -448.5, 5.0]
    mask = mask24_np(np.nan_to_num(x), axis=1)
    mask[0, :8] = [True, False, True, False, True, True, False, False]  # keep 1e9, inf, NaN, 449
    x, mask = jnp.asarray(x), jnp.asarray(mask)
    s = jnp.float32(1.0)
    ref = cs.cutlass_compress(quantize_on_cpu(jnp.where(mask, x, 0.0), s))
    got = poisoned(functools.partial(cf.fp8_masked_compress, transposed=False))(x, mask, s)
    # NaN payloads: compare bytes; e4m3fn has one NaN pattern per sign (0x7F / 0xFF)
    assert_same_fp8_compressed(got, ref, f"seed={seed}")


def _nonzero_fp8(rng, shape, scale=1.0):
    x = rng.standard_normal(shape).astype(np.float32) * scale
    x = np.where(np.abs(x) < 1e-2, np.float32(0.5), x)
    return jnp.asarray(x).astype(FP8)


#: Accumulation error bound of the fp8 tensor-core GEMM, relative to Σ|terms| (see the docstring).
ACC_REL = 2.0**-12


def _check_gemm(d, qa, qb, alpha, what, roundings=1):
    """d (n, m) bf16 vs float64 b @ a.T · alpha: ``roundings`` bf16 roundings + float32 accumulation."""
    a, b = np.asarray(qa.astype(jnp.float32), np.float64), np.asarray(qb.astype(jnp.float32), np.float64)
    exact = (b @ a.T) * float(alpha)
    terms = (np.abs(b) @ np.abs(a).T) * float(alpha)
    got = np.asarray(jnp.asarray(d).astype(jnp.float32), np.float64)
    assert d.dtype == jnp.bfloat16 and got.shape == exact.shape, f"{what}: {d.dtype} {got.shape}"
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    tol = roundings * 2.0**-8 * np.abs(exact) + ACC_REL * terms + 1e-30
    bad = np.abs(got - exact) > tol
    if bad.any():
        r, c = np.nonzero(bad)
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} off, first ({r[0]}, {c[0]}): {got[r[0], c[0]]} vs "
                             f"{exact[r[0], c[0]]}; rows {np.unique(r)[:8]}")
    rel = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert rel < 2.0**-7, f"{what}: relative Frobenius error {rel:.3g}"


# (M, N, K) of the fp8 GEMM: partial tiles, M not % 64, K not % 128, long K, the smallest legal one.
GEMM_SHAPES = [(256, 128, 128), (264, 144, 160), (1024, 528, 512), (384, 256, 3072), (8, 16, 32)]


@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cutlass_spmm_fp8_every_config(shape):
    m, n, k = shape
    rng, seed = _rng()
    a = _nonzero_fp8(rng, (m, k), 8.0)
    a = jnp.where(jnp.asarray(mask24_np(np.asarray(a.astype(jnp.float32)), axis=1)), a, jnp.zeros((), FP8))
    b = _nonzero_fp8(rng, (n, k), 8.0)
    alpha = jnp.float32(rng.uniform(1e-4, 1e-2))
    values, meta = jax.jit(cs.cutlass_compress)(a)
    for config in [-1, *range(len(cf.cutlass_configs_fp8()))]:
        d = poisoned(functools.partial(cf.cutlass_spmm_fp8, m=m, k=k, config=config))(values, meta, b, alpha)
        name = "default" if config == -1 else cf.cutlass_configs_fp8()[config]
        _check_gemm(d, a, b, alpha, f"seed={seed} shape={shape} config={name}")


def test_fp8_compress_then_gemm_round_trip():
    """fused compress (forward operand q(W̃)ᵀ) + GEMM with b = I and alpha = 1 gives q(W̃) back exactly."""
    rng, seed = _rng()
    i, o = 128, 64
    w = _x(rng, (i, o), jnp.bfloat16)
    mask = cm.transposable_mask24_cuda(w)
    s = f8.current_scale(jnp.where(mask, w, 0))
    values, meta = cf.fp8_masked_compress(w, mask, s, transposed=True)  # A = q(W̃)ᵀ (o, i)
    eye = jnp.eye(i, dtype=jnp.float32).astype(FP8)
    d = poisoned(functools.partial(cf.cutlass_spmm_fp8, m=o, k=i))(values, meta, eye, jnp.float32(1.0))
    want = quantize_on_cpu(jnp.where(mask, w, 0), s).astype(jnp.float32)  # (i, o) = D (n=i, m=o)
    np.testing.assert_array_equal(np.asarray(d.astype(jnp.float32)), np.asarray(want), err_msg=f"seed={seed}")


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])  # 2- and 4-word keys
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_fp8_mvue24_compress_bit_exact(shape, dtype, impl):
    rng, seed = _rng()
    g = _x(rng, shape, dtype)
    key = jax.random.key(int(rng.integers(1 << 30)), impl=impl)
    sample = jax.jit(functools.partial(cm.mvue24_cuda, axis=0))(key, g)  # the element-wise kernel's draws
    for s in (f8.mvue_scale(g), jnp.float32(rng.uniform(1e-3, 0.3)), jnp.float32(1.0)):
        ref = jax.jit(cs.cutlass_compress)(quantize_on_cpu(sample, s).T)
        got = poisoned(cf.fp8_mvue24_compress)(key, g, s)
        assert_same_fp8_compressed(got, ref, f"seed={seed} shape={shape} {jnp.dtype(dtype).name} s={float(s)}")
    # the sample's scale covers it: nothing saturates at 448 except a value of exactly 2·max|g|
    q = np.abs(np.asarray(f8.quantize(sample, f8.mvue_scale(g)).astype(jnp.float32)))
    big = np.abs(np.asarray(sample, np.float32)) >= 0.999 * 2 * float(jnp.max(jnp.abs(g.astype(jnp.float32))))
    assert not ((q == 448) & ~big).any(), f"seed={seed}"


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", [(160, 224), (16, 8), (96, 416), (4112, 520)], ids=lambda s: "x".join(map(str, s)))
def test_fp8_quantize_transpose_bit_exact(shape, dtype):
    """q(x)ᵀ against fp8.quantize then a transpose, partial tiles included, poisoned output."""
    rng, seed = _rng()
    x = _x(rng, shape, dtype)
    for s in (f8.current_scale(x), jnp.float32(rng.uniform(1e-3, 0.3))):
        ref = np.asarray(quantize_on_cpu(x, s).T).view(np.uint8)
        got = np.asarray(poisoned(cf.fp8_quantize_transpose)(x, s)).view(np.uint8)
        assert got.shape == ref.shape and np.array_equal(got, ref), f"seed={seed} shape={shape} s={float(s)}"


# --- the layer on the GPU vs the same op on the CPU -------------------------------------------------


@pytest.mark.parametrize("transposable", [True, False], ids=["transposable", "plain-mask"])
@pytest.mark.parametrize("tio", [(256, 512, 384), (272, 160, 96)], ids=["aligned", "partial-tiles"])
def test_sparse24_linear_fp8_gpu_matches_cpu_reference(tio, transposable):
    t, i, o = tio
    rng, seed = _rng()
    w = jnp.asarray(rng.standard_normal((i, o)).astype(np.float32) * 0.05)
    mask = s24.transposable_mask24(w) if transposable else s24.mask24(w, axis=0)
    x = jnp.asarray(rng.standard_normal((t, i)).astype(np.float32)).astype(jnp.bfloat16)
    g = jnp.asarray(rng.standard_normal((t, o)).astype(np.float32) * 1e-3).astype(jnp.bfloat16)
    w = w.astype(jnp.bfloat16)
    plan = s24.linear_plan(t, i, o, jnp.bfloat16, transposable=transposable, fp8=True)
    assert plan["forward"] == "cutlass (fp8)", plan  # every shape here is aligned for the kernel
    assert plan["input_grad"] == ("cutlass (fp8)" if transposable else "xla (fp8)"), plan

    def run(x, w, g):
        y, vjp = jax.vjp(lambda x, w: s24.sparse24_linear(x, w, mask, transposable=transposable, fp8=True), x, w)
        return (y,) + vjp(g)

    cpu = jax.devices("cpu")[0]
    y, dx, dw = jax.jit(run)(*jax.device_put((x, w, g), gpu()))
    yc, dxc, dwc = jax.jit(run)(*jax.device_put((x, w, g), cpu))
    wm = jnp.where(mask, w, 0)
    s_x, s_w, s_g = (float(f8.current_scale(a)) for a in (x, wm, g))
    terms_y = np.abs(np.asarray(f8.quantize(x, s_x).astype(jnp.float32), np.float64)) @ np.abs(
        np.asarray(f8.quantize(wm, s_w).astype(jnp.float32), np.float64)) * s_x * s_w
    terms_dx = np.abs(np.asarray(f8.quantize(g, s_g).astype(jnp.float32), np.float64)) @ np.abs(
        np.asarray(f8.quantize(wm, s_w).astype(jnp.float32), np.float64)).T * s_g * s_w
    for got, ref, terms, k, name in ((y, yc, terms_y, i, "y"), (dx, dxc, terms_dx, o, "dx")):
        _assert_same_product(got, ref, terms, k, f"seed={seed} {name}")
    # without a key the weight gradient is the 16-bit GEMM (cuBLAS vs CPU): bf16 tolerance
    np.testing.assert_allclose(np.asarray(dw, np.float32), np.asarray(dwc, np.float32), rtol=2e-2,
                               atol=2e-2 * float(jnp.max(jnp.abs(dwc.astype(jnp.float32)))), err_msg=f"seed={seed}")


def _terms(x, s_x, g, s_g):
    """|q(x)|ᵀ·|q(g)|·s_x·s_g in float64: the scale of the weight gradient's accumulation error."""
    qx = np.abs(np.asarray(f8.quantize(x, s_x).astype(jnp.float32), np.float64))
    qg = np.abs(np.asarray(f8.quantize(g, s_g).astype(jnp.float32), np.float64))
    return qx.T @ qg * float(s_x) * float(s_g)


def _assert_same_product(got, ref, terms, k, what):
    """Two bf16 roundings of the same exact fp8 product: 2 bf16 ulps + both accumulations."""
    got = np.asarray(jnp.asarray(got).astype(jnp.float32), np.float64)
    ref = np.asarray(jnp.asarray(ref).astype(jnp.float32), np.float64)
    tol = 2.0**-7 * np.abs(ref) + (ACC_REL + (k + 2) * 2.0**-24) * terms + 1e-30
    bad = np.abs(got - ref) > tol
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} elements off"


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("tio", [(256, 512, 384), (272, 160, 96)], ids=["aligned", "padded-tokens"])
def test_sparse24_linear_fp8_mvue_weight_grad_matches_xla(tio, dtype):
    """With a key, backend='cutlass' runs the fused MVUE compressor + sparse fp8 GEMM (T padded to 32;
    auto does where the 16-bit planner runs the sparse MVUE gradient: large shapes); the same sample
    through XLA's fp8 dot (backend='dense' on the GPU: same draws) gives the same product, in every
    compute dtype the compressor takes."""
    t, i, o = tio
    rng, seed = _rng()
    w = jnp.asarray(rng.standard_normal((i, o)).astype(np.float32) * 0.05)
    mask = s24.transposable_mask24(w)
    x = jnp.asarray(rng.standard_normal((t, i)).astype(np.float32)).astype(dtype)
    g = jnp.asarray(rng.standard_normal((t, o)).astype(np.float32) * 1e-3).astype(dtype)
    w = w.astype(dtype)
    key = jax.random.key(int(rng.integers(1 << 30)))
    assert s24.linear_plan(t, i, o, dtype, fp8=True, backend="cutlass")["weight_grad"] == "cutlass (fp8, MVUE)"

    def dw_of(x, w, g, backend):
        _, vjp = jax.vjp(lambda w: s24.sparse24_linear(x, w, mask, key=key, fp8=True, backend=backend), w)
        return vjp(g)[0]

    x, w, g = jax.device_put((x, w, g), gpu())
    got = jax.jit(dw_of, static_argnums=3)(x, w, g, "cutlass")
    ref = jax.jit(dw_of, static_argnums=3)(x, w, g, "dense")
    sample = cm.mvue24_cuda(key, g, axis=0)
    _assert_same_product(got, ref, _terms(x, f8.current_scale(x), sample, f8.mvue_scale(g)), t, f"seed={seed} dw")
    # and it is an MVUE gradient, not the exact one (a path that ignored the key would fail here);
    # the 7B shapes plan it under auto
    assert s24.linear_plan(16384, 4096, 11008, jnp.bfloat16, fp8=True)["weight_grad"] == "cutlass (fp8, MVUE)"
    _, vjp = jax.vjp(lambda w: s24.sparse24_linear(x, w, mask, fp8=True), w)
    assert not np.array_equal(np.asarray(got), np.asarray(vjp(g)[0]))


def test_sparse24_linear_fp8_delayed_scaling_on_the_kernels():
    """Delayed scaling on the GPU kernels (forward, ∇x, the fp8 MVUE ∇W): with amax histories whose
    maxima are the tensors' own amaxes the scales equal current scaling's, so the outputs and
    gradients are bit-identical to the current-scaling run on the GPU; a history half as large
    saturates x (different numbers); the new state holds this call's amaxes."""
    rng, seed = _rng()
    t, i, o = 256, 512, 384
    w = jnp.asarray(rng.standard_normal((i, o)).astype(np.float32) * 0.05)
    mask = s24.transposable_mask24(w)
    x = jnp.asarray(rng.standard_normal((t, i)).astype(np.float32)).astype(jnp.bfloat16)
    g = jnp.asarray(rng.standard_normal((t, o)).astype(np.float32) * 1e-3).astype(jnp.bfloat16)
    w = w.astype(jnp.bfloat16)
    key = jax.random.key(int(rng.integers(1 << 30)))
    x, w, g = jax.device_put((x, w, g), gpu())
    wm = jnp.where(mask, w, 0)
    amax = {"input": f8.amax(x), "kernel": f8.amax(wm), "output_grad": f8.amax(g)}
    meta = {n: (jnp.ones((1,), jnp.float32) if n.endswith("_scale") else
                jnp.full((4,), amax[n.rsplit("_amax_history")[0]], jnp.float32)) for n in f8.META_NAMES}

    def run(x, w, meta):
        f = lambda x, w, m: s24.sparse24_linear(x, w, mask, key=key, fp8=True, fp8_meta=m, backend="cutlass")  # noqa: E731
        y, vjp = jax.vjp(f, x, w, meta)
        return (y,) + vjp(g)

    def run_current(x, w):
        y, vjp = jax.vjp(lambda x, w: s24.sparse24_linear(x, w, mask, key=key, fp8=True, backend="cutlass"), x, w)
        return (y,) + vjp(g)

    y, dx, dw, new = jax.jit(run)(x, w, meta)
    for a, b, name in zip((y, dx, dw), jax.jit(run_current)(x, w), ("y", "dx", "dw")):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"seed={seed} {name}")
    for op, a in amax.items():
        assert float(new[f"{op}_amax_history"][0]) == float(a), op
    half = dict(meta, input_amax_history=meta["input_amax_history"] * 0.5)
    assert not np.array_equal(np.asarray(jax.jit(run)(x, w, half)[0]), np.asarray(y))


def test_fp8_kernel_errors_name_the_constraint():
    x = jnp.ones((64, 48), jnp.bfloat16)
    with pytest.raises(ValueError, match="K % 32 == 0"):
        cf.fp8_masked_compress(x, x != 0, jnp.float32(1.0))
    with pytest.raises(ValueError, match=r"unpacked weight x of shape \(64, 48\).*K % 32 == 0"):
        cf.fp8_packed_compress(jnp.ones((32, 48), jnp.bfloat16), jnp.zeros((8, 48), jnp.uint8), jnp.float32(1.0))
    with pytest.raises(ValueError, match=r"bits must be uint8 of shape \(rows / 8, cols\) = \(8, 64\)"):
        cf.fp8_packed_compress(jnp.ones((32, 64), jnp.bfloat16), jnp.zeros((4, 64), jnp.uint8), jnp.float32(1.0))
    a = jnp.ones((64, 64), FP8)
    values, meta = cs.cutlass_compress(jnp.where(jnp.asarray(mask24_np(np.ones((64, 64)))), a, jnp.zeros((), FP8)))
    with pytest.raises(ValueError, match="n % 16 == 0"):
        cf.cutlass_spmm_fp8(values, meta, jnp.ones((40, 64), FP8), jnp.float32(1.0), m=64, k=64)
    with pytest.raises(ValueError, match="must be float8_e4m3fn"):
        cf.cutlass_spmm_fp8(values, meta, jnp.ones((32, 64), jnp.bfloat16), jnp.float32(1.0), m=64, k=64)
    assert cf.cutlass_alignment_fp8() == (8, 16, 32)
