"""``Sparse24Array``: a compressed 2:4 array (values + 2-bit index metadata) and matmuls on it.

Storage (the portable CPU format): the array is kept with its 2:4 groups along the *last* axis
of a stored array of shape ``(..., K)``:

* ``values``: ``(..., K // 2)`` — the two kept values of every group of 4, in index order;
* ``meta``: ``(..., ceil(K / 8))`` ``uint8`` — the two 2-bit in-group indices of each group
  (4 bits per group, low nibble = even group, high nibble = odd group; in each nibble bits 0–1
  hold the first index and bits 2–3 the second), the same 4 bits per group the sparse tensor
  cores use.

``.T`` reverses the logical axes without touching the data: the groups then run along the
logical *first* axis. ``matmul`` (and ``@``) accepts a ``Sparse24Array`` on either side as long
as its groups run along the contraction axis; a dense layer with a compressed weight is
``matmul(x, to_sparse(w, axis=0)) + bias``.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_sparse24._src import ffi, ops
from jax_sparse24._src import validation as v
from jax_sparse24._src.backends import CUTLASS

__all__ = ["Sparse24Array", "to_sparse", "matmul", "LAYOUTS"]

#: The storage of a :class:`Sparse24Array` that every platform reads (the format above).
PORTABLE = "portable"
#: The kernel layouts: a backend's operand layout (its ``compress_layout``) -> the backend whose sparse
#: GEMM reads it in place (``compress``, ``spmm``, ``supports``).
_KERNEL_LAYOUTS = {CUTLASS.compress_layout: CUTLASS}
#: What ``Sparse24Array.layout`` holds.
LAYOUTS = (PORTABLE,) + tuple(_KERNEL_LAYOUTS)


@jax.tree_util.register_pytree_node_class
class Sparse24Array:
    """A 2:4-sparse array stored compressed: ``values``, 2-bit index ``meta``, shape and dtype.

    Build one with :func:`jax_sparse24.to_sparse`. It is a pytree (usable under ``jit``,
    ``vmap`` over its leaves, in optimizer state, in checkpoints).

    Attributes:
      values: kept values, shape ``stored_shape[:-1] + (K // 2,)``.
      meta: ``uint8`` packed indices, shape ``stored_shape[:-1] + (ceil(K / 8),)``.
      shape: logical shape.
      transposed: when True the logical array is the transpose (all axes reversed) of the
        stored one, i.e. the 2:4 groups run along the logical first axis.
      layout: ``"portable"`` (the format above, every platform) or ``"cutlass"`` (2-D only: the
        compressed A operand of the CUTLASS SM90 sparse GEMM — the operand layout of
        :data:`jax_sparse24._src.backends.CUTLASS` — GPU only; ``matmul`` then runs on the
        sparse tensor cores with no decompression).
    """

    def __init__(self, values, meta, shape: tuple[int, ...], transposed: bool = False,
                 layout: str = PORTABLE):
        self.values = values
        self.meta = meta
        self.shape = tuple(int(s) for s in shape)
        self.transposed = bool(transposed)
        self.layout = layout

    # pytree protocol
    def tree_flatten(self):
        return (self.values, self.meta), (self.shape, self.transposed, self.layout)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, *aux)

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def sparse_axis(self) -> int:
        """Logical axis along which the 2:4 groups run."""
        return 0 if self.transposed else self.ndim - 1

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return self.shape[::-1] if self.transposed else self.shape

    @property
    def T(self) -> "Sparse24Array":
        """Transpose (all axes reversed); no data is moved."""
        return Sparse24Array(self.values, self.meta, self.shape[::-1], not self.transposed, self.layout)

    def todense(self):
        """The dense array (zeros at the pruned positions)."""
        kernel = _KERNEL_LAYOUTS.get(self.layout)
        if kernel is not None:
            rows, k = self.stored_shape
            # D (K, rows) = I_K · Sᵀ: the sparse GEMM against the identity decompresses exactly.
            dense = kernel.spmm(self.values, self.meta, jnp.eye(k, dtype=self.dtype), m=rows, k=k).T
        else:
            dense = _decompress(self.values, self.meta, self.stored_shape[-1])
        return dense.T if self.transposed else dense

    def __matmul__(self, other):
        return matmul(self, other)

    def __rmatmul__(self, other):
        return matmul(other, self)

    def __repr__(self) -> str:
        return (f"Sparse24Array(shape={self.shape}, dtype={self.dtype}, sparse_axis={self.sparse_axis}, "
                f"layout={self.layout!r})")


def _pack(idx):
    """(..., G, 2) int indices in [0, 4) -> (..., ceil(G/2)) uint8."""
    nib = (idx[..., 0] | (idx[..., 1] << 2)).astype(jnp.uint8)  # (..., G)
    g = nib.shape[-1]
    if g % 2:
        nib = jnp.concatenate([nib, jnp.zeros(nib.shape[:-1] + (1,), jnp.uint8)], axis=-1)
    nib = nib.reshape(*nib.shape[:-1], -1, 2)
    return nib[..., 0] | (nib[..., 1] << 4)


def _unpack(meta, groups: int):
    """(..., ceil(G/2)) uint8 -> (..., G, 2) int32 indices."""
    nib = jnp.stack([meta & 0xF, meta >> 4], axis=-1).reshape(*meta.shape[:-1], -1)[..., :groups]
    nib = nib.astype(jnp.int32)
    return jnp.stack([nib & 3, (nib >> 2) & 3], axis=-1)


def _compress(x, keep):
    """Compress ``x`` (..., K) given a 2:4-or-sparser bool ``keep`` along the last axis."""
    k = x.shape[-1]
    g = x.reshape(*x.shape[:-1], k // 4, 4)
    kg = keep.reshape(g.shape)
    # Take the kept lanes first (lower index on ties); groups with fewer than two kept lanes
    # are padded with a dropped lane whose value is stored as zero.
    _, idx = lax.top_k(kg.astype(jnp.int8), 2)
    idx = jnp.sort(idx, axis=-1)
    vals = jnp.take_along_axis(g, idx, axis=-1) * jnp.take_along_axis(kg, idx, axis=-1).astype(x.dtype)
    return vals.reshape(*x.shape[:-1], k // 2), _pack(idx)


def _decompress(values, meta, k: int):
    groups = k // 4
    idx = _unpack(meta, groups)  # (..., G, 2)
    vals = values.reshape(*values.shape[:-1], groups, 2)
    onehot = idx[..., None] == jnp.arange(4)  # (..., G, 2, 4)
    dense = jnp.sum(jnp.where(onehot, vals[..., None], jnp.zeros((), values.dtype)), axis=-2)
    return dense.reshape(*values.shape[:-1], k)


def _cutlass_layout_ok(shape, dtype) -> bool:
    """The CUTLASS layout applies: 2-D bf16/f16, aligned, extension built and a GPU visible."""
    if len(shape) != 2 or not ffi.cuda_kernels_available():
        return False
    rows, k = shape
    return CUTLASS.supports(rows, 16, k, dtype)


def to_sparse(x, mask=None, *, method: str = "magnitude", key=None, axis: int = -1,
              layout: str = "auto", check_mask: bool = True) -> Sparse24Array:
    """Compress ``x`` to a :class:`Sparse24Array` with 2:4 groups along ``axis``.

    Args:
      x: floating-point array; ``x.shape[axis] % 4 == 0``.
      mask: optional ``bool`` mask, at most 2 True per group of 4 along ``axis`` (checked, see
        ``check_mask``). When given, exactly the masked entries are kept and ``method`` is ignored.
      method: ``"magnitude"`` (keep the 2 largest ``|x|``, :func:`mask24`) or ``"mvue"`` (the
        unbiased stochastic estimate :func:`mvue24`, needs ``key``).
      key: PRNG key for ``method="mvue"``.
      axis: the grouping axis: ``-1`` (last) or ``0`` (first, stored transposed).
      layout: ``"portable"``, ``"cutlass"`` (GPU sparse-GEMM operand; error where unsupported)
        or ``"auto"``: ``"cutlass"`` for 2-D bfloat16/float16 arrays with aligned shapes when the
        CUDA kernels are available, else ``"portable"``.
      check_mask: check a traced ``mask`` on the device too (as :func:`jax_sparse24.sparse24_linear`);
        a concrete one is always checked. ``False``: a mask keeping more than 2 of 4 gives
        undefined values.

    >>> import jax.numpy as jnp, jax_sparse24 as s24
    >>> s = s24.to_sparse(jnp.array([[1., -5., 3., 0.], [0., 2., 0., -1.]]))
    >>> s.values
    Array([[-5.,  3.],
           [ 2., -1.]], dtype=float32)
    >>> s.todense()
    Array([[ 0., -5.,  3.,  0.],
           [ 0.,  2.,  0., -1.]], dtype=float32)
    """
    op = "to_sparse"
    v.check_float(x, "x", op)
    x = jnp.asarray(x)
    axis = v.normalize_axis(axis, x.ndim, op, x.shape)
    if axis not in (0, x.ndim - 1):
        raise ValueError(f"{op}: axis must be the first or the last axis, got {axis} for shape {x.shape}")
    v.check_divisible(x, axis, 4, op)
    if layout != "auto" and layout not in LAYOUTS:
        raise ValueError(f"{op}: layout must be 'auto', 'portable' or 'cutlass', got {layout!r}")
    if method not in ("magnitude", "mvue"):
        raise ValueError(f"{op}: method must be 'magnitude' or 'mvue', got {method!r}")
    transposed = axis == 0 and x.ndim > 1
    if mask is not None:
        v.check_same_shape(x, mask, op, ("x", "mask"))
        v.check_nm_mask(mask, 2, 4, axis, op, hint=" check_mask=False skips this check.",
                        on_device=check_mask)
        keep = jnp.asarray(mask) != 0
    elif method == "mvue":
        if key is None:
            raise ValueError(f"{op}: method='mvue' needs a PRNG `key`")
        x = ops.mvue24(key, x, axis)
        keep = ops.mask24(x, axis)  # the (at most two) non-zeros of every group
    else:
        keep = ops.mask24(x, axis)
    if transposed:
        x, keep = x.T, keep.T
    shape = x.shape[::-1] if transposed else x.shape
    cutlass_ok = layout != PORTABLE and _cutlass_layout_ok(x.shape, x.dtype)
    if layout in _KERNEL_LAYOUTS or cutlass_ok:  # the one kernel layout, CUTLASS's
        if not cutlass_ok:
            raise ValueError(
                f"{op}: layout='cutlass' needs a 2-D bfloat16/float16 array with CUTLASS-aligned shape "
                f"(rows % 8, groups axis % 16), the CUDA extension and a GPU; got shape {tuple(shape)}, "
                f"dtype {x.dtype}")
        values, meta = CUTLASS.compress(jnp.where(keep, x, jnp.zeros((), x.dtype)))
        return Sparse24Array(values, meta, shape, transposed, CUTLASS.compress_layout)
    values, meta = _compress(x, keep)
    return Sparse24Array(values, meta, shape, transposed)


def _dense_operand(a, side: str, contraction_axis: int, op: str):
    if isinstance(a, Sparse24Array):
        if a.ndim != 2 and side == "rhs":
            raise ValueError(f"{op}: a sparse right operand must be 2-D, got shape {a.shape}")
        _dense_operand_check(a, side, contraction_axis, op)
        return a.todense()
    return jnp.asarray(a)


def _in_kernel_layout(a) -> bool:
    """``a`` is a :class:`Sparse24Array` stored in a kernel layout (CUTLASS's operand: the only one)."""
    return isinstance(a, Sparse24Array) and a.layout in _KERNEL_LAYOUTS


def _cutlass_matmul(a, b, op: str):
    """``a @ b`` on the sparse tensor cores when one operand is in the CUTLASS layout, else None."""
    if _in_kernel_layout(b):
        _dense_operand_check(b, "rhs", 0, op)
        m, k = b.stored_shape  # stored S = bᵀ (M, K): exactly CUTLASS's A
        a = jnp.asarray(a, b.dtype)
        if a.shape[-1] != k:
            raise ValueError(f"{op}: contraction sizes differ: {a.shape} @ {b.shape}")
        a2 = a.reshape(-1, k)
        if not CUTLASS.supports(m, a2.shape[0], k, b.dtype):
            return None
        return CUTLASS.spmm(b.values, b.meta, a2, m=m, k=k).reshape(a.shape[:-1] + (m,))
    if _in_kernel_layout(a):
        _dense_operand_check(a, "lhs", -1, op)
        m, k = a.stored_shape  # a (M, K) = S
        b = jnp.asarray(b, a.dtype)
        if b.ndim != 2 or b.shape[0] != k:
            raise ValueError(f"{op}: contraction sizes differ: {a.shape} @ {b.shape}")
        if not CUTLASS.supports(m, b.shape[1], k, a.dtype):
            return None
        return CUTLASS.spmm(a.values, a.meta, b.T, m=m, k=k).T  # (Bᵀ·Sᵀ)ᵀ
    return None


def _dense_operand_check(a, side: str, contraction_axis: int, op: str):
    want = contraction_axis % a.ndim
    if a.sparse_axis != want:
        raise ValueError(
            f"{op}: the {side} Sparse24Array has its 2:4 groups along axis {a.sparse_axis} but "
            f"the contraction axis is {want} (shape {a.shape}); use `.T` or compress along the "
            "contraction axis")


def matmul(a, b, *, precision=None):
    """``a @ b`` where either operand may be a :class:`Sparse24Array`.

    A sparse ``a`` must have its groups along its last axis, a sparse ``b`` along its first —
    the contraction axis, which is what the 2:4 tensor cores require.

    >>> import jax, jax_sparse24 as s24
    >>> w = jax.random.normal(jax.random.key(0), (8, 4))
    >>> sw = s24.to_sparse(w, axis=0)
    >>> x = jax.random.normal(jax.random.key(1), (2, 8))
    >>> bool(jax.numpy.allclose(s24.matmul(x, sw), x @ sw.todense()))
    True
    """
    op = "matmul"
    if isinstance(a, Sparse24Array) and isinstance(b, Sparse24Array):
        raise ValueError(f"{op}: at most one operand may be a Sparse24Array")
    if not isinstance(a, Sparse24Array) and not isinstance(b, Sparse24Array):
        return jnp.matmul(a, b, precision=precision)
    fast = _cutlass_matmul(a, b, op)
    if fast is not None:
        return fast
    da = _dense_operand(a, "lhs", -1, op)
    db = _dense_operand(b, "rhs", 0 if np.ndim(b) != 1 else 0, op)
    if da.shape[-1] != db.shape[0]:
        raise ValueError(f"{op}: contraction sizes differ: {da.shape} @ {db.shape}")
    return jnp.matmul(da, db, precision=precision)
