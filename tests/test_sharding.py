"""Sharding: the 2:4 ops, sparse24_linear and a Sparse24Dense MLP on 8 host devices.

Every case compares against the single-device run. "auto" = ``jit`` with ``NamedSharding``
in/out shardings (the ops are ``custom_partitioning`` ops, Shardy and GSPMD); "explicit" =
``shard_map``; "explicit axes" = sharding in types (``AxisType.Explicit``). The compiled HLO of the sharded cases must hold no all-gather of a full weight,
and the lowered module must hold the partitioned custom calls (the same wrapping that runs around
the CUDA kernels on a GPU). Needs ``--xla_force_host_platform_device_count=8`` (tests/conftest.py).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sparse24 as s24
from jax_sparse24 import sharding as shd
from jax_sparse24._src import reference_ops
from jax_sparse24.nn import Sparse24Dense
from jax_sparse24.masks import refresh_masks

CPUS = jax.devices("cpu")
pytestmark = pytest.mark.skipif(len(CPUS) < 8, reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8")

CP_TARGET = "CustomSPMDPartitioning"


def test_mvue_shard_map_without_vma_checks_draws_per_device():
    """shard_map(check_vma=False): JAX tracks no varying axes, so which axes split the data is unknown;
    every device then draws its own MVUE sample (fold_in with its index over all manual axes), as with
    the checks on. Before, the key was folded by the data's (empty) varying axes: 8 identical token
    shards drew 8 identical samples."""
    mesh = _mesh("data=8")
    key, block = jax.random.key(3), np.asarray(_rand((8, 16), 4))
    g = jnp.asarray(np.tile(block, (8, 1)))  # 8 identical token shards
    for check in (True, False):
        out = jax.jit(jax.shard_map(lambda k, g: s24.mvue24(k, g, axis=0), mesh=mesh, in_specs=(P(), P("data")),
                                    out_specs=P("data"), check_vma=check))(key, g)
        shards = np.asarray(out).reshape(8, 8, 16)
        assert len({s.tobytes() for s in shards}) == 8, f"check_vma={check}: shards drew the same sample"
        want = [np.asarray(reference_ops.mvue24(jax.random.fold_in(key, d), jnp.asarray(block), 0)) for d in range(8)]
        np.testing.assert_allclose(shards, np.stack(want), rtol=1e-6, atol=1e-6)


def test_kernel_ops_inside_shard_map_type_like_the_reference(monkeypatch):
    """With the CUDA kernels planned (the extension's interface and the FFI call faked; a CPU traces
    the CUDA branch of lax.platform_dependent), the ops trace inside shard_map with check_vma=True:
    jax.ffi.ffi_call returns results that vary over no mesh axis, so without the cast in ffi.ffi_call
    the CUDA branch did not type like the reference branch (TypeError: switch branches must have equal
    output types) — fp8 and 16-bit GEMMs, the MVUE and mask kernels alike."""
    from test_fp8 import _clear_caches, _FakeExt

    from jax_sparse24._src import ffi

    _clear_caches()
    monkeypatch.setattr(ffi, "_load", lambda: (_FakeExt(), None))
    monkeypatch.setattr(ffi, "cuda_kernels_available", lambda: True)

    def fake_ffi_call(target, result_shape_dtypes, **kw):  # results typed as the real ones: no varying axes
        def call(*args, **attrs):
            single = not isinstance(result_shape_dtypes, (list, tuple))
            outs = [jnp.zeros(r.shape, r.dtype) for r in ([result_shape_dtypes] if single else result_shape_dtypes)]
            return outs[0] if single else outs
        return call

    monkeypatch.setattr(jax.ffi, "ffi_call", fake_ffi_call)
    mesh = _mesh("data=4")
    x, w = _rand((128, 64), 1), 0.1 * _rand((64, 32), 2)
    m = reference_ops.transposable_mask24(w)
    key = jax.random.key(0)

    def fp8_step(x):
        return jax.grad(lambda x: jnp.sum(s24.sparse24_linear(x, w, m, transposable=True, fp8=True, backend="cutlass",
                                                              key=key) ** 2))(x)

    cases = {
        "fp8 linear fwd+bwd": fp8_step,
        "bf16 linear cutlass": lambda x: s24.sparse24_linear(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), m,
                                                            backend="cutlass"),
        "mvue24": lambda x: s24.mvue24(key, x, axis=0),
        "mask24": lambda x: s24.mask24(x, axis=-1).astype(jnp.float32),
    }
    for name, fn in cases.items():
        f = jax.shard_map(fn, mesh=mesh, in_specs=P("data"), out_specs=P("data"), check_vma=True)
        jaxpr = jax.make_jaxpr(f)(x)  # raised TypeError before
        assert "platform_index" in str(jaxpr) or "cond" in str(jaxpr), name  # the CUDA branch was traced
    # sharding in types (Explicit axes): the ops run their own shard_map, the same cast applies
    explicit = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,), devices=CPUS[:4])
    xe = jax.device_put(x, NamedSharding(explicit, P("data")))
    for name in ("fp8 linear fwd+bwd", "mvue24", "mask24"):
        jax.make_jaxpr(cases[name])(xe)  # raised TypeError before


@pytest.fixture
def partitioner_runs():
    """JAX's persistent compilation cache off for the test: a hit skips the partitioner, whose callbacks the test
    records (and the cache key does not see what a test fakes in them: two parametrizations of the same program
    would share one entry, whichever compiled first)."""
    cache = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", cache)


def _mesh(spec):
    shape = dict(p.split("=") for p in spec.split(","))
    n = int(np.prod([int(v) for v in shape.values()]))
    return shd.make_mesh(spec, devices=CPUS[:n])


@pytest.fixture(params=["shardy", "gspmd"])
def partitioner(request):
    try:
        old = jax.config.jax_use_shardy_partitioner
    except AttributeError:  # a JAX without the GSPMD option: Shardy only
        if request.param == "gspmd":
            pytest.skip("this JAX has no jax_use_shardy_partitioner flag")
        yield request.param
        return
    jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
    yield request.param
    jax.config.update("jax_use_shardy_partitioner", old)


def _rand(shape, seed):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _tree_close(a, b, rtol=2e-5, atol=2e-6):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        if x.dtype == jnp.bool_:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def _all_gathers(hlo: str):
    """Result shapes of all-gathers in compiled HLO text, e.g. ['f32[32,128]']."""
    out = []
    for line in hlo.splitlines():
        if re.search(r"\ball-gather(-start)?\(", line):
            m = re.search(r"=\s*\(?\s*([a-z0-9]+\[[0-9,]*\])", line)
            out.append(m.group(1) if m else line.strip())
    return out


def _assert_no_full_gather(jitted, args, shapes):
    hlo = jitted.lower(*args).compile().as_text()
    gathered = _all_gathers(hlo)
    full = {f"[{','.join(map(str, s))}]" for s in shapes}
    bad = [g for g in gathered if any(g.endswith(f) for f in full)]
    assert not bad, f"all-gather of full weights in the compiled HLO: {bad}"
    return gathered


# ----------------------------------------------------------------------------------------------
# Mask-family ops
# ----------------------------------------------------------------------------------------------

_MASK_OPS = {
    "mask24_in": (lambda x: s24.mask24(x, axis=0), lambda x: reference_ops.mask24(x, 0)),
    "mask24_out": (lambda x: s24.mask24(x, axis=-1), lambda x: reference_ops.mask24(x, -1)),
    "transposable": (s24.transposable_mask24, reference_ops.transposable_mask24),
    "soft": (lambda x: s24.soft_threshold24(x, axis=0), lambda x: reference_ops.soft_threshold24(x, 0)),
}


@pytest.mark.parametrize("spec", [P("data", "model"), P(None, ("data", "model"))])
@pytest.mark.parametrize("op", list(_MASK_OPS))
def test_mask_ops_auto(partitioner, op, spec):
    if partitioner == "gspmd" and spec != P("data", "model"):
        pytest.skip("GSPMD: one layout per op")
    mesh = _mesh("data=2,model=4")
    fn, ref = _MASK_OPS[op]
    x = _rand((32, 64), 0)
    sh = NamedSharding(mesh, spec)
    f = jax.jit(fn, in_shardings=sh, out_shardings=sh)
    _tree_close(f(x), ref(x), rtol=0, atol=0)
    assert CP_TARGET in f.lower(x).as_text()
    assert _all_gathers(f.lower(x).compile().as_text()) == []


def test_mask_ops_output_sharding_follows_input():
    mesh = _mesh("data=2,model=4")
    x = _rand((32, 64), 1)
    y = jax.jit(lambda x: s24.mask24(x, axis=0), in_shardings=NamedSharding(mesh, P("model", "data")))(x)
    assert y.sharding.spec == P("model", "data")


def test_mask_ops_vmap_and_grad_sharded():
    mesh = _mesh("data=2,model=4")
    x = _rand((4, 8, 16), 2)
    sh = NamedSharding(mesh, P("data", None, "model"))
    f = jax.jit(jax.vmap(lambda x: s24.mask24(x, axis=0)), in_shardings=sh, out_shardings=sh)
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(jax.vmap(lambda x: reference_ops.mask24(x, 0))(x)))
    w = _rand((32, 16), 3)
    loss = lambda w, st: jnp.sum(st(w, 0)[0] ** 2)  # noqa: E731
    g = jax.jit(jax.grad(lambda w: loss(w, s24.soft_threshold24)), in_shardings=NamedSharding(mesh, P("data", "model")))(w)
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(lambda w: loss(w, reference_ops.soft_threshold24))(w)),
                               rtol=1e-6)


def test_mask_ops_shard_map():
    mesh = _mesh("data=2,model=4")
    x = _rand((32, 64), 4)
    for op, (fn, ref) in _MASK_OPS.items():
        f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model")))
        _tree_close(f(x), ref(x), rtol=0, atol=0)


def test_mvue_blocks_auto_equals_shard_map_equals_per_block_reference():
    mesh = _mesh("data=2,model=4")
    key, g = jax.random.key(7), _rand((32, 16), 5)
    spec = P("data", "model")
    auto = jax.jit(lambda k, g: s24.mvue24(k, g, axis=0),
                   in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, spec)))(key, g)
    expl = jax.jit(jax.shard_map(lambda k, g: s24.mvue24(k, g, axis=0), mesh=mesh, in_specs=(P(), spec),
                                 out_specs=spec))(key, g)
    # Block (d, m) of the (data=2, model=4) mesh draws with fold_in(key, d*4 + m).
    @jax.jit
    def emulate(key, g):
        blocks = g.reshape(2, 16, 4, 4).transpose(0, 2, 1, 3).reshape(8, 16, 4)
        keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(8))
        out = jax.vmap(lambda k, b: reference_ops.mvue24(k, b, 0))(keys, blocks)
        return out.reshape(2, 4, 16, 4).transpose(0, 2, 1, 3).reshape(32, 16)

    emu = np.asarray(emulate(key, g))
    np.testing.assert_allclose(np.asarray(auto), emu, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(expl), emu, rtol=1e-6, atol=1e-6)
    # Unsharded: the plain key (the single-device result).
    rep = jax.jit(lambda k, g: s24.mvue24(k, g, axis=0), in_shardings=NamedSharding(mesh, P()))(key, g)
    np.testing.assert_allclose(np.asarray(rep), np.asarray(jax.jit(reference_ops.mvue24, static_argnums=2)(key, g, 0)),
                               rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# sparse24_linear (two layers: column- then row-parallel)
# ----------------------------------------------------------------------------------------------

T, D, F = 64, 32, 128
_LAYOUTS = {  # mesh, x spec, (w1, b1, w2, b2) specs
    "dp8": ("data=8", P("data"), (P(), P(), P(), P())),
    "tp8": ("model=8", P(), (P(None, "model"), P("model"), P("model", None), P())),
    "tp4": ("model=4", P(), (P(None, "model"), P("model"), P("model", None), P())),
    "dp2xtp4": ("data=2,model=4", P("data"), (P(None, "model"), P("model"), P("model", None), P())),
}


def _linear_problem():
    x, w1, w2 = _rand((T, D), 10), 0.2 * _rand((D, F), 11), 0.1 * _rand((F, D), 12)
    b1, b2 = 0.1 * _rand((F,), 13), 0.1 * _rand((D,), 14)
    m1, m2 = reference_ops.transposable_mask24(w1), reference_ops.transposable_mask24(w2)

    def loss(params, masks, x):
        (w1, b1, w2, b2), (m1, m2) = params, masks
        h = jax.nn.gelu(s24.sparse24_linear(x, w1, m1, b1, transposable=True))
        y = s24.sparse24_linear(h, w2, m2, b2, transposable=True)
        return jnp.mean(jnp.sin(y) * y)

    return loss, (w1, b1, w2, b2), (m1, m2), x


@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_linear_auto_forward_and_grads(partitioner, layout):
    if partitioner == "gspmd" and layout != "dp2xtp4":
        pytest.skip("GSPMD: the 2-axis layout covers it")
    mesh_spec, xs, ps = _LAYOUTS[layout]
    mesh = _mesh(mesh_spec)
    loss, params, masks, x = _linear_problem()
    vg = jax.value_and_grad(loss)
    ref = jax.jit(vg)(params, masks, x)
    psh = tuple(NamedSharding(mesh, s) for s in ps)
    msh = (psh[0], psh[2])
    f = jax.jit(vg, in_shardings=(psh, msh, NamedSharding(mesh, xs)), out_shardings=(NamedSharding(mesh, P()), psh))
    out = f(params, masks, x)
    _tree_close(out, ref)
    assert f.lower(params, masks, x).as_text().count(CP_TARGET) >= 5  # 2 × (fwd, ∇W) + ∇h
    gathered = _assert_no_full_gather(f, (params, masks, x), [(D, F), (F, D)])
    if layout != "dp8":  # tensor parallel: weights never move at all
        assert not [g for g in gathered if g.startswith(("f32[32,", "f32[128,", "pred["))], gathered


def test_linear_forward_shardings():
    mesh = _mesh("data=2,model=4")
    x, w = _rand((16, 32), 20), _rand((32, 64), 21)
    m = reference_ops.mask24(w, 0)
    # check_mask=False: a traced mask's device check adds its own reduction (an all-reduce of one count)
    lin = lambda x, w, m: s24.sparse24_linear(x, w, m, check_mask=False)  # noqa: E731
    ns = lambda *s: NamedSharding(mesh, P(*s))  # noqa: E731
    # tokens sharded -> y tokens sharded; W on out -> y on out; W on in (x on features) -> psum.
    for xs, ws, ys in [(("data",), (), ("data",)), ((), (None, "model"), (None, "model")),
                       (("data", "model"), ("model", None), ("data",))]:
        f = jax.jit(lin, in_shardings=(ns(*xs), ns(*ws), ns(*ws)))
        y = f(x, w, m)
        np.testing.assert_allclose(np.asarray(y), np.asarray(x @ (w * m)), rtol=2e-5, atol=2e-5)
        assert y.sharding.spec == P(*ys)
        hlo = f.lower(x, w, m).compile().as_text()
        assert _all_gathers(hlo) == []
        assert ("all-reduce" in hlo) == (ws == ("model", None))


def test_linear_mvue_weight_grad_data_parallel():
    """∇W = Σ_shards xᵀ·MVUE(∇y) with each data shard drawing from fold_in(key, shard)."""
    mesh = _mesh("data=8")
    x, w, c = _rand((64, 16), 30), _rand((16, 8), 31), _rand((64, 8), 32)
    m, key = reference_ops.mask24(w, 0), jax.random.key(3)
    loss = lambda w, x: jnp.sum(s24.sparse24_linear(x, w, m, key=key, backend="dense") * c)  # noqa: E731  (∇y = c)
    dw = jax.jit(jax.grad(loss), in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))))(w, x)

    @jax.jit
    def emulate(x, c):
        keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(8))
        gs = jax.vmap(lambda k, c: reference_ops.mvue24(k, c, 0))(keys, c.reshape(8, 8, 8))
        return jnp.einsum("dti,dto->io", x.reshape(8, 8, 16), gs)

    emu = emulate(x, c)
    np.testing.assert_allclose(np.asarray(dw), np.asarray(emu), rtol=1e-5, atol=1e-5)


def test_linear_shard_map_megatron():
    mesh = _mesh("data=2,model=4")
    loss, params, masks, x = _linear_problem()
    ref = jax.jit(jax.value_and_grad(loss))(params, masks, x)
    pspec = (P(None, "model"), P("model"), P("model", None), P())
    mspec = (P(None, "model"), P("model", None))

    def local(params, masks, x):
        def l(params):
            (w1, b1, w2, b2), (m1, m2) = params, masks
            h = jax.nn.gelu(s24.sparse24_linear(x, w1, m1, b1, transposable=True))
            y = jax.lax.psum(s24.sparse24_linear(h, w2, m2, transposable=True), "model") + b2
            return jax.lax.pmean(jnp.mean(jnp.sin(y) * y), "data")
        return jax.value_and_grad(l)(params)

    f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(pspec, mspec, P("data")), out_specs=(P(), pspec)))
    _tree_close(f(params, masks, x), ref)


def test_linear_explicit_axes_mesh():
    """Sharding in types (``AxisType.Explicit``, ``jax.make_mesh``'s default): same rule, run as a
    shard_map at trace time; a split 4-group is a plain ValueError while tracing."""
    explicit = (jax.sharding.AxisType.Explicit,) * 2
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=explicit, devices=CPUS[:8])
    loss, params, masks, x = _linear_problem()
    ref = jax.jit(jax.value_and_grad(loss))(params, masks, x)
    specs = (P(None, "model"), P("model"), P("model", None), P())
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    args = (tuple(put(a, s) for a, s in zip(params, specs)),
            (put(masks[0], specs[0]), put(masks[1], specs[2])), put(x, P("data")))
    out = jax.jit(jax.value_and_grad(loss))(*args)
    _tree_close(out, ref)
    assert out[1][2].sharding.spec == P("model", None)
    w = put(_rand((48, 8), 60), P(("data", "model"), None))  # in=48 over 8 devices: 6 each
    with pytest.raises(ValueError, match=r"sharded 8 ways over mesh axes \('data', 'model'\)"):
        jax.jit(lambda w: s24.mask24(w, axis=0))(w)


@pytest.mark.parametrize("wspec", [P("fsdp", None), P("model", "fsdp")], ids=["fsdp", "fsdp_model"])
def test_linear_explicit_axes_fsdp_gradients(wspec):
    """FSDP with sharding in types: tokens and weight split over one Explicit axis (and the weight
    over ``model`` too). The gradients have their primals' shardings -- a custom_vjp cotangent must,
    there (before, the GEMM's replicated weight gradient was refused) -- and equal one device's."""
    explicit = (jax.sharding.AxisType.Explicit,) * 2
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=explicit, devices=CPUS[:8])
    k1, k2 = jax.random.split(jax.random.key(0))
    x, w = jax.random.normal(k1, (64, 32)), jax.random.normal(k2, (32, 48))
    m = s24.transposable_mask24(w)

    def loss(x, w, m):
        return jnp.sum(jnp.sin(s24.sparse24_linear(x, w, m, transposable=True, check_mask=False)))

    ref = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w, m)
    xa = jax.device_put(x, NamedSharding(mesh, P("fsdp", None)))
    wa, ma = (jax.device_put(a, NamedSharding(mesh, wspec)) for a in (w, m))
    out = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(xa, wa, ma)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):  # another summation order than one device
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
    assert out[1][0].sharding.spec == xa.sharding.spec and out[1][1].sharding.spec == wspec


# ----------------------------------------------------------------------------------------------
# A 2-layer Sparse24Dense MLP train step
# ----------------------------------------------------------------------------------------------


class _MLP(nn.Module):
    hidden: int = F
    out: int = D

    @nn.compact
    def __call__(self, x):
        h = nn.gelu(Sparse24Dense(self.hidden, name="fc1")(x))
        return Sparse24Dense(self.out, name="fc2")(h)


_TX = optax.chain(s24.optim.masked_decay(2e-4), optax.adamw(1e-2))


def _train_step(params, sparsity, opt_state, x, y, step):
    model = _MLP()

    def loss_fn(p):
        return jnp.mean((model.apply({"params": p, "sparsity": sparsity}, x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    masks = s24.masks.masks_for_params(params, sparsity)
    updates, opt_state = _TX.update(grads, opt_state, params, masks=masks)
    params = optax.apply_updates(params, updates)
    sparsity, flips = refresh_masks(params, sparsity, step=step)
    return params, sparsity, opt_state, loss, flips


def _mlp_setup():
    x, y = _rand((16, 4, D), 40), _rand((16, 4, D), 41)
    variables = _MLP().init(jax.random.key(0), x)
    params, sparsity = variables["params"], variables["sparsity"]
    sparsity = jax.tree_util.tree_map(lambda a: jnp.ones_like(a) if a.dtype == jnp.int32 else a, sparsity)  # refresh every step
    return params, sparsity, _TX.init(params), x, y


def _run(step_fn, state, x, y, steps=2):
    params, sparsity, opt_state = state
    for s in range(steps):
        params, sparsity, opt_state, loss, flips = step_fn(params, sparsity, opt_state, x, y, s)
    return params, sparsity, opt_state, loss, flips


@pytest.mark.parametrize("layout", ["dp8", "tp8", "tp4", "dp2xtp4"])
def test_mlp_train_step_auto(layout):
    mesh_spec, xs, _ = _LAYOUTS[layout]
    mesh = _mesh(mesh_spec)
    params, sparsity, opt_state, x, y = _mlp_setup()
    ref = _run(jax.jit(_train_step), (params, sparsity, opt_state), x, y)

    rules = shd.megatron_mlp_rules("fc1", "fc2") if "model" in mesh.axis_names else []
    p_sh = shd.param_shardings(params, mesh, rules)
    s_sh = shd.param_shardings(sparsity, mesh, rules)
    o_sh = shd.param_shardings(opt_state, mesh, rules)
    if layout == "tp8":
        assert s_sh["fc1"]["transposable_mask"].spec == P(None, "model")  # masks follow kernels
    x_sh = NamedSharding(mesh, xs)
    rep = NamedSharding(mesh, P())
    step = jax.jit(_train_step, in_shardings=(p_sh, s_sh, o_sh, x_sh, x_sh, None),
                   out_shardings=(p_sh, s_sh, o_sh, rep, rep))
    out = _run(step, (params, sparsity, opt_state), x, y)
    _tree_close(out, ref, rtol=1e-4, atol=1e-5)
    assert out[0]["fc1"]["kernel"].sharding.spec == p_sh["fc1"]["kernel"].spec
    lowered_args = (params, sparsity, opt_state, x, y, 0)
    # fwd ×2, ∇h, ∇W ×2, transposable_mask24 ×2 (refresh)
    assert step.lower(*lowered_args).as_text().count(CP_TARGET) >= 7
    _assert_no_full_gather(step, lowered_args, [(D, F), (F, D)])


def test_mlp_train_step_explicit_axes_mesh():
    explicit = (jax.sharding.AxisType.Explicit,) * 2
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=explicit, devices=CPUS[:8])
    params, sparsity, opt_state, x, y = _mlp_setup()
    ref = _run(jax.jit(_train_step), (params, sparsity, opt_state), x, y)
    rules = shd.megatron_mlp_rules("fc1", "fc2")
    put = lambda tree: jax.device_put(tree, shd.param_shardings(tree, mesh, rules))  # noqa: E731
    xs, ys = (jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (x, y))
    out = _run(jax.jit(_train_step), (put(params), put(sparsity), put(opt_state)), xs, ys)
    _tree_close(out, ref, rtol=1e-4, atol=1e-5)
    assert out[0]["fc2"]["kernel"].sharding.spec == P("model", None)


def test_mlp_train_step_shard_map_data_parallel():
    mesh = _mesh("data=8")
    params, sparsity, opt_state, x, y = _mlp_setup()
    ref = _run(jax.jit(_train_step), (params, sparsity, opt_state), x, y, steps=1)

    def local(params, sparsity, opt_state, x, y):
        model = _MLP()

        def loss_fn(p):
            return jax.lax.pmean(jnp.mean((model.apply({"params": p, "sparsity": sparsity}, x) - y) ** 2), "data")

        loss, grads = jax.value_and_grad(loss_fn)(params)  # replicated params: grads come back summed
        masks = s24.masks.masks_for_params(params, sparsity)
        updates, opt_state = _TX.update(grads, opt_state, params, masks=masks)
        params = optax.apply_updates(params, updates)
        sparsity, flips = refresh_masks(params, sparsity, step=0)
        return params, sparsity, opt_state, loss, flips

    f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), P("data"), P("data")),
                              out_specs=(P(), P(), P(), P(), P())))
    _tree_close(f(params, sparsity, opt_state, x, y), ref, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Errors: a 4-group split across devices
# ----------------------------------------------------------------------------------------------


def test_error_contraction_shard_not_multiple_of_4(partitioner):
    mesh = _mesh("model=8")
    x, w = _rand((16, 48), 50), _rand((48, 8), 51)  # in=48 over 8 devices: 6 per device
    m = reference_ops.mask24(w, 0)
    f = jax.jit(lambda x, w, m: s24.sparse24_linear(x, w, m),
                in_shardings=(NamedSharding(mesh, P(None, "model")), NamedSharding(mesh, P("model", None)),
                              NamedSharding(mesh, P("model", None))))
    with pytest.raises(Exception, match=r"ValueError.*sharded 8 ways over mesh axes \('model',\).*6 elements per "
                                         r"device.*multiple of 4") as info:
        f(x, w, m)
    assert isinstance(info.value, (ValueError, RuntimeError))
    g = jax.jit(lambda x: s24.mask24(x, axis=-1), in_shardings=NamedSharding(mesh, P(None, "model")))
    with pytest.raises(Exception, match=r"mask24.*size 48.*mesh axes \('model',\).*multiple of 4"):
        g(x)


def test_error_shard_map_local_shape():
    mesh = _mesh("model=8")
    x = _rand((16, 48), 52)
    f = jax.shard_map(lambda x: s24.mask24(x, axis=-1), mesh=mesh, in_specs=P(None, "model"),
                      out_specs=P(None, "model"))
    with pytest.raises(ValueError, match="divisible by 4"):
        jax.jit(f)(x)


def test_param_shardings_errors_early():
    mesh = _mesh("model=8")
    params = {"fc1": {"kernel": jnp.zeros((8, 48))}, "fc2": {"kernel": jnp.zeros((48, 8))}}
    with pytest.raises(ValueError, match=r"fc2/kernel.*sharded 8 ways over mesh axes \('model',\).*6 per device"):
        shd.param_shardings(params, mesh, shd.megatron_mlp_rules("fc1", "fc2"))
    with pytest.raises(ValueError, match="needs 16 devices"):
        shd.make_mesh("data=4,model=4", devices=CPUS[:8])


def test_make_mesh_and_shard_batch():
    mesh = shd.make_mesh("data=-1,model=2", devices=CPUS[:8])
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    b = shd.shard_batch({"x": np.zeros((8, 3)), "y": np.zeros((8,))}, mesh)
    assert b["x"].sharding.spec == P("data") and b["x"].addressable_shards[0].data.shape == (2, 3)
    with pytest.raises(ValueError, match="not divisible"):
        shd.shard_batch(np.zeros((6, 2)), mesh)


@pytest.mark.parametrize("backend", ["cutlass", "cusparselt"])
def test_prepared_gemm_rules_data_parallel(backend):
    """The prepared GEMMs take the compressed operand of either backend (CUTLASS's two 2-D arrays,
    cuSPARSELt's one byte buffer) replicated, with the tokens sharded: per-shard GEMMs, no psum, and
    the same values as unsharded (the reference lowering here; the GPU runs the kernels)."""
    from jax_sparse24._src import backends, prepared_weight
    from jax_sparse24._src import partitioning as _sh

    rule = backends.get(backend).sharding_rule("forward", prepared=True)
    extra = rule.operands[3:]
    assert extra == ((("pv0", "pv1"), ("pm0", "pm1")) if backend == "cutlass" else (("pb",),))
    assert {"i", "o", *(d for dims in extra for d in dims)} <= set(rule.replicated) and rule.contract == ()
    mesh = _mesh("data=8")
    x, w = _rand((64, 32), 30), _rand((32, 48), 31)
    m = reference_ops.mask24(w, 0) & reference_ops.mask24(w, 1)
    entry = ({"values": jnp.zeros((48, 16)), "meta": jnp.zeros((48, 4), jnp.uint8)} if backend == "cutlass"
             else {"cusparselt": jnp.zeros((48 * 32 * 9 // 8,), jnp.uint8)})  # never read off CUDA
    ns = lambda *s: NamedSharding(mesh, P(*s))  # noqa: E731
    rep = jax.tree.map(lambda _: ns(), entry)
    for fn, b, want in ((prepared_weight.forward_prepared, x, x @ (w * m)),
                        (prepared_weight.input_grad_prepared, x @ (w * m), (x @ (w * m)) @ (w * m).T)):
        f = jax.jit(lambda b, w, m, e, fn=fn: fn(b, w, m, e), in_shardings=(ns("data"), ns(), ns(), rep))
        y = f(b, w, m, entry)
        np.testing.assert_allclose(np.asarray(y), np.asarray(want), rtol=2e-5, atol=2e-5)
        assert y.sharding.spec == P("data")
        hlo = f.lower(b, w, m, entry).compile().as_text()
        assert _all_gathers(hlo) == [] and "all-reduce" not in hlo
    # tensor parallel: the weight (and mask) sharded over `model`; the prepared operand covers the
    # whole weight, so the rule gathers the weight for these GEMMs — same values
    tp = _mesh("data=2,model=4")
    nt = lambda *s: NamedSharding(tp, P(*s))  # noqa: E731
    rep_tp = jax.tree.map(lambda _: nt(), entry)
    for fn, b, want in ((prepared_weight.forward_prepared, x, x @ (w * m)),
                        (prepared_weight.input_grad_prepared, x @ (w * m), (x @ (w * m)) @ (w * m).T)):
        f = jax.jit(lambda b, w, m, e, fn=fn: fn(b, w, m, e),
                    in_shardings=(nt("data"), nt(None, "model"), nt(None, "model"), rep_tp))
        y = f(b, w, m, entry)
        np.testing.assert_allclose(np.asarray(y), np.asarray(want), rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match="the 'dense' backend has no prepared operand"):
        backends.get("dense").sharding_rule("forward", prepared=True)
    with pytest.raises(ValueError, match="applies to 'forward' and 'input_grad'"):
        backends.get("cutlass").sharding_rule("weight_grad", prepared=True)


@pytest.mark.parametrize("local_kernel", ["sparse", "mvue_dense"])
def test_mvue_weight_grad_kernel_sees_local_shapes_tensor_parallel(monkeypatch, local_kernel, partitioner_runs):
    """Under tensor parallelism the fused MVUE weight-gradient GEMM runs on O-shards: every size
    handed to the kernels is the shard's (a 2-GPU run with ``--mesh data=1,model=2`` failed with
    "`values` must have the compressed shape (3072, 4096) ..., got (1536, 4096)": the global O).
    The CUDA branch is traced here with the kernel calls stubbed (shape-checked by the real argument
    checks); a shard the sparse kernel cannot take draws the same MVUE sample and multiplies dense."""
    from jax_sparse24._src import cuda_compress_ops as cc
    from jax_sparse24._src import cuda_mask_ops as cmo
    from jax_sparse24._src import cuda_spmm_ops as cs
    from jax_sparse24._src import autotune, backends, ffi, gemm

    if ffi.extension() is None:
        pytest.skip(f"needs the built extension (shape checks): {ffi.extension_error()}")
    calls = []
    monkeypatch.setattr(autotune, "weight_grad_path", lambda *a: autotune.WeightGradPath(backends.CUTLASS, mvue=True))
    monkeypatch.setattr(cs, "cutlass_configs_kn", lambda: ("k1",))
    # global O = 128 is supported; the 16-wide shards are only where local_kernel == "sparse"
    monkeypatch.setattr(cs, "cutlass_supports_kn", lambda m, n, k, dt: local_kernel == "sparse" or m >= 128)

    def compress(key, x, *, transposed=True, layout="cutlass"):  # A = MVUE(x)ᵀ: (x.cols, x.rows)
        calls.append(("compress", x.shape))
        vs, ms = cs.cutlass_compressed_shapes(x.shape[1], x.shape[0], x.dtype)
        return jnp.zeros(vs, x.dtype), jnp.zeros(ms, jnp.uint8)

    def spmm_call(target, values, meta, b, dtype, m, n, k, *rest):
        calls.append(("spmm", m, n, k))
        return jnp.zeros((n, m), dtype)

    def mvue_cuda(key, g, axis):
        calls.append(("mvue", g.shape))
        return g

    monkeypatch.setattr(cc, "mvue24_compress", compress)
    monkeypatch.setattr(cs, "_spmm_call", spmm_call)
    monkeypatch.setattr(cmo, "mvue24_cuda", mvue_cuda)
    # trace the CUDA branch (its argument checks run), compute with the reference on the CPU
    monkeypatch.setattr(ffi, "per_platform", lambda ref, cuda, *a, **kw: (cuda(*a), ref(*a))[1])
    mesh = _mesh("model=8")
    x, g = _rand((64, 32), 40).astype(jnp.bfloat16), _rand((64, 128), 41).astype(jnp.bfloat16)
    key = jax.random.key(5)
    ns = lambda *s: NamedSharding(mesh, P(*s))  # noqa: E731
    f = jax.jit(lambda key, x, g: gemm.weight_grad_mvue(key, x, g, backend="cutlass"),
                in_shardings=(ns(), ns(), ns(None, "model")), out_shardings=ns(None, "model"))
    dw = f(key, x, g)
    assert dw.shape == (32, 128) and bool(jnp.isfinite(dw.astype(jnp.float32)).all())
    # (the partitioner also traces the whole op once on the global shapes: the calls with O = 128)
    local_calls = [c for c in calls if c[0] != "spmm" and c[1] == (64, 16) or c[0] == "spmm" and c[1] == 16]
    if local_kernel == "sparse":
        assert local_calls == [("compress", (64, 16)), ("spmm", 16, 32, 64)], calls
    else:
        assert local_calls == [("mvue", (64, 16))], calls


@pytest.mark.parametrize("layout", ["dp8", "tp4", "dp2xtp4"])
def test_linear_fp8_sparse_gemms_partitioned(monkeypatch, layout, partitioner_runs):
    """fp8=True with the sparse fp8 kernels planned (the extension's interface faked, a CPU computes
    each shard's XLA branch): the forward and input-gradient fp8 GEMMs are custom-partitioned ops like
    the 16-bit ones — the same loss and gradients as unsharded (up to the bfloat16 rounding of the
    partial sums of a sharded contraction), no full weight gathered, and on a GPU the kernels would
    see the local shards: the compressor gets w's shard, the GEMM the shard's m and k."""
    from test_fp8 import _clear_caches, _FakeExt

    from jax_sparse24._src import cuda_fp8_ops as cf
    from jax_sparse24._src import ffi

    _clear_caches()
    monkeypatch.setattr(ffi, "_load", lambda: (_FakeExt(), None))
    monkeypatch.setattr(ffi, "cuda_kernels_available", lambda: True)
    mesh_spec, xs, ps = _LAYOUTS[layout]
    mesh = _mesh(mesh_spec)
    tokens = 256  # 32 per data shard: the fp8 kernel's n % 16
    x, w1, w2 = _rand((tokens, D), 10), 0.2 * _rand((D, F), 11), 0.1 * _rand((F, D), 12)
    if layout == "dp8":  # token shards of very different magnitudes: a scale taken per shard instead of
        # over the whole tensor would change the quantization of every shard but the largest. (Under a
        # model axis the bf16 partial sums flip fp8 roundings of ∇y, which such skew amplifies past the
        # tolerance: the skew is for the data-parallel layout only.)
        x = x * jnp.asarray(np.repeat(2.0 ** np.arange(-4, 4), tokens // 8)[:, None], jnp.float32)
    m1, m2 = reference_ops.transposable_mask24(w1), reference_ops.transposable_mask24(w2)

    def loss(params, x):
        w1, w2 = params
        h = jax.nn.gelu(s24.sparse24_linear(x, w1, m1, transposable=True, fp8=True, backend="cutlass"))
        y = s24.sparse24_linear(h, w2, m2, transposable=True, fp8=True, backend="cutlass")
        return jnp.mean(jnp.sin(y) * y)

    vg = jax.value_and_grad(loss)
    ref = jax.jit(vg)((w1, w2), x)
    psh = (NamedSharding(mesh, ps[0]), NamedSharding(mesh, ps[2]))
    f = jax.jit(vg, in_shardings=(psh, NamedSharding(mesh, xs)), out_shardings=(NamedSharding(mesh, P()), psh))
    out = f((w1, w2), x)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2 * np.abs(b).max())
    assert f.lower((w1, w2), x).as_text().count(CP_TARGET) >= 5  # 2 × (fwd, ∇W) + ∇h
    _assert_no_full_gather(f, ((w1, w2), x), [(D, F), (F, D)])
    # the CUDA branch, traced with the kernels stubbed: every call on the shard's sizes
    calls = []

    def compress(w, mask, scale, *, transposed=False):
        calls.append(("compress", w.shape, transposed))
        vs, ms = cf.fp8_compressed_shapes(*(w.shape[::-1] if transposed else w.shape))
        return jnp.zeros(vs, jnp.float8_e4m3fn), jnp.zeros(ms, jnp.uint8)

    def spmm(values, meta, b, alpha, *, m, k, config=-1):
        calls.append(("spmm", m, b.shape[0], k))
        return jnp.zeros((b.shape[0], m), jnp.bfloat16)

    monkeypatch.setattr(cf, "fp8_masked_compress", compress)
    monkeypatch.setattr(cf, "cutlass_spmm_fp8", spmm)
    real_pp = ffi.per_platform
    monkeypatch.setattr(ffi, "per_platform",
                        lambda ref, cuda, *a, **kw: (cuda is not None and cuda(*a), real_pp(ref, None, *a))[1])
    jax.jit(lambda p, x: vg(p, x), in_shardings=(psh, NamedSharding(mesh, xs))).lower((w1, w2), x).compile()
    n_model = dict(p.split("=") for p in mesh_spec.split(",")).get("model", "1")
    tl = tokens // int(dict(p.split("=") for p in mesh_spec.split(",")).get("data", "1"))
    fl = F // int(n_model)
    # layer 1 (D -> F, column parallel under model): forward A = q(W̃1)ᵀ (F/n, D), ∇x A = q(W̃1) (D, F/n)
    assert ("compress", (D, fl), True) in calls and ("spmm", fl, tl, D) in calls, calls
    # layer 2 (F -> D, row parallel): forward A = q(W̃2)ᵀ (D, F/n), contraction F/n; ∇h A = q(W̃2) (F/n, D)
    assert ("compress", (fl, D), True) in calls and ("compress", (fl, D), False) in calls, calls
    monkeypatch.setattr(ffi, "per_platform", real_pp)
    _clear_caches()


@pytest.mark.parametrize("gather", ["packed", "dense"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_fsdp_weight_reaches_the_compressor_packed(monkeypatch, fp8, gather, partitioner_runs):
    """Under FSDP (weight and tokens split over ``fsdp``), the sparse kernels planned (the extension's
    interface faked, a CPU computes each shard's XLA branch): the gathered weight goes to the packed
    compressor (``packed_compress``; ``fp8_packed_compress`` for fp8) as it was gathered (values of half the
    rows), for both GEMMs' directions, never to the masked one; under ``weight_gather("dense")`` the other
    way round. Loss and gradients as one device either way."""
    from test_fp8 import _clear_caches, _FakeExt

    from jax_sparse24._src import cuda_compress_ops as cc
    from jax_sparse24._src import cuda_fp8_ops as cf
    from jax_sparse24._src import cuda_spmm_ops as cs
    from jax_sparse24._src import ffi

    _clear_caches()
    monkeypatch.setattr(ffi, "_load", lambda: (_FakeExt(), None))
    monkeypatch.setattr(ffi, "cuda_kernels_available", lambda: True)
    mesh = _mesh("fsdp=4")
    dtype = jnp.float32 if fp8 else jnp.bfloat16
    x, w = _rand((256, F), 60).astype(dtype), (0.2 * _rand((F, F), 61)).astype(dtype)  # both GEMMs' A: (F, F)
    m = reference_ops.transposable_mask24(w)

    def loss(w, x):
        y = s24.sparse24_linear(x, w, m, transposable=True, fp8=fp8, backend="cutlass")
        return jnp.mean(jnp.sin(y) * y)

    vg = jax.value_and_grad(loss, argnums=(0, 1))  # ∇x too: the input-gradient GEMM
    ref = jax.jit(vg)(w, x)
    sh = NamedSharding(mesh, P("fsdp", None))
    with shd.weight_gather(gather):
        out = jax.jit(vg, in_shardings=(sh, sh), out_shardings=(NamedSharding(mesh, P()), (sh, sh)))(w, x)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2 * np.abs(b).max())
    calls = []

    def stub(name):
        def compress(a, b, *scale, transposed=False, layout="cutlass"):
            calls.append((name, a.shape, transposed))
            shape = (2 * a.shape[0], a.shape[1]) if name == "packed" else a.shape
            mk = shape[::-1] if transposed else shape
            if fp8:
                vs, ms = cf.fp8_compressed_shapes(*mk)
                return jnp.zeros(vs, jnp.float8_e4m3fn), jnp.zeros(ms, jnp.uint8)
            vs, ms = cs.cutlass_compressed_shapes(*mk, a.dtype)
            return jnp.zeros(vs, a.dtype), jnp.zeros(ms, jnp.uint8)
        return compress

    if fp8:
        monkeypatch.setattr(cf, "fp8_packed_compress", stub("packed"))
        monkeypatch.setattr(cf, "fp8_masked_compress", stub("masked"))
        monkeypatch.setattr(cf, "cutlass_spmm_fp8", lambda v, meta, b, alpha, *, m, k, config=-1:
                            jnp.zeros((b.shape[0], m), jnp.bfloat16))
    else:
        monkeypatch.setattr(cc, "packed_compress", stub("packed"))
        monkeypatch.setattr(cc, "masked_compress", stub("masked"))
        monkeypatch.setattr(cs, "cutlass_spmm", lambda v, meta, b, *, m, k, config=-1:
                            jnp.zeros((b.shape[0], m), b.dtype))
    real_pp = ffi.per_platform
    monkeypatch.setattr(ffi, "per_platform",
                        lambda ref, cuda, *a, **kw: (cuda is not None and cuda(*a), real_pp(ref, None, *a))[1])
    with shd.weight_gather(gather):
        jax.jit(vg, in_shardings=(sh, sh)).lower(w, x).compile()
    gemm_calls = set(calls)
    if gather == "packed":
        assert gemm_calls == {("packed", (F // 2, F), True), ("packed", (F // 2, F), False)}, calls
    else:
        assert gemm_calls == {("masked", (F, F), True), ("masked", (F, F), False)}, calls
    monkeypatch.setattr(ffi, "per_platform", real_pp)
    _clear_caches()


def test_fp8_delayed_scaling_sharded():
    """Delayed fp8 scaling under jit + NamedSharding (data and tensor parallel): the amaxes are the whole
    tensors' (XLA reduces across the shards), so the output, the gradients and the new state equal the
    unsharded ones; inside shard_map (where each shard would record its own amax) it is refused."""
    from jax_sparse24 import fp8 as f8

    mesh = _mesh("data=2,model=4")
    x, w = _rand((64, 32), 50), 0.2 * _rand((32, 128), 51)
    m = reference_ops.transposable_mask24(w)
    meta = f8.init_meta(4)
    meta["input_amax_history"] = meta["input_amax_history"].at[1].set(2.0)

    def loss(w, meta, x):
        return jnp.mean(jnp.sin(s24.sparse24_linear(x, w, m, fp8=True, fp8_meta=meta).astype(jnp.float32)))

    vg = jax.value_and_grad(loss, argnums=(0, 1))
    ref = jax.jit(vg)(w, meta, x)
    ns = lambda *s: NamedSharding(mesh, P(*s))  # noqa: E731
    out = jax.jit(vg, in_shardings=(ns(None, "model"), ns(), ns("data")))(w, meta, x)
    _tree_close(out, ref, rtol=1e-2, atol=1e-3)
    np.testing.assert_array_equal(np.asarray(out[1][1]["input_amax_history"]),
                                  np.asarray(ref[1][1]["input_amax_history"]))  # one global amax
    f = jax.shard_map(lambda x: s24.sparse24_linear(x, w, m, fp8=True, fp8_meta=meta), mesh=mesh,
                      in_specs=P("data"), out_specs=P("data"))
    with pytest.raises(ValueError, match="not supported inside shard_map"):
        jax.jit(f)(x)
    f = jax.shard_map(lambda x: s24.sparse24_linear(x, w, m, fp8=True, fp8_meta=meta), mesh=mesh,
                      in_specs=P("data"), out_specs=P("data"), check_vma=False)  # no varying types: the mesh says
    with pytest.raises(ValueError, match="not supported inside shard_map"):
        jax.jit(f)(x)


def test_fsdp_param_shardings_largest_axis_whole_groups_and_stacked_layers():
    """FSDP: every >=2-D leaf (params, masks, optimizer moments) sharded over `fsdp` on its
    largest axis that leaves whole 4-groups (2:4 kernels and masks) and splits evenly, after the
    tensor-parallel rules; a stacked (L, in, out) kernel keeps its layer axis whole; 1-D leaves and
    leaves no axis of which fits stay replicated over fsdp."""
    mesh = shd.make_mesh("fsdp=4,model=2", devices=CPUS[:8])
    L = 3
    params = {"mlp": {"fc1": {"kernel": jnp.zeros((L, 64, 256)), "bias": jnp.zeros((L, 256))},
                      "fc2": {"kernel": jnp.zeros((L, 256, 64))}},
              "embed": jnp.zeros((100, 64)), "odd": jnp.zeros((6, 10)), "norm": jnp.zeros((64,))}
    sparsity = {"mlp": {"fc1": {"transposable_mask": jnp.zeros((L, 64, 256), bool)}}}
    tree = {"params": params, "sparsity": sparsity, "opt": {"mu": params}}
    sh = shd.param_shardings(tree, mesh, shd.megatron_mlp_rules("mlp/fc1", "mlp/fc2"), fsdp="fsdp",
                             stacked=r"(^|/)mlp/")
    get = lambda t, *k: tuple(__import__("functools").reduce(lambda a, b: a[b], k, t).spec)  # noqa: E731
    assert get(sh, "params", "mlp", "fc1", "kernel") == (None, "fsdp", "model")  # out taken by model
    assert get(sh, "params", "mlp", "fc1", "bias") == (None, "model")  # 1-D per layer: no fsdp
    assert get(sh, "params", "mlp", "fc2", "kernel") == (None, "model", "fsdp")
    assert get(sh, "sparsity", "mlp", "fc1", "transposable_mask") == (None, "fsdp", "model")
    assert get(sh, "opt", "mu", "mlp", "fc2", "kernel") == (None, "model", "fsdp")
    assert get(sh, "params", "embed") == ("fsdp", None)  # 100 = 4 x 25 (not a 2:4 leaf)
    assert get(sh, "params", "odd") == ()  # neither 6 nor 10 splits 4 ways
    assert get(sh, "params", "norm") == ()
    # a 2:4 kernel whose only fitting axis would cut 4-groups: in = 8 over 4 leaves 2 per device
    assert tuple(shd.fsdp_spec((8, 6), P(), mesh, leaf_name="kernel")) == ()
    assert tuple(shd.fsdp_spec((8, 6), P(), mesh, leaf_name="embedding")) == ("fsdp", None)
    with pytest.raises(ValueError, match="fsdp axis 'zero' is not in the mesh"):
        shd.param_shardings(tree, mesh, fsdp="zero")


def test_fsdp_under_vmap_gathers_the_weight_not_the_batch():
    """``vmap`` over a batch axis split over ``fsdp``, the weight split over ``fsdp`` too: the vmapped
    axis is one of the activations' token axes (``Rule.batched`` adds it to ``tokens_first``), so the
    weight is gathered (packed) and the batch stays where it is -- before, the activations were
    gathered and moved by an all-to-all. Same values and gradients as one device."""
    mesh = shd.make_mesh("fsdp=4", devices=CPUS[:4])
    x = jax.random.normal(jax.random.key(0), (8, 16, 32))
    w = jax.random.normal(jax.random.key(1), (32, 48))
    m = s24.mask24(w, axis=0)

    def loss(x, w, m):
        return jnp.sum(jax.vmap(lambda xb: s24.sparse24_linear(xb, w, m, check_mask=False))(x) ** 2)

    ref = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w, m)
    xs, ws = NamedSharding(mesh, P("fsdp", None, None)), NamedSharding(mesh, P("fsdp", None))
    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), in_shardings=(xs, ws, ws))
    for a, b in zip(jax.tree.leaves(f(x, w, m)), jax.tree.leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
    hlo = f.lower(x, w, m).compile().as_text()
    assert set(re.findall(r"= ([a-z0-9]+\[[0-9,]*\])\S* all-gather", hlo)) == {"f32[16,48]", "u8[4,48]"}
    assert "all-to-all" not in hlo


def test_weight_gather_mode_is_part_of_the_jit_cache_key():
    """One jitted function, traced under each mode in turn: each call gathers as its mode says (the
    mode is a jit-cache-sensitive context, not a value read once at the first trace); a bad mode is
    an error naming the modes."""
    mesh = shd.make_mesh("fsdp=4", devices=CPUS[:4])
    w = jax.random.normal(jax.random.key(1), (32, 48))
    m = s24.mask24(w, axis=0)
    xs, ws = NamedSharding(mesh, P("fsdp", None)), NamedSharding(mesh, P("fsdp", None))
    f = jax.jit(lambda x, w, m: jnp.sum(s24.sparse24_linear(x, w, m, check_mask=False) ** 2),
                in_shardings=(xs, ws, ws))
    x = jax.random.normal(jax.random.key(0), (64, 32))

    def gathered_mask(mode):
        with shd.weight_gather(mode):
            hlo = f.lower(x, w, m).compile().as_text()
        return bool(re.search(r"= pred\[32,48\]\S* all-gather", hlo))

    assert [gathered_mask(mode) for mode in ("packed", "dense", "packed")] == [False, True, False]
    with pytest.raises(ValueError, match=r"mode must be one of \('packed', 'dense'\)"):
        with shd.weight_gather("compressed"):
            pass


def test_packed_gather_reaches_the_16_bit_gemms_packed(monkeypatch):
    """Under FSDP the forward and input-gradient GEMMs get the weight as gathered, a ``Packed24`` and no
    mask (their sparse kernels compress the encoding: ``cuda_compress_ops.packed_compress``); under
    ``weight_gather("dense")`` the weight and its mask. Recorded at ``gemm._masked`` (the CPU's dense
    path); the values and gradients match one device either way."""
    from jax_sparse24._src import gemm, packed24

    seen = []
    real = gemm._masked
    monkeypatch.setattr(gemm, "_masked", lambda w, mask, dtype: (seen.append((type(w).__name__, mask is None)),
                                                                 real(w, mask, dtype))[1])
    mesh = shd.make_mesh("fsdp=4", devices=CPUS[:4])
    x = jax.random.normal(jax.random.key(0), (64, 32))
    w = jax.random.normal(jax.random.key(1), (32, 48))
    m = s24.mask24(w, axis=0)

    def loss(x, w, m):
        return jnp.sum(s24.sparse24_linear(x, w, m, check_mask=False) ** 2)

    ref = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w, m)
    sh = NamedSharding(mesh, P("fsdp", None))
    for mode in ("packed", "dense"):
        seen.clear()
        f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), in_shardings=(sh, sh, sh))
        with shd.weight_gather(mode):
            got = f(x, w, m)
        # the per-shard functions of the forward and the input gradient (the unpartitioned trace sees arrays)
        n_packed = seen.count(("Packed24", True))
        assert (n_packed == 2 if mode == "packed" else n_packed == 0) and len(seen) >= 2, (mode, seen)
        assert all(not is_none for name, is_none in seen if name != "Packed24"), seen
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
    p = packed24.Packed24(*packed24.pack24(w, m))
    assert p.shape == w.shape and p.dtype == w.dtype and "Packed24(shape=(32, 48)" in repr(p)
    np.testing.assert_array_equal(packed24.unpacked_weight(p.values, p.bits), jnp.where(m, w, 0))
    assert [a.shape for a in jax.tree.leaves(p)] == [(16, 48), (4, 48)]  # a pytree of its arrays


def test_packed_gather_falls_back_where_shards_cannot_pack(partitioner):
    """Uneven shards (68 rows over 8 devices) or shards of rows not a multiple of 8 (4 over 8
    devices): the weight and mask are gathered by XLA as without the packed gather, with the same
    result as one device, under both partitioners."""
    mesh = shd.make_mesh("fsdp=8", devices=CPUS[:8])
    x = jax.random.normal(jax.random.key(0), (64, 72))
    w = jax.random.normal(jax.random.key(1), (72, 48))
    m = s24.mask24(w, axis=0)
    sh = NamedSharding(mesh, P("fsdp", None))
    for rows in (68, 32):  # 68 / 8 is uneven; 32 / 8 = 4 rows per shard, not a multiple of 8
        def loss(x, w, m):
            return jnp.sum(s24.sparse24_linear(x[:, :rows], w[:rows], m[:rows], check_mask=False) ** 2)

        f = jax.jit(loss, in_shardings=(sh, sh, sh))
        np.testing.assert_allclose(f(x, w, m), jax.jit(loss)(x, w, m), rtol=1e-5)
        hlo = f.lower(x, w, m).compile().as_text()
        assert not re.search(r"= u8\[\S* all-gather", hlo), rows  # no packed mask bits gathered


@pytest.mark.parametrize("gather", ["packed", "dense"])
@pytest.mark.parametrize("wspec", [P("fsdp", None), P(None, "fsdp")], ids=["in", "out"])
def test_fsdp_linear_gathers_the_weight_not_the_tokens(gather, wspec):
    """A 2:4 linear whose tokens and weight are both split over one axis (FSDP): the GEMMs keep the
    tokens sharded and gather the weight (Rule.tokens_first) instead of moving the activations to
    match the weight (an all-to-all) and psumming the output. ``packed`` (the default): the op
    gathers the packed weight -- kept values (half the rows) and mask bits (uint8, an eighth of the
    rows) -- never the weight or its bool mask; ``dense``: XLA gathers weight and mask. Same result
    and gradients as one device either way, the weight split along ``in`` or ``out``."""
    mesh = shd.make_mesh("fsdp=4", devices=CPUS[:4])
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (64, 32))
    w = jax.random.normal(k2, (32, 48))
    m = s24.transposable_mask24(w)

    def loss(x, w, m):
        return jnp.sum(s24.sparse24_linear(x, w, m, transposable=True) ** 2)

    ref = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w, m)
    xs, ws = NamedSharding(mesh, P("fsdp", None)), NamedSharding(mesh, wspec)
    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), in_shardings=(xs, ws, ws),
                out_shardings=(NamedSharding(mesh, P()), (xs, ws)))
    with shd.weight_gather(gather):
        lowered = f.lower(x, w, m)
    compiled = lowered.compile()
    got = compiled(x, w, m)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
    for a, b in zip(got[1], ref[1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)
    hlo = compiled.as_text()
    assert "all-to-all" not in hlo
    gathered = [s.split("{")[0] for s in re.findall(r"= (\S+) all-gather(?:-start)?\(", hlo)]
    assert not any(s.startswith("f32[64,") for s in gathered), gathered  # never the tokens
    if gather == "packed":
        assert set(gathered) == {"f32[16,48]", "u8[4,48]"}, gathered  # values and mask bits, forward and backward
    else:
        assert set(gathered) == {"f32[32,48]", "pred[32,48]"}, gathered  # the weight and its mask, whole


# --- batch_sharded_activations: FSDP keeps the activations on the batch sharding -----------------------

class _PinMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        ab = Sparse24Dense(64, name="fc")(x)
        a, g = ab[..., :32], ab[..., 32:]
        return nn.Dense(16, name="proj")(inputs=nn.silu(a) * g)  # by keyword: the pin finds it too


class _PinBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + _PinMLP(name="mlp")(x)


class _MyDense(nn.Dense):
    """A subclass of a linear layer: pinned as one (its base class's name matches)."""


class _PinModel(nn.Module):
    @nn.compact
    def __call__(self, x):
        return _MyDense(8, name="head")(_PinBlock(name="block")(x))


def _pins(mesh, batch_axes, **kw):
    """The sharding constraints of value_and_grad of a block + head model traced inside the context, the
    variables and the two functions (pinned, unpinned)."""
    from jaxpr_util import sharding_constraints

    model = _PinModel()
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 8, 16)), jnp.float32)
    variables = model.init(jax.random.PRNGKey(0), x)

    def loss(params, x):
        return jnp.sum(model.apply({**variables, "params": params}, x) ** 2)

    def pinned(params, x):
        with shd.batch_sharded_activations(mesh, batch_axes, **kw):
            return loss(params, x)

    found = sharding_constraints(jax.make_jaxpr(jax.value_and_grad(pinned))(variables["params"], x))
    return found, variables["params"], x, pinned, loss


def test_batch_sharded_activations_pins_blocks_and_the_token_axis_of_linear_layers():
    """Inside the context the block's and MLP's inputs and outputs are constrained to ``P(batch)``, and every
    linear layer's (the 2:4 one, the dense one called by keyword, a subclass of Dense) to the batch sharding on
    the token axis only, in the forward pass and on the way back to the params; outside it nothing is
    constrained; the values are unchanged."""
    from jaxpr_util import sharding_constraints

    mesh = _mesh("fsdp=2,model=2")
    found, params, x, pinned, loss = _pins(mesh, "fsdp")
    u = P.UNCONSTRAINED
    block, tok = ("fsdp",), ("fsdp", u, u)
    # the forward pass, in program order: block in, mlp in, fc in / out, proj in / out, mlp out, block out, head
    # in / out (the linear layers: their token axis only)
    assert found[:10] == [((4, 8, 16), block), ((4, 8, 16), block), ((4, 8, 16), tok), ((4, 8, 64), tok),
                          ((4, 8, 32), tok), ((4, 8, 16), tok), ((4, 8, 16), block), ((4, 8, 16), block),
                          ((4, 8, 16), tok), ((4, 8, 8), tok)], found[:10]
    # the backward pass constrains the gradients the same way (those on the way to the params)
    backward = found[10:]
    for c in [((4, 8, 8), tok), ((4, 8, 16), block), ((4, 8, 32), tok), ((4, 8, 64), tok)]:
        assert c in backward, (c, backward)
    assert not sharding_constraints(jax.make_jaxpr(jax.value_and_grad(loss))(params, x))
    got = jax.jit(jax.value_and_grad(pinned))(params, x)
    want = jax.value_and_grad(loss)(params, x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_batch_sharded_activations_options():
    """Two batch axes make one entry of the spec; ``linear=None`` pins only the blocks; ``modules`` that
    match nothing pin only the linear layers."""
    u = P.UNCONSTRAINED
    found = _pins(_mesh("data=2,fsdp=2"), ("data", "fsdp"))[0]
    assert ((4, 8, 16), (("data", "fsdp"),)) in found and ((4, 8, 64), (("data", "fsdp"), u, u)) in found
    found = _pins(_mesh("fsdp=2"), "fsdp", linear=None)[0]
    assert found and all(spec == ("fsdp",) for _, spec in found)
    found = _pins(_mesh("fsdp=2"), "fsdp", modules="^$")[0]
    assert found and all(spec == ("fsdp", u, u) for _, spec in found)


def test_batch_sharded_activations_names_a_missing_or_empty_axis():
    with pytest.raises(ValueError, match=r"batch axes \['fsdp'\] are not axes of the mesh \('data',\)"):
        with shd.batch_sharded_activations(_mesh("data=2")):
            pass
    with pytest.raises(ValueError, match="batch_axes is empty"):
        with shd.batch_sharded_activations(_mesh("data=2"), ()):
            pass
