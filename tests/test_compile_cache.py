"""Compile time of unrolled models: identical 2:4 op instances share one partition result per compile.

XLA's partitioner calls every ``custom_partitioning`` op instance back; for an unrolled model (a Python loop of
blocks) that was the same tracing and StableHLO lowering of the same per-shard function once per layer
(``jax_sparse24._src.partitioning._CachedPartitioning``). These tests fail if that work grows with identical layers
again, or if sharing it changes the program XLA builds or its values. Needs the 8 host devices of
tests/conftest.py.
"""

import re
import sys
from pathlib import Path

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
from jax_sparse24._src import partitioning as _shd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import partition_profile  # noqa: E402  (times the partitioner callbacks: imported before any op is traced)

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
    """Shardy or GSPMD, and JAX's persistent compilation cache off (a hit would skip the partitioner)."""
    old, cache = jax.config.jax_use_shardy_partitioner, jax.config.jax_enable_compilation_cache
    jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield request.param
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)
        jax.config.update("jax_enable_compilation_cache", cache)


@pytest.fixture(autouse=True)
def _shared_partitions_undecided(monkeypatch):
    """Each test starts and ends with the switch undecided (the environment decides at the first op)."""
    monkeypatch.delenv(_shd.SHARED_PARTITIONS_ENV, raising=False)
    _shd.share_partition_results(False)
    _shd._CACHED_CP_STATE["decided"] = False
    yield
    _shd.share_partition_results(False)
    _shd._CACHED_CP_STATE["decided"] = False


def test_shared_partitions_are_opt_in(monkeypatch):
    """Off unless JAX_SPARSE24_SHARED_PARTITIONS=1: the ops lower to JAX's own custom_partitioning target."""
    mesh = shd.make_mesh("data=2,fsdp=4", devices=CPUS[:8])
    fn, args = _step_and_args(1, mesh)
    assert "CustomSPMDPartitioning_jax_sparse24" not in fn.lower(*args).as_text()
    assert _shd._shared_partitioning() is None
    _shd._CACHED_CP_STATE["decided"] = False
    monkeypatch.setenv(_shd.SHARED_PARTITIONS_ENV, "1")
    assert _shd._shared_partitioning() is not None


def test_partition_work_does_not_grow_with_identical_layers(partitioner):
    """3 and 2 unrolled identical blocks under FSDP trace the same number of per-shard functions (one per
    distinct op); the extra block's instances reuse them; the second program traces its own again (the results
    are shared within one compiled program, not across programs)."""
    assert _shd.share_partition_results(True), "this JAX lacks the internals of the shared partition results"
    mesh = shd.make_mesh("data=2,fsdp=4", devices=CPUS[:8])
    counts = {}
    for n in (3, 2):
        fn, args = _step_and_args(n, mesh)
        before = partition_profile.partition_callback_stats()
        fn.lower(*args).compile()
        counts[n] = _calls(before, partition_profile.partition_callback_stats())
    (b3, r3), (b2, r2) = counts[3], counts[2]
    assert b2 > 0 and b3 == b2, counts
    # the extra block's instances, (forward, input-gradient, weight-gradient GEMMs, mask refresh) x 2 linear
    # layers, are all reused
    assert r3 - r2 == 2 * 4, counts


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
    assert _shd.share_partition_results(True), "this JAX lacks the internals of the shared partition results"
    mesh = shd.make_mesh("data=2,fsdp=4", devices=CPUS[:8])
    out = {}
    for cached in (True, False):
        if not cached:
            _shd.share_partition_results(False)
        fn, args = _step_and_args(2, mesh)  # a fresh jit: traced and lowered again
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


def test_bench_compile_smoke(tmp_path):
    """benchmarks/bench_compile.py on a one-layer model: dense and srste, JSON and markdown written."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_compile

    argv = ["--d-model", "64", "--n-layer", "1", "--vocab", "256", "--tokens", "128", "--seq-len", "16",
            "--mesh", f"fsdp={len(jax.devices())}", "--variants", "dense,srste",
            "--out", str(tmp_path), "--name", "smoke"]
    assert bench_compile.main(argv) == 0
    res = json.loads((tmp_path / "smoke.json").read_text())
    row = res["rows"][0]
    assert row["srste"]["custom_partitioning_ops"] > 0 and row["dense"]["custom_partitioning_ops"] == 0
    assert row["srste"]["partition_results_reused"] > 0 and row["ratio_compile/srste"] > 0
    assert "| srste |" in (tmp_path / "smoke.md").read_text() and res["command"].endswith("smoke")
