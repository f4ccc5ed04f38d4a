"""Helpers shared by the GPU test modules (tests/test_gpu_*.py).

Importable on a CPU-only machine: nothing here touches a GPU until it is called.
"""

from __future__ import annotations

import functools
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# Hopper's legal 4-bit sparse-MMA metadata values (index pairs (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)).
LEGAL_NIBBLES = {0x4, 0x8, 0xC, 0x9, 0xD, 0xE}


def skip_module_without_kernels():
    """Skip the calling test module (call it at module level) unless the CUDA kernels can run."""
    from jax_sparse24._src import ffi

    if not ffi.cuda_kernels_available():
        pytest.skip("CUDA kernels unavailable (no GPU, extension not built, or JAX_SPARSE24_BACKEND=reference): "
                    f"{ffi.extension_error() or 'no CUDA device'}", allow_module_level=True)


def gpu():
    """The first GPU device."""
    return jax.devices("gpu")[0]


def fresh_rng():
    """A generator from a fresh seed; the seed is returned so a failure message can print it.

    ``JAX_SPARSE24_TEST_SEED=<seed>`` (the number a failure printed) replays that seed instead:
    ``JAX_SPARSE24_TEST_SEED=123 pytest -m gpu tests/... -k "the failed case"``."""
    replay = os.environ.get("JAX_SPARSE24_TEST_SEED")
    seed = int(replay) if replay else int(np.random.SeedSequence().entropy % (2**63))
    return np.random.default_rng(seed), seed


def quantize_on_cpu(t, s):
    """``fp8.quantize(t, s)`` evaluated by XLA's CPU backend, as a device array again: the oracle of
    the bit-exact fp8 kernel tests. XLA's GPU lowering of the same jnp function is not bit-exact with
    its documented float32 math (one correctly rounded ``1/s``, one product, round to nearest even): on
    the H100 it rounded 2 of 21M random float32 elements to the other fp8 neighbour
    (``scripts/check_xla_quantize.py``), which failed a kernel test that agreed with the CPU."""
    from jax_sparse24._src import fp8_math as f8

    cpu = jax.devices("cpu")[0]
    q = jax.jit(f8.quantize)(jax.device_put(t, cpu), jax.device_put(jnp.asarray(s, jnp.float32), cpu))
    return jnp.asarray(np.asarray(q))


def cutlass_compiled(dtype) -> bool:
    """Whether this build has the CUTLASS kernels for ``dtype`` (a minimal build has bf16 only)."""
    from jax_sparse24._src import cuda_spmm_ops

    try:
        cuda_spmm_ops.cutlass_compressed_shapes(64, 128, dtype)
    except ValueError:
        return False
    return True


def skip_uncompiled(dtype):
    if not cutlass_compiled(dtype):
        pytest.skip(f"{jnp.dtype(dtype)} kernels not compiled in this build")


def mask24_np(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """Top-2 |a| of every 4 consecutive elements along ``axis`` (ties -> lower index), in NumPy."""
    a = np.moveaxis(np.abs(a.astype(np.float32)), axis, -1)
    lead, n = a.shape[:-1], a.shape[-1]
    g = a.reshape(*lead, n // 4, 4)
    keep = np.argsort(-g, axis=-1, kind="stable")[..., :2]
    m = np.zeros_like(g, dtype=bool)
    np.put_along_axis(m, keep, True, axis=-1)
    return np.moveaxis(m.reshape(*lead, n), -1, axis)


def poisoned(fn):
    """``jit(fn)`` whose outputs are written into donated buffers pre-filled with poison.

    Poison: NaN for floats, 0xFF for uint8, True for bool — an element the kernel does not write
    keeps a value no valid output has (or breaks the 2-per-group mask structure). Raises if XLA
    cannot alias a donated buffer to its output (JAX's "donated buffers were not usable" warning).
    """

    def poison_of(sds):
        if sds.dtype == jnp.uint8:
            return jnp.full(sds.shape, 0xFF, jnp.uint8, device=gpu())
        if sds.dtype == jnp.bool_:
            return jnp.ones(sds.shape, jnp.bool_, device=gpu())
        return jnp.full(sds.shape, jnp.nan, sds.dtype, device=gpu())

    @functools.partial(jax.jit, donate_argnums=0, keep_unused=True)
    def run(poison, *args):
        del poison
        return fn(*args)

    def call(*args):
        poison = jax.tree_util.tree_map(poison_of, jax.eval_shape(fn, *args))
        # A donated buffer XLA cannot use for an output would leave that output unpoisoned: fail.
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*donated buffers were not usable")
            return run(poison, *args)

    return call


def bit_patterns(a) -> np.ndarray:
    """The unsigned-integer bit patterns of an array (uint8 for fp8, uint16 for bf16/f16, ...)."""
    a = jnp.asarray(a)
    return np.asarray(jax.lax.bitcast_convert_type(a, jnp.dtype(f"uint{8 * a.dtype.itemsize}")))


def assert_same_compressed(got, ref, what: str):
    """Compressed operands ``(values, meta)``: same shapes, only legal metadata nibbles, and
    bit-identical values and metadata."""
    (gv, gm), (rv, rm) = got, ref
    assert gv.shape == rv.shape and gm.shape == rm.shape, f"{what}: shapes {gv.shape, gm.shape} vs {rv.shape, rm.shape}"
    gm, rm = np.asarray(gm), np.asarray(rm)
    nib = np.concatenate([gm & 0xF, gm >> 4]).ravel()
    bad_nib = sorted(set(np.unique(nib).tolist()) - LEGAL_NIBBLES)
    assert not bad_nib, f"{what}: illegal metadata nibbles {bad_nib} (0xF = unwritten poison)"
    gb, rb = bit_patterns(gv), bit_patterns(rv)
    if not np.array_equal(gb, rb):
        r, c = np.nonzero(gb != rb)
        w = 2 + 2 * gb.dtype.itemsize
        raise AssertionError(f"{what}: {r.size} value elements differ, first at {(r[0], c[0])}: "
                             f"{gb[r[0], c[0]]:#0{w}x} vs {rb[r[0], c[0]]:#0{w}x}; rows {np.unique(r)[:8]}")
    if not np.array_equal(gm, rm):
        r, c = np.nonzero(gm != rm)
        raise AssertionError(f"{what}: {r.size} metadata bytes differ, first at {(r[0], c[0])}: "
                             f"{gm[r[0], c[0]]:#04x} vs {rm[r[0], c[0]]:#04x}; rows {np.unique(r)[:8]}")
