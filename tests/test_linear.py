"""sparse24_linear: forward, the custom VJP (STE / MVUE weight gradient), check_grads, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jax_sparse24 as s24


def _setup(t=12, i=16, o=8, seed=0, dtype=jnp.float32, transposable=True):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(t, i)), dtype)
    w = jnp.asarray(rng.normal(size=(i, o)), dtype)
    b = jnp.asarray(rng.normal(size=(o,)), dtype)
    m = s24.transposable_mask24(w) if transposable else s24.mask24(w, axis=0)
    return x, w, b, m


def test_forward_matches_masked_dense():
    x, w, b, m = _setup()
    y = s24.sparse24_linear(x, w, m, b)
    np.testing.assert_allclose(np.asarray(y), np.asarray(x @ (w * m) + b), rtol=1e-5, atol=1e-5)


def test_leading_batch_dims():
    x, w, b, m = _setup(t=12)
    xb = x.reshape(3, 4, 16)
    y = s24.sparse24_linear(xb, w, m, b)
    assert y.shape == (3, 4, 8)
    np.testing.assert_allclose(np.asarray(y.reshape(12, 8)), np.asarray(x @ (w * m) + b), rtol=1e-5, atol=1e-5)


def test_vjp_is_ste_without_key():
    x, w, b, m = _setup()
    g = jnp.asarray(np.random.default_rng(9).normal(size=(12, 8)), jnp.float32)
    _, vjp = jax.vjp(lambda x, w, b: s24.sparse24_linear(x, w, m, b), x, w, b)
    dx, dw, db = vjp(g)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(g @ (w * m).T), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dw), np.asarray(x.T @ g), rtol=1e-5, atol=1e-5)  # dense: straight-through
    np.testing.assert_allclose(np.asarray(db), np.asarray(g.sum(0)), rtol=1e-5)


@pytest.mark.parametrize("t", [12, 10])  # 10: tokens padded to a multiple of 4 for MVUE
def test_vjp_weight_grad_uses_mvue_along_tokens(t):
    x, w, b, m = _setup(t=t)
    g = jnp.asarray(np.random.default_rng(9).normal(size=(t, 8)), jnp.float32)
    key = jax.random.key(5)
    _, vjp = jax.vjp(lambda x, w: s24.sparse24_linear(x, w, m, b, key=key, backend="dense"), x, w)
    dx, dw = vjp(g)
    pad = (-t) % 4
    gp = jnp.concatenate([g, jnp.zeros((pad, 8))]) if pad else g
    xp = jnp.concatenate([x, jnp.zeros((pad, 16))]) if pad else x
    want = xp.T @ s24.mvue24(key, gp, axis=0)
    np.testing.assert_allclose(np.asarray(dw), np.asarray(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(g @ (w * m).T), rtol=1e-5, atol=1e-5)


def test_mvue_weight_grad_is_unbiased():
    # Fixed seed; a 5-sigma bound per element from the sample standard error of N independent draws.
    x, w, b, m = _setup(t=8, i=8, o=4, seed=2)
    g = jnp.asarray(np.random.default_rng(3).normal(size=(8, 4)), jnp.float32)

    def dw(key):
        _, vjp = jax.vjp(lambda w: s24.sparse24_linear(x, w, m, key=key, backend="dense"), w)
        return vjp(g)[0]

    n = 20000
    draws = np.asarray(jax.jit(jax.vmap(dw))(jax.random.split(jax.random.key(0), n)), np.float64)
    exact = np.asarray(x, np.float64).T @ np.asarray(g, np.float64)

    def within_bound(samples):
        mean = samples.mean(0)
        stderr = samples.std(0, ddof=1) / np.sqrt(len(samples))
        err = np.abs(mean - exact)
        return err <= 5.0 * stderr + 1e-4, err

    ok, err = within_bound(draws)
    assert ok.all(), err
    # A 10%-biased estimator fails the same bound: the test can fail.
    ok_biased, _ = within_bound(1.1 * draws)
    assert not ok_biased.all()


def test_check_grads_reference_path():
    x, w, b, m = _setup(t=4, i=8, o=4, seed=1)
    x, w, b = (a.astype(jnp.float64) if jax.config.jax_enable_x64 else a for a in (x, w, b))
    # x and bias: the exact gradient.
    check_grads(lambda x, b: s24.sparse24_linear(x, w, m, b), (x, b), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)
    # w: the STE gradient is exact for the kept entries, so parameterise w by them.
    idx = np.nonzero(np.asarray(m))

    def f(kept):
        wk = jnp.zeros_like(w).at[idx].set(kept)
        return s24.sparse24_linear(x, wk, m, b)

    check_grads(f, (w[idx],), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("backend", ["auto", "dense", "reference"])
def test_backends_agree_on_cpu(backend):
    x, w, b, m = _setup()
    y = s24.sparse24_linear(x, w, m, b, backend=backend)
    np.testing.assert_allclose(np.asarray(y), np.asarray(x @ (w * m) + b), rtol=1e-5, atol=1e-5)


def test_jit_vmap_grad():
    x, w, b, m = _setup()
    f = jax.jit(jax.grad(lambda w, x: s24.sparse24_linear(x, w, m, b).sum()))
    np.testing.assert_allclose(np.asarray(f(w, x)), np.asarray(x.T @ jnp.ones((12, 8))), rtol=1e-5)
    xs = jnp.stack([x, 2 * x])
    ys = jax.vmap(lambda x: s24.sparse24_linear(x, w, m, b))(xs)
    np.testing.assert_allclose(np.asarray(ys[1]), np.asarray(2 * x @ (w * m) + b), rtol=1e-5, atol=1e-5)


def test_bf16():
    x, w, b, m = _setup(dtype=jnp.bfloat16)
    y = s24.sparse24_linear(x, w, m, b)
    assert y.dtype == jnp.bfloat16
    ref = (x.astype(jnp.float32) @ (w * m).astype(jnp.float32) + b.astype(jnp.float32))
    assert float(jnp.linalg.norm(y.astype(jnp.float32) - ref) / jnp.linalg.norm(ref)) < 1e-2
    dw = jax.grad(lambda w: s24.sparse24_linear(x, w, m, b).astype(jnp.float32).sum())(w)
    assert dw.dtype == jnp.bfloat16


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda x, w, m: s24.sparse24_linear(x, w, jnp.ones_like(m)), "not 2:4"),
        (lambda x, w, m: s24.sparse24_linear(x[:, :8], w, m), "last axis must equal"),
        (lambda x, w, m: s24.sparse24_linear(x, w[:, :6], m), "same shape"),
        (lambda x, w, m: s24.sparse24_linear(x[:, :6], w[:6], m[:6]), r"divisible by 4.*\(6, 8\)"),
        (lambda x, w, m: s24.sparse24_linear(x.astype(jnp.int32), w, m), "floating-point"),
        (lambda x, w, m: s24.sparse24_linear(x, w, m, jnp.ones(3)), "bias must have shape"),
        (lambda x, w, m: s24.sparse24_linear(x, w, m, backend="magic"), "backend must be"),
        (lambda x, w, m: s24.sparse24_linear(x, w[None], m), "rank 2"),
    ],
)
def test_bad_input(call, match):
    x, w, b, m = _setup()
    with pytest.raises(ValueError, match=match):
        call(x, w, m)


def test_auto_backend_uses_the_exact_weight_grad_where_mvue_does_not_pay():
    """backend='auto' samples MVUE only to feed a faster sparse GEMM; on a CPU (no kernels) the
    weight gradient is the exact xᵀ·∇y even with a key, while backend='dense' samples MVUE."""
    x, w, b, m = _setup()
    g = jnp.asarray(np.random.default_rng(9).normal(size=(12, 8)), jnp.float32)
    key = jax.random.key(5)
    dws = {}
    for backend in ("auto", "dense"):
        _, vjp = jax.vjp(lambda w: s24.sparse24_linear(x, w, m, key=key, backend=backend), w)
        dws[backend] = np.asarray(vjp(g)[0])
    np.testing.assert_allclose(dws["auto"], np.asarray(x.T @ g), rtol=1e-5, atol=1e-5)
    assert np.abs(dws["dense"] - np.asarray(x.T @ g)).max() > 1e-2  # the MVUE sample differs


def test_exact_weight_grad_materialises_its_operands():
    """The exact weight gradient's GEMM reads materialised operands (an optimization barrier): XLA
    otherwise fused the producer of ∇y into a slow Triton GEMM fusion on the H100."""
    x, w, b, m = _setup()

    def dw(w):
        return jax.grad(lambda w: jnp.sum(jnp.concatenate([s24.sparse24_linear(x, w, m)] * 2, axis=1) ** 2))(w)

    text = jax.jit(dw).lower(w).as_text()
    assert "optimization_barrier" in text
    y_grad = 2 * 2 * (x @ (w * m))  # d/dy of sum(concat([y, y])**2)
    np.testing.assert_allclose(np.asarray(dw(w)), np.asarray(x.T @ y_grad), rtol=1e-4, atol=1e-4)


# --- prepared weights -------------------------------------------------------------------------


@pytest.mark.parametrize("transposable", [True, False])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_prepared_weight_gives_the_same_values_and_gradients(transposable, dtype):
    x, w, b, m = _setup(dtype=dtype, transposable=transposable)
    pw = s24.prepare_weight(w, m, tokens=x.shape[0], reuse=3)
    assert set(pw) == {"masked"} and pw["masked"].dtype == dtype  # a CPU: dense GEMMs on W̃

    def loss(x, w, b, pw):
        return jnp.sum(jnp.sin(s24.sparse24_linear(x, w, m, b, prepared=pw).astype(jnp.float32)))

    plain = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(x, w, b, None)
    prep = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(x, w, b, pw)
    for a, c in zip(jax.tree.leaves(plain), jax.tree.leaves(prep)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
    # under a gradient-accumulation scan, prepared once outside it
    xs = jnp.stack([x, 2 * x, -x])

    def accum(w, pw):
        def body(c, xb):
            return c + jax.grad(lambda w: loss(xb, w, b, pw))(w), None
        return jax.lax.scan(body, jnp.zeros_like(w), xs)[0]

    np.testing.assert_array_equal(np.asarray(jax.jit(accum)(w, None)), np.asarray(jax.jit(accum)(w, pw)))


def test_prepared_weight_is_what_the_gemms_use():
    """The forward and ∇x GEMMs read the prepared W̃ (not w ⊙ mask of this call); ∇w still comes
    from this call's x and ∇y and reaches w."""
    x, w, b, m = _setup()
    other = 3.0 * w
    pw = s24.prepare_weight(other, m, tokens=12)
    y = s24.sparse24_linear(x, w, m, prepared=pw)
    np.testing.assert_allclose(np.asarray(y), np.asarray(x @ (other * m)), rtol=1e-5, atol=1e-5)
    gx, gw = jax.grad(lambda x, w: s24.sparse24_linear(x, w, m, prepared=pw).sum(), (0, 1))(x, w)
    g = jnp.ones((12, 8))
    np.testing.assert_allclose(np.asarray(gx), np.asarray(g @ (other * m).T), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(x.T @ g), rtol=1e-5, atol=1e-5)
    # built inside the differentiated function: no gradient through the preparation
    gw2 = jax.grad(lambda w: s24.sparse24_linear(x, w, m, prepared=s24.prepare_weight(w, m, tokens=12)).sum())(w)
    np.testing.assert_allclose(np.asarray(gw2), np.asarray(x.T @ g), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda x, w, m: s24.sparse24_linear(x, w, m, prepared={"masked": (w * m)[:, :4]}), "must be W̃ of w's shape"),
        (lambda x, w, m: s24.sparse24_linear(x, w, m, prepared={"masked": (w * m).astype(jnp.bfloat16)}),
         "compute dtype float32"),
        (lambda x, w, m: s24.sparse24_linear(x, w, m, prepared={"weights": w}), "made by jax_sparse24.prepare_weight"),
        (lambda x, w, m: s24.sparse24_linear(x, w, m, prepared=w), "made by jax_sparse24.prepare_weight"),
        (lambda x, w, m: s24.sparse24_linear(x, w, m, prepared={"input_grad": {"values": w, "meta": w}}),
         "neither 'forward' nor 'masked'"),
        (lambda x, w, m: s24.sparse24_linear(x, w, m, prepared={"forward": {"cusparselt": w}, "masked": w * m}),
         "must be a 1-D uint8 buffer"),
        (lambda x, w, m: s24.sparse24_linear(x, w, m, prepared={"forward": {"cusparselt": jnp.zeros(64, jnp.uint8)},
                                                                 "masked": w * m}),
         "cuSPARSELt prepared weight computes in bfloat16/float16"),
        (lambda x, w, m: s24.sparse24_linear(x, w, m, prepared={"forward": {"packed": w}, "masked": w * m}),
         r"prepared\['forward'\]: a prepared operand must be"),
        (lambda x, w, m: s24.prepare_weight(w, m, tokens=0), "tokens must be a positive integer"),
        (lambda x, w, m: s24.prepare_weight(w, m, tokens=8, reuse=1.5), "reuse must be a positive integer"),
        (lambda x, w, m: s24.prepare_weight(w, jnp.ones_like(m), tokens=8), "not 2:4"),
        (lambda x, w, m: s24.prepare_weight(w[:6], m[:6], tokens=8), "divisible by 4"),
        (lambda x, w, m: s24.prepare_weight(w, m, tokens=8, dtype=jnp.int32), "floating dtype"),
        (lambda x, w, m: s24.prepare_weight(w, m, tokens=8, backend="fast"), "backend must be"),
    ],
)
def test_prepared_bad_input(call, match):
    x, w, b, m = _setup()
    with pytest.raises(ValueError, match=match):
        call(x, w, m)


# --- masks that are not 2:4 never reach a GEMM unnoticed (under jit too) ---------------------------------

def _bad_masks(w):
    """Masks a user could pass by mistake: all ones, 2:4 along the wrong axis (out), 2:4 only along in."""
    return {"ones": jnp.ones_like(w, bool), "wrong axis": s24.mask24(w, axis=-1),
            "in only": s24.mask24(w, axis=0)}


@pytest.mark.parametrize("case", ["ones", "wrong axis"])
@pytest.mark.parametrize("where", ["concrete", "jit"])
def test_mask_not_24_along_in_is_an_error(case, where):
    x, w, b, _ = _setup(i=32, o=16)
    m = _bad_masks(w)[case]
    match = r"`mask` is not 2:4 along axis 0 \(in\): \d+ of 128 group\(s\) of 4 keep more than 2"
    if where == "concrete":
        with pytest.raises(s24.MaskCheckError, match=match):
            s24.sparse24_linear(x, w, m, b)
    else:
        f = jax.jit(lambda x, w, m: s24.sparse24_linear(x, w, m, b))
        with pytest.raises(jax.errors.JaxRuntimeError, match=match):
            f(x, w, m).block_until_ready()


@pytest.mark.parametrize("where", ["concrete", "jit", "grad"])
def test_transposable_mask_is_checked_along_out(where):
    x, w, b, _ = _setup(i=32, o=16)
    m = _bad_masks(w)["in only"]
    assert int((np.asarray(m).reshape(32, 4, 4).sum(-1) > 2).sum()) > 0  # not 2:4 along out
    match = r"not 2:4 along axis 1 \(out, needed by transposable=True\)"
    f = lambda x, w, m: s24.sparse24_linear(x, w, m, b, transposable=True)  # noqa: E731
    if where == "concrete":
        with pytest.raises(s24.MaskCheckError, match=match):
            f(x, w, m)
        return
    if where == "grad":
        f = jax.grad(lambda x, w, m: (s24.sparse24_linear(x, w, m, b, transposable=True) ** 2).sum())
    with pytest.raises(jax.errors.JaxRuntimeError, match=match):
        jax.block_until_ready(jax.jit(f)(x, w, m))


def test_valid_traced_masks_pass_and_match():
    x, w, b, m = _setup(i=32, o=16)
    f = jax.jit(lambda x, w, m: s24.sparse24_linear(x, w, m, b, transposable=True))
    np.testing.assert_allclose(np.asarray(f(x, w, m)), np.asarray(x @ (w * m) + b), rtol=1e-5, atol=1e-5)
    m_in = s24.mask24(w, axis=0)
    g = jax.jit(lambda x, w, m: s24.sparse24_linear(x, w, m, b))
    np.testing.assert_allclose(np.asarray(g(x, w, m_in)), np.asarray(x @ (w * m_in) + b), rtol=1e-5, atol=1e-5)


def test_check_mask_false_skips_only_the_traced_check():
    x, w, b, _ = _setup(i=32, o=16)
    ones = jnp.ones_like(w, bool)
    y = jax.jit(lambda x, w, m: s24.sparse24_linear(x, w, m, b, check_mask=False))(x, w, ones)
    assert y.shape == (12, 16)  # on a CPU the dense reference: x·(w⊙m); on the sparse kernels undefined
    with pytest.raises(s24.MaskCheckError):  # a concrete mask is always checked
        s24.sparse24_linear(x, w, ones, b, check_mask=False)
    with pytest.raises(ValueError, match="check_mask must be True, False or 'nan'"):
        s24.sparse24_linear(x, w, _setup(i=32, o=16)[3], b, check_mask="yes")


def test_prepare_weight_and_to_sparse_check_traced_masks():
    _, w, _, _ = _setup(i=32, o=16)
    ones = jnp.ones_like(w, bool)
    with pytest.raises(jax.errors.JaxRuntimeError, match="prepare_weight: `mask` is not 2:4 along axis 0"):
        jax.block_until_ready(jax.jit(lambda w, m: s24.prepare_weight(w, m, tokens=8))(w, ones))
    with pytest.raises(jax.errors.JaxRuntimeError, match="to_sparse: `mask` is not 2:4 along axis 1"):
        jax.block_until_ready(jax.jit(lambda w, m: s24.to_sparse(w, m).values)(w, ones))


def test_layers_trust_their_own_masks_without_a_device_check():
    """A Sparse24Dense step's masks are the library's: no host callback in the jitted program."""
    x = jnp.ones((4, 32))
    layer = s24.nn.Sparse24Dense(16)
    v = layer.init(jax.random.key(0), x)
    text = jax.jit(lambda v, x: layer.apply(v, x)).lower(v, x).as_text()
    assert "callback" not in text
    text = jax.jit(lambda x, w, m: s24.sparse24_linear(x, w, m)).lower(
        x, v["params"]["kernel"], v["sparsity"]["transposable_mask"]).as_text()
    assert "callback" in text  # ...while a mask passed in by the user is checked


@pytest.mark.parametrize("transposable", [False, True])
def test_check_mask_nan_poisons_the_output_of_a_bad_traced_mask(transposable):
    x, w, b, good = _setup(i=32, o=16)
    bad = s24.mask24(w, axis=0) if transposable else jnp.ones_like(w, bool)
    f = jax.jit(lambda x, w, m: s24.sparse24_linear(x, w, m, b, transposable=transposable, check_mask="nan"))
    assert np.isnan(np.asarray(f(x, w, bad))).all()
    np.testing.assert_allclose(np.asarray(f(x, w, good)), np.asarray(x @ (w * good) + b), rtol=1e-5, atol=1e-5)
    assert "callback" not in jax.jit(f).lower(x, w, good).as_text()  # no host round trip
    with pytest.raises(s24.MaskCheckError):  # a concrete mask still raises at trace time
        s24.sparse24_linear(x, w, bad, b, transposable=transposable, check_mask="nan")
