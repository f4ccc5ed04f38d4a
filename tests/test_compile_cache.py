"""Compile time of unrolled models: identical 2:4 op instances share one partition result per compile.

XLA's partitioner calls every ``custom_partitioning`` op instance back; for an unrolled model (a Python loop of
blocks) that was the same tracing and StableHLO lowering of the same per-shard function once per layer
(``jax_sparse24._src.sharding._CachedPartitioning``). These tests fail if that work grows with identical layers
again, or if sharing it changes the program XLA builds or its values. Needs the 8 host devices of
tests/conftest.py.
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
from jax_sparse24._src import sharding as _shd

CPUS = jax.devices("cpu")
pytestmark = pytest.mark.skipif(len(CPUS) < 8, reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8")


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = s24.nn.Sparse24Dense(64, use_bias=False, name="up")(x)
        return x + s24.nn.Sparse24Dense(32, use_bias=False, name="down")(nn.gelu(h))


class Stack(nn.Module):
    n_layer: int

    @nn.compact
    def __call__(self, x):
        for i in range(self.n_layer):  # unrolled, as a user writes it
            x = Block(name=f"block_{i}")(x)
        return x


def _step_and_args(n_layer, mesh):
    model = Stack(n_layer)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(16, 32)), jnp.float32)
    v = model.init(jax.random.key(1), x)
    tx = optax.chain(s24.optim.masked_decay(2e-2), optax.adamw(1e-2))
    state = s24.training.SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx,
                                                sparsity=v["sparsity"], rng=jax.random.key(2))
    state_sh = shd.param_shardings(state, mesh, fsdp="fsdp")
    batch_sh = NamedSharding(mesh, P(("data", "fsdp")))
    state, x = jax.device_put(state, state_sh), jax.device_put(x, batch_sh)

    def step(state, x):
        def loss_fn(p):
            with shd.batch_sharded_activations(mesh, ("data", "fsdp")):
                return (state.apply(x, params=p) ** 2).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss, grads

    return jax.jit(step, out_shardings=(state_sh, NamedSharding(mesh, P()), state_sh.params)), (state, x)


def _calls(before, after):
    """(per-shard functions traced, partition results reused) between two partition_callback_stats readings
    (GSPMD's ``infer`` callbacks, many per instance and cheap, are not counted)."""
    d = {r: n - before.get(r, (0, 0.0))[0] for r, (n, _) in after.items()}
    built = sum(n for r, n in d.items() if r.endswith(" (trace)"))
    return built, sum(n for r, n in d.items() if r.endswith(" (cached)"))


@pytest.fixture(params=["shardy", "gspmd"])
def partitioner(request):
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
    yield request.param
    jax.config.update("jax_use_shardy_partitioner", old)


def test_partition_work_does_not_grow_with_identical_layers(partitioner):
    """2 and 4 unrolled identical blocks under FSDP build the same number of partition results (one per distinct
    op); the extra layers' instances reuse them; a second compile builds its own again (per program)."""
    assert _shd._CACHED_CP is not None, "the cached partitioning is off (this JAX lacks the internals it uses)"
    mesh = shd.make_mesh("data=2,fsdp=4", devices=CPUS[:8])
    counts = {}
    for n in (2, 4, 4):
        fn, args = _step_and_args(n, mesh)
        before = _shd.partition_callback_stats()
        fn.lower(*args).compile()
        counts.setdefault(n, []).append(_calls(before, _shd.partition_callback_stats()))
    (b2, r2), (b4, r4), (b4_again, _) = counts[2][0], counts[4][0], counts[4][1]
    assert b2 > 0 and b4 == b2 == b4_again, counts
    # the 2 extra blocks' instances, (forward, input-gradient, weight-gradient GEMMs, mask refresh) x 2 linear
    # layers each, are all reused
    assert r4 - r2 == 2 * 2 * 4, counts


def _normalized_hlo(text):
    """Optimized HLO without its debug information (stack frames, source metadata) and custom call names."""
    keep = []
    for line in text.splitlines():
        if re.match(r"^\d+ ", line) or line.startswith(("FileNames", "FunctionNames", "FileLocations", "StackFrames")):
            continue
        keep.append(re.sub(r", stack_frame_id=\d+|, metadata=\{[^}]*\}", "", line))
    return "\n".join(keep)


def test_shared_partition_results_give_the_same_program_and_values(monkeypatch):
    """With and without the shared partition results: the same optimized HLO and bit-identical results."""
    assert _shd._CACHED_CP is not None, "the cached partitioning is off (this JAX lacks the internals it uses)"
    mesh = shd.make_mesh("data=2,fsdp=4", devices=CPUS[:8])
    out = {}
    for cached in (True, False):
        if not cached:
            monkeypatch.setattr(_shd, "_CACHED_CP", None)
        fn, args = _step_and_args(3, mesh)  # a fresh jit: traced and lowered again
        lowered = fn.lower(*args)
        assert lowered.as_text().count("CustomSPMDPartitioning") > 0
        exe = lowered.compile()
        out[cached] = (_normalized_hlo(exe.as_text()), exe(*args))
    assert out[True][0] == out[False][0]
    def data(a):
        return jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a

    for a, b in zip(jax.tree_util.tree_leaves(out[True][1]), jax.tree_util.tree_leaves(out[False][1])):
        np.testing.assert_array_equal(np.asarray(data(a)), np.asarray(data(b)))


def test_op_keys_tell_apart_what_the_per_shard_function_computes():
    """Closures over equal values key alike, over different values differently; one over an array is not
    keyed (the op stays a plain custom_partitioning op)."""
    def make(scale, backend):
        def f(x):
            return x * scale if backend == "a" else x

        return f

    key = _shd._fn_key
    assert key(make(2.0, "a")) == key(make(2.0, "a"))
    assert key(make(2.0, "a")) != key(make(3.0, "a"))
    assert key(make(2.0, "a")) != key(make(2.0, "b"))
    assert key(jax.vmap(make(2.0, "a"))) == key(jax.vmap(make(2.0, "a")))
    with pytest.raises(_shd._Unkeyable):
        key(make(jnp.ones(3), "a"))
    rule = _shd.grouped_rule("mask24", 2, 0)
    assert _shd._op_key(rule, make(jnp.ones(3), "a"), 1, False, {}, [(4, 4)], [jnp.float32]) is None
