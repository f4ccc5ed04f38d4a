"""Fused 2:4 compressors (CUDA only): one pass over a dense array, CUTLASS SM90 compressed output.

Each function reads a dense ``(R, C)`` bfloat16/float16 array once and writes the compressed
``(values, meta)`` of the sparse GEMM's A operand (the layout of
:func:`jax_sparse24._src.cuda_spmm_ops.cutlass_compress`, read by
:func:`~jax_sparse24._src.cuda_spmm_ops.cutlass_spmm`):

* ``transposed=False``: ``A = op(x)`` (M = R, K = C; groups of 4 along x's axis 1);
* ``transposed=True``:  ``A = op(x).T`` (M = C, K = R; groups of 4 along x's axis 0), read in x's
  natural layout — e.g. ``W (I, O) -> W̃ᵀ`` for the forward GEMM, ``∇y (T, O) -> MVUE(∇y)ᵀ`` for
  the weight gradient. No transpose is materialised.

Every result is bit-identical to ``cutlass_compress`` of the dense op result (rounded to x's
dtype), e.g. ``mvue24_compress(key, g, transposed=True) == cutlass_compress(mvue24_cuda(key, g,
axis=0).T)`` (same Philox draws as the element-wise MVUE kernel).

* :func:`masked_compress`           ``x * mask`` (mask 2:4 along the compressed axis);
* :func:`masked_compress_both`      ``x * mask`` compressed as both ``A = (x*mask).T`` and
  ``A = x*mask`` in one pass (transposable mask: the forward and input-gradient operands of W);
* :func:`mvue24_compress`           unbiased MVUE 2:4 sample;
* :func:`masked_compress_many`      :func:`masked_compress` / :func:`masked_compress_both` of many
  ``(x, mask)`` pairs of one dtype in one launch per :data:`MAX_TENSORS_PER_LAUNCH` pairs (the
  prepared weights of a whole model per optimizer step: one small launch per layer is latency-bound);
* :func:`packed_compress`           a weight in :mod:`~jax_sparse24._src.packed24`'s encoding (kept values +
  mask bits), unpacked and compressed in one pass (an FSDP weight gathered packed).

``layout="cusparselt"`` writes cuSPARSELt's compressed operand instead (for
:func:`~jax_sparse24._src.cuda_cusparselt_ops.cusparselt_spmm` with ``a_layout=A_MK``): one uint8
buffer of ``m·k·9/8`` bytes per operand, values then metadata (``xla_ffi/compress_layout.h``). That
layout is not documented by NVIDIA; :func:`jax_sparse24._src.cuda_cusparselt_ops.fused_compress_ok`
checks it against ``cusparseLtSpMMACompress`` before the GEMM paths use it.

Shape rules (ValueError at trace time, checked again by the handlers): R and C multiples of 8, the
compressed K (C, or R when transposed) a multiple of 16; for ``layout="cusparselt"`` the operand's
M a multiple of 64 and K of 32. These functions lower only on CUDA; callers
select them with ``lax.platform_dependent`` (:func:`jax_sparse24._src.ffi.per_platform`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse24._src import cuda_mask_ops, packed24
from jax_sparse24._src import cuda_spmm_ops as _spmm
from jax_sparse24._src import ffi as _ffi

__all__ = [
    "DIRECTIONS",
    "LAYOUTS",
    "MAX_TENSORS_PER_LAUNCH",
    "compress_supports",
    "lt_compressed_bytes",
    "masked_compress",
    "masked_compress_both",
    "masked_compress_many",
    "packed_compress",
    "mvue24_compress",
]

_T_MASK = "jax_sparse24_masked_compress"
_T_MASK_BOTH = "jax_sparse24_masked_compress_both"
_T_MVUE = "jax_sparse24_mvue24_compress"
_T_MASK_MANY = "jax_sparse24_masked_compress_many"
_T_PACKED = "jax_sparse24_packed_compress"


class _Layout(NamedTuple):
    """An output layout of the compressors: the FFI handlers' name ``suffix``, the arrays of one operand
    (CUTLASS's values and meta, or cuSPARSELt's one buffer: ``out_types(m, k, dtype)``) and the
    operand's extra alignment ``(m, k)`` (None: CUTLASS's alone), named ``title`` in errors."""

    suffix: str
    out_types: Callable
    align: tuple[int, int] | None
    title: str


def _cutlass_out_types(m: int, k: int, dtype):
    values_shape, meta_shape = _spmm.cutlass_compressed_shapes(m, k, dtype)
    return (jax.ShapeDtypeStruct(values_shape, dtype), jax.ShapeDtypeStruct(meta_shape, jnp.uint8))


def _lt_out_types(m: int, k: int, dtype):
    return (jax.ShapeDtypeStruct((lt_compressed_bytes(m, k),), jnp.uint8),)


_LAYOUTS = {"cutlass": _Layout("", _cutlass_out_types, None, "CUTLASS"),
            "cusparselt": _Layout("_lt", _lt_out_types, (64, 32), "cuSPARSELt")}
#: Output layouts: CUTLASS's (values, meta) pair, or cuSPARSELt's single buffer (handler name + "_lt").
LAYOUTS = tuple(_LAYOUTS)
#: Outputs of :func:`masked_compress_many`: both operands (:func:`masked_compress_both`), or
#: ``A = (x*mask).T`` / ``A = x*mask`` alone (:func:`masked_compress` with ``transposed=True`` / ``False``).
DIRECTIONS = ("both", "transposed", "direct")
#: Most ``(x, mask)`` pairs one launch of the many-tensor compressor takes (``kMaxMany`` in
#: ``xla_ffi/compress_kernels.cu``: its tile table is a kernel parameter); longer lists are split.
MAX_TENSORS_PER_LAUNCH = 64


def _target(name: str, layout: str) -> str:
    return name + _LAYOUTS[layout].suffix


def _check_layout(layout, op: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"{op}: layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def lt_compressed_bytes(m: int, k: int) -> int:
    """Bytes of cuSPARSELt's compressed (m, k) 16-bit operand as our compressors write it."""
    return m * k + m * k // 8


def _operand_shape(shape, transposed: bool) -> tuple[int, int]:
    r, c = shape
    return (c, r) if transposed else (r, c)


def _reason(x, transposed: bool, layout: str = "cutlass") -> str | None:
    shape = tuple(int(s) for s in np.shape(x))
    dtype = jnp.result_type(x)
    if len(shape) != 2:
        return f"x must be 2-D (rows, cols), got shape {shape}"
    if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"x must be bfloat16 or float16, got {dtype}"
    r, c = shape
    if r % 8 or c % 8:
        return f"x's rows and cols must be multiples of 8, got shape {shape}"
    m, k = _operand_shape(shape, transposed)
    try:
        _spmm.cutlass_compressed_shapes(m, k, dtype)
    except ValueError as e:
        return f"the compressed operand A = {'x.T' if transposed else 'x'} (m={m}, k={k}): {e}"
    align, title = _LAYOUTS[layout].align, _LAYOUTS[layout].title
    if align is not None and (m % align[0] or k % align[1]):
        return (f"{title}'s layout of A = {'x.T' if transposed else 'x'} needs m % {align[0]} == 0 and "
                f"k % {align[1]} == 0, got m={m}, k={k}")
    return None


def compress_supports(x, *, transposed: bool = False, layout: str = "cutlass") -> bool:
    """True when the extension is built and the fused compressors handle ``x`` (shape, dtype, layout)."""
    if _ffi.extension() is None:
        return False
    return _reason(x, transposed, _check_layout(layout, "compress_supports")) is None


def _out_types(x, transposed: bool, layout: str = "cutlass"):
    m, k = _operand_shape(np.shape(x), transposed)
    return _LAYOUTS[layout].out_types(m, k, jnp.result_type(x))


def _check(x, transposed: bool, op: str, layout: str = "cutlass"):
    reason = _reason(x, transposed, _check_layout(layout, op))
    if reason is not None:
        raise ValueError(f"{op}: {reason}")
    return jnp.asarray(x)


def _result(outs, layout: str):
    """(values, meta) for CUTLASS's layout; the one uint8 buffer for cuSPARSELt's."""
    return tuple(outs) if len(outs) > 1 else outs[0]


def _check_mask(mask, x, op: str):
    if tuple(np.shape(mask)) != tuple(np.shape(x)):
        raise ValueError(f"{op}: mask must have x's shape {tuple(np.shape(x))}, got {tuple(np.shape(mask))}")
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        mask = mask != 0
    return mask


def masked_compress(x, mask, *, transposed: bool = False, layout: str = "cutlass"):
    """Compress ``x * mask`` (``mask`` 2:4 along the compressed axis) in one pass over ``x`` and ``mask``.

    A group with more than two kept elements keeps its first two (not a 2:4 mask: undefined math).

    Args:
      x: (R, C) bfloat16/float16; ``mask`` its mask (bool, or nonzero = kept).
      transposed: compress ``A = (x*mask).T`` (groups along axis 0) instead of ``A = x*mask``.
      layout: ``"cutlass"`` or ``"cusparselt"`` (module docstring).

    Returns:
      ``(values, meta)`` of A (:func:`~jax_sparse24._src.cuda_spmm_ops.cutlass_compressed_shapes`), or
      for ``layout="cusparselt"`` one uint8 array of :func:`lt_compressed_bytes`.
    """
    op = "masked_compress"
    x = _check(x, transposed, op, layout)
    mask = _check_mask(mask, x, op)
    return _result(_ffi.ffi_call(_target(_T_MASK, layout), _out_types(x, transposed, layout), x, mask,
                                 transposed=np.int64(bool(transposed))), layout)


def masked_compress_both(x, mask, *, layout: str = "cutlass"):
    """Compress ``x * mask`` as both ``A = (x*mask).T`` and ``A = x*mask``, reading ``x`` once.

    For a weight ``W (I, O)`` with a transposable mask: the first pair is the forward GEMM's operand
    ``W̃ᵀ`` (M = O, K = I), the second the input-gradient GEMM's ``W̃`` (M = I, K = O).

    Returns:
      ``((values_t, meta_t), (values, meta))``; for ``layout="cusparselt"`` ``(buffer_t, buffer)``.
    """
    op = "masked_compress_both"
    for transposed in (True, False):
        _check(x, transposed, op, layout)
    x = jnp.asarray(x)
    mask = _check_mask(mask, x, op)
    out_types = _out_types(x, True, layout) + _out_types(x, False, layout)
    outs = _ffi.ffi_call(_target(_T_MASK_BOTH, layout), out_types, x, mask)
    n = len(out_types) // 2  # arrays per operand
    return _result(outs[:n], layout), _result(outs[n:], layout)


def packed_compress(values, bits, *, transposed: bool = False, layout: str = "cutlass"):
    """Compress the weight ``W`` that :func:`~jax_sparse24._src.packed24.pack24` encoded as ``(values,
    bits)`` in one pass over them, never unpacking ``W`` in memory: the GEMM operand of an FSDP weight
    gathered packed.

    ``values (R/2, C)`` 16-bit and ``bits (R/8, C)`` ``uint8`` encode ``W (R, C)`` (groups of 4 along
    its rows). Bit for bit ``masked_compress(*unpack24(values, bits), transposed=transposed,
    layout=layout)``: ``transposed=True`` gives ``A = Wᵀ`` (the forward GEMM's operand, groups along
    ``R``); ``False`` gives ``A = W``, whose groups run along ``C`` (the input gradient's: ``W`` needs
    a transposable mask). Returns what :func:`masked_compress` returns for ``layout``.
    """
    op = "packed_compress"
    values, bits = jnp.asarray(values), jnp.asarray(bits)
    w_shape = jax.ShapeDtypeStruct(packed24.unpacked_shape(values, bits, op), values.dtype)
    reason = _reason(w_shape, transposed, _check_layout(layout, op))
    if reason is not None:
        raise ValueError(f"{op}: for the unpacked weight x of shape {w_shape.shape}: {reason}")
    return _result(_ffi.ffi_call(_target(_T_PACKED, layout), _out_types(w_shape, transposed, layout), values, bits,
                                 transposed=np.int64(bool(transposed))), layout)


def mvue24_compress(key, x, *, transposed: bool = True, layout: str = "cutlass"):
    """Unbiased MVUE 2:4 of ``x`` (groups along the compressed axis) compressed in one pass.

    Same Philox stream and group numbering as ``mvue24_cuda(key, x, axis=0 if transposed else 1)``,
    so ``mvue24_compress(key, g) == cutlass_compress(mvue24_cuda(key, g, axis=0).T)`` bit for bit.

    Args:
      key: a single PRNG key (typed or raw uint32 key data).
      x: (R, C) bfloat16/float16, e.g. ``∇y (T, O)``.
      transposed: True (default): ``A = MVUE(x).T`` (M = C, K = R: groups along x's rows, the token
        axis of ``∇y``); False: ``A = MVUE(x)`` (groups along x's columns).
      layout: ``"cutlass"`` or ``"cusparselt"`` (module docstring).
    """
    op = "mvue24_compress"
    x = _check(x, transposed, op, layout)
    try:
        words = cuda_mask_ops._key_words(key)
    except ValueError as e:
        raise ValueError(str(e).replace("mvue24_cuda", op)) from None
    return _result(_ffi.ffi_call(_target(_T_MVUE, layout), _out_types(x, transposed, layout), words, x,
                                 transposed=np.int64(bool(transposed))), layout)


def _direction_flags(direction: str) -> tuple[bool, ...]:
    """The ``transposed`` values :func:`masked_compress_many` writes for ``direction``, in output order."""
    return {"both": (True, False), "transposed": (True,), "direct": (False,)}[direction]


def _one(x, mask, direction: str, layout: str):
    """One pair through the one-tensor handlers (what a table of one would compute, same bits)."""
    if direction == "both":
        return masked_compress_both(x, mask, layout=layout)
    return masked_compress(x, mask, transposed=direction == "transposed", layout=layout)


def masked_compress_many(xs, masks, *, direction: str = "both", layout: str = "cutlass",
                         max_per_launch: int = MAX_TENSORS_PER_LAUNCH) -> list:
    """:func:`masked_compress_both` (or :func:`masked_compress`) of many ``(x, mask)`` pairs in few launches.

    One custom call per ``max_per_launch`` pairs (the lists are split into that many near-equal
    chunks) compresses every pair with the one-tensor kernel's tile code, so each result is bit for
    bit the one-tensor op's; a chunk of one pair runs the one-tensor op itself. The pairs may have
    different shapes but must share one dtype (group mixed lists by dtype; one launch covers one
    output kind).

    Args:
      xs: (R_i, C_i) bfloat16/float16 arrays, one dtype; the shape rules of the one-tensor ops for
        the chosen outputs (module docstring).
      masks: their masks (bool, or nonzero = kept), 2:4 along each compressed axis.
      direction: ``"both"`` (``A = (x*mask).T`` and ``A = x*mask``), ``"transposed"`` or ``"direct"``.
      layout: ``"cutlass"`` or ``"cusparselt"``.
      max_per_launch: pairs per launch, 1 to :data:`MAX_TENSORS_PER_LAUNCH`.

    Returns:
      a list with, per pair, what the one-tensor op returns: ``masked_compress_both(x, mask,
      layout=layout)`` for ``"both"``, ``masked_compress(x, mask, transposed=direction ==
      "transposed", layout=layout)`` otherwise.

    Raises:
      ValueError: lists of different lengths, mixed dtypes, an unknown direction / layout, or a pair
        the one-tensor op rejects (the message names the pair's index).
    """
    op = "masked_compress_many"
    layout = _check_layout(layout, op)
    if direction not in DIRECTIONS:
        raise ValueError(f"{op}: direction must be one of {DIRECTIONS}, got {direction!r}")
    if isinstance(max_per_launch, bool) or not isinstance(max_per_launch, (int, np.integer)) or not (
            1 <= max_per_launch <= MAX_TENSORS_PER_LAUNCH):
        raise ValueError(f"{op}: max_per_launch must be an int in [1, {MAX_TENSORS_PER_LAUNCH}], got {max_per_launch!r}")
    xs, masks = list(xs), list(masks)
    if len(xs) != len(masks):
        raise ValueError(f"{op}: needs one mask per x, got {len(xs)} arrays and {len(masks)} masks")
    checked = []
    for i, (x, mask) in enumerate(zip(xs, masks)):
        where = f"{op}: tensor {i}"
        for transposed in _direction_flags(direction):
            _check(x, transposed, where, layout)
        x = jnp.asarray(x)
        checked.append((x, _check_mask(mask, x, where)))
    dtypes = [x.dtype for x, _ in checked]
    for i, dt in enumerate(dtypes):
        if dt != dtypes[0]:
            raise ValueError(f"{op}: every x must have one dtype (one launch per dtype), tensor 0 is "
                             f"{dtypes[0].name} and tensor {i} {dt.name}; group the pairs by dtype")
    n = len(checked)
    chunks = -(-n // int(max_per_launch)) if n else 0
    out = []
    for c in range(chunks):
        part = checked[c * n // chunks:(c + 1) * n // chunks]
        if len(part) == 1:
            out.append(_one(*part[0], direction, layout))
            continue
        out_types, operands = [], []
        for x, mask in part:
            operands += [x, mask]
            for transposed in _direction_flags(direction):
                out_types += list(_out_types(x, transposed, layout))
        flat = iter(_ffi.ffi_call(_target(_T_MASK_MANY, layout), out_types, *operands,
                                  direct=np.int64(direction != "transposed"),
                                  transposed=np.int64(direction != "direct")))
        per_operand = len(_out_types(part[0][0], True, layout))
        for _ in part:
            results = [_result([next(flat) for _ in range(per_operand)], layout) for _ in _direction_flags(direction)]
            out.append(tuple(results) if direction == "both" else results[0])
    return out

