"""A compact encoding of a 2:4 masked weight, for moving it between devices.

``pack24(w, mask)`` encodes ``(w ⊙ mask, mask)`` of a weight ``(..., I, O)`` whose mask keeps at most
two elements of each group of 4 along ``I`` (axis -2, the forward GEMM's contraction axis):

* ``values (..., I/2, O)``: per group, the kept elements in order (the first kept, then the second;
  a zero where a group keeps fewer than two);
* ``bits (..., I/8, O)`` ``uint8``: the mask, one bit per element, 8 consecutive rows per byte
  (bit ``j`` of byte ``r`` is row ``8r + j``).

That is 0.5625 of the bfloat16 weight's bytes, against 1.5 for the weight plus a ``bool`` mask.
``unpack24`` gives back ``(w ⊙ mask, mask)`` bit for bit (for a 2:4 mask). Both are plain elementwise ``jnp`` (XLA fuses
each into one pass) and work on any block of rows that is a multiple of 8: a device packs its own
shard, and the shards' packed arrays concatenate along ``I`` or ``O`` into the packed whole weight —
which is how the sharding rules gather an FSDP-sharded 2:4 weight
(:func:`jax_sparse24._src.partitioning.weight_gather`). The gathered weight reaches the GEMMs still packed
(:class:`Packed24`): the CUDA compressor reads the encoding directly
(:func:`~jax_sparse24._src.cuda_compress_ops.packed_compress`), so the weight is never unpacked in memory
on the way to a sparse GEMM.

A group with more than two kept elements (not a 2:4 mask) keeps its first two, as the fused
compressors do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["pack24", "unpack24", "unpacked_weight", "packable", "PACK_ROWS", "Packed24", "unpacked_shape"]

#: ``I`` (per shard) must be a multiple of this: 4-groups, and 8 mask bits per byte.
PACK_ROWS = 8
#: The unsigned integer type of each float width, to move values by their bits.
_BITS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def packable(rows: int) -> bool:
    """Whether a block of ``rows`` rows (axis -2) can be packed."""
    return rows > 0 and rows % PACK_ROWS == 0


def _ranks(m4):
    """Per element of a group (axis -2 of ``m4 (..., G, 4, O)``): 1 for the first kept, 2 for the second.

    The running count is written out as three adds, not ``jnp.cumsum``: XLA lowers a cumsum to a
    ``reduce-window``, which inside the (un)packing fusion is evaluated per output element."""
    m = m4.astype(jnp.int8)
    m0, m1, m2, m3 = (m[..., j:j + 1, :] for j in range(4))
    c = jnp.concatenate([m0, m0 + m1, m0 + m1 + m2, m0 + m1 + m2 + m3], axis=-2)
    return jnp.where(m4, c, 0)


def pack24(w, mask):
    """``(values, bits)`` of ``w ⊙ mask`` (module docstring). ``w (..., I, O)``, ``mask`` its shape, ``I % 8 == 0``."""
    *lead, i, o = w.shape
    if not packable(i):
        raise ValueError(f"pack24: axis -2 of w must be a positive multiple of {PACK_ROWS}, got shape {w.shape}")
    if mask.shape != w.shape:
        raise ValueError(f"pack24: mask shape {mask.shape} differs from w's {w.shape}")
    mask = mask.astype(jnp.bool_)
    # the kept elements' bits, selected as integers: no arithmetic on the values (-0.0 and subnormals
    # come back as they went in)
    bits_dtype = _BITS[jnp.dtype(w.dtype).itemsize]
    w4 = jax.lax.bitcast_convert_type(w, bits_dtype).reshape(*lead, i // 4, 4, o)
    r = _ranks(mask.reshape(*lead, i // 4, 4, o))
    zero = jnp.zeros((), bits_dtype)
    first = jnp.sum(jnp.where(r == 1, w4, zero), axis=-2, dtype=bits_dtype)
    second = jnp.sum(jnp.where(r == 2, w4, zero), axis=-2, dtype=bits_dtype)
    values = jax.lax.bitcast_convert_type(jnp.stack([first, second], axis=-2), w.dtype).reshape(*lead, i // 2, o)
    m8 = mask.reshape(*lead, i // 8, 8, o).astype(jnp.uint8)
    weights = (jnp.uint8(1) << jnp.arange(8, dtype=jnp.uint8))[:, None]
    bits = jnp.sum(m8 * weights, axis=-2, dtype=jnp.uint8)
    return values, bits


def unpacked_shape(values, bits, op: str) -> tuple[int, int]:
    """``(R, C)`` of the 2-D weight that ``values (R/2, C)`` and ``bits (R/8, C)`` ``uint8`` encode; ``ValueError``
    naming ``op`` and the constraint otherwise (the kernels that read the encoding check it at trace time)."""
    vs, bs = tuple(jnp.shape(values)), tuple(jnp.shape(bits))
    if len(vs) != 2 or len(bs) != 2:
        raise ValueError(f"{op}: values and bits must be 2-D, got shapes {vs} and {bs}")
    r2, c = vs
    if jnp.result_type(bits) != jnp.uint8 or bs != (2 * r2 // 8, c) or (2 * r2) % PACK_ROWS:
        raise ValueError(f"{op}: bits must be uint8 of shape (rows / 8, cols) = ({2 * r2 // 8}, {c}) for values {vs} "
                         f"(the weight has 2 * {r2} rows, a multiple of {PACK_ROWS}), got {jnp.result_type(bits)} {bs}")
    return 2 * r2, c


def unpack24(values, bits):
    """``(w ⊙ mask, mask)`` from :func:`pack24`'s ``(values, bits)``."""
    *lead, i2, o = values.shape
    i = 2 * i2
    if bits.shape != (*lead, i // 8, o) or bits.dtype != jnp.uint8:
        raise ValueError(f"unpack24: bits must be uint8 of shape {(*lead, i // 8, o)} for values {values.shape}, "
                         f"got {bits.dtype} {bits.shape}")
    shifts = jnp.arange(8, dtype=jnp.uint8)[:, None]
    mask = ((bits[..., :, None, :] >> shifts) & jnp.uint8(1)).astype(jnp.bool_).reshape(*lead, i, o)
    r = _ranks(mask.reshape(*lead, i // 4, 4, o))
    v = values.reshape(*lead, i // 4, 2, o)
    first, second = v[..., 0:1, :], v[..., 1:2, :]
    zero = jnp.zeros((), values.dtype)
    w = jnp.where(r == 1, first, jnp.where(r == 2, second, zero)).reshape(*lead, i, o)  # selects: exact
    return w, mask


def unpacked_weight(values, bits):
    """``w ⊙ mask`` alone from :func:`pack24`'s ``(values, bits)`` (:func:`unpack24` without the mask): the
    dense weight the reference paths compute with."""
    return unpack24(values, bits)[0]


@jax.tree_util.register_pytree_node_class
class Packed24:
    """A 2:4 weight ``w ⊙ mask`` held as :func:`pack24`'s ``(values, bits)``, with the unpacked weight's
    ``shape`` and ``dtype``: what an FSDP-gathered weight is when it reaches a GEMM that takes it packed
    (``Rule.packed_weight`` in :mod:`jax_sparse24._src.partitioning`). A pytree of its two arrays."""

    def __init__(self, values, bits):
        self.values, self.bits = values, bits

    def tree_flatten(self):
        return (self.values, self.bits), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(*children)

    @property
    def shape(self) -> tuple[int, ...]:
        *lead, i2, o = self.values.shape
        return (*lead, 2 * i2, o)

    @property
    def dtype(self):
        return self.values.dtype

    def __repr__(self) -> str:
        return f"Packed24(shape={self.shape}, dtype={self.dtype})"
