"""jax_sparse24.training.SparseTrainState: a train step written with it is the hand-wired one."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

import jax_sparse24 as s24
from jax_sparse24.training import SparseTrainState

D, H = 16, 32


class MLP(nn.Module):
    method: str = "srste"
    mvue: bool = True
    mask_every: int = 2

    @nn.compact
    def __call__(self, x, sparse=None):
        # backend="dense": the MVUE weight gradient is always sampled (on a CPU too), so the MVUE key
        # of every step shows in the gradients
        kw = dict(method=self.method, mvue=self.mvue, mask_every=self.mask_every, backend="dense")
        h = nn.gelu(s24.nn.Sparse24Dense(H, name="up", **kw)(x, sparse=sparse))
        return s24.nn.Sparse24Dense(D, name="down", **kw)(h, sparse=sparse)


def _data(n=8):
    kx, ky = jax.random.split(jax.random.key(7))
    return jax.random.normal(kx, (n, D)), jax.random.normal(ky, (n, D))


def _loss(out, y):
    return ((out - y) ** 2).mean()


def _state(model, tx, **kw):
    x, _ = _data()
    v = model.init(jax.random.key(0), x)
    return SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx, sparsity=v["sparsity"],
                                   rng=jax.random.key(1), **kw)


@jax.jit
def train_step(state, x, y):
    loss, grads = jax.value_and_grad(lambda p: _loss(state.apply(x, params=p), y))(state.params)
    return state.apply_gradients(grads=grads), loss


@functools.partial(jax.jit, static_argnums=3)
def _static_step(state, x, y, sparse):
    """One program per phase: the Python bool ``sparse`` for the model and the masked decay."""
    grads = jax.grad(lambda p: _loss(state.apply(x, params=p, sparse=sparse), y))(state.params)
    return state.apply_gradients(grads=grads, sparse=sparse)


def _hand_step(model, tx, *, sparse=None, key=jax.random.key(1)):
    """The README's hand-wired step (sparse: a function of (step, opt_state) -> Python bool, or None)."""

    def step_fn(params, sparsity, opt_state, step, x, y, flag):
        kw = {} if flag is None else {"sparse": flag}
        loss_fn = lambda p: _loss(model.apply({"params": p, "sparsity": sparsity}, x,  # noqa: E731
                                              rngs={"mvue": jax.random.fold_in(key, step)}, **kw), y)
        grads = jax.grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params, masks=s24.masks.masks_for_params(params, sparsity))
        params = optax.apply_updates(params, updates)
        sparsity, flip = s24.masks.refresh_masks(params, sparsity, step=step + 1)
        return params, sparsity, opt_state, flip

    return jax.jit(step_fn, static_argnums=6)


def _leaves(tree):
    """Leaves as arrays numpy can read (a typed PRNG key as its key data)."""
    return [jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
            for x in jax.tree_util.tree_leaves(tree)]


def _assert_tree_equal(a, b):
    la, lb = _leaves(a), _leaves(b)
    assert len(la) == len(lb)
    for u, v in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def _run_hand(model, tx, steps, sparse_at=None):
    x, y = _data()
    v = model.init(jax.random.key(0), x)
    params, sparsity, opt_state = v["params"], v["sparsity"], tx.init(v["params"])
    step_fn = _hand_step(model, tx)
    flips, flags = [], []
    for step in range(steps):
        flag = None if sparse_at is None else sparse_at(step, opt_state)
        flags.append(flag)
        params, sparsity, opt_state, flip = step_fn(params, sparsity, opt_state, step, x, y, flag)
        flips.append(float(flip))
    return params, sparsity, opt_state, flips, flags


def test_matches_hand_wired_step_bit_for_bit():
    """Masked decay with the layers' masks, AdamW, mask refresh every 2 steps, per-step MVUE key."""
    tx = optax.chain(s24.optim.masked_decay(0.05), optax.adamw(0.05))
    x, y = _data()
    state = _state(MLP(), tx)
    flips = []
    for _ in range(6):
        state, loss = train_step(state, x, y)
        flips.append(float(state.flip_rate))
        assert state.prepared is None
    params, sparsity, opt_state, ref_flips, _ = _run_hand(MLP(), tx, 6)
    assert int(state.step) == 6
    _assert_tree_equal(state.params, params)
    _assert_tree_equal(state.sparsity, sparsity)
    _assert_tree_equal(state.opt_state, opt_state)
    assert flips == ref_flips
    assert flips[1] > 0 and flips[3] > 0 and flips[0] == flips[2] == 0  # refreshed at steps 2, 4, 6 only


class TwoPeriods(nn.Module):
    """Two srste layers with different refresh periods (2 and 3 steps)."""

    @nn.compact
    def __call__(self, x, sparse=None):
        kw = dict(method="srste", mvue=True, backend="dense")
        h = nn.gelu(s24.nn.Sparse24Dense(H, name="up", mask_every=2, **kw)(x, sparse=sparse))
        return s24.nn.Sparse24Dense(D, name="down", mask_every=3, **kw)(h, sparse=sparse)


@jax.jit
def _step_no_refresh(state, x, y):
    loss, grads = jax.value_and_grad(lambda p: _loss(state.apply(x, params=p), y))(state.params)
    return state.apply_gradients(grads=grads, refresh=False), loss


def _has_cond(fn, *args) -> bool:
    return "cond[" in str(jax.make_jaxpr(fn)(*args))


def test_refresh_outside_the_step_matches_the_in_step_refresh():
    """apply_gradients(refresh=False) + refresh_masks() on the steps refresh_due names (each layer its
    own period) is the in-step refresh bit for bit: params, masks, optimizer state, flip rates; the
    step and the refresh program have no conditional, the in-step refresh has one."""
    tx = optax.chain(s24.optim.masked_decay(0.05), optax.adamw(0.05))
    x, y = _data()
    ref = _state(TwoPeriods(), tx)
    state = _state(TwoPeriods(), tx)
    periods = s24.masks.mask_periods(state.sparsity)
    assert periods == (2, 3)
    refresh = jax.jit(lambda s: s.refresh_masks())
    ref_flips, flips, due = [], [], []
    for i in range(7):
        ref, _ = train_step(ref, x, y)
        ref_flips.append(float(ref.flip_rate))
        state, _ = _step_no_refresh(state, x, y)
        assert float(state.flip_rate) == 0.0
        due.append(s24.masks.refresh_due(periods, i + 1))
        if due[-1]:
            state = refresh(state)
        flips.append(float(state.flip_rate))
        _assert_tree_equal(state.sparsity, ref.sparsity)
    assert due == [False, True, True, True, False, True, False]  # steps 2, 3, 4, 6
    _assert_tree_equal(state.params, ref.params)
    _assert_tree_equal(state.opt_state, ref.opt_state)
    assert flips == ref_flips and all(f > 0 for f, d in zip(flips, due) if d)
    assert _has_cond(train_step, ref, x, y)
    assert not _has_cond(_step_no_refresh, state, x, y) and not _has_cond(lambda s: s.refresh_masks(), state)


def test_refresh_masks_without_skip_idle_keeps_layers_not_due():
    """skip_idle=False computes every mask but keeps the old one where the layer is not due, and
    agrees with the lax.cond form at every step (due or not)."""
    model = TwoPeriods()
    x, _ = _data()
    v = model.init(jax.random.key(0), x)
    params = jax.tree.map(lambda k: k + 0.3 * jax.random.normal(jax.random.key(5), k.shape), v["params"])
    no_cond = jax.jit(lambda p, sp, st: s24.masks.refresh_masks(p, sp, step=st, skip_idle=False))
    for step in range(7):
        a, fa = s24.masks.refresh_masks(params, v["sparsity"], step=step)
        b, fb = no_cond(params, v["sparsity"], step)
        _assert_tree_equal(a, b)
        assert float(fa) == float(fb)
        changed = [not np.array_equal(np.asarray(a[n]["transposable_mask"]), np.asarray(v["sparsity"][n]["transposable_mask"]))
                   for n in ("up", "down")]
        assert changed == [step % 2 == 0, step % 3 == 0]


def test_mask_periods_and_refresh_due():
    v = TwoPeriods().init(jax.random.key(0), _data()[0])
    assert s24.masks.mask_periods(v["sparsity"]) == (2, 3)
    assert s24.masks.mask_periods({}) == () and not s24.masks.refresh_due((), 4)
    assert [s24.masks.refresh_due((2, 3), s) for s in range(1, 7)] == [False, True, True, True, False, True]
    with pytest.raises(ValueError, match="outside jit"):
        jax.jit(lambda sp: s24.masks.mask_periods(sp))(v["sparsity"])
    stacked = {"blocks": {"transposable_mask": jnp.ones((3, 8, 4), bool), "mask_every": jnp.array([4, 6, 4])}}
    assert s24.masks.mask_periods(stacked) == (4, 6)  # a stack of layers: one period each


def test_masked_decay_gets_the_layer_masks():
    """Without masks= masked_decay would decay by its own (non-transposable) magnitude masks."""
    tx = optax.chain(s24.optim.masked_decay(0.5), optax.sgd(0.1))
    state = _state(MLP(mask_every=1000), tx)
    masks = state.decay_masks()
    _assert_tree_equal(masks["up"]["kernel"], state.sparsity["up"]["transposable_mask"])
    assert masks["up"]["bias"] is None
    zero = jax.tree.map(jnp.zeros_like, state.params)
    new = state.apply_gradients(grads=zero)
    w, m = state.params["up"]["kernel"], state.sparsity["up"]["transposable_mask"]
    expected = w - 0.1 * 0.5 * jnp.where(m, 0.0, w)
    np.testing.assert_allclose(new.params["up"]["kernel"], expected, rtol=1e-6)
    _assert_tree_equal(new.params["up"]["bias"], state.params["up"]["bias"])
    # no masked_decay in tx: no masks= (plain optax transforms would not take it)
    plain = _state(MLP(), optax.sgd(0.1))
    assert plain.decay_masks() is None
    plain.apply_gradients(grads=zero)


@pytest.mark.parametrize("static", [True, False])
def test_dense_finetune_switch(static):
    """dense_after=3: sparse for steps 0-2, then the model runs dense and nothing is decayed."""
    tx_stop = optax.chain(s24.optim.masked_decay(0.05, active_until=3), optax.adamw(0.05))
    tx_auto = optax.chain(s24.optim.masked_decay(0.05), optax.adamw(0.05))  # the state stops the decay
    x, y = _data()
    sparse_at = lambda s, _: s < 3  # noqa: E731
    params3, _, opt_state3, _, _ = _run_hand(MLP(), tx_stop, 3, sparse_at=sparse_at)
    params, sparsity, opt_state, _, ref_flags = _run_hand(MLP(), tx_stop, 5, sparse_at=sparse_at)
    assert ref_flags == [True, True, True, False, False]
    for tx in (tx_stop, tx_auto):
        state = _state(MLP(), tx, dense_after=3)
        flags = []
        for i in range(5):
            flags.append(bool(state.is_sparse()))
            if not flags[-1]:  # dense: the decay masks keep everything
                assert all(bool(m.all()) for m in jax.tree_util.tree_leaves(state.decay_masks()))
            state = _static_step(state, x, y, flags[-1]) if static else train_step(state, x, y)[0]
            if i == 2 and static and tx is tx_stop:  # the sparse phase: the hand-wired program bit for bit
                _assert_tree_equal(state.params, params3)
                _assert_tree_equal(state.opt_state, opt_state3)
        assert flags == ref_flags
        _assert_tree_equal(state.sparsity, sparsity)
        # same math after the switch; XLA fuses a traced flag, the all-ones decay masks, ... differently
        for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(params)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # the model really ran dense: the forward is the dense kernel's
    out = state.apply(x)
    dense = MLP(method="dense").apply({"params": state.params}, x)
    np.testing.assert_allclose(out, dense, rtol=1e-6, atol=1e-6)


def test_step_phase_switch():
    """STEP (adamw_step in tx): dense until the optimizer switches, then sparse."""
    tx = optax.chain(optax.clip_by_global_norm(1.0), s24.optim.adamw_step(0.01, b2=0.99, clipping=(1, 3)))
    x, y = _data()
    state = _state(MLP(), tx)
    assert state.has_phases
    flags = []
    for _ in range(6):
        flags.append(bool(state.is_sparse()))
        state = _static_step(state, x, y, flags[-1])
    assert flags == [False] * 4 + [True] * 2  # switched by update t_max + 1 = 4
    params, sparsity, opt_state, _, ref_flags = _run_hand(
        MLP(), tx, 6, sparse_at=lambda s, opt: bool(s24.optim.is_sparse_phase(opt)))
    assert ref_flags == flags
    _assert_tree_equal(state.params, params)
    _assert_tree_equal(state.sparsity, sparsity)
    _assert_tree_equal(state.opt_state, opt_state)
    # the traced phase flag (one program) follows the same switch
    state2 = _state(MLP(), tx)
    for _ in range(6):
        state2, _ = train_step(state2, x, y)
    assert bool(state2.is_sparse())
    for a, b in zip(jax.tree_util.tree_leaves(state2.params), jax.tree_util.tree_leaves(params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _accum_step(n, prepare):
    @jax.jit
    def step(state, x, y):
        xs, ys = x.reshape(n, -1, D), y.reshape(n, -1, D)
        if prepare:
            state = state.prepare(xs[0], reuse=n)

        def body(acc, inp):
            j, xb, yb = inp
            g = jax.grad(lambda p: _loss(state.apply(xb, params=p, micro_batch=j), yb))(state.params)
            return jax.tree.map(jnp.add, acc, g), None

        grads, _ = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, state.params), (jnp.arange(n), xs, ys))
        return state.apply_gradients(grads=jax.tree.map(lambda g: g / n, grads))

    return step


def test_gradient_accumulation_with_prepare():
    tx = optax.chain(s24.optim.masked_decay(0.05), optax.adamw(0.05))
    x, y = _data(16)
    with_prep, without = _state(MLP(), tx), _state(MLP(), tx)
    prepared = with_prep.prepare(x[:4], reuse=4).prepared
    assert set(prepared) == {"up", "down"} and "weight" in prepared["up"]
    for _ in range(3):
        with_prep = _accum_step(4, True)(with_prep, x, y)
        without = _accum_step(4, False)(without, x, y)
    _assert_tree_equal(with_prep, without)
    assert with_prep.prepared is None
    # without MVUE, 4 micro-batches of 4 = one batch of 16
    full = _state(MLP(mvue=False), tx)
    accum = _state(MLP(mvue=False), tx)
    for _ in range(3):
        full, _ = train_step(full, x, y)
        accum = _accum_step(4, True)(accum, x, y)
    for a, b in zip(jax.tree_util.tree_leaves(full.params), jax.tree_util.tree_leaves(accum.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_orbax_round_trip_continues_bit_exactly(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    tx = optax.chain(s24.optim.masked_decay(0.05), optax.adamw(0.05))
    x, y = _data()
    state = _state(MLP(), tx)
    for _ in range(3):
        state, _ = train_step(state, x, y)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(tmp_path / "ckpt", state)
    ckptr.wait_until_finished()
    restored = ckptr.restore(tmp_path / "ckpt", jax.eval_shape(lambda: _state(MLP(), tx)))
    assert isinstance(restored, SparseTrainState) and restored.tx is tx
    _assert_tree_equal(restored, state)
    for _ in range(3):  # crosses the refresh at step 4 and 6
        state, _ = train_step(state, x, y)
        restored, _ = train_step(restored, x, y)
    _assert_tree_equal(restored, state)


def test_sharded_step_matches_single_device():
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 devices")
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = s24.sharding.make_mesh("data=2", devices=jax.devices()[:2])
    tx = optax.chain(s24.optim.masked_decay(0.05), optax.adamw(0.05))
    x, y = _data()
    state = _state(MLP(mvue=False), tx)
    replicated = jax.device_put(state, NamedSharding(mesh, P()))
    xs, ys = (jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (x, y))
    for _ in range(3):
        state, _ = train_step(state, x, y)
        replicated, _ = train_step(replicated, xs, ys)
    for a, b in zip(_leaves(state), _leaves(replicated)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_readme_style_train_step_is_short():
    import inspect
    lines = [ln for ln in inspect.getsource(train_step).splitlines() if ln.strip()]
    assert len(lines) <= 15


def test_bad_input():
    x, _ = _data()
    model = MLP()
    v = model.init(jax.random.key(0), x)
    tx = optax.adamw(1e-3)
    with pytest.raises(ValueError, match="sparsity=variables"):
        SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx)
    with pytest.raises(ValueError, match="whole variables dict"):
        SparseTrainState.create(apply_fn=model.apply, params=v, tx=tx, sparsity=v["sparsity"])
    # a model with Sparse24Dense layers run without its masks: the layer names what is missing
    state = SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx, sparsity={})
    with pytest.raises(ValueError, match="needs 'sparsity/transposable_mask'"):
        state.apply(x)
    other = MLP().init(jax.random.key(0), jnp.ones((2, 2 * D)))
    with pytest.raises(ValueError, match="same model.init"):
        SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx, sparsity=other["sparsity"])
    with pytest.raises(ValueError, match="same model.init"):
        SparseTrainState.create(apply_fn=model.apply, params={"up": v["params"]["up"]}, tx=tx,
                                sparsity=v["sparsity"])
    bad = MLP(mask_every=0)
    vb = bad.init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="mask_every=0"):
        SparseTrainState.create(apply_fn=bad.apply, params=vb["params"], tx=tx, sparsity=vb["sparsity"])
    with pytest.raises(ValueError, match="dense_after"):
        SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx, sparsity=v["sparsity"],
                                dense_after=-1)
    with pytest.raises(ValueError, match="rng"):
        SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx, sparsity=v["sparsity"], rng=3)
    two = optax.chain(s24.optim.adamw_step(1e-3, clipping=(1, 2)), s24.optim.adamw_step(1e-3, clipping=(1, 2)))
    with pytest.raises(ValueError, match="more than one adamw_step"):
        SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=two, sparsity=v["sparsity"])
    state = SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx, sparsity=v["sparsity"])
    with pytest.raises(ValueError, match="reuse"):
        state.prepare(x, reuse=0)
    with pytest.raises(ValueError, match="sparse must be"):
        state.apply(x, sparse="yes")


def test_no_rng_no_mvue_and_dense_only_model():
    """rng=None: no "mvue" stream; a model without masks (ste layers) takes sparsity={}."""
    x, y = _data()
    model = MLP(method="ste")
    v = model.init(jax.random.key(0), x)
    assert "sparsity" not in v
    state = SparseTrainState.create(apply_fn=model.apply, params=v["params"],
                                    tx=optax.chain(s24.optim.masked_decay(0.05), optax.adamw(0.05)), sparsity={})
    assert state.mvue_key() is None and state.decay_masks() is None  # masked_decay uses its own masks
    assert state.variables() == {"params": state.params}
    state, loss = train_step(state, x, y)
    assert int(state.step) == 1 and np.isfinite(float(loss)) and float(state.flip_rate) == 0.0


class _MixedMLP(nn.Module):
    """An srste layer (stored masks) and an ste layer (mask recomputed each call, none stored)."""

    @nn.compact
    def __call__(self, x, sparse=None):
        h = nn.gelu(s24.nn.Sparse24Dense(H, name="up", method="srste", mask_every=2, backend="dense")(x, sparse=sparse))
        return s24.nn.Sparse24Dense(D, name="down", method="ste", backend="dense")(h, sparse=sparse)


@pytest.mark.parametrize("reset_moments", [False, True])
def test_prune_to_masks(reset_moments):
    """prune_to_masks: srste kernels -> kernel * mask (the dense model then computes what the 2:4 model
    computed), everything else untouched; reset_moments zeroes Adam's mu/nu at the pruned positions."""
    tx = optax.chain(optax.clip_by_global_norm(1.0), s24.optim.masked_decay(0.05), optax.adamw(0.05))
    x, y = _data()
    state = _state(_MixedMLP(), tx, dense_after=3)
    for _ in range(3):
        state = _static_step(state, x, y, True)
    assert not bool(state.is_sparse())
    pruned = state.prune_to_masks(reset_moments=reset_moments)

    m = state.sparsity["up"]["transposable_mask"]
    assert 0 < float(jnp.mean(m)) < 1
    w = state.params["up"]["kernel"]
    assert float(jnp.abs(jnp.where(m, 0.0, w)).max()) > 0  # decayed, not zero: the pruning changes them
    _assert_tree_equal(pruned.params["up"]["kernel"], jnp.where(m, w, 0.0))
    for name in ("bias",):
        _assert_tree_equal(pruned.params["up"][name], state.params["up"][name])
    _assert_tree_equal(pruned.params["down"], state.params["down"])  # ste: no stored mask, not pruned
    _assert_tree_equal(pruned.sparsity, state.sparsity)
    assert int(pruned.step) == 3 and pruned.prepared is None
    # continuity (a model of srste layers only): the dense model of the pruned state computes the
    # 2:4 model of the state; the unpruned dense model does not
    st = _state(MLP(), tx, dense_after=3)
    for _ in range(3):
        st = _static_step(st, x, y, True)
    sparse_before = st.apply(x, sparse=True)
    np.testing.assert_allclose(st.prune_to_masks().apply(x), sparse_before, rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(st.apply(x) - sparse_before).max()) > 1e-4
    adam = state.opt_state[2][0]
    new_adam = pruned.opt_state[2][0]
    assert isinstance(adam, optax.ScaleByAdamState)
    for field in ("mu", "nu"):
        old, new = getattr(adam, field), getattr(new_adam, field)
        assert float(jnp.abs(jnp.where(m, 0.0, old["up"]["kernel"])).max()) > 0
        if reset_moments:
            _assert_tree_equal(new["up"]["kernel"], jnp.where(m, old["up"]["kernel"], 0.0))
            _assert_tree_equal(new["up"]["bias"], old["up"]["bias"])
            _assert_tree_equal(new["down"], old["down"])
        else:
            _assert_tree_equal(new, old)
    _assert_tree_equal(new_adam.count, adam.count)
    _assert_tree_equal(pruned.opt_state[1], state.opt_state[1])  # masked_decay's state
    # idempotent (so a resumed run may apply it again)
    _assert_tree_equal(pruned.prune_to_masks(reset_moments=reset_moments).params, pruned.params)
    _assert_tree_equal(pruned.prune_to_masks(reset_moments=reset_moments).opt_state, pruned.opt_state)
    # jits (the state is a pytree) to the same numbers
    _assert_tree_equal(jax.jit(lambda s: s.prune_to_masks(reset_moments=reset_moments))(state).params, pruned.params)
    # and a dense step from it trains
    after = _static_step(pruned, x, y, False)
    assert float(jnp.abs(jnp.where(m, 0.0, after.params["up"]["kernel"])).max()) > 0


@pytest.mark.parametrize("method", ["ste", "soft"])
def test_prune_to_masks_of_layers_without_stored_masks(method):
    """prune_to_masks(method=, paths=) for ste / soft (S-STE) layers: each kernel becomes the weight its
    sparse forward pass used (ste: kernel ⊙ mask24(kernel); soft: β·S(kernel)), so the dense model of
    the new state computes the 2:4 model of the old one; soft's β become 1 and a second call changes
    nothing; reset_moments zeroes Adam's moments where the new kernel is pruned."""
    tx = optax.adamw(0.05)
    x, y = _data()
    model = MLP(method=method, mvue=False)
    v = model.init(jax.random.key(0), x)  # ste: no sparsity collection at all
    state = SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx,
                                    sparsity=v.get("sparsity", {}), dense_after=3)
    for _ in range(3):
        state = _static_step(state, x, y, True)
    paths = [("up",), "down"]  # tuples or "a/b" strings
    new, masks = s24.masks.sparse_weights(state.params, state.sparsity, method=method, paths=paths)
    for name in ("up", "down"):
        w, m = state.params[name]["kernel"], masks[name]["kernel"]
        if method == "ste":
            want_m = s24.mask24(w, axis=0)
            want = jnp.where(want_m, w, 0.0)
        else:
            s, want_m = s24.soft_threshold24(w, axis=0)
            beta = state.sparsity[name]["beta"]
            assert float(beta) != 1.0
            want = (beta * s).astype(w.dtype)
        _assert_tree_equal(m, want_m)
        _assert_tree_equal(new[name]["kernel"], want)
        _assert_tree_equal(new[name]["bias"], state.params[name]["bias"])
        assert masks[name]["bias"] is None
    pruned = state.prune_to_masks(method=method, paths=paths)
    _assert_tree_equal(pruned.params, new)
    sparse_before = state.apply(x, sparse=True)
    np.testing.assert_allclose(pruned.apply(x, sparse=False), sparse_before, rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(state.apply(x, sparse=False) - sparse_before).max()) > 1e-4
    if method == "soft":
        for name in ("up", "down"):
            assert float(pruned.sparsity[name]["beta"]) == 1.0
    else:
        _assert_tree_equal(pruned.sparsity, state.sparsity)
    again = pruned.prune_to_masks(method=method, paths=paths)  # idempotent: a resumed run may apply it twice
    _assert_tree_equal(again.params, pruned.params)
    _assert_tree_equal(again.sparsity, pruned.sparsity)
    reset = state.prune_to_masks(method=method, paths=paths, reset_moments=True)
    mu = reset.opt_state[0].mu
    m = masks["up"]["kernel"]
    _assert_tree_equal(mu["up"]["kernel"], jnp.where(m, state.opt_state[0].mu["up"]["kernel"], 0.0))
    _assert_tree_equal(mu["up"]["bias"], state.opt_state[0].mu["up"]["bias"])
    # the srste call is unchanged by the new arguments' defaults; errors name the problem
    with pytest.raises(ValueError, match="method and paths together"):
        state.prune_to_masks(method=method)
    with pytest.raises(ValueError, match="no kernel at nope"):
        s24.masks.sparse_weights(state.params, state.sparsity, method=method, paths=["nope"])
    with pytest.raises(ValueError, match="must be 'srste', 'ste' or 'soft'"):
        s24.masks.sparse_weights(state.params, state.sparsity, method="dense", paths=paths)
    with pytest.raises(ValueError, match="list of layer paths"):
        s24.masks.sparse_weights(state.params, state.sparsity, method=method, paths="up")
    if method == "soft":
        with pytest.raises(ValueError, match="no S-STE beta for up"):
            s24.masks.sparse_weights(state.params, {}, method="soft", paths=["up"])


def test_create_checks_the_masks_it_is_given():
    """The layers trust their sparsity collection: a mask edited by hand is refused at create."""
    class M(nn.Module):
        @nn.compact
        def __call__(self, x):
            return s24.nn.Sparse24Dense(8)(x)

    x = jnp.ones((2, 16))
    v = M().init(jax.random.key(0), x)
    bad = jax.tree_util.tree_map(lambda a: jnp.ones_like(a) if a.dtype == jnp.bool_ else a, v["sparsity"])
    with pytest.raises(s24.MaskCheckError, match=r"transposable_mask'.*not 2:4 along axis 0 \(in\)"):
        s24.training.SparseTrainState.create(apply_fn=M().apply, params=v["params"], tx=optax.sgd(0.1),
                                             sparsity=bad)
    in_only = jax.tree_util.tree_map(
        lambda a: s24.mask24(v["params"]["Sparse24Dense_0"]["kernel"], axis=0) if a.dtype == jnp.bool_ else a,
        v["sparsity"])
    with pytest.raises(s24.MaskCheckError, match=r"along axis 1 \(out, transposable\)"):
        s24.training.SparseTrainState.create(apply_fn=M().apply, params=v["params"], tx=optax.sgd(0.1),
                                             sparsity=in_only)
    s24.training.SparseTrainState.create(apply_fn=M().apply, params=v["params"], tx=optax.sgd(0.1),
                                         sparsity=v["sparsity"])  # the library's own masks pass
