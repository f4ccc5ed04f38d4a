"""The packed encoding of a 2:4 masked weight (jax_sparse24/_src/packed24.py) that FSDP gathers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse24 as s24
from jax_sparse24._src import packed24
from jax_sparse24._src.packed24 import pack24, packable, unpack24


def _weight(shape, dtype=jnp.bfloat16, seed=0):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("shape", [(16, 8), (3, 64, 24)])
def test_round_trip_exact_and_sizes(shape, dtype):
    w = _weight(shape, dtype)
    m = s24.mask24(w, axis=-2)
    values, bits = pack24(w, m)
    assert values.shape == shape[:-2] + (shape[-2] // 2, shape[-1]) and values.dtype == dtype
    assert bits.shape == shape[:-2] + (shape[-2] // 8, shape[-1]) and bits.dtype == jnp.uint8
    w2, m2 = unpack24(values, bits)
    np.testing.assert_array_equal(np.asarray(m2), np.asarray(m))
    np.testing.assert_array_equal(np.asarray(w2, np.float32), np.asarray(jnp.where(m, w, 0), np.float32))
    # bytes against the weight plus a bool mask (bf16): 0.5625 / 1.5
    if dtype == jnp.bfloat16:
        packed = values.size * 2 + bits.size
        assert packed == 0.5625 * w.size * 2 and packed / (w.size * 3) == 0.375


def test_groups_keeping_fewer_or_more_than_two():
    """Fewer than two kept: zeros fill the empty value slots and unpack keeps exactly the mask. More
    than two (not a 2:4 mask): the first two kept survive, as in the fused compressors."""
    w = jnp.arange(1, 17, dtype=jnp.float32).reshape(16, 1) * jnp.array([1.0, -1.0])
    rows = [[0, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 1], [1, 1, 1, 0]]
    m = jnp.asarray(np.repeat(np.array(rows, bool).reshape(16, 1), 2, axis=1))
    values, bits = pack24(w, m)
    np.testing.assert_array_equal(np.asarray(values[:, 0]), [0, 0, 6, 0, 9, 12, 13, 14])
    w2, m2 = unpack24(values, bits)
    np.testing.assert_array_equal(np.asarray(m2), np.asarray(m))  # the mask itself travels as bits
    np.testing.assert_array_equal(np.asarray(w2[:12]), np.asarray(jnp.where(m[:12], w[:12], 0)))
    np.testing.assert_array_equal(np.asarray(w2[12:, 0]), [13, 14, 0, 0])  # the first two of 13, 14, 15


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_values_travel_by_their_bits(dtype):
    """-0.0, subnormals, inf and NaN come back bit for bit (the values are moved as integers, never
    added: a sum would turn a kept -0.0 into +0.0 and, on CPUs that flush them, subnormals into 0)."""
    special = [-0.0, float(jnp.finfo(dtype).smallest_subnormal), float("inf"), float("nan")]
    w = jnp.asarray(np.tile(np.array(special, np.float32).reshape(4, 1), (4, 3)), dtype)
    w = w.at[:, 1].set(w[::-1, 1])
    m = jnp.asarray(np.tile(np.array([[1, 0, 1], [1, 1, 0], [0, 1, 0], [0, 0, 1]], bool), (4, 1)))
    w2, m2 = unpack24(*pack24(w, m))
    expect = np.where(np.asarray(m), np.asarray(w), np.zeros((), np.asarray(w).dtype))
    np.testing.assert_array_equal(np.asarray(w2).view(np.uint8), expect.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(m2), np.asarray(m))


@pytest.mark.parametrize("axis", [-2, -1])
def test_shards_concatenate_into_the_packed_whole(axis):
    """Packing each device's block and concatenating along ``in`` or ``out`` gives the packed whole
    weight: what the all-gather inside the sharded GEMM relies on."""
    w = _weight((2, 64, 48), seed=1)
    m = s24.transposable_mask24(w[0])[None].repeat(2, axis=0)
    whole = pack24(w, m)
    parts = [pack24(a, b) for a, b in zip(jnp.split(w, 4, axis=axis), jnp.split(m, 4, axis=axis))]
    for j in range(2):
        np.testing.assert_array_equal(np.asarray(jnp.concatenate([p[j] for p in parts], axis=axis), np.float32),
                                      np.asarray(whole[j], np.float32))


def test_bad_shapes_are_errors():
    assert packable(8) and packable(64) and not packable(4) and not packable(0)
    w = _weight((12, 8))
    with pytest.raises(ValueError, match="multiple of 8"):
        pack24(w, jnp.ones(w.shape, bool))
    w = _weight((16, 8))
    with pytest.raises(ValueError, match="mask shape"):
        pack24(w, jnp.ones((16, 4), bool))
    values, bits = pack24(w, s24.mask24(w, axis=0))
    with pytest.raises(ValueError, match="bits must be uint8"):
        unpack24(values, bits.astype(jnp.int32))


def test_unpacked_shape_names_the_constraint():
    """The shape check of the kernels that read the encoding (``packed_compress``, ``fp8_packed_compress``):
    the weight's (R, C) from values and bits, or a ValueError naming the op and the bits' expected shape."""
    values, bits = packed24.pack24(jnp.ones((16, 24)), jnp.ones((16, 24), bool))
    assert packed24.unpacked_shape(values, bits, "op") == (16, 24)
    with pytest.raises(ValueError, match=r"op: bits must be uint8 of shape \(rows / 8, cols\) = \(2, 24\)"):
        packed24.unpacked_shape(values, bits[:1], "op")
    with pytest.raises(ValueError, match="bits must be uint8"):
        packed24.unpacked_shape(values, bits.astype(jnp.int8), "op")
    with pytest.raises(ValueError, match="a multiple of 8"):
        packed24.unpacked_shape(values[:6], bits[:1], "op")  # 12 rows
    with pytest.raises(ValueError, match="must be 2-D"):
        packed24.unpacked_shape(values[None], bits, "op")
