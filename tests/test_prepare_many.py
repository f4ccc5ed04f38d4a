"""Batched weight preparation: ``masked_compress_many`` and ``preparation.prepare`` running the
compressions of all layers together, on the CPU.

The many-tensor kernel itself is checked bit for bit against the one-tensor kernel on the GPU
(tests/test_gpu_compress.py) and in the host emulation (tests/test_compress_emulation.py). Here the
Python side runs against a fake device: ``ffi_call`` computes a deterministic stand-in for every
compressor target (one-tensor, both-directions and many-tensor, CUTLASS and cuSPARSELt layouts) from
the operands it is given, so a batched preparation equals the per-layer one only if every operand
reaches its launch and every result its layer. Without the fake (the real CPU lowering) both give
the same placeholders.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from jax_sparse24 import preparation as s24prep
from jax_sparse24._src import autotune, backends, prepared_weight
from jax_sparse24._src import cuda_compress_ops as cc
from jax_sparse24._src import cuda_cusparselt_ops as lt
from jax_sparse24._src import cuda_spmm_ops as cs
from jax_sparse24._src import partitioning as _sh
from jax_sparse24.nn import Sparse24Dense
from jax_sparse24.preparation import PREPARED

BF16, F16 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)


def _shapes(m, k, dtype):
    """CUTLASS's compressed shapes (the extension's rule, without the extension)."""
    if jnp.dtype(dtype) not in (BF16, F16):
        raise ValueError(f"cutlass_compressed_shapes: dtype {jnp.dtype(dtype)}")
    if m % 8 or k % 16:
        raise ValueError(f"cutlass_compressed_shapes(m={m}, k={k}): the CUTLASS sparse GEMM needs m % 8 == 0 and "
                         "k % 16 == 0")
    return (m, k // 2), (-(-m // 64) * 64, -(-k // 128) * 128 // 8)


def _fake_compress(x, mask, transposed, out_types):
    """A stand-in compressor: outputs of the requested shapes, computed from (x * mask) in the direction."""
    a = jnp.where(mask, x, jnp.zeros((), x.dtype))
    a = a.T if transposed else a
    m, k = a.shape
    vals = a[:, 0::2] + a[:, 1::2]
    tag = ((jnp.sum(a != 0) + 7 * m + 3 * k + (5 if transposed else 0)) % 256).astype(jnp.uint8)
    if len(out_types) == 1:  # cuSPARSELt's buffer
        return [jnp.concatenate([jax.lax.bitcast_convert_type(vals, jnp.uint8).reshape(-1),
                                 jnp.full((m * k // 8,), tag, jnp.uint8)])]
    return [vals, jnp.full(out_types[1].shape, tag, jnp.uint8)]


class FakeDevice:
    """``_ffi`` of cuda_compress_ops with every masked-compress target computed by ``_fake_compress``."""

    def __init__(self):
        self.calls = []

    def ffi_call(self, target, out_types, *args, **attrs):
        out_types = list(out_types)
        base = target[:-3] if target.endswith("_lt") else target
        self.calls.append((base, target.endswith("_lt"), len(args) // 2))
        if base == "jax_sparse24_masked_compress":
            return _fake_compress(args[0], args[1], bool(attrs["transposed"]), out_types)
        if base == "jax_sparse24_masked_compress_both":
            h = len(out_types) // 2
            return (_fake_compress(args[0], args[1], True, out_types[:h])
                    + _fake_compress(args[0], args[1], False, out_types[h:]))
        assert base == "jax_sparse24_masked_compress_many", target
        flags = [True] * int(attrs["transposed"]) + [False] * int(attrs["direct"])
        per = len(out_types) // (len(args) // 2) // len(flags)
        out, it = [], iter(out_types)
        for x, mask in zip(args[0::2], args[1::2]):
            for t in flags:
                out += _fake_compress(x, mask, t, [next(it) for _ in range(per)])
        return out

    def many_calls(self):
        return [c for c in self.calls if c[0].endswith("_many")]


def _fake_lt_library(a, *, m, n, k, a_layout, b_layout=lt.B_NK):
    flat = a.reshape(-1)
    return jnp.concatenate([jax.lax.bitcast_convert_type(flat[: m * k // 2] * 3, jnp.uint8).reshape(-1),
                            jnp.full((m * k // 8,), (jnp.sum(a != 0) % 256).astype(jnp.uint8), jnp.uint8)])


#: (in, out) -> (forward, input_grad) kernels the stubbed planner picks: every prepared format and
#: direction, a fully dense layer, and cuSPARSELt's library compressor (float16).
PLANS = {
    (64, 128): ("cutlass", "cutlass"),
    (128, 64): ("cutlass", "dense"),
    (64, 256): ("cutlass", "cutlass"),
    (256, 64): ("cusparselt", "cusparselt"),
    (64, 192): ("dense", "cutlass"),
    (192, 128): ("cusparselt", "cusparselt"),
    (128, 128): ("cusparselt", "cutlass"),
    (64, 64): ("dense", "dense"),
    (32, 32): ("cutlass", "cutlass"),  # test_lifted_transforms_and_shared_layers
}


#: The ``batched`` argument of every weight plan the stubbed planner was asked for.
PLANNED_BATCHED = []


@pytest.fixture
def stubs(monkeypatch):
    """Kernels "available": the planner's choices from PLANS, the extension's shape rules, cuSPARSELt's
    checks (fused layout for bfloat16 only, as the library's version check allows)."""
    monkeypatch.setattr(cs, "cutlass_compressed_shapes", _shapes)
    PLANNED_BATCHED.clear()

    def plan(backend, tokens, i, o, dtype, transposable, reuse=None, batched=False):
        PLANNED_BATCHED.append(batched)
        return tuple(backends.get(name) for name in PLANS[(i, o)])

    monkeypatch.setattr(autotune, "weight_gemms_backends", plan)
    monkeypatch.setattr(lt, "fused_compress_ok", lambda m, n, k, dtype, b_layout=lt.B_NK: jnp.dtype(dtype) == BF16)
    monkeypatch.setattr(lt, "cusparselt_compressed_size", lambda m, n, k, dtype, a, b: m * k * 9 // 8)
    monkeypatch.setattr(lt, "cusparselt_compress", _fake_lt_library)


@pytest.fixture
def device(stubs, monkeypatch):
    """The fake device: the preparation takes its CUDA branch, the compressors are FakeDevice's."""
    dev = FakeDevice()
    monkeypatch.setattr(cc, "_ffi", types.SimpleNamespace(ffi_call=dev.ffi_call))
    real = prepared_weight.ffi.per_platform

    def per_platform(ref, cuda, *args, **kw):  # the preparation's CUDA branch; the GEMMs stay on the CPU's
        return cuda(*args) if cuda.__qualname__.startswith("prepare_many.") else real(ref, cuda, *args, **kw)

    monkeypatch.setattr(prepared_weight, "ffi", types.SimpleNamespace(per_platform=per_platform))
    return dev


class Block(nn.Module):
    dtype: object = jnp.bfloat16

    @nn.compact
    def __call__(self, x):
        h = Sparse24Dense(128, dtype=self.dtype, name="qkv")(x)       # (64, 128): CUTLASS, both
        h = Sparse24Dense(64, dtype=self.dtype, name="proj")(h)       # (128, 64): CUTLASS, forward only
        h = Sparse24Dense(256, dtype=self.dtype, name="fc")(h)        # (64, 256): CUTLASS, both
        return Sparse24Dense(64, dtype=self.dtype, name="down")(h)    # (256, 64): cuSPARSELt, both


class Net(nn.Module):
    """GPT-like: blocks of four layers (two dtypes), plus layers of the remaining plans."""

    @nn.compact
    def __call__(self, x):
        for j in range(3):
            x = x + Block(name=f"h_{j}")(x)
        x = x + Block(dtype=jnp.float16, name="h_f16")(x)
        h = Sparse24Dense(192, dtype=jnp.bfloat16, name="a")(x)       # (64, 192): CUTLASS, input_grad only
        h = Sparse24Dense(128, dtype=jnp.bfloat16, name="b")(h)       # (192, 128): cuSPARSELt, both
        h = Sparse24Dense(128, dtype=jnp.bfloat16, name="c")(h)       # (128, 128): cuSPARSELt fwd + CUTLASS dx
        h = Sparse24Dense(64, dtype=jnp.bfloat16, name="d")(h)        # (128, 64): CUTLASS, forward only
        return x + Sparse24Dense(64, dtype=jnp.bfloat16, name="dense")(h)  # (64, 64): W̃ only


def _net():
    m = Net()
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 64)), jnp.float32)
    return m, m.init(jax.random.key(0), x), x


def _assert_same_tree(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, jax.tree_util.keystr(path)
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8), jax.tree_util.keystr(path))


def test_batched_prepare_is_the_per_layer_prepare_bit_for_bit(device):
    m, v, x = _net()
    per_layer = jax.jit(lambda v, x: s24prep.prepare(m, v, x, batch=False))(v, x)
    n_single = len(device.calls)
    assert not device.many_calls() and n_single > 10
    # the planner is told how the weights will be prepared (a batched pass costs less per weight)
    assert PLANNED_BATCHED and not any(PLANNED_BATCHED)
    PLANNED_BATCHED.clear()
    device.calls.clear()
    batched = jax.jit(lambda v, x: s24prep.prepare(m, v, x, batch=True))(v, x)
    assert PLANNED_BATCHED and all(PLANNED_BATCHED)
    _assert_same_tree(batched, per_layer)
    # every format of PLANS is there
    w = batched["h_0"]
    assert set(w["qkv"]["weight"]) == {"forward", "input_grad"} and set(w["proj"]["weight"]) == {"forward", "masked"}
    assert set(w["down"]["weight"]["forward"]) == {"cusparselt"}
    assert set(batched["h_f16"]["down"]["weight"]["input_grad"]) == {"cusparselt"}  # the library's
    assert set(batched["a"]["weight"]) == {"input_grad", "masked"}
    assert set(batched["c"]["weight"]["forward"]) == {"cusparselt"} and set(batched["c"]["weight"]["input_grad"]) == {
        "values", "meta"}
    assert set(batched["dense"]["weight"]) == {"masked"}
    # one launch per (dtype, format, direction) group (test below), 21 calls per layer
    assert n_single == 20 and len(device.calls) == 7
    # batch="auto" plans batched exactly where it then runs batched (here: 8 host devices, weights
    # of unknown sharding under jit -> per layer)
    PLANNED_BATCHED.clear()
    calls = len(device.calls)
    jax.jit(lambda v, x: s24prep.prepare(m, v, x))(v, x)
    ran_batched = any(c[0].endswith("_many") for c in device.calls[calls:])
    assert PLANNED_BATCHED and set(PLANNED_BATCHED) == {ran_batched}


def test_batched_prepare_groups_by_dtype_format_and_direction(device):
    m, v, x = _net()
    s24prep.prepare(m, v, x, batch=True)
    many = sorted(device.many_calls())
    # (target, cuSPARSELt layout, tensors): bfloat16 and float16 never share a launch, directions neither
    assert many == sorted([("jax_sparse24_masked_compress_many", False, 6),   # bf16 CUTLASS both: qkv, fc x3
                           ("jax_sparse24_masked_compress_many", False, 4),   # bf16 CUTLASS forward: proj x3, d
                           ("jax_sparse24_masked_compress_many", True, 4),    # bf16 cuSPARSELt both: down x3, b
                           ("jax_sparse24_masked_compress_many", False, 2),   # f16 CUTLASS both: qkv, fc
                           ("jax_sparse24_masked_compress_many", False, 2)])  # bf16 CUTLASS input_grad: a, c
    singles = sorted(c for c in device.calls if not c[0].endswith("_many"))
    assert singles == sorted([("jax_sparse24_masked_compress", False, 1),   # f16 proj: a group of one
                              ("jax_sparse24_masked_compress", True, 1)])   # bf16 c: cuSPARSELt forward
    # (the float16 cuSPARSELt operands of h_f16/down come from the library's compressor, per layer)


def test_batched_prepare_on_the_cpu_lowering_equals_per_layer(stubs):
    """The real non-CUDA lowering (placeholders for the compressed operands, W̃ where a GEMM is
    dense): the same tree either way, eager and under jit."""
    m, v, x = _net()
    per_layer = s24prep.prepare(m, v, x, batch=False)
    _assert_same_tree(s24prep.prepare(m, v, x, batch=True), per_layer)
    _assert_same_tree(jax.jit(lambda v, x: s24prep.prepare(m, v, x, batch=True))(v, x), per_layer)
    _assert_same_tree(jax.jit(lambda v, x: s24prep.prepare(m, v, x))(v, x), per_layer)


def test_prepared_weights_drive_the_model_the_same(device):
    """apply with the batched preparation = apply with the per-layer one (the collection is read as before)."""
    m, v, x = _net()
    outs = []
    for batch in (False, True):
        prep = s24prep.prepare(m, v, x, batch=batch)
        outs.append(jax.jit(lambda v, p, x: m.apply({**v, PREPARED: p}, x))(v, prep, x))
    np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(outs[1]))


def test_train_state_prepare_batches(device):
    import optax

    from jax_sparse24.training import SparseTrainState

    m, v, x = _net()
    state = SparseTrainState.create(apply_fn=m.apply, params=v["params"], tx=optax.sgd(0.1), sparsity=v["sparsity"])
    per_layer = state.prepare(x, batch=False).prepared
    assert not device.many_calls()
    batched = jax.jit(lambda s, x: s.prepare(x, batch=True))(state, x).prepared
    assert device.many_calls()
    _assert_same_tree(batched, per_layer)
    with pytest.raises(ValueError, match="batch must be 'auto', True or False"):
        state.prepare(x, batch="yes")


class _Scanned(nn.Module):
    """Layers inside lifted transforms (scan, remat) next to plain ones."""

    @nn.compact
    def __call__(self, x):
        x = Sparse24Dense(32, dtype=jnp.bfloat16, name="in")(x)

        class Cell(nn.Module):
            @nn.compact
            def __call__(self, c, _):
                return Sparse24Dense(32, dtype=jnp.bfloat16, name="fc")(c), None

        x, _ = nn.scan(Cell, variable_axes={"params": 0, "sparsity": 0, PREPARED: 0}, split_rngs={"params": True},
                       length=3)(name="scan")(x, None)
        x = nn.remat(Sparse24Dense)(32, dtype=jnp.bfloat16, name="remat")(x)
        shared = Sparse24Dense(32, dtype=jnp.bfloat16, name="shared")
        return shared(shared(x))  # called twice: one preparation


def test_lifted_transforms_and_shared_layers(device, monkeypatch):
    monkeypatch.setitem(PLANS, (32, 32), ("cutlass", "cutlass"))
    m = _Scanned()
    x = jnp.ones((2, 8, 32), jnp.float32)
    v = m.init(jax.random.key(0), x)
    per_layer = jax.jit(lambda v, x: s24prep.prepare(m, v, x, batch=False))(v, x)
    device.calls.clear()
    batched = jax.jit(lambda v, x: s24prep.prepare(m, v, x, batch=True))(v, x)
    _assert_same_tree(batched, per_layer)
    assert jax.tree.map(jnp.shape, batched["scan"]["fc"]["weight"]["forward"]) == {"values": (3, 32, 16),
                                                                                    "meta": (3, 64, 16)}
    # one batched call for every weight: "in", "shared" (its last call), the scanned stack's 3 layers
    # (deferred out of the scan body) and the rematerialized layer
    assert sorted(n for base, _, n in device.calls if base.endswith("_many")) == [6]


def test_batch_auto_follows_what_is_known_about_the_sharding(device):
    """On several devices ``batch="auto"`` keeps one call per layer unless the weights are known whole
    on each device (``unpartitioned_batch_ok``): eager arrays on one device are."""
    m, v, x = _net()
    if jax.device_count() > 1:
        jax.jit(lambda v, x: s24prep.prepare(m, v, x))(v, x)  # automatic sharding: nothing known while tracing
        assert not device.many_calls()
    s24prep.prepare(m, v, x)
    assert device.many_calls()
    device.calls.clear()
    jax.jit(lambda v, x: s24prep.prepare(m, v, x, batch=True))(v, x)
    assert device.many_calls()
    with pytest.raises(ValueError, match="batch must be 'auto', True or False"):
        s24prep.prepare(m, v, x, batch=1)


@pytest.mark.skipif(len(jax.devices("cpu")) < 8, reason="needs 8 host devices (tests/conftest.py)")
def test_unpartitioned_batch_ok():
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    x = jnp.ones((16, 32))
    seen = {}
    jax.jit(lambda a: seen.setdefault("auto", _sh.unpartitioned_batch_ok([a])) and a)(x)
    assert seen["auto"] is False
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
    with jax.set_mesh(mesh):
        rep = jax.device_put(x, NamedSharding(mesh, P()))
        shd = jax.device_put(x, NamedSharding(mesh, P("data")))
        jax.jit(lambda a, b: seen.update(rep=_sh.unpartitioned_batch_ok([a]), mixed=_sh.unpartitioned_batch_ok(
            [a, b])) or a)(rep, shd)
        jax.jit(jax.shard_map(lambda a: seen.update(local=_sh.unpartitioned_batch_ok([a])) or a, mesh=mesh,
                              in_specs=P("data"), out_specs=P("data")))(shd)
    assert seen["rep"] is True and seen["mixed"] is False and seen["local"] is True


# --- masked_compress_many itself ------------------------------------------------------------------


def _pairs(shapes, dtype=jnp.bfloat16, seed=0):
    rng = np.random.default_rng(seed)
    xs = [jnp.asarray(rng.normal(size=s), dtype) for s in shapes]
    masks = [jnp.asarray(rng.random(s) < 0.5) for s in shapes]
    return xs, masks


@pytest.mark.parametrize("layout", ["cutlass", "cusparselt"])
@pytest.mark.parametrize("direction", ["both", "transposed", "direct"])
def test_many_is_the_one_tensor_ops_and_splits_long_lists(device, direction, layout):
    shapes = [(64, 128), (128, 64), (192, 64), (64, 64), (128, 128), (64, 192), (256, 64), (64, 256)]
    xs, masks = _pairs(shapes)
    one = [cc._one(x, mk, direction, layout) for x, mk in zip(xs, masks)]
    device.calls.clear()
    many = jax.jit(lambda xs, ms: cc.masked_compress_many(xs, ms, direction=direction, layout=layout,
                                                          max_per_launch=3))(xs, masks)
    assert [n for _, _, n in device.calls] == [2, 3, 3]  # 8 pairs, at most 3 per launch: near-equal chunks
    _assert_same_tree(many, one)
    device.calls.clear()
    assert len(cc.masked_compress_many(xs, masks, direction=direction, layout=layout)) == 8
    assert [n for _, _, n in device.calls] == [8]
    # a chunk of one pair is the one-tensor op (same bits, no table)
    device.calls.clear()
    cc.masked_compress_many(xs[:1], masks[:1], direction=direction, layout=layout)
    assert [c[0] for c in device.calls] == [
        "jax_sparse24_masked_compress_both" if direction == "both" else "jax_sparse24_masked_compress"]
    assert cc.masked_compress_many([], [], direction=direction, layout=layout) == []


def test_many_errors_name_the_tensor(stubs):
    xs, masks = _pairs([(64, 128), (64, 128), (64, 128)])
    with pytest.raises(ValueError, match="one dtype.*tensor 0 is bfloat16 and tensor 2 float16"):
        cc.masked_compress_many(xs[:2] + [xs[2].astype(jnp.float16)], masks)
    with pytest.raises(ValueError, match=r"tensor 1: mask must have x's shape \(64, 128\)"):
        cc.masked_compress_many(xs, [masks[0], masks[1][:, :64], masks[2]])
    with pytest.raises(ValueError, match="tensor 2: x's rows and cols must be multiples of 8"):
        cc.masked_compress_many(xs[:2] + [jnp.ones((60, 128), jnp.bfloat16)], masks[:2] + [jnp.ones((60, 128), bool)])
    with pytest.raises(ValueError, match=r"tensor 1: the compressed operand A = x.T \(m=128, k=40\)"):
        cc.masked_compress_many([xs[0], jnp.ones((40, 128), jnp.bfloat16)], [masks[0], jnp.ones((40, 128), bool)])
    with pytest.raises(ValueError, match="tensor 0: x must be bfloat16 or float16"):
        cc.masked_compress_many([jnp.ones((64, 128), jnp.float32)], masks[:1])
    with pytest.raises(ValueError, match="one mask per x"):
        cc.masked_compress_many(xs, masks[:2])
    with pytest.raises(ValueError, match="direction must be one of"):
        cc.masked_compress_many(xs, masks, direction="forward")
    with pytest.raises(ValueError, match="layout must be one of"):
        cc.masked_compress_many(xs, masks, layout="packed")
    with pytest.raises(ValueError, match=r"max_per_launch must be an int in \[1, 64\]"):
        cc.masked_compress_many(xs, masks, max_per_launch=65)
    with pytest.raises(ValueError, match=r"tensor 0: cuSPARSELt's layout of A = x.T needs m % 64"):
        cc.masked_compress_many([jnp.ones((64, 96), jnp.bfloat16)], [jnp.ones((64, 96), bool)], layout="cusparselt")
