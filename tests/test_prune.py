"""Tests of jax_sparse24.prune (CPU): pattern parsing, masks against the reference ops and
brute-force numpy, prune_trained, keep_pruned and channel permutation."""

from __future__ import annotations

import itertools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jax_sparse24 import prune
from jax_sparse24._src import prune_impl
from jax_sparse24._src import reference_ops


def _rand(shape, seed=0, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32), dtype)


# ---------------------------------------------------------------------------------------------
# parsing


@pytest.mark.parametrize(
    "name, n, m, kind, extra",
    [
        ("m4n2_1d", 2, 4, "1d", None),
        ("m4n2_1d_best", 2, 4, "1d", None),
        ("m32n3_1d_greedy", 3, 32, "1d", None),
        ("m16n1_1d", 1, 16, "1d", None),
        ("m4n2_2d_best", 2, 4, "2d_best", None),
        ("m8n4_2d_greedy", 4, 8, "2d_greedy", None),
        ("m4n2_1d_v8", 2, 4, "vector", 8),
        ("m8n2_1d_b4x16", 2, 8, "block", (4, 16)),
    ],
)
def test_parse_good_names(name, n, m, kind, extra):
    spec = prune.parse_pattern(name)
    assert (spec.name, spec.n, spec.m, spec.kind) == (name, n, m, kind)
    if kind == "vector":
        assert spec.v == extra
    if kind == "block":
        assert spec.block == extra


@pytest.mark.parametrize(
    "name, needle",
    [
        ("m4n2", "does not follow the grammar"),
        ("", "does not follow the grammar"),
        ("M4N2_1d", "does not follow the grammar"),
        (" m4n2_1d", "does not follow the grammar"),
        ("m4n2_3d", "does not follow the grammar"),
        ("m4n2_1d_fast", "does not follow the grammar"),
        ("m4n4_1d", "1 <= N < M"),
        ("m4n6_1d", "1 <= N < M"),
        ("m4n0_1d", "1 <= N < M"),
        ("m33n2_1d", "M <= 32"),
        ("m1n0_1d", "2 <= M"),
        ("m4n2_2d", "_2d_best"),
        ("m4n2_2d_best_v4", "only for 1d"),
        ("m4n2_1d_v0", "V must be >= 1"),
        ("m4n2_1d_b0x4", "block sizes"),
    ],
)
def test_parse_bad_names(name, needle):
    with pytest.raises(ValueError) as e:
        prune.parse_pattern(name)
    msg = str(e.value)
    assert repr(name) in msg and needle in msg
    assert "m{M}n{N}_1d" in msg  # the grammar is spelled out


def test_parse_non_string():
    with pytest.raises(ValueError, match="must be a str"):
        prune.parse_pattern(42)


# ---------------------------------------------------------------------------------------------
# 1-D


@pytest.mark.parametrize("n, m", [(2, 4), (1, 4), (3, 8), (4, 16), (3, 32)])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_1d_equals_reference(n, m, axis, dtype):
    x = _rand((64, 96), seed=n + m, dtype=dtype)
    got = prune.mask_from_pattern(x, f"m{m}n{n}_1d", axis=axis)
    np.testing.assert_array_equal(got, reference_ops.nm_mask(x, n, m, axis))
    assert got.dtype == jnp.bool_


def test_1d_best_and_greedy_are_the_exact_1d_mask():
    x = _rand((32, 8), seed=1)
    for name in ("m8n3_1d_best", "m8n3_1d_greedy"):
        np.testing.assert_array_equal(prune.mask_from_pattern(x, name), reference_ops.nm_mask(x, 3, 8, 0))


def test_default_axis_is_flax_input_axis():
    w = _rand((8, 12))
    np.testing.assert_array_equal(prune.mask_from_pattern(w, "m4n2_1d"), reference_ops.mask24(w, axis=0))


@pytest.mark.parametrize(
    "pattern, shape, needles",
    [
        ("m4n2_1d", (6, 8), ["'m4n2_1d'", "(6, 8)", "axis 0", "not divisible by 4"]),
        ("m4n2_2d_best", (8, 6), ["'m4n2_2d_best'", "axis 1", "not divisible by 4"]),
        ("m4n2_2d_greedy", (8, 8, 4), ["2-D"]),
        ("m4n2_1d_v3", (8, 8), ["axis 1", "vectors of 3"]),
        ("m4n2_1d_b2x2", (4, 8), ["block grid (2, 4)", "groups of 4 blocks"]),
    ],
)
def test_shape_errors_name_pattern_and_constraint(pattern, shape, needles):
    with pytest.raises(ValueError) as e:
        prune.mask_from_pattern(jnp.ones(shape), pattern)
    for s in needles:
        assert s in str(e.value)


def test_non_float_rejected():
    with pytest.raises(ValueError, match="floating-point"):
        prune.mask_from_pattern(jnp.ones((8, 8), jnp.int32), "m4n2_1d")


# ---------------------------------------------------------------------------------------------
# 2-D


def _blocks_np(x, m):
    r, c = x.shape
    return np.abs(np.asarray(x, np.float64)).reshape(r // m, m, c // m, m).transpose(0, 2, 1, 3)


def _row_col_counts(mask, m):
    b = np.asarray(mask).reshape(mask.shape[0] // m, m, mask.shape[1] // m, m).transpose(0, 2, 1, 3)
    return b.sum(-1), b.sum(-2)  # per block: row counts, column counts


@pytest.mark.parametrize("shape", [(16, 16), (8, 24), (32, 12)])
def test_2d_best_m4n2_is_transposable_mask(shape):
    x = _rand(shape, seed=3)
    got = prune.mask_from_pattern(x, "m4n2_2d_best")
    np.testing.assert_array_equal(got, reference_ops.transposable_mask24(x))
    g = np.asarray(got)
    assert (g.reshape(-1, 4, g.shape[1]).sum(1) == 2).all()  # 2:4 along axis 0
    assert (g.reshape(g.shape[0], -1, 4).sum(2) == 2).all()  # 2:4 along axis 1


def test_pattern_enumeration_matches_reference_order():
    np.testing.assert_array_equal(prune_impl.patterns_2d(4, 2), reference_ops.transposable_patterns())
    for (m, n), count in {(4, 1): 24, (4, 3): 24, (5, 2): 2040, (6, 2): 67950}.items():
        assert prune_impl.count_2d_patterns(m, n) == count
        if count < 5000:
            assert prune_impl.patterns_2d(m, n).shape == (count, m * m)


@pytest.mark.parametrize("m, n", [(4, 1), (4, 3), (5, 2)])
def test_2d_best_general_is_brute_force_optimum(m, n):
    x = _rand((2 * m, 3 * m), seed=m * 10 + n)
    got = np.asarray(prune.mask_from_pattern(x, f"m{m}n{n}_2d_best"))
    rows, cols = _row_col_counts(got, m)
    assert (rows == n).all() and (cols == n).all()
    # brute force: every m×m 0/1 matrix with n ones per row and column
    row_pats = [np.isin(np.arange(m), c) for c in itertools.combinations(range(m), n)]
    pats = [np.array(p) for p in itertools.product(row_pats, repeat=m)]
    pats = [p for p in pats if (p.sum(0) == n).all()]
    blocks = _blocks_np(x, m)
    gb = got.reshape(2, m, 3, m).transpose(0, 2, 1, 3)
    for i in range(2):
        for j in range(3):
            best = max(float((blocks[i, j] * p).sum()) for p in pats)
            assert float((blocks[i, j] * gb[i, j]).sum()) == pytest.approx(best, rel=1e-6)


def test_2d_best_infeasible_suggests_greedy():
    with pytest.raises(ValueError) as e:
        prune.mask_from_pattern(jnp.ones((8, 8)), "m8n4_2d_best")
    msg = str(e.value)
    assert "116,963,796,250" in msg and "'m8n4_2d_greedy'" in msg
    with pytest.raises(ValueError, match="m16n2_2d_greedy"):
        prune.mask_from_pattern(jnp.ones((16, 16)), "m16n2_2d_best")


def _greedy_np(x, n, m):
    """ASP's mn_2d_greedy, written with loops (ties: lower row-major index first)."""
    out = np.zeros(x.shape, bool)
    a = np.abs(np.asarray(x, np.float64))
    for r0 in range(0, a.shape[0], m):
        for c0 in range(0, a.shape[1], m):
            blk = a[r0:r0 + m, c0:c0 + m].reshape(-1)
            order = sorted(range(m * m), key=lambda k: (-blk[k], k))
            rc, cc = [0] * m, [0] * m
            for k in order:
                r, c = divmod(k, m)
                if rc[r] < n and cc[c] < n:
                    out[r0 + r, c0 + c] = True
                    rc[r] += 1
                    cc[c] += 1
    return out


@pytest.mark.parametrize("m, n", [(4, 2), (4, 1), (8, 4), (8, 3)])
def test_2d_greedy(m, n):
    x = _rand((4 * m, 6 * m), seed=m + n)
    got = np.asarray(prune.mask_from_pattern(x, f"m{m}n{n}_2d_greedy"))
    np.testing.assert_array_equal(got, _greedy_np(x, n, m))
    rows, cols = _row_col_counts(got, m)
    assert rows.max() <= n and cols.max() <= n
    blocks = _blocks_np(x, m)
    kept = (blocks * got.reshape(4, m, 6, m).transpose(0, 2, 1, 3)).sum((-1, -2))
    # baseline: a fixed feasible pattern (the circulant: row r keeps columns r..r+n-1 mod m)
    circ = np.zeros((m, m))
    for r in range(m):
        circ[r, [(r + k) % m for k in range(n)]] = 1
    assert kept.sum() >= (blocks * circ).sum()
    # greedy b-matching is a 1/2-approximation of the per-block optimum
    if (m, n) == (4, 2):
        best = np.asarray(prune.mask_from_pattern(x, "m4n2_2d_best"))
        best_kept = (blocks * best.reshape(4, m, 6, m).transpose(0, 2, 1, 3)).sum((-1, -2))
        assert (kept >= 0.5 * best_kept - 1e-9).all()
        assert best_kept.sum() >= kept.sum()


def test_2d_greedy_jit():
    x = _rand((16, 16), seed=9)
    f = jax.jit(lambda a: prune.mask_from_pattern(a, "m4n2_2d_greedy"))
    np.testing.assert_array_equal(f(x), _greedy_np(x, 2, 4))


# ---------------------------------------------------------------------------------------------
# vector- and block-wise


def _vector_np(x, n, m, v, norm):
    x = np.asarray(x, np.float64)
    out = np.zeros(x.shape, bool)
    for j0 in range(0, x.shape[1], v):
        s = np.abs(x[:, j0:j0 + v])
        score = s.sum(1) if norm == "l1" else (s * s).sum(1)
        for i0 in range(0, x.shape[0], m):
            g = score[i0:i0 + m]
            keep = sorted(range(m), key=lambda k: (-g[k], k))[:n]
            for k in keep:
                out[i0 + k, j0:j0 + v] = True
    return out


@pytest.mark.parametrize("n, m, v", [(2, 4, 4), (1, 4, 2), (3, 8, 8), (2, 4, 1)])
@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_vector_wise_brute_force(n, m, v, norm):
    x = _rand((32, 16), seed=v)
    got = np.asarray(prune.vector_nm_mask(x, n, m, v, norm=norm))
    np.testing.assert_array_equal(got, _vector_np(x, n, m, v, norm))
    if norm == "l1":
        np.testing.assert_array_equal(prune.mask_from_pattern(x, f"m{m}n{n}_1d_v{v}"), got)
    # structure: each v-vector is all kept or all dropped; n of m along axis 0
    g = got.reshape(32, 16 // v, v)
    assert (g.all(-1) | ~g.any(-1)).all()
    assert (got.reshape(32 // m, m, 16).sum(1) == n).all()


def test_vector_wise_axis1_and_nd():
    x = _rand((12, 16), seed=4)
    got = np.asarray(prune.vector_nm_mask(x, 2, 4, 3, axis=1))
    np.testing.assert_array_equal(got, _vector_np(x.T, 2, 4, 3, "l1").T)
    x3 = _rand((2, 8, 6), seed=5)
    got3 = np.asarray(prune.vector_nm_mask(x3, 2, 4, 3, axis=1, vector_axis=2))
    for b in range(2):
        np.testing.assert_array_equal(got3[b], _vector_np(x3[b], 2, 4, 3, "l1"))
    with pytest.raises(ValueError, match="vector_axis must be given"):
        prune.vector_nm_mask(x3, 2, 4, 3, axis=1)


def _block_np(x, n, m, bh, bw, axis, norm):
    x = np.abs(np.asarray(x, np.float64))
    gr, gc = x.shape[0] // bh, x.shape[1] // bw
    score = np.zeros((gr, gc))
    for i in range(gr):
        for j in range(gc):
            b = x[i * bh:(i + 1) * bh, j * bw:(j + 1) * bw]
            score[i, j] = b.sum() if norm == "l1" else (b * b).sum()
    keep = np.zeros((gr, gc), bool)
    s = score if axis == 0 else score.T
    k = keep if axis == 0 else keep.T
    for j in range(s.shape[1]):
        for i0 in range(0, s.shape[0], m):
            g = s[i0:i0 + m, j]
            for t in sorted(range(m), key=lambda q: (-g[q], q))[:n]:
                k[i0 + t, j] = True
    return np.repeat(np.repeat(keep, bh, 0), bw, 1)


@pytest.mark.parametrize("n, m, bh, bw, axis", [(2, 4, 2, 2, 0), (1, 2, 4, 1, 0), (2, 4, 1, 4, 1),
                                                (3, 8, 2, 3, 0)])
@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_block_wise_brute_force(n, m, bh, bw, axis, norm):
    shape = (m * bh * 2, 6 * bw) if axis == 0 else (4 * bh, m * bw * 2)
    x = _rand(shape, seed=bh * 7 + bw)
    got = np.asarray(prune.block_nm_mask(x, n, m, (bh, bw), axis=axis, norm=norm))
    np.testing.assert_array_equal(got, _block_np(x, n, m, bh, bw, axis, norm))
    assert got.mean() == pytest.approx(n / m)
    if norm == "l1":
        np.testing.assert_array_equal(
            prune.mask_from_pattern(x, f"m{m}n{n}_1d_b{bh}x{bw}", axis=axis), got)


def test_kept_magnitude():
    x = jnp.array([[1.0, -8.0], [-4.0, 1.0], [2.0, 2.0], [3.0, 0.0]])
    assert prune.kept_magnitude(x) == pytest.approx(4 + 3 + 8 + 2)


# ---------------------------------------------------------------------------------------------
# prune_trained


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(16, name="fc1")(x)
        return nn.Dense(8, name="fc2")(nn.gelu(h))


class _Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(8, name="embed_proj")(x)
        x = _Block(name="mlp")(x)
        x = nn.LayerNorm(name="ln")(x)
        return nn.Dense(6, name="lm_head")(x)  # input 8: fine; output 6


def _net_params():
    return jax.jit(_Net().init)(jax.random.key(0), jnp.ones((2, 12)))


def _paths(masks):
    flat = jax.tree_util.tree_flatten_with_path(masks, is_leaf=lambda x: x is None)[0]
    return {prune_impl.path_str(p) for p, m in flat if m is not None}


def test_prune_trained_defaults_prune_all_2d_kernels():
    params = _net_params()
    pruned, masks = prune.prune_trained(params)
    assert _paths(masks) == {"params/embed_proj/kernel", "params/mlp/fc1/kernel",
                             "params/mlp/fc2/kernel", "params/lm_head/kernel"}
    assert jax.tree_util.tree_structure(pruned) == jax.tree_util.tree_structure(params)
    for layer in ("fc1", "fc2"):
        w, mk = params["params"]["mlp"][layer]["kernel"], masks["params"]["mlp"][layer]["kernel"]
        np.testing.assert_array_equal(mk, reference_ops.mask24(w, axis=0))
        np.testing.assert_array_equal(pruned["params"]["mlp"][layer]["kernel"], jnp.where(mk, w, 0))
        assert masks["params"]["mlp"][layer]["bias"] is None
        np.testing.assert_array_equal(pruned["params"]["mlp"][layer]["bias"],
                                      params["params"]["mlp"][layer]["bias"])
    assert masks["params"]["ln"]["scale"] is None


def test_prune_trained_allowed_disallowed():
    params = _net_params()
    _, masks = prune.prune_trained(params, allowed="*/mlp/*")
    assert _paths(masks) == {"params/mlp/fc1/kernel", "params/mlp/fc2/kernel"}
    _, masks = prune.prune_trained(params, allowed=["*/mlp/*", "*embed*"], disallowed="*fc2")
    assert _paths(masks) == {"params/mlp/fc1/kernel", "params/embed_proj/kernel"}
    _, masks = prune.prune_trained(params, disallowed=re.compile(r"lm_head|embed"))
    assert _paths(masks) == {"params/mlp/fc1/kernel", "params/mlp/fc2/kernel"}
    _, masks = prune.prune_trained(params, allowed="re:fc[12]/kernel$")
    assert _paths(masks) == {"params/mlp/fc1/kernel", "params/mlp/fc2/kernel"}
    _, masks = prune.prune_trained(params, allowed="params/mlp/fc1")  # a layer path, exact
    assert _paths(masks) == {"params/mlp/fc1/kernel"}


def test_prune_trained_skips_ungroupable_with_warning():
    params = {"params": {"a": {"kernel": jnp.ones((6, 8))}, "b": {"kernel": _rand((8, 4))},
                         "c": {"kernel": jnp.ones((4, 4, 4))}}}
    with pytest.warns(UserWarning) as rec:
        pruned, masks = prune.prune_trained(params)
    msgs = [str(r.message) for r in rec]
    assert any("'params/a/kernel'" in s and "(6, 8)" in s and "not divisible by 4" in s
               and "skipped" in s for s in msgs)
    assert any("'params/c/kernel'" in s and "2-D" in s for s in msgs)
    assert masks["params"]["a"]["kernel"] is None and masks["params"]["c"]["kernel"] is None
    assert masks["params"]["b"]["kernel"] is not None
    np.testing.assert_array_equal(pruned["params"]["a"]["kernel"], params["params"]["a"]["kernel"])
    with pytest.raises(ValueError, match=r"'params/a/kernel'.*not divisible by 4"):
        prune.prune_trained(params, strict=True, allowed="*a*")


def test_prune_trained_bad_pattern_always_raises():
    with pytest.raises(ValueError, match="'m4n4_1d'"):
        prune.prune_trained(_net_params(), pattern="m4n4_1d")


@pytest.mark.parametrize("pattern", ["m4n2_2d_best", "m8n2_1d", "m4n1_2d_greedy", "m4n2_1d_v4"])
def test_prune_trained_patterns(pattern):
    params = {"p": {"kernel": _rand((16, 16), seed=11)}}
    pruned, masks = prune.prune_trained(params, pattern=pattern)
    np.testing.assert_array_equal(masks["p"]["kernel"],
                                  prune.mask_from_pattern(params["p"]["kernel"], pattern))


# ---------------------------------------------------------------------------------------------
# keep_pruned


def _finetune(params, opt, steps=60):
    """``steps`` jitted optimizer steps on random (biased) gradients."""

    @jax.jit
    def step(p, state, grads):
        upd, state = opt.update(grads, state, p)
        return optax.apply_updates(p, upd), state

    state, rng = opt.init(params), np.random.default_rng(100)
    for _ in range(steps):
        grads = jax.tree.map(lambda a: rng.standard_normal(a.shape).astype(np.float32) + 0.5, params)
        params, state = step(params, state, grads)
    return params


def test_keep_pruned_adamw_weight_decay():
    params = {"mlp": _mlp_params(d=8, hidden=16), "head": {"kernel": _rand((8, 4), seed=5)}}
    pruned, masks = prune.prune_trained(params, allowed="mlp/*")
    assert masks["head"]["kernel"] is None
    adamw = optax.adamw(1e-2, weight_decay=0.1)
    for opt in (prune.keep_pruned(masks, adamw), optax.chain(adamw, prune.keep_pruned(masks))):
        out = _finetune(pruned, opt)
        for layer in ("fc1", "fc2"):
            mk = masks["mlp"][layer]["kernel"]
            w = out["mlp"][layer]["kernel"]
            assert (w[~mk] == 0).all()  # pruned: exactly zero after 60 AdamW steps
            assert (w[mk] != pruned["mlp"][layer]["kernel"][mk]).all()  # kept: trained
        assert (out["head"]["kernel"] != pruned["head"]["kernel"]).all()  # unpruned: trained
    # the same fine-tune without keep_pruned revives pruned weights: the test can fail
    plain = _finetune(pruned, adamw)
    mk = masks["mlp"]["fc1"]["kernel"]
    assert (plain["mlp"]["fc1"]["kernel"][~mk] != 0).all()


def test_keep_pruned_masks_gradients_for_inner():
    masks = {"w": jnp.array([True, False])}
    seen = []

    def spy_update(updates, state, params=None):
        seen.append(updates["w"])
        return updates, state

    inner = optax.GradientTransformation(lambda p: optax.EmptyState(), spy_update)
    opt = prune.keep_pruned(masks, inner)
    opt.update({"w": jnp.array([1.0, 2.0])}, opt.init({"w": jnp.zeros(2)}))
    np.testing.assert_array_equal(seen[-1], [1.0, 0.0])
    opt = prune.keep_pruned(masks, inner, mask_gradients=False)
    upd, _ = opt.update({"w": jnp.array([1.0, 2.0])}, opt.init({"w": jnp.zeros(2)}))
    np.testing.assert_array_equal(seen[-1], [1.0, 2.0])
    np.testing.assert_array_equal(upd["w"], [1.0, 0.0])


def test_keep_pruned_jit():
    params = {"w": _rand((8, 4))}
    pruned, masks = prune.prune_trained({"l": {"kernel": params["w"]}})
    opt = prune.keep_pruned(masks, optax.sgd(0.1, momentum=0.9))
    state = opt.init(pruned)

    @jax.jit
    def step(p, s):
        g = jax.tree.map(jnp.ones_like, p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    p = pruned
    for _ in range(5):
        p, state = step(p, state)
    mk = masks["l"]["kernel"]
    assert (p["l"]["kernel"][~mk] == 0).all() and (p["l"]["kernel"][mk] != pruned["l"]["kernel"][mk]).all()


# ---------------------------------------------------------------------------------------------
# channel permutation


def _mlp(x, p):
    """producer → gelu → consumer in float64 numpy (so summation order does not matter)."""
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    z = f(x) @ f(p["fc1"]["kernel"]) + f(p["fc1"]["bias"])
    h = 0.5 * z * (1 + np.tanh(0.7978845608 * (z + 0.044715 * z**3)))
    return h @ f(p["fc2"]["kernel"]) + f(p["fc2"]["bias"])


def _mlp_params(seed=0, d=16, hidden=64):
    k = jax.random.split(jax.random.key(seed), 4)
    # heavy-tailed rows so channel grouping matters
    scale = jnp.exp(jax.random.normal(k[3], (hidden, 1)))
    return {"fc1": {"kernel": jax.random.normal(k[0], (d, hidden)), "bias": jax.random.normal(k[1], (hidden,))},
            "fc2": {"kernel": jax.random.normal(k[2], (hidden, d)) * scale, "bias": jnp.zeros(d)}}


def test_permutation_keeps_function_and_improves_kept_magnitude():
    p = _mlp_params()
    res = prune.permute_channels(p["fc2"]["kernel"], p["fc1"]["kernel"], p["fc1"]["bias"])
    q = {"fc1": {"kernel": res.producer, "bias": res.producer_bias},
         "fc2": {"kernel": res.consumer, "bias": p["fc2"]["bias"]}}
    x = _rand((5, 16), seed=1)
    np.testing.assert_allclose(_mlp(x, q), _mlp(x, p), rtol=1e-6, atol=1e-6)
    before = prune.kept_magnitude(p["fc2"]["kernel"])
    after = prune.kept_magnitude(res.consumer)
    assert res.kept_before == pytest.approx(before, rel=1e-6)
    assert res.kept_after == pytest.approx(after, rel=1e-6)
    assert after > before
    assert sorted(res.perm.tolist()) == list(range(64))


def test_permutation_constructed_example_strictly_better():
    # all big rows in one group: unpermuted 2:4 keeps 10+10 and 1+1 per column
    w = np.array([[10.0, 10.0]] * 4 + [[1.0, 1.0]] * 4)
    perm = prune.search_permutation(w)
    assert prune.kept_magnitude(w) == 44.0
    assert prune.kept_magnitude(w[perm]) == 80.0


@pytest.mark.parametrize("n, m", [(2, 4), (1, 4), (2, 8)])
def test_permutation_never_worse_and_deterministic(n, m):
    w = np.asarray(_rand((32, 24), seed=n * m)) * np.exp(np.asarray(_rand((32, 1), seed=7)))
    p1 = prune.search_permutation(w, n=n, m=m)
    p2 = prune.search_permutation(w, n=n, m=m)
    np.testing.assert_array_equal(p1, p2)
    name = f"m{m}n{n}_1d"
    assert prune.kept_magnitude(w[p1], name) >= prune.kept_magnitude(w, name) - 1e-9
    # a bounded search stops early but stays valid
    p0 = prune.search_permutation(w, n=n, m=m, max_iters=0)
    np.testing.assert_array_equal(p0, np.arange(32))


@pytest.mark.parametrize("n, m", [(2, 4), (1, 4), (3, 8)])
def test_permutation_is_a_local_optimum(n, m):
    # after the search no single swap between two groups gains: checks the incremental gains
    w = np.asarray(_rand((4 * m, 6), seed=m + n)) * np.exp(np.asarray(_rand((4 * m, 1), seed=3)))
    aw = np.abs(w.astype(np.float64))
    perm = prune.search_permutation(w, n=n, m=m)
    best = prune_impl.kept_by_groups(aw, perm, n, m)
    for i in range(len(perm)):
        for j in range(i + 1, len(perm)):
            if i // m == j // m:
                continue
            q = perm.copy()
            q[i], q[j] = q[j], q[i]
            # (gains below 1e-5 of a group's kept magnitude are float32 rounding, not taken)
            assert prune_impl.kept_by_groups(aw, q, n, m) <= best + 1e-5 * best / (len(perm) // m)


def test_apply_permutation_on_flax_tree():
    mlp = nn.Sequential([nn.Dense(32), nn.gelu, nn.Dense(8)])
    params = jax.jit(mlp.init)(jax.random.key(3), jnp.ones((1, 8)))
    new, perm = prune.permute_mlp(params, "params/layers_0", "params/layers_2")
    x = _rand((4, 8), seed=2)
    np.testing.assert_allclose(mlp.apply(new, x), mlp.apply(params, x), rtol=1e-6, atol=1e-6)
    k_old = params["params"]["layers_2"]["kernel"]
    assert prune.kept_magnitude(new["params"]["layers_2"]["kernel"]) >= prune.kept_magnitude(k_old)
    np.testing.assert_array_equal(new["params"]["layers_0"]["bias"], params["params"]["layers_0"]["bias"][perm])
    # explicit paths ending in /kernel are accepted too
    again = prune.apply_permutation(params, "params/layers_0/kernel", "params/layers_2/kernel", perm)
    np.testing.assert_array_equal(again["params"]["layers_2"]["kernel"], new["params"]["layers_2"]["kernel"])


def test_permutation_errors():
    p = _mlp_params()
    with pytest.raises(ValueError, match=r"no parameter at path 'fc9/kernel'.*'fc1'"):
        prune.apply_permutation(p, "fc9", "fc2", np.arange(64))
    with pytest.raises(ValueError, match="permutation of range"):
        prune.apply_permutation(p, "fc1", "fc2", np.zeros(64, int))
    with pytest.raises(ValueError, match="does not produce"):
        prune.apply_permutation(p, "fc2", "fc2", np.arange(64))
    with pytest.raises(ValueError, match="not divisible by m=4"):
        prune.search_permutation(np.ones((6, 4)))
