"""Sparse24Dense inside flax.linen.scan: stacked masks, prepared weights, MVUE keys, and the library's
functions over stacked (L, in, out) leaves, against the same model unrolled."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

import jax_sparse24 as s24
from jax_sparse24 import nn as snn
from jax_sparse24 import masks as s24masks
from jax_sparse24 import preparation as s24prep
from jax_sparse24._src import prepared_weight as _pw
from jax_sparse24.optim import magnitude_masks, masked_decay
from jax_sparse24.training import SparseTrainState

L, D, H = 3, 16, 32
NAMES = [f"h_{i}" for i in range(L)]
SCAN_AXES = {"params": 0, s24masks.SPARSITY: 0, s24prep.PREPARED: 0, snn.FP8_META: 0}


class Block(nn.Module):
    method: str = "srste"
    backend: str = "auto"
    mask_every: int = 1
    mvue: bool = True

    @nn.compact
    def __call__(self, x, _=None):
        kw = dict(method=self.method, backend=self.backend, mask_every=self.mask_every, mvue=self.mvue)
        h = snn.Sparse24Dense(H, name="fc", **kw)(x)
        return x + snn.Sparse24Dense(D, name="proj", **kw)(jnp.tanh(h)), None


class Stack(nn.Module):
    scan: bool = True
    split_mvue: bool = True
    kw: tuple = ()
    remat: bool = False

    @nn.compact
    def __call__(self, x):
        kw = dict(self.kw)
        if self.scan:
            body = nn.remat(Block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable) if self.remat else Block
            blocks = nn.scan(body, length=L, variable_axes=SCAN_AXES,
                             split_rngs={"params": True, snn.MVUE_RNG: self.split_mvue})
            x, _ = blocks(**kw, name="h")(x, None)
        else:
            for i in range(L):
                x, _ = Block(**kw, name=f"h_{i}")(x)
        return x


def _x(seed=0, n=8):
    return jax.random.normal(jax.random.key(seed), (n, D))


def _models(**kw):
    kw = tuple(sorted(kw.items()))
    return Stack(scan=False, kw=kw), Stack(scan=True, kw=kw)


def _close(a, b, **tol):
    jax.tree.map(lambda u, v: np.testing.assert_allclose(np.asarray(u), np.asarray(v), **tol), a, b)


def test_scanned_matches_unrolled_loss_and_grads():
    """(srste: test_gpt_scanned_matches_unrolled; here S-STE, whose β is per layer)"""
    unrolled, scanned = _models(method="soft")
    x = _x()
    v = jax.jit(unrolled.init)(jax.random.key(0), x)
    vs = s24masks.stack_layers(v, NAMES, "h")
    assert jax.tree.map(jnp.shape, jax.eval_shape(scanned.init, jax.random.key(0), x)) == jax.tree.map(jnp.shape, vs)
    loss = lambda m, var: lambda p: jnp.mean(m.apply({**var, "params": p}, x) ** 2)  # noqa: E731
    lu, gu = jax.jit(jax.value_and_grad(loss(unrolled, v)))(v["params"])
    ls, gs = jax.jit(jax.value_and_grad(loss(scanned, vs)))(vs["params"])
    np.testing.assert_allclose(lu, ls, rtol=1e-5)
    _close(s24masks.stack_layers(gu, NAMES, "h"), gs, rtol=1e-4, atol=1e-6)
    # rematerialised blocks (nn.remat inside the scan, jax.checkpoint's "dots" policy): the same
    lr, gr = jax.jit(jax.value_and_grad(loss(Stack(scan=True, kw=scanned.kw, remat=True), vs)))(vs["params"])
    np.testing.assert_allclose(lr, ls, rtol=1e-6)
    _close(gr, gs, rtol=1e-5, atol=1e-7)
    _close(s24masks.unstack_layers(vs, "h", NAMES), v, rtol=0, atol=0)  # the round trip is exact


def test_mvue_key_per_layer():
    """Every layer of the stack draws its own MVUE key: with the same weights and inputs in every layer,
    the MVUE weight gradients differ between layers (and are equal with the stream not split)."""

    class Parallel(nn.Module):  # every layer sees the same x (no carry), outputs summed
        split: bool

        @nn.compact
        def __call__(self, x):
            body = lambda mdl, c, _: (c, snn.Sparse24Dense(D, backend="dense", name="fc")(c))  # noqa: E731
            f = nn.scan(body, length=L, variable_axes=SCAN_AXES,
                        split_rngs={"params": True, snn.MVUE_RNG: self.split})
            return f(self, x, None)[1].sum(0)

    x = _x(n=16)
    for split in (True, False):
        m = Parallel(split)
        v = jax.jit(m.init)(jax.random.key(0), x)
        v = {**v, "params": jax.tree.map(lambda a: jnp.broadcast_to(a[:1], a.shape), v["params"])}
        v = {**v, "sparsity": jax.tree.map(lambda a: jnp.broadcast_to(a[:1], a.shape), v["sparsity"])}
        g = jax.jit(jax.grad(lambda p: jnp.sum(m.apply({**v, "params": p}, x, rngs={"mvue": jax.random.key(3)}) ** 2)))(
            v["params"])["fc"]["kernel"]
        if split:
            exact = jax.jit(jax.grad(lambda p: jnp.sum(m.apply({**v, "params": p}, x) ** 2)))(v["params"])
            assert not np.allclose(g[0], exact["fc"]["kernel"][0])  # MVUE sampled (backend="dense")
        same = [np.array_equal(g[0], g[i]) for i in range(1, L)]
        assert not any(same) if split else all(same)


@functools.partial(jax.jit, static_argnames="skip_idle")
def _refresh_traced(p, s, step, skip_idle=True):
    return s24masks.refresh_masks(p, s, step=step, skip_idle=skip_idle)


_refresh_all = jax.jit(lambda p, s: s24masks.refresh_masks(p, s, step=None))


def _refresh(p, s, step, skip_idle=True):
    """refresh_masks under jit, the step traced (one program for every step)."""
    return _refresh_all(p, s) if step is None else _refresh_traced(p, s, jnp.int32(step), skip_idle=skip_idle)


def test_refresh_stacked_equals_per_layer():
    unrolled, _ = _models(mask_every=2)
    v = jax.jit(unrolled.init)(jax.random.key(0), _x())
    # new kernels: the masks change
    params = jax.tree.map(lambda a: a + 0.5 * jax.random.normal(jax.random.key(9), a.shape), v["params"])
    stacked_params, stacked_sp = s24masks.stack_layers(params, NAMES, "h"), s24masks.stack_layers(v["sparsity"], NAMES, "h")
    for step in (None, 2, 3):
        su, ru = _refresh(params, v["sparsity"], step)
        ss, rs = _refresh(stacked_params, stacked_sp, step)
        _close(s24masks.stack_layers(su, NAMES, "h"), ss, rtol=0, atol=0)
        np.testing.assert_allclose(ru, rs, rtol=1e-6)
        assert (float(rs) > 0) == (step != 3)
        if step is not None:  # skip_idle=False (no conditional): the same
            _close(ss, _refresh(stacked_params, stacked_sp, step, skip_idle=False)[0], rtol=0, atol=0)
        # per-layer flip rates: one per layer of the stack, those of the unrolled layers
        per = s24masks.layer_flip_rates(stacked_sp, ss)
        per_u = s24masks.layer_flip_rates(v["sparsity"], su)
        assert set(per) == {"h/fc", "h/proj"} and per["h/fc"].shape == (L,)
        for name in ("fc", "proj"):
            np.testing.assert_allclose(per[f"h/{name}"], [per_u[f"h_{i}/{name}"] for i in range(L)], rtol=1e-6)
        if step != 3:
            assert len(set(np.asarray(per["h/fc"]).tolist())) > 1  # not one rate for the stack


def test_refresh_stacked_per_layer_periods():
    """A stack whose layers have different periods refreshes each layer on its own."""
    _, scanned = _models()
    v = jax.jit(scanned.init)(jax.random.key(0), _x())
    sp = jax.tree.map(lambda a: a, v["sparsity"])
    sp["h"]["fc"]["mask_every"] = jnp.array([1, 2, 3], jnp.int32)
    params = jax.tree.map(lambda a: a + jax.random.normal(jax.random.key(9), a.shape), v["params"])
    new, _ = s24masks.refresh_masks(params, sp, step=2)
    changed = [not np.array_equal(new["h"]["fc"]["transposable_mask"][i], sp["h"]["fc"]["transposable_mask"][i])
               for i in range(L)]
    assert changed == [True, True, False]
    assert s24masks.mask_periods(sp) == (1, 2, 3)
    with pytest.raises(ValueError, match="mask_every=0"):
        sp["h"]["fc"]["mask_every"] = jnp.array([1, 0, 3], jnp.int32)
        SparseTrainState.create(apply_fn=scanned.apply, params=params, tx=optax.sgd(0.1), sparsity=sp)


def test_stacked_masks_are_per_layer():
    _, scanned = _models()
    v = jax.jit(scanned.init)(jax.random.key(0), _x())
    k = v["params"]["h"]["fc"]["kernel"]
    m = v["sparsity"]["h"]["fc"]["transposable_mask"]
    for i in range(L):
        np.testing.assert_array_equal(m[i], s24.transposable_mask24(k[i]))
    mm = magnitude_masks(v["params"], where=lambda path, x: path.endswith("kernel"))
    mt = magnitude_masks(v["params"], where=lambda path, x: path.endswith("kernel"), transposable=True)
    for i in range(L):
        np.testing.assert_array_equal(mm["h"]["fc"]["kernel"][i], s24.mask24(k[i], axis=0))
        np.testing.assert_array_equal(mt["h"]["fc"]["kernel"][i], m[i])
    # masks_for_params / apply_sparsity / sparse_weights / kernel_masks: per layer, stacked
    masks = s24masks.masks_for_params(v["params"], v["sparsity"])
    np.testing.assert_array_equal(masks["h"]["fc"]["kernel"], m)
    np.testing.assert_array_equal(s24masks.apply_sparsity(v["params"], v["sparsity"])["h"]["fc"]["kernel"],
                                  jnp.where(m, k, 0))
    km = s24masks.kernel_masks(v["params"], paths=["h/fc"])["h"]["fc"]["kernel"]
    np.testing.assert_array_equal(km, mm["h"]["fc"]["kernel"])
    # masked_decay with stacked masks decays exactly the pruned entries of each layer
    tx = masked_decay(1.0)
    g = jax.tree.map(jnp.zeros_like, v["params"])
    upd, _ = tx.update(g, tx.init(v["params"]), v["params"], masks=masks)
    np.testing.assert_array_equal(upd["h"]["fc"]["kernel"], jnp.where(m, 0, k))


def test_sparse_weights_soft_stacked():
    unrolled, scanned = _models(method="soft")
    x = _x()
    v = jax.jit(unrolled.init)(jax.random.key(0), x)
    vs = s24masks.stack_layers(v, NAMES, "h")
    paths_u = [f"h_{i}/{n}" for i in range(L) for n in ("fc", "proj")]
    wu, mu = jax.jit(lambda p, s: s24masks.sparse_weights(p, s, method="soft", paths=paths_u))(v["params"], v["sparsity"])
    ws, ms = jax.jit(lambda p, s: s24masks.sparse_weights(p, s, method="soft", paths=["h/fc", "h/proj"]))(
        vs["params"], vs["sparsity"])
    _close(s24masks.stack_layers(wu, NAMES, "h"), ws, rtol=1e-6)
    np.testing.assert_array_equal(ms["h"]["fc"]["kernel"],
                                  jnp.stack([mu[f"h_{i}"]["fc"]["kernel"] for i in range(L)]))


def test_train_state_scanned_matches_unrolled():
    """SparseTrainState over a few steps (masked decay, mask refresh every step): the scanned model's
    state is the unrolled one's, restacked."""
    unrolled, scanned = _models()
    x, y = _x(0), _x(1)
    v = jax.jit(unrolled.init)(jax.random.key(0), x)
    tx = optax.chain(masked_decay(0.05), optax.adam(0.05))

    def run(model, params, sparsity):
        state = SparseTrainState.create(apply_fn=model.apply, params=params, tx=tx, sparsity=sparsity)

        @jax.jit
        def step(state):
            loss, g = jax.value_and_grad(lambda p: jnp.mean((state.apply(x, params=p) - y) ** 2))(state.params)
            return state.apply_gradients(grads=g), loss

        losses, flips = [], []
        for _ in range(4):
            state, loss = step(state)
            losses.append(float(loss))
            flips.append(float(state.flip_rate))
        return state, losses, flips

    su, lu, fu = run(unrolled, v["params"], v["sparsity"])
    ss, ls, fs = run(scanned, s24masks.stack_layers(v["params"], NAMES, "h"), s24masks.stack_layers(v["sparsity"], NAMES, "h"))
    np.testing.assert_allclose(lu, ls, rtol=1e-4)
    np.testing.assert_allclose(fu, fs, rtol=1e-4, atol=1e-6)
    assert max(fs) > 0 and ls[-1] < ls[0]
    _close(s24masks.stack_layers(su.params, NAMES, "h"), ss.params, rtol=1e-3, atol=1e-5)
    _close(s24masks.stack_layers(su.sparsity, NAMES, "h"), ss.sparsity, rtol=0, atol=0)
    # the whole train state converts (params, masks, Adam's moments)
    _close(s24masks.stack_layers(su, NAMES, "h").opt_state, ss.opt_state, rtol=1e-3, atol=1e-5)
    # prune_to_masks on stacked masks
    pruned = ss.prune_to_masks()
    m = ss.sparsity["h"]["proj"]["transposable_mask"]
    assert not np.any(np.asarray(pruned.params["h"]["proj"]["kernel"])[~np.asarray(m)])


def test_prepare_scanned_equals_unprepared_in_one_call(monkeypatch):
    """preparation.prepare on a scanned model: one prepare_many call for every layer of the stack; the
    micro-batch passes with the stacked prepared collection give the unprepared loss and gradients."""
    _, scanned = _models(backend="dense", mvue=False)
    x = _x()
    v = jax.jit(scanned.init)(jax.random.key(0), x)
    calls = []
    real = _pw.prepare_many
    monkeypatch.setattr(_pw, "prepare_many", lambda plans, **kw: calls.append(len(plans)) or real(plans, **kw))
    prepared = jax.jit(lambda v: s24prep.prepare(scanned, v, x, reuse=2))(v)
    assert calls == [2 * L]  # fc and proj of every layer, together
    assert jax.tree.map(jnp.shape, prepared)["h"]["fc"]["weight"]["masked"] == (L, D, H)
    kfc, mfc = v["params"]["h"]["fc"]["kernel"], v["sparsity"]["h"]["fc"]["transposable_mask"]
    np.testing.assert_array_equal(prepared["h"]["fc"]["weight"]["masked"], jnp.where(mfc, kfc, 0))
    loss = lambda var: lambda p: jnp.mean(scanned.apply({**var, "params": p}, x) ** 2)  # noqa: E731
    l0, g0 = jax.jit(jax.value_and_grad(loss(v)))(v["params"])
    l1, g1 = jax.jit(jax.value_and_grad(loss({**v, s24prep.PREPARED: prepared})))(v["params"])
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    _close(g0, g1, rtol=1e-5, atol=1e-7)
    # batch=False: each layer on its own, inside the scan body (one traced call)
    calls.clear()
    p2 = s24prep.prepare(scanned, v, x, batch=False)
    assert calls and set(calls) == {1}  # (nn.scan may trace its body more than once)
    _close(prepared, p2, rtol=0, atol=0)
    # SparseTrainState.prepare: the same collection
    state = SparseTrainState.create(apply_fn=scanned.apply, params=v["params"], tx=optax.sgd(0.1),
                                    sparsity=v["sparsity"])
    _close(state.prepare(x).prepared, prepared, rtol=0, atol=0)


def test_fp8_delayed_state_stacked():
    class FP8Block(nn.Module):
        @nn.compact
        def __call__(self, x, _=None):
            return x + snn.Sparse24Dense(D, fp8=True, fp8_scaling="delayed", amax_history_length=4, name="fc")(x), None

    class M(nn.Module):
        @nn.compact
        def __call__(self, x):
            f = nn.scan(FP8Block, length=L, variable_axes=SCAN_AXES, split_rngs={"params": True})
            return f(name="h")(x, None)[0]

    m, x = M(), _x()
    v = m.init(jax.random.key(0), x)
    meta = v[snn.FP8_META]
    assert all(np.shape(a)[0] == L for a in jax.tree.leaves(meta))
    state = SparseTrainState.create(apply_fn=m.apply, params=v["params"], tx=optax.sgd(0.01),
                                    sparsity=v["sparsity"], fp8_meta=meta)

    @jax.jit
    def step(state):
        g, gm = jax.grad(lambda p, mt: jnp.sum(state.apply(x, params=p, fp8_meta=mt) ** 2), argnums=(0, 1))(
            state.params, state.fp8_meta)
        return state.apply_gradients(grads=g, fp8_meta=gm)

    new = step(state)
    assert jax.tree.map(jnp.shape, new.fp8_meta) == jax.tree.map(jnp.shape, meta)
    hist = [a for p, a in jax.tree_util.tree_leaves_with_path(new.fp8_meta) if "history" in jax.tree_util.keystr(p)]
    assert hist and all(np.any(np.asarray(h) != 0) for h in hist)


def test_stack_unstack_errors():
    tree = {"params": {"h_0": {"k": jnp.ones(2)}, "h_1": {"k": jnp.ones(3)}}}
    with pytest.raises(ValueError, match="differ in structure or shapes"):
        s24masks.stack_layers(tree, ["h_0", "h_1"], "h")
    with pytest.raises(ValueError, match="already in the scanned layout"):
        s24masks.stack_layers({"params": {"h": {"k": jnp.ones((2, 2))}}}, ["h_0", "h_1"], "h")
    with pytest.raises(ValueError, match="already in the unrolled layout"):
        s24masks.unstack_layers(tree, "h", ["h_0", "h_1"])
    with pytest.raises(ValueError, match="leading axis of 3"):
        s24masks.unstack_layers({"h": {"k": jnp.ones((2, 2))}}, "h", ["a", "b", "c"])


# --------------------------------------------------------------------------------------------------
# The example's GPT: scanned stack (default) vs unrolled blocks
# --------------------------------------------------------------------------------------------------


def _gpt():
    import sys
    from pathlib import Path

    sys.path[:0] = [str(Path(__file__).resolve().parents[1] / p) for p in ("benchmarks/harness", "examples")]
    import gpt_model
    import model

    return gpt_model, model


def test_gpt_scanned_matches_unrolled():
    """The scanned GPT (optionally rematerialised) computes the unrolled one's loss and gradients from
    the converted params and masks; convert_layout round-trips; sparse_layer_paths follow the layout."""
    import dataclasses

    gm, ex = _gpt()
    cfg = gm.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, method="srste", sparse_attn=True,
                       layers="unroll")
    scfg = dataclasses.replace(cfg, layers="scan")
    idx = jax.random.randint(jax.random.key(1), (2, 16), 0, 256)
    vu = jax.jit(ex.GPT(cfg).init)(jax.random.key(0), idx)
    vs = gm.convert_layout(vu, 2, to="scan")
    assert jax.tree.map(jnp.shape, vs) == jax.tree.map(jnp.shape, jax.eval_shape(ex.GPT(scfg).init, jax.random.key(0), idx))
    assert vs["params"]["h"]["mlp"]["fc"]["kernel"].shape == (2, 32, 128)

    def grads(model, v):
        def loss(p):
            logits = model.apply({**v, "params": p}, idx[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, idx[:, 1:]).mean()
        return jax.jit(jax.value_and_grad(loss))(v["params"])

    lu, gu = grads(ex.GPT(cfg), vu)
    ls, gs = grads(ex.GPT(scfg), vs)
    np.testing.assert_allclose(lu, ls, rtol=1e-5)
    _close(gm.convert_layout(gu, 2, to="scan"), gs, rtol=2e-4, atol=1e-6)
    # (remat="dots": test_scanned_matches_unrolled_loss_and_grads; GPTConfig's remat wraps the block alike)
    _close(gm.convert_layout(vs, 2, to="unroll"), vu, rtol=0, atol=0)
    assert ex.sparse_layer_paths(scfg) == [("h", "attn", "qkv"), ("h", "attn", "proj"), ("h", "mlp", "fc"),
                                           ("h", "mlp", "proj")]
    assert len(ex.sparse_layer_paths(cfg)) == 8
    with pytest.raises(ValueError, match="layers must be one of"):
        gm.GPTConfig(layers="loop")
    with pytest.raises(ValueError, match="already in the scanned layout"):
        gm.convert_layout(vs, 2, to="scan")


def test_gpt_checkpoint_layout_mismatch_is_a_clear_error(tmp_path):
    """A checkpoint of the other block layout (or of before the scanned stack: no 'layers' in its config)
    is refused by name, both layouts in the message."""
    _gpt()
    import gpt_checkpoints
    from data import CLIError

    with pytest.raises(CLIError, match="layers='unroll' in the checkpoint but 'scan' now"):
        gpt_checkpoints.check_config({"recipe": "srste"}, {"recipe": "srste", "layers": "scan"}, tmp_path)
    gpt_checkpoints.check_config({"recipe": "srste"}, {"recipe": "srste", "layers": "unroll"}, tmp_path)


# --------------------------------------------------------------------------------------------------
# NNX: layers stacked with nnx.vmap, run with nnx.scan
# --------------------------------------------------------------------------------------------------


def test_nnx_scanned_layers():
    """Sparse24Linear stacked by nnx.vmap (split rngs) and run by nnx.scan: per-layer masks, the
    outputs and gradients of the layers run one by one, refresh per layer, a distinct MVUE stream per
    layer."""
    from flax import nnx

    from jax_sparse24.nnx import Sparse24Linear, Sparse24Mask, refresh_masks

    class Blk(nnx.Module):
        def __init__(self, rngs):
            self.fc = Sparse24Linear(D, D, backend="dense", mask_every=2, rngs=rngs)

        def __call__(self, x):
            return x + jnp.tanh(self.fc(x))

    @nnx.split_rngs(splits=L)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return Blk(rngs)

    blocks = make(nnx.Rngs(0, mvue=1))
    k, m = blocks.fc.kernel[...], blocks.fc.mask[...]
    assert k.shape == m.shape == (L, D, D)
    np.testing.assert_array_equal(m[1], s24.transposable_mask24(k[1]))

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def fwd(x, blk):
        return blk(x)

    x = _x()
    exact = lambda blks: jnp.sum(fwd(x, blks) ** 2)  # noqa: E731

    def by_hand(params):  # the layers one by one, exact gradient
        h = x
        for i in range(L):
            w = params[0][i] + jax.lax.stop_gradient(jnp.where(m[i], params[0][i], 0) - params[0][i])  # STE
            h = h + jnp.tanh(h @ w + params[1][i])
        return jnp.sum(h ** 2)

    # exact gradient: the MVUE streams off (the layers' own streams are used when present)
    plain = make(nnx.Rngs(0))
    g = nnx.jit(nnx.grad(exact))(plain)
    gk = jax.jit(jax.grad(by_hand))((plain.fc.kernel[...], plain.fc.bias[...]))
    np.testing.assert_allclose(g.fc.kernel[...], gk[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g.fc.bias[...], gk[1], rtol=1e-4, atol=1e-6)
    # MVUE: one key per layer
    keys = jax.random.key_data(blocks.fc.mvue_rngs.key[...])
    assert len({tuple(np.ravel(keys[i])) for i in range(L)}) == L
    # refresh of the stacked masks: per layer (compared with each slice's own mask)
    new_k = k + jax.random.normal(jax.random.key(5), k.shape)
    blocks.fc.kernel[...] = new_k
    old = nnx.to_pure_dict(nnx.state(blocks, Sparse24Mask))
    rate = refresh_masks(blocks, step=2)
    for i in range(L):
        np.testing.assert_array_equal(blocks.fc.mask[...][i], s24.transposable_mask24(new_k[i]))
    per = s24masks.layer_flip_rates(old, nnx.to_pure_dict(nnx.state(blocks, Sparse24Mask)))
    assert per["fc"].shape == (L,)
    np.testing.assert_allclose(float(rate), float(np.mean(per["fc"])), rtol=1e-6)


def test_prepare_needs_the_collection_scanned():
    """A scan without PREPARED among its variable_axes would drop the preparation silently: an error
    naming the collection instead."""

    class M(nn.Module):
        @nn.compact
        def __call__(self, x):
            f = nn.scan(Block, length=L, variable_axes={"params": 0, s24masks.SPARSITY: 0}, split_rngs={"params": True})
            return f(name="h")(x, None)[0]

    m, x = M(), _x()
    v = jax.eval_shape(m.init, jax.random.key(0), x)
    with pytest.raises(ValueError, match="add 'sparse24_prepared' to the transform's variable collections"):
        jax.eval_shape(lambda v: s24prep.prepare(m, v, x), v)
